"""The example trainers under examples/ run under tilewise and, with ``tilewise`` replaced by ``torch`` in their
imports, under PyTorch; the two agree where they can be compared exactly.

Framework random streams differ, so each check starts both from one saved state: torch writes the initial
weights (a torch-format .pt file), both evaluate them on the same fixed validation data (equal losses), tilewise
trains a few steps and saves a checkpoint in torch's format, and torch evaluates that checkpoint (equal to
tilewise's own evaluation of it). A run with ``--resume`` continues from the checkpoint.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from childenv import python_path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

SMALL = {
    "train_gpt.py": ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "4",
                     "--grad-accum", "2", "--eval-interval", "100", "--eval-batches", "2"],
    "train_char_lstm.py": ["--hidden", "32", "--layers", "2", "--seq-len", "24", "--batch-size", "8",
                           "--workers", "2", "--eval-batches", "2"],
    "train_mnist_cnn.py": ["--train-size", "256", "--test-size", "128", "--batch-size", "32", "--epochs", "2"],
    "train_word_lm.py": ["--emsize", "32", "--nhid", "32", "--nlayers", "1", "--bptt", "16", "--batch-size", "8",
                         "--words", "20000", "--eval-batches", "4"],
}
WORD_LM_MODELS = ["LSTM", "Transformer"]


def as_torch(source: str) -> str:
    """The same program for PyTorch: ``tilewise`` becomes ``torch`` in the import lines, nothing else changes."""
    lines = []
    for line in source.splitlines(keepends=True):
        if re.match(r"\s*(import|from)\s+tilewise\b", line):
            line = re.sub(r"\btilewise\b", "torch", line)
        lines.append(line)
    return "".join(lines)


def run(script: Path, framework: str, args: list[str], tmp: Path) -> str:
    path = script
    if framework == "torch":
        path = tmp / f"torch_{script.name}"
        path.write_text(as_torch(script.read_text()))
    env = dict(os.environ, PYTHONPATH=python_path(EXAMPLES))
    done = subprocess.run([sys.executable, str(path), "--device", "cpu", *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp)
    assert done.returncode == 0, f"{framework} {script.name} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def val_loss(output: str) -> float:
    return float(re.findall(r"val loss ([0-9.]+)", output)[-1])


def train_losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"^step \d+ loss ([0-9.]+)", output, flags=re.M)]


def test_the_torch_form_changes_only_import_lines():
    source = "import tilewise as torch\nfrom tilewise.utils.data import DataLoader\nx = 'tilewise'\n"
    assert as_torch(source) == "import torch as torch\nfrom torch.utils.data import DataLoader\nx = 'tilewise'\n"
    for script in SMALL:
        tree = ast.parse((EXAMPLES / script).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "tilewise" not in names, f"{script} names tilewise outside its imports"


SLOW = pytest.mark.slow  # each case starts six processes; the GPT trainer stays in the default run


@pytest.mark.parametrize("script,extra", [("train_gpt.py", []),
                                          pytest.param("train_char_lstm.py", [], marks=SLOW),
                                          pytest.param("train_mnist_cnn.py", [], marks=SLOW),
                                          *[pytest.param("train_word_lm.py", ["--model", m], marks=SLOW)
                                            for m in WORD_LM_MODELS]],
                         ids=["gpt", "char_lstm", "mnist_cnn", *[f"word_lm_{m}" for m in WORD_LM_MODELS]])
def test_an_example_trains_like_torch(script, extra, tmp_path):
    path, args = EXAMPLES / script, SMALL[script] + extra
    init = tmp_path / "init.pt"
    run(path, "torch", [*args, "--save-init", str(init)], tmp_path)
    ours = val_loss(run(path, "tilewise", [*args, "--init-from", str(init), "--eval-only"], tmp_path))
    theirs = val_loss(run(path, "torch", [*args, "--init-from", str(init), "--eval-only"], tmp_path))
    assert ours == pytest.approx(theirs, rel=1e-4), "the same weights evaluate differently"

    out = tmp_path / "run"
    trained = run(path, "tilewise", [*args, "--init-from", str(init), "--steps", "4", "--out", str(out)], tmp_path)
    losses = train_losses(trained)
    assert len(losses) >= 2 and all(v == v for v in losses), trained
    ours_after = val_loss(trained)
    assert ours_after < ours, f"training did not lower the validation loss: {ours} -> {ours_after}"
    checked = val_loss(run(path, "torch", [*args, "--out", str(out), "--resume", "--eval-only"], tmp_path))
    assert checked == pytest.approx(ours_after, rel=1e-4), "torch reads tilewise's checkpoint differently"
    resumed = run(path, "tilewise", [*args, "--out", str(out), "--resume", "--steps", "5"], tmp_path)
    assert len(train_losses(resumed)) >= 1, resumed


@pytest.mark.skipif(importlib.util.find_spec("tilewise.distributed.run") is None,
                    reason="needs the launcher, python -m tilewise.distributed.run")
def test_gpt_on_two_processes_takes_the_single_process_steps(tmp_path):
    """Launched on two CPU processes (gloo), the GPT trainer deals each step's micro-batches out to the ranks,
    accumulates two of them per rank (the first without synchronising) and averages the gradients: its losses and
    its final validation loss are those of one process."""
    path = EXAMPLES / "train_gpt.py"
    args = [*SMALL["train_gpt.py"], "--device", "cpu", "--steps", "3", "--grad-accum", "4"]  # 2 micro-steps a rank
    init = tmp_path / "init.pt"
    run(path, "tilewise", [*args, "--save-init", str(init)], tmp_path)
    single = run(path, "tilewise", [*args, "--init-from", str(init), "--out", str(tmp_path / "one")], tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(EXAMPLES), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "tilewise.distributed.run", "--nproc-per-node", "2", str(path),
                           *args, "--init-from", str(init), "--out", str(tmp_path / "two")],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, f"the two-process run failed:\n{done.stdout}\n{done.stderr}"
    assert len(train_losses(done.stdout)) == 3, done.stdout  # rank 0 alone reports
    assert train_losses(done.stdout) == pytest.approx(train_losses(single), rel=1e-5)
    assert val_loss(done.stdout) == pytest.approx(val_loss(single), rel=1e-5)


@pytest.mark.parametrize("script", ["hessian_vector_product.py", "physics_jacobian.py"])
def test_function_transform_examples_check_themselves_against_torch(script, tmp_path):
    """Each checks its derivatives against closed forms, the other AD mode and torch.func, and exits non-zero on a
    mismatch; both run in seconds."""
    output = run(EXAMPLES / script, "tilewise", [], tmp_path)
    assert "torch.func" in output

