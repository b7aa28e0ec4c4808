"""``tilewise.report`` and ``tilewise report script.py:function``: one self-contained HTML page of a compiled call."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_explain_functions import MLP_SCRIPT as EXPLAIN_MLP_SCRIPT
from test_explain_functions import SMALL

import tilewise as tw
from tilewise import nn
from tilewise.cli import main
from tilewise.fileio import is_temporary_of
from tilewise.profiler.report import HOT_PTX, HOT_SASS, SECTIONS, classify, render

# the MLP training step of the explain tests, as a script whose ARGS give the call
MLP_SCRIPT = EXPLAIN_MLP_SCRIPT + "ARGS = (tw.randn(8, 16), tw.randint(0, 4, (8,)))\n"


def _mlp_step():
    tw.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return train_step, (tw.randn(8, 16), tw.randint(0, 4, (8,)))


class BalancedTags(HTMLParser):
    """Parses HTML and fails on a closing tag that closes nothing open, or on a tag left open."""

    VOID = frozenset({"meta", "br", "hr", "img", "input", "link", "wbr", "col", "source"})

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.seen: dict[str, int] = {}
        self.ids: set[str] = set()
        self.lazy: dict[str, str] = {}  # id -> JSON text of the collapsed blocks' contents
        self._json_id = None
        self._json_parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.seen[tag] = self.seen.get(tag, 0) + 1
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "script" and attrs.get("type") == "application/json":
            self._json_id, self._json_parts = attrs["id"], []
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):  # <circle .../> in SVG
        self.seen[tag] = self.seen.get(tag, 0) + 1

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes {self.open[-1:]} (open: {self.open[-5:]})"
        self.open.pop()
        if tag == "script" and self._json_id is not None:
            self.lazy[self._json_id] = "".join(self._json_parts)
            self._json_id = None

    def handle_data(self, data):
        if self._json_id is not None:
            self._json_parts.append(data)

    def finish(self) -> BalancedTags:
        self.close()
        assert not self.open, f"tags left open: {self.open}"
        return self


def _parsed(text: str) -> BalancedTags:
    parser = BalancedTags()
    parser.feed(text)
    return parser.finish()


def _blocks(page: BalancedTags) -> list[str]:
    """The collapsed blocks' HTML, each checked to parse with balanced tags on its own."""
    blocks = [json.loads(text) for text in page.lazy.values()]
    for block in blocks:
        _parsed(block)
    return blocks


@pytest.fixture(scope="module")
def mlp_cpu():
    step, args = _mlp_step()
    explained = tw.explain(step, *args, repeats=2, roofline_size=SMALL)
    return explained, render(explained)


# ---------------------------------------------------------------------------- the page

def test_a_training_step_page_has_every_section_and_parses(mlp_cpu):
    explained, text = mlp_cpu
    page = _parsed(text)
    assert {*SECTIONS} <= page.ids
    assert text.startswith("<!DOCTYPE html>") and "<style>" in text
    blocks = _blocks(page)
    kernels = [k for p in explained.programs for k in p.kernels]
    for kernel in kernels:  # each kernel's IR, schedule and its own C function, in its collapsed block
        block = next(b for b in blocks if f"kernel {kernel.name}(" in b)
        assert "<h4>schedule</h4>" in block and f"void {kernel.name}(" in block
    passes = [name for name, _ in explained.programs[-1].passes]
    assert all(f"after {name}" in text for name in passes[1:])
    assert "unchanged</span>" in text and re.search(r"\+\d+ &minus;\d+</span>", text)  # each pass's diff marker


def test_the_page_is_self_contained(mlp_cpu):
    _, text = mlp_cpu
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", text)
    assert "@import" not in text and "url(" not in text
    assert text.count("<script>") == 1  # one inline script; the rest are inert JSON blocks


def test_sources_are_escaped(mlp_cpu):
    _, text = mlp_cpu
    page = _parsed(text)
    assert "d0 < " not in text and not any("<" in block for block in page.lazy.values())
    assert any("d0 &lt; 8LL" in b for b in _blocks(page))  # a loop bound of the generated C, escaped


def test_the_roofline_and_the_timeline_have_one_mark_per_step(mlp_cpu):
    explained, text = mlp_cpu
    roofline = re.search(r'<svg class="chart roofline".*?</svg>', text, flags=re.S)[0]
    timeline = re.search(r'<svg class="chart timeline".*?</svg>', text, flags=re.S)[0]
    assert roofline.count("<circle ") == len(explained.kernels) > 0
    assert timeline.count('<rect class="bar ') == len(explained.kernels)
    assert roofline.count('<polyline class="roof"') == len(explained.roofline.peak_gflops)
    timed = [r for r in explained.kernels if r.seconds is not None]
    assert timed
    assert all(f"{1e3 * r.seconds:.4f} ms" in timeline for r in timed)  # each bar's tooltip is its step


def test_the_memory_plan_draws_every_arena_buffer(mlp_cpu):
    explained, text = mlp_cpu
    blocks = _blocks(_parsed(text))
    for p in explained.programs:
        plan = p.program.plan
        arena = sum(plan.buffers[b].kind == "arena" for b in plan.of.values())
        chart = next(b for b in blocks if "memory plan: arena" in b and f"arena {plan.arena_bytes} bytes" in b)
        assert chart.count('<rect class="life"') == arena > 0


def test_report_writes_the_page_atomically(tmp_path):
    step, args = _mlp_step()
    out = tmp_path / "step.html"
    assert tw.report(step, *args, out=out, repeats=1, roofline_size=SMALL) == out
    assert {*SECTIONS} <= _parsed(out.read_text()).ids
    assert [p.name for p in tmp_path.iterdir()] == ["step.html"]
    assert not any(is_temporary_of(p, out) for p in tmp_path.iterdir())


def test_cuda_target_without_a_gpu_shows_ptx_and_sass_side_by_side(tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    step, args = _mlp_step()
    out = tw.report(step, *args, out=tmp_path / "cuda.html", arch="sm_90")
    text = out.read_text()
    page = _parsed(text)
    assert {*SECTIONS} <= page.ids
    blocks = _blocks(page)
    kernels = [b for b in blocks if '<div class="side">' in b]
    assert kernels and all(".target sm_90" in b for b in kernels)
    if "nvdisasm not found" not in kernels[0]:
        assert all("registers/thread" in b for b in kernels)
        assert any('<span class="hot vector">' in b for b in kernels)  # float4 loads of the epilogue kernels
    assert "not run" in text and text.count("<circle ") == text.count('<rect class="bar ') > 0


@pytest.mark.parametrize("line, rules, kind", [
    ("        /*0090*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;", HOT_SASS, "mma"),
    ("        /*0100*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;", HOT_SASS, "mma"),
    ("        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;", HOT_SASS, "vector"),
    ("        /*0050*/                   STG.E.64 desc[UR4][R6.64], R8 ;", HOT_SASS, "vector"),
    ("        /*0040*/                   LDG.E R4, desc[UR4][R2.64] ;", HOT_SASS, ""),
    ("        /*0060*/                   STL [R1+0x4], R5 ;", HOT_SASS, "spill"),
    ("        /*0070*/                   LDL.LU R5, [R1+0x4] ;", HOT_SASS, "spill"),
    ("        /*0080*/                   FFMA R4, R5, R6, R4 ;", HOT_SASS, ""),
    ("\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, ...;", HOT_PTX, "mma"),
    ("\twgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {...};", HOT_PTX, "mma"),
    ("\tld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd4];", HOT_PTX, "vector"),
    ("\tld.global.f32 %f1, [%rd4];", HOT_PTX, ""),
    ("\tst.local.u32 [%rd9], %r3;", HOT_PTX, "spill"),
])
def test_machine_code_lines_worth_marking(line, rules, kind):
    assert classify(line, rules) == kind


# ---------------------------------------------------------------------------- the command line

def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "step.py"
    path.write_text(body)
    return path


def _report_error(capsys, *argv: str, forms: bool = True) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["report", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tilewise report" in err
    assert ("Accepted form: tilewise report path/to/script.py:function" in err) == forms
    return err


def test_the_script_form_writes_the_page(tmp_path, capsys):
    path = _script(tmp_path, MLP_SCRIPT)
    out = tmp_path / "page.html"
    assert main(["report", f"{path}:train_step", "--out", str(out), "--repeats", "1", "--no-run"]) == 0
    assert f"tilewise report: wrote {out}" in capsys.readouterr().out
    text = out.read_text()
    line = MLP_SCRIPT.splitlines().index("def train_step(x, y):") + 1
    assert {*SECTIONS} <= _parsed(text).ids and f"train_step at {path}:{line}" in text


def test_script_errors_point_at_the_problem(tmp_path, capsys):
    missing = tmp_path / "nowhere.py"
    assert f"no script '{missing}'" in _report_error(capsys, f"{missing}:f")
    path = _script(tmp_path, "import tilewise as tw\n\ndef f(x):\n    return x + 1\n\nvalue = 3\n")
    assert f"{path} has no function 'g'; its functions: f" in _report_error(capsys, f"{path}:g")
    assert f"{path} defines no ARGS: add ARGS = (...)" in _report_error(capsys, f"{path}:f")
    assert f"name the function after the script, as in {path}:train_step" in _report_error(capsys, str(path))
    assert "'x + 1' is not SCRIPT.py:FUNCTION" in _report_error(capsys, "x + 1")
    assert f"--out '{tmp_path}' is a folder" in _report_error(capsys, f"{path}:f", "--out", str(tmp_path), forms=False)
    nowhere = tmp_path / "no" / "page.html"
    assert f"no folder '{nowhere.parent}'" in _report_error(capsys, f"{path}:f", "--out", str(nowhere), forms=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", f"{path}:f", "--arch", "sm90"])
    assert exit_info.value.code == 2
    assert "argument --arch: unknown CUDA target 'sm90'" in capsys.readouterr().err


# ---------------------------------------------------------------------------- in a real browser

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _find_chromium() -> str | None:
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = _find_chromium()
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        try:  # a CI host without it: the OS package, once per module (an install that stalls is a skip)
            subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=300)
        except subprocess.TimeoutExpired:
            pass
        found = _find_chromium()
    if found is None:
        pytest.skip("no Chromium: not on PATH and `apt-get install -y chromium` could not install it "
                    "(needs apt-get, root and the package index)")
    return found


def _open_in_chromium(chromium: str, url: str, *flags: str) -> subprocess.CompletedProcess:
    command = [chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
               "--enable-logging=stderr", "--v=0", *flags, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_chromium_reports_a_script_error(chromium, tmp_path):
    """The check below would see a script error: a page whose script throws logs 'Uncaught'."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>notAFunction();</script></body></html>")
    assert "Uncaught" in _open_in_chromium(chromium, page.as_uri(), "--dump-dom").stderr


def test_chromium_opens_the_page_without_script_errors(chromium, mlp_cpu, tmp_path):
    explained, text = mlp_cpu
    page = tmp_path / "report.html"
    page.write_text(text)
    kernel = explained.programs[-1].kernels[0].name
    fragment = f"kernel-{explained.programs[-1].label.replace(' ', '-')}-{kernel}"
    start = time.perf_counter()
    dumped = _open_in_chromium(chromium, f"{page.as_uri()}#{fragment}", "--dump-dom")
    seconds = time.perf_counter() - start
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert "Uncaught" not in dumped.stderr, dumped.stderr[-2000:]
    dom = dumped.stdout
    assert all(f'<section id="{key}">' in dom for key in SECTIONS)
    assert f"void {kernel}(" in dom and 'data-filled="1"' in dom  # the fragment's block was opened and filled
    screenshot = tmp_path / "report.png"
    shot = _open_in_chromium(chromium, page.as_uri(), f"--screenshot={screenshot}", "--window-size=1280,2400")
    assert shot.returncode == 0 and "Uncaught" not in shot.stderr, shot.stderr[-2000:]
    assert screenshot.stat().st_size > 10_000
    print(f"\nscreenshot: {screenshot} (page {len(text) / 1e3:.0f} kB; chromium --dump-dom {seconds:.2f} s)")
