"""The roofline: measured device figures cached on disk, and each kernel's bytes and FLOPs from its kernel IR."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from childenv import python_path
from torch.utils.flop_counter import FlopCounterMode

import tilewise as tw
from tilewise.profiler import roofline as rl

ROOT = Path(__file__).resolve().parents[1]
SMALL = 1 << 20  # bytes per measurement: fast, and a cache entry of its own


def _only_kernel(fn, *args):
    compiled = tw.compile(fn)
    compiled(*args)
    (program,) = compiled.programs()
    (kernel,) = program.kernels
    return kernel


# ---------------------------------------------------------------------------- work from the kernel IR

@pytest.mark.parametrize("n", [1, 1000, 4096])
def test_add_moves_12n_bytes_and_does_n_flops(n):
    kernel = _only_kernel(lambda x, y: x + y, tw.randn(n), tw.randn(n))
    assert rl.kernel_bytes(kernel) == 12 * n
    assert rl.kernel_flops(kernel) == n
    assert rl.kernel_dtype(kernel) == "float32"


def test_add_of_float64_counts_their_bytes():
    kernel = _only_kernel(lambda x, y: x + y, tw.randn(100, dtype=tw.float64), tw.randn(100, dtype=tw.float64))
    assert (rl.kernel_bytes(kernel), rl.kernel_flops(kernel), rl.kernel_dtype(kernel)) == (2400, 100, "float64")


def test_a_sum_reads_each_element_once_and_folds_each_once():
    n = 3000
    kernel = _only_kernel(lambda x: x.sum(), tw.randn(n))
    assert rl.kernel_bytes(kernel) == 4 * n + 4
    assert rl.kernel_flops(kernel) == n


def test_a_row_sum_counts_every_row():
    kernel = _only_kernel(lambda x: (x * 2).sum(-1), tw.randn(16, 64))
    assert rl.kernel_bytes(kernel) == 4 * 16 * 64 + 4 * 16
    assert rl.kernel_flops(kernel) == 2 * 16 * 64  # one multiply and one add per element


def test_shared_subexpressions_count_once():
    e = tw.randn(10)
    kernel = _only_kernel(lambda x: (x + 1) * (x + 1), e)
    assert rl.kernel_flops(kernel) == 2 * 10


@pytest.mark.parametrize("m,k,n", [(8, 16, 4), (33, 7, 65)])
def test_a_gemm_is_2mnk_flops_as_torch_counts_it(m, k, n):
    a, b = torch.randn(m, k), torch.randn(k, n)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    explained = tw.explain(lambda x, y: x @ y, tw.tensor(a.numpy()), tw.tensor(b.numpy()), repeats=1,
                           roofline_size=SMALL)
    (gemm,) = [r for r in explained.kernels if r.kind == "library call"]
    assert gemm.name == "mm"
    assert gemm.flops == counter.get_total_flops() == 2 * m * n * k
    assert gemm.nbytes == 4 * (m * k + k * n + m * n)


# ---------------------------------------------------------------------------- the roofline itself

def test_placement_says_which_bound_applies():
    roof = rl.Roofline("cpu", "test", copy_gbs=10.0, peak_gflops={"float32": 100.0, "float64": 50.0}, size=0)
    assert roof.ridge("float32") == 10.0 and roof.ridge("float64") == 5.0
    memory = roof.place(12_000_000, 1_000_000, 2e-3, "float32")
    assert memory.bound == "memory" and memory.achieved_gbs == pytest.approx(6.0)
    assert memory.fraction == pytest.approx(1.0 / 2e-3 / 1e3 / (10.0 * 1 / 12))  # GFLOP/s over the roof at 1/12
    compute = roof.place(1_000_000, 100_000_000, 2e-3, "float32")
    assert compute.bound == "compute" and compute.achieved_gflops == pytest.approx(50.0)
    assert compute.fraction == pytest.approx(0.5)
    copy = roof.place(8_000_000, 0, 1e-3, "float32")
    assert copy.bound == "memory" and copy.fraction == pytest.approx(0.8)
    assert roof.peak("bfloat16") == ("float32", 100.0)  # a dtype not measured is placed against float32's peak
    assert "memory bound" in memory.describe() and "% of the roofline" in memory.describe()


def test_a_step_above_the_roofline_says_why():
    """The bytes counted are the fewest a step must move, so passing the memory roofline means it read from the
    cache (a small step timed repeatedly: 205% was shown bare on an H200); nothing is added below the roofline."""
    roof = rl.Roofline("cpu", "test", copy_gbs=10.0, peak_gflops={"float32": 100.0}, size=0)
    cached = roof.place(40_000_000, 0, 2e-3, "float32")  # 20 GB/s against a 10 GB/s copy
    assert cached.fraction == pytest.approx(2.0)
    assert "200.0% of the roofline (above the memory roofline: the step read operands the cache still held" \
        in cached.describe()
    fast = roof.place(1_000, 400_000_000, 2e-3, "float32")  # 200 GFLOP/s against a 100 GFLOP/s peak
    assert "(above the measured peak" in fast.describe()
    assert "above" not in roof.place(8_000_000, 0, 1e-3, "float32").describe()


def test_the_cache_is_written_once_and_read_afterwards(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    measured = rl.roofline("cpu", size=SMALL)
    assert measured.origin == "measured" and measured.copy_gbs > 0
    assert set(measured.peak_gflops) == {"float32", "float64"} and min(measured.peak_gflops.values()) > 0
    (entry,) = (tmp_path / f"roofline-v{rl.ROOFLINE_FORMAT_VERSION}").iterdir()
    assert Path(measured.path) == entry

    monkeypatch.setattr(rl, "measure_cpu", lambda *a, **k: pytest.fail("measured again instead of reading"))
    read = rl.roofline("cpu", size=SMALL)
    assert read.origin == "cache" and read.path == str(entry)
    assert (read.copy_gbs, read.peak_gflops) == (measured.copy_gbs, measured.peak_gflops)
    assert rl.cached_roofline("cpu", size=SMALL) == read
    assert rl.cached_roofline("cpu", size=2 * SMALL) is None  # another size is another measurement


def test_a_damaged_entry_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    first = rl.roofline("cpu", size=SMALL)
    Path(first.path).write_bytes(b"{not sealed")
    calls = []
    monkeypatch.setattr(rl, "measure_cpu", lambda size: calls.append(size) or (1.0, {"float32": 2.0}))
    with pytest.warns(RuntimeWarning, match="damaged entry of the roofline cache"):
        again = rl.roofline("cpu", size=SMALL)
    assert calls == [SMALL] and again.origin == "measured" and again.copy_gbs == 1.0
    assert rl.roofline("cpu", size=SMALL).origin == "cache"
    assert json.loads(rl._cache().read(Path(again.path).name))["copy_gbs"] == 1.0


def test_refresh_measures_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    rl.roofline("cpu", size=SMALL)
    monkeypatch.setattr(rl, "measure_cpu", lambda size: (3.0, {"float32": 4.0}))
    assert rl.roofline("cpu", size=SMALL, refresh=True).copy_gbs == 3.0
    assert rl.roofline("cpu", size=SMALL).copy_gbs == 3.0


def test_unknown_devices_are_refused():
    with pytest.raises(ValueError, match="no measurement for 'tpu' devices"):
        rl.roofline("tpu")


@pytest.mark.parametrize("arch,block,registers,shared,expected", [
    ("sm_90", 256, 32, 0, (1.0, "threads")),
    ("sm_90", 256, 128, 0, (0.25, "registers")),  # 128 regs * 256 threads = half the file per block: 2 blocks
    ("sm_90", 1024, 64, 0, (0.5, "registers")),
    ("sm_90", 128, 32, 100_000, (0.125, "shared memory")),  # two blocks of 100 KB (+1 KB reserved) in 228 KB
    ("sm_86", 256, 32, 0, (1.0, "threads")),
    ("sm_100a", 32, 16, 0, (0.5, "blocks")),  # at most 32 blocks of one warp: 32 of 64 warps
])
def test_theoretical_occupancy_as_the_occupancy_calculator_gives_it(arch, block, registers, shared, expected):
    assert rl.theoretical_occupancy(arch, block, registers, shared) == expected


# ---------------------------------------------------------------------------- tilewise info

def test_info_shows_the_measured_roofline_and_measures_only_once(tmp_path):
    env = {**os.environ, "TILEWISE_CACHE_DIR": str(tmp_path), "PYTHONPATH": python_path()}
    runs = [subprocess.run([sys.executable, "-m", "tilewise", "info"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "cpu: " in run.stdout and " GB/s" in run.stdout and "peak GFLOP/s float32 " in run.stdout
        assert "GiB memory" in run.stdout
    assert "measuring the roofline of cpu (first use" in runs[0].stdout
    assert "measuring" not in runs[1].stdout
    assert len(list((tmp_path / f"roofline-v{rl.ROOFLINE_FORMAT_VERSION}").iterdir())) == 1


@pytest.mark.cuda
def test_cuda_roofline_is_measured_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEWISE_CACHE_DIR", str(tmp_path))
    roof = rl.roofline("cuda:0", size=64 << 20)
    assert roof.origin == "measured" and roof.copy_gbs > 50
    assert set(roof.peak_gflops) == set(rl.GEMM_DTYPES_CUDA) and min(roof.peak_gflops.values()) > 1000
    assert rl.roofline("cuda:0", size=64 << 20).origin == "cache"
