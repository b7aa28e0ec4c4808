"""``benchmarks/distributed.py`` runs end to end: on the CPU over gloo between 2 processes at tiny sizes (its own
ranks through tilewise's launcher and torchrun), every collective giving the values its arithmetic must give on
both sides; the GPT part trains tilewise's DDP to the losses of single-process training of the global batch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "distributed.py"


def run_benchmark(*args: str, tmp_path: Path, timeout: float = 120) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               TILEWISE_CACHE_DIR=os.environ.get("TILEWISE_CACHE_DIR", str(tmp_path / "cache")))
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--timeout", str(timeout - 10)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def table_rows(output: str, first_cell: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in output.splitlines()
            if re.match(rf"^\| {first_cell} \|", line)]


def check_collectives(out: str, sides: str) -> None:
    for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        rows = table_rows(out, name)
        assert [(r[1], r[2]) for r in rows] == [(d, s) for d in ("bfloat16", "float32") for s in ("1 KB", "64 KB")]
        for row in rows:
            assert float(row[3]) > 0, row  # tilewise's bus bandwidth
            assert row[4] == "n/a", row  # no nccl4py side without GPUs
            assert row[8] == f"ok / {'ok' if 'torch' in sides else 'n/a'}", row
            if "torch" in sides:
                assert float(row[6]) > 0, row


def test_collectives_on_the_cpu_over_gloo_give_their_arithmetic(tmp_path):
    out = run_benchmark("--cpu", "--collectives", "--sides", "tilewise", tmp_path=tmp_path)
    assert "| tilewise: error" not in out, out
    check_collectives(out, "tilewise")


@pytest.mark.slow
def test_the_whole_cpu_run_beside_torch(tmp_path):
    """Collectives on both sides; GPT with DDP trains to the losses of one process on the global batch."""
    out = run_benchmark("--cpu", "--steps", "4", "--warmup", "1", tmp_path=tmp_path, timeout=300)
    assert "error" not in out, out
    check_collectives(out, "tilewise,torch")
    rows = {r[1]: r for r in table_rows(out, "2")}
    assert set(rows) == {"tilewise DDP, compiled step", "tilewise DDP, eager", "torch DDP, eager"}, out
    for side, row in rows.items():
        assert float(row[2]) > 0, (side, row)
        difference, steps = row[6].split(" over ")
        assert float(difference) < 1e-4 and steps == "4", (side, row)


def test_sharded_training_on_the_cpu_follows_the_unsharded_losses(tmp_path):
    """--sharded: fully_shard over 2 gloo ranks trains to the losses of one unsharded process on the global
    batch (the memory columns read 0 on the CPU, where the allocator keeps no peak)."""
    out = run_benchmark("--cpu", "--sharded", "--sides", "tilewise", tmp_path=tmp_path)
    rows = {r[1]: r for r in table_rows(out, "2")}
    assert set(rows) == {"tilewise", "torch"}, out
    assert "not run (--sides)" in rows["torch"][8], out
    difference, steps = rows["tilewise"][7].split(" over ")
    assert float(difference) < 1e-4 and steps == "3", out
    assert float(rows["tilewise"][6]) > 0, out
