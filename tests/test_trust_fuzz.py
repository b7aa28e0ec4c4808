"""The trust fuzzer: random programs (tests/fuzz_programs.py) with random changes to the Python state they read
between calls and random NaN/inf inputs; tilewise compiled == tilewise eager == torch eager at every call.

CI runs a fixed set of programs in about a minute; ``TILEWISE_FUZZ_PROGRAMS=N`` (and ``TILEWISE_FUZZ_START``)
runs N programs for a longer search, reporting every mismatch at the end.
"""

from __future__ import annotations

import os
import traceback

import numpy as np
import pytest
import torch
from fuzz_programs import CHANGES, World, inputs, program

import tilewise as tw

CALLS = 4
QUICK = 24


def _np(value):
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _same(a, b, what: str) -> None:
    a, b = _np(a), _np(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} vs {b.shape}"
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=2e-4, atol=2e-5, equal_nan=True,
                               err_msg=what)


def run_program(seed: int) -> None:
    """Run program ``seed`` in the three ways; raise AssertionError at the first difference."""
    source = program(np.random.default_rng(seed))
    worlds = {"compiled": World(tw, seed), "eager": World(tw, seed), "torch": World(torch, seed)}
    functions = {}
    for name, world in worlds.items():
        exec(compile(source, f"<fuzz program {seed}>", "exec"), world.namespace)  # noqa: S102
        functions[name] = world.namespace["f"]
    functions["compiled"] = tw.compile(functions["compiled"])
    changes = np.random.default_rng(seed + 1)
    for call in range(CALLS):
        results = {name: fn(*inputs(worlds[name].lib, np.random.default_rng([seed, call])))
                   for name, fn in functions.items()}
        for k, (c, e, t) in enumerate(zip(results["compiled"], results["eager"], results["torch"])):
            _same(e, t, f"program {seed}, call {call}, output {k}: eager vs torch\n{source}")
            _same(c, t, f"program {seed}, call {call}, output {k}: compiled vs torch\n{source}")
        logs = [worlds[name].namespace["LOG"] for name in worlds]
        assert len(logs[0]) == len(logs[1]) == len(logs[2]), f"program {seed}: side effects ran {len(logs[0])}, " \
            f"{len(logs[1])} and {len(logs[2])} times\n{source}"
        for k, (c, t) in enumerate(zip(logs[0], logs[2])):
            _same(c, t, f"program {seed}, call {call}, LOG[{k}]\n{source}")
        kind = CHANGES[int(changes.integers(len(CHANGES)))]
        state = int(changes.integers(2**31))
        for world in worlds.values():
            world.change(kind, np.random.default_rng(state))


@pytest.mark.parametrize("seed", range(QUICK))
def test_random_programs_with_state_changes(seed):
    run_program(seed)


def test_a_long_search():
    count = int(os.environ.get("TILEWISE_FUZZ_PROGRAMS", "0"))
    if not count:
        pytest.skip("set TILEWISE_FUZZ_PROGRAMS=N to run N more programs")
    start = int(os.environ.get("TILEWISE_FUZZ_START", str(QUICK)))
    failures = []
    for seed in range(start, start + count):
        try:
            run_program(seed)
        except Exception as exc:  # noqa: BLE001 — every failure is reported at the end
            failures.append(f"program {seed}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
    assert not failures, f"{len(failures)} of {count} programs failed:\n\n" + "\n\n".join(failures[:20])


if __name__ == "__main__":  # python tests/test_trust_fuzz.py START COUNT [SECONDS]: one line per program
    import sys
    import time

    first, count = int(sys.argv[1]), int(sys.argv[2])
    deadline = time.monotonic() + (float(sys.argv[3]) if len(sys.argv) > 3 else float("inf"))
    for seed in range(first, first + count):
        if time.monotonic() > deadline:
            break
        try:
            run_program(seed)
            print(f"program {seed} ok", flush=True)
        except Exception as exc:  # noqa: BLE001 — reported, and the search goes on
            text = f"{type(exc).__name__}: {exc}".replace("\n", "\n    ")
            print(f"program {seed} FAILED {text}", flush=True)
