"""The main job, run as the README runs it: ``python -m tilewise demo`` in a subprocess."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tilewise as tw
from tilewise.models import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]


def _tilewise(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilewise", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_demo_trains_reports_samples_and_plots(tmp_path):
    out = tmp_path / "demo"
    run = _tilewise("demo", "--steps", "24", "--model-size", "tiny", "--seed", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    text = run.stdout
    baseline = float(re.search(r"unigram baseline on validation text: ([\d.]+) nats/char", text).group(1))
    first, last = map(float, re.search(r"train loss: first step ([\d.]+) → last step ([\d.]+)", text).groups())
    val = [float(v) for v in re.findall(r"validation loss ([\d.]+)\n", text)]
    assert 2.5 < baseline < 3.5
    assert last < first and len(val) >= 2 and val[-1] < val[0]
    assert "tokens/s" in text and re.search(r"vs unigram baseline [\d.]+", text)
    sample = text.split("sample (temperature 0.8):\n", 1)[1].split("\nloss curve:", 1)[0]
    assert len(sample.replace("\n", "")) >= 250
    png = Path(re.search(r"loss curve: (.+\.png)", text).group(1))
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoint = tw.load(out / "char_gpt.safetensors")
    assert checkpoint["config"]["n_layer"] == 1 and len(checkpoint["chars"]) == checkpoint["config"]["vocab_size"]
    model = GPT(GPTConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    assert model.head.weight is model.tok_emb.weight


def test_demo_stops_at_its_time_limit_and_says_so(tmp_path):
    run = _tilewise("demo", "--steps", "100000", "--model-size", "tiny", "--time-limit", "2", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert re.search(r"stopped after \d+ of 100000 steps: the time limit of 2 s was reached", run.stdout)
    assert (tmp_path / "loss_curve.png").exists()


def test_help_lists_the_commands():
    run = _tilewise("--help")
    assert run.returncode == 0
    for command in ("demo", "info", "explain", "bench"):
        assert command in run.stdout


def test_info_and_bench():
    info = _tilewise("info")
    assert info.returncode == 0 and "operators declared" in info.stdout and "best device" in info.stdout
    bench = _tilewise("bench")
    assert bench.returncode == 2 and "benchmarks/" in bench.stderr and bench.stdout == ""


def test_explain_follows_a_call_through_every_layer():
    run = _tilewise("explain", "x.softmax(-1) + y", "--shape", "8x32", "--shape", "32")
    assert run.returncode == 0, run.stderr
    titles = re.findall(r"^== (.+?) =+$", run.stdout, flags=re.M)
    assert titles[:5] == ["the call", "operators", "eager", "graph passes", "fusion"]
    assert any(t.endswith(": IR") for t in titles) and any(t.endswith(": schedule") for t in titles)
    assert "generated C" in titles and titles[-1] == "run"
    assert "softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor" in run.stdout
    assert "after decompose: graph" in run.stdout and "largest difference from eager" in run.stdout


def test_explain_shows_cuda_source_ptx_and_sass_without_a_gpu():
    pytest.importorskip("cuda.bindings.nvrtc")
    import tilewise as tw

    sections = dict(tw.explain(lambda x: x.relu() * 0.5 + 1, tw.randn(64, 64), target="cuda"))
    (ptx,) = [text for title, text in sections.items() if "PTX" in title]
    assert ".entry k0_relu_mul_add" in ptx and "ld.global" in ptx
    assert "extern \"C\" __global__" in sections["generated CUDA C"]
    (sass,) = [text for title, text in sections.items() if "SASS" in title]
    assert "registers/thread" in sass or "nvdisasm not found" in sass


def test_readme_opens_with_the_two_commands_and_its_example_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith('```bash\npip install -e ".[demo]" && python -m tilewise demo\n'
                             'pip install -e ".[test]" && python -m pytest\n```\n')
    test_command = readme.splitlines()[2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines(), "CI must run the README's test command verbatim"
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    assert example == (ROOT / "examples" / "quickstart.py").read_text().split('"""\n\n', 1)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    assert (tmp_path / "quickstart.safetensors").exists()
