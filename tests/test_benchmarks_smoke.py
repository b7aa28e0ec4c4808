"""The benchmarks run end to end at tiny sizes on the CPU, and what they compare is the same computation on each
side: ``benchmarks/vision_train_step.py`` trains a narrow ResNet-50 and a narrow UNet from the same weights in
tilewise and torch, and their losses must agree step for step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from childenv import python_path

ROOT = Path(__file__).resolve().parent.parent
VISION = ROOT / "benchmarks" / "vision_train_step.py"
TINY = ["--quick", "--formats", "contiguous"]


def run_vision(*args: str, tmp_path: Path, device: str = "cpu") -> str:
    env = dict(os.environ, TILEWISE_CACHE_DIR=os.environ.get("TILEWISE_CACHE_DIR", str(tmp_path / "cache")),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), PYTHONPATH=python_path())
    if device == "cpu":
        # one thread a library: on a shared few-core host, torch's and tilewise's thread pools waiting on each
        # other's cores made a tiny step take seconds instead of tens of milliseconds
        env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, str(VISION), "--device", device, *TINY, *args], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def losses_by_section(output: str) -> dict[str, dict[str, list[float]]]:
    """{section title: {side: the losses of every step}} from the benchmark's report."""
    sections = {}
    for section in output.split("\n### ")[1:]:
        title = section.splitlines()[0]
        sides = re.findall(r"^losses  (.+?)\s*: ?(.*)$", section, flags=re.M)
        sections[title] = {name: [float(v) for v in values.split()] for name, values in sides}
    return sections


def assert_losses_agree(sections: dict, ours: str, rel: float, steps: int = 3) -> None:
    for title, sides in sections.items():
        reference = sides["torch eager"]
        assert len(reference) == steps and len(sides[ours]) == steps, (title, sides)
        assert sides[ours] == pytest.approx(reference, rel=rel), (title, sides)


def test_vision_step_trains_like_torch_and_times_the_convolutions(tmp_path):
    out = run_vision("--dtypes", "fp32", "--sides", "tilewise-eager,torch-eager", "--conv-repeats", "1",
                     tmp_path=tmp_path)
    sections = losses_by_section(out)
    steps = [t for t in sections if "convolutions alone" not in t]
    assert len(steps) == 2 and any("ResNet-50's design with width 8" in t for t in steps) and any(
        t.startswith("UNet") for t in steps), list(sections)
    assert_losses_agree({t: sections[t] for t in steps}, "tilewise eager", rel=1e-4)
    rows = re.findall(r"^\| (\d+->\d+ k\d s\d p\d \d+x\d+) \| (\d+) \| contiguous \| fp32 \| (.*)$", out, flags=re.M)
    assert [r[0] for r in rows] == ["3->8 k7 s2 p3 48x48", "8->8 k1 s1 p0 12x12"], out
    assert all(re.search(r"\d\.\d\dx", r[2]) and "n/a" not in r[2] for r in rows), rows
    assert re.search(r"^\| contiguous \| fp32 \| .* \| \d+\.\d\dx \|$", out, flags=re.M), out


@pytest.mark.slow
def test_vision_step_compiled_and_bf16_train_like_torch(tmp_path):
    out = run_vision("--dtypes", "fp32,bf16", "--sides", "tilewise-eager,tilewise-compiled,torch-eager",
                     "--no-convs", tmp_path=tmp_path)
    sections = losses_by_section(out)
    assert len(sections) == 4, list(sections)
    for dtype, rel in (("float32", 1e-4), ("bf16", 2e-2)):
        chosen = {t: s for t, s in sections.items() if dtype in t}
        assert len(chosen) == 2
        assert_losses_agree(chosen, "tilewise eager", rel)
        assert_losses_agree(chosen, "tilewise compiled (whole step)", rel)



@pytest.mark.cuda
def test_vision_step_on_cuda_trains_like_torch_in_every_format_and_precision(tmp_path):
    out = run_vision("--formats", "contiguous,channels_last", "--dtypes", "fp32,bf16",
                     "--sides", "tilewise-eager,tilewise-compiled,torch-eager", "--conv-shapes", "3",
                     "--conv-repeats", "3", "--batch", "4", "--image", "64", tmp_path=tmp_path, device="cuda")
    sections = losses_by_section(out)
    steps = {t: s for t, s in sections.items() if "convolutions alone" not in t}
    assert len(steps) == 8, list(sections)
    no_channels_last = "n/a (no channels_last)" in out
    for title, sides in steps.items():
        if no_channels_last and "channels_last" in title:
            continue
        # torch's float32 convolutions run in TF32 on CUDA by default
        rel = 3e-2 if "bf16" in title else 1e-2
        assert_losses_agree({title: sides}, "tilewise eager", rel)
        assert_losses_agree({title: sides}, "tilewise compiled (whole step)", rel)
    rows = re.findall(r"^\| \d+->\d+ k\d s\d p\d \d+x\d+ \| \d+ \| (\w+) \| (\w+) \| (.*)$", out, flags=re.M)
    assert len(rows) == 12, out
    for fmt, _, cells in rows:
        if not (no_channels_last and fmt == "channels_last"):
            assert "n/a" not in cells, cells


def test_eager_steps_time_each_phase_beside_torch_eager(tmp_path):
    """``benchmarks/eager_steps.py`` at tiny sizes on the CPU: every side of every model times its four phases, and
    tilewise's eager losses, with and without the compiled backward, are torch eager's to bf16 autocast's
    tolerance."""
    env = dict(os.environ, TILEWISE_CACHE_DIR=os.environ.get("TILEWISE_CACHE_DIR", str(tmp_path / "cache")),
               PYTHONPATH=python_path(), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "eager_steps.py"), "--tiny", "--device", "cpu",
                           "--models", "gpt2,resnet50", "--steps", "4", "--warmup", "2"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    sections = done.stdout.split("\n### ")[1:]
    assert len(sections) == 2, done.stdout
    for section in sections:
        rows = re.findall(r"^\| (torch-eager|tilewise-eager|tilewise-eager-cb) \| ([0-9.]+) \| [0-9.]+x \| "
                          r"([0-9.]+) / ([0-9.]+) / ([0-9.]+) / ([0-9.]+) \| .* \| ([0-9.e+-]+|—) \| .*\|$",
                          section, flags=re.M)
        assert [r[0] for r in rows] == ["torch-eager", "tilewise-eager", "tilewise-eager-cb"], section
        if section.startswith("gpt2"):
            assert all(float(r[6]) < 2e-2 for r in rows[1:]), section
