"""Grad mode, autocast, tracing and saved-tensor hooks are per thread, as in torch; compiled functions may be
called from several threads at once."""

from __future__ import annotations

import threading

import numpy as np
import torch

import tilewise as tw


def _train(seed: int, steps: int = 6) -> list[float]:
    rng = np.random.default_rng(seed)
    model = tw.nn.Sequential(tw.nn.Linear(5, 8), tw.nn.Tanh(), tw.nn.Linear(8, 3))
    with tw.no_grad():
        for p in model.parameters():
            p.copy_(tw.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.3))
    opt = tw.optim.Adam(model.parameters(), lr=0.01)
    x = tw.tensor(rng.standard_normal((16, 5)).astype(np.float32))
    y = tw.tensor(rng.integers(0, 3, 16))
    losses = []
    for _ in range(steps):
        loss = tw.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        with tw.no_grad():  # an evaluation inside the loop, as training scripts do
            model(x).argmax(1)
    return losses


def _in_threads(target, n: int) -> list:
    results, errors = [None] * n, []

    def run(k):
        try:
            results[k] = target(k)
        except BaseException as exc:  # noqa: BLE001 — reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_threads_training_their_own_models_match_one_thread():
    expected = [_train(k) for k in range(4)]
    for _ in range(5):
        assert _in_threads(_train, 4) == expected


def test_no_grad_in_one_thread_leaves_the_others_recording():
    entered, checked = threading.Event(), threading.Event()

    def evaluating(_):
        with tw.no_grad():
            entered.set()
            checked.wait(10)
        return tw.is_grad_enabled()

    def training(_):
        entered.wait(10)
        x = tw.ones(2, requires_grad=True)
        y = (x * 2).sum()
        checked.set()
        return tw.is_grad_enabled(), y.requires_grad

    evaluator = threading.Thread(target=evaluating, args=(0,))
    evaluator.start()
    assert _in_threads(training, 1) == [(True, True)]
    evaluator.join()
    assert tw.is_grad_enabled()


def test_autocast_in_one_thread_does_not_cast_another_threads_matmul():
    entered, done = threading.Event(), threading.Event()
    dtypes = {}

    def casting():
        with tw.autocast("cpu", dtype=tw.bfloat16):
            entered.set()
            dtypes["inside"] = (tw.ones(2, 2) @ tw.ones(2, 2)).dtype
            done.wait(10)

    thread = threading.Thread(target=casting)
    thread.start()
    entered.wait(10)
    dtypes["other"] = (tw.ones(2, 2) @ tw.ones(2, 2)).dtype
    done.set()
    thread.join()
    assert dtypes == {"inside": tw.bfloat16, "other": tw.float32}


def test_a_trace_in_one_thread_does_not_record_another_threads_operators():
    tracing, eager_done = threading.Event(), threading.Event()

    def slow(x):
        y = x + 1
        tracing.set()
        eager_done.wait(10)  # another thread runs eager operators while this one traces
        return y * 2

    compiled = tw.compile(slow)
    results = {}

    def eager():
        tracing.wait(10)
        results["eager"] = (tw.full((3,), 5.0) * 3).tolist()
        eager_done.set()

    thread = threading.Thread(target=eager)
    thread.start()
    results["compiled"] = compiled(tw.ones(3)).tolist()
    thread.join()
    assert results == {"eager": [15.0] * 3, "compiled": [4.0] * 3}
    eager_done.set()
    assert compiled(tw.full((3,), 2.0)).tolist() == [6.0] * 3  # the program holds no other thread's work


def test_a_compiled_step_called_from_several_threads():
    model = tw.nn.Linear(6, 4)
    forward = tw.compile(lambda x: (model(x).relu() * 2).sum(1))
    inputs = [tw.tensor(np.random.default_rng(k).standard_normal((32, 6)).astype(np.float32)) for k in range(8)]
    expected = [(model(x).relu() * 2).sum(1).tolist() for x in inputs]

    def call(k):
        return [forward(inputs[j]).tolist() for j in range(8) for _ in range(3) if (j + k) % 2 == 0]

    results = _in_threads(call, 4)
    for k, got in enumerate(results):
        want = [expected[j] for j in range(8) for _ in range(3) if (j + k) % 2 == 0]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_saved_tensor_hooks_are_per_thread():
    packed = []
    entered, done = threading.Event(), threading.Event()

    def hooked():
        with tw.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t, lambda t: t):
            entered.set()
            done.wait(10)

    thread = threading.Thread(target=hooked)
    thread.start()
    entered.wait(10)
    x = tw.ones(3, requires_grad=True)
    (x * x).sum().backward()
    done.set()
    thread.join()
    assert packed == [] and x.grad.tolist() == [2.0] * 3


def test_threads_match_torch_in_the_same_situation():
    """The reference: torch keeps grad mode per thread too."""
    seen = {}

    def worker(lib, key):
        with lib.no_grad():
            seen[key] = lib.is_grad_enabled()

    for lib, key in ((tw, "tilewise"), (torch, "torch")):
        t = threading.Thread(target=worker, args=(lib, key))
        t.start()
        t.join()
    assert seen == {"tilewise": False, "torch": False}
    assert tw.is_grad_enabled() and torch.is_grad_enabled()
