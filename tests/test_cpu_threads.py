"""CPU thread counts: torch's defaults and errors, and GEMMs that never oversubscribe the cores (see [Note: CPU
threads])."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from childenv import python_path

import tilewise as tw
from tilewise.backends.cpu import threads
from tilewise.backends.cpu.threads import GEMM_PARALLEL_MIN_FLOPS, blas_thread_counts

REPORT = ("import torch, tilewise as tw\n"
          "print(tw.get_num_threads(), torch.get_num_threads(), tw.get_num_interop_threads(), "
          "torch.get_num_interop_threads())\n")


def counts_in_child(**env) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, check=True,
                         env={**clean, **env, "PYTHONPATH": python_path()}).stdout.split()
    return [int(n) for n in out]


@pytest.mark.parametrize("omp", [None, "1", "1,2", "64"])
def test_default_counts_are_torchs(omp):
    ours, theirs, ours_interop, theirs_interop = counts_in_child(**({"OMP_NUM_THREADS": omp} if omp else {}))
    assert (ours, ours_interop) == (theirs, theirs_interop)


@pytest.fixture
def restore_threads():
    before = tw.get_num_threads()
    yield
    tw.set_num_threads(before)


@pytest.mark.parametrize("bad", [0, -3, 1.5, "2", None])
def test_bad_counts_raise_torchs_error(bad, restore_threads):
    with pytest.raises(Exception) as theirs:
        torch.set_num_threads(bad)
    with pytest.raises(type(theirs.value)) as ours:
        tw.set_num_threads(bad)
    assert str(ours.value) == str(theirs.value)


def test_set_num_threads_is_what_get_returns(restore_threads):
    for n in (1, 3, 2):
        tw.set_num_threads(n)
        assert tw.get_num_threads() == n


def test_small_gemm_runs_on_one_blas_thread_and_a_large_one_on_all(restore_threads):
    if not blas_thread_counts():
        pytest.skip("numpy's BLAS is not one threadpoolctl can see")
    tw.set_num_threads(2)
    small = tw.randn(64, 64)
    (small @ small).sum()
    assert blas_thread_counts() == [1] * len(blas_thread_counts())
    side = int(round((GEMM_PARALLEL_MIN_FLOPS / 2) ** (1 / 3))) + 1
    large = tw.ones(side, side)
    np.testing.assert_allclose((large @ large).numpy(), np.full((side, side), side, np.float32))
    assert set(blas_thread_counts()) == {2}


def test_compiled_program_with_a_gemm_leaves_blas_on_one_thread(restore_threads):
    """BLAS workers spinning after a GEMM would fight the program's OpenMP team for the cores: a compiled program's
    small GEMMs run on one BLAS thread, whatever the count was before."""
    if not blas_thread_counts():
        pytest.skip("numpy's BLAS is not one threadpoolctl can see")
    tw.set_num_threads(2)
    assert set(blas_thread_counts()) == {2}
    x, w = tw.randn(48, 32), tw.randn(32, 16)
    f = tw.compile(lambda x, w: ((x @ w).relu() * 2).sum(-1))
    np.testing.assert_allclose(f(x, w).numpy(), ((x @ w).relu() * 2).sum(-1).numpy(), rtol=1e-5)
    threads.use_blas_threads(2)  # as after a large eager GEMM
    f(x, w)
    assert blas_thread_counts() == [1] * len(blas_thread_counts())
