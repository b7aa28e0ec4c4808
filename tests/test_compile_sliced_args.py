"""A compiled function called on slices of a tensor loaded whole (``x[i:i + batch]``) shares its variants across
the slices instead of compiling one per storage offset, and the cases where a slice cannot be handed over as a
window of its memory (written, returned, or aliasing a tensor the function holds) run as eagerly they would."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from compiled_steps import classifier_step

import tilewise as tw


def _loop(compiled: bool, batches: int = 20):
    tw.manual_seed(0)
    features = tw.randn(batches * 50, 20)
    labels = tw.randint(0, 3, (batches * 50,))
    tw.manual_seed(1)
    model = tw.nn.Sequential(tw.nn.Linear(20, 32), tw.nn.ReLU(), tw.nn.Linear(32, 3))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = classifier_step(model, opt, tw.nn.functional.cross_entropy)
    f = tw.compile(step) if compiled else step
    losses = [float(f(features[i:i + 50], labels[i:i + 50])) for _ in range(2) for i in range(0, batches * 50, 50)]
    return losses, f


def test_a_loop_over_slices_of_a_loaded_dataset_compiles_once_and_trains_as_eager():
    eager, _ = _loop(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the recompile limit's warning would fail the test
        compiled, f = _loop(True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-5, atol=1e-6)
    assert len(f.variants) == 2  # the first step (no gradients to zero yet) and the steady step, for every offset


def test_slices_at_offsets_of_every_alignment_give_the_values_of_eager():
    data = tw.arange(200, dtype=tw.float32)
    f = tw.compile(lambda x: (x * 2 + 1).sum(0))
    for start in range(0, 40, 3):  # offsets in every 16-byte class
        piece = data[start:start + 64].view(8, 8)
        np.testing.assert_array_equal(f(piece).numpy(), (piece * 2 + 1).sum(0).numpy())
    assert len(f.variants) <= 4  # one per offset within a 16-byte boundary, at most


def test_a_slice_written_in_place_updates_the_tensor_it_was_cut_from_and_bumps_its_version():
    data = tw.zeros(10)
    f = tw.compile(lambda x: x.add_(1).sum())
    for start in (0, 4, 2):
        before = data._version
        assert float(f(data[start:start + 3])) == pytest.approx(float(data[start:start + 3].sum()))
        assert data._version > before
    np.testing.assert_array_equal(data.numpy(), [1, 1, 2, 1, 2, 1, 1, 0, 0, 0])


def test_a_slice_the_function_returns_is_the_callers_own_tensor():
    data = tw.arange(12, dtype=tw.float32)
    f = tw.compile(lambda x, y: (x, y * 2))
    for start in (1, 5):
        piece = data[start:start + 4]
        out, doubled = f(piece, data[:4])
        assert out is piece
        np.testing.assert_array_equal(doubled.numpy(), [0, 2, 4, 6])


def test_a_slice_of_a_tensor_the_function_holds_and_writes_reads_it_as_eager_does():
    def make():
        held = tw.arange(12, dtype=tw.float32)

        def f(x):
            held.mul_(2)  # x lies in held's memory: it sees the doubled values, as eagerly
            return x + 1
        return held, f

    held, f = make()
    held_eager, f_eager = make()
    compiled = tw.compile(f)
    for start in (2, 6, 3):
        got = compiled(held[start:start + 3])
        want = f_eager(held_eager[start:start + 3])
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(held.numpy(), held_eager.numpy())


def test_two_slices_of_one_tensor_are_passed_as_they_are():
    data = tw.arange(20, dtype=tw.float32)
    f = tw.compile(lambda a, b: a * b)
    for start in (0, 3, 7):
        a, b = data[start:start + 5], data[start + 5:start + 10]
        np.testing.assert_array_equal(f(a, b).numpy(), (a * b).numpy())


def test_a_slice_that_needs_a_gradient_keeps_its_history():
    w = tw.randn(10, 3, requires_grad=True)
    f = tw.compile(lambda x: (x * x).sum())
    for start in (0, 4):
        f(w[start:start + 3]).backward()
    expected = np.zeros((10, 3), np.float32)
    wn = w.detach().numpy()
    for start in (0, 4):
        expected[start:start + 3] += 2 * wn[start:start + 3]
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)


@pytest.mark.cuda
def test_on_the_gpu_slices_of_a_tensor_share_a_variant_and_its_graph():
    if not tw.cuda.is_available():
        pytest.skip("needs a GPU")
    data = tw.arange(1 << 16, dtype=tw.float32, device="cuda")
    f = tw.compile(lambda x: (x * 2 + 1).sum(0))
    for start in range(0, 1 << 15, 1 << 11):
        piece = data[start:start + (1 << 14)].view(128, 128)
        np.testing.assert_array_equal(f(piece).cpu().numpy(), (piece * 2 + 1).sum(0).cpu().numpy())
    assert len(f.variants) == 1


def test_an_argument_viewing_another_dtypes_storage_is_read_and_written_within_its_memory():
    """A compiled function given real views of complex tensors (``view_as_real``: an optimizer's parameters and
    moments) or a ``view(dtype)`` of a float tensor: the argument's memory is counted in its own elements. Counted in
    the storage's, a program writing two such views overran the heap (``double free or corruption``, a compiled
    multi-tensor Adam over complex parameters)."""

    def update(ps, gs, ms, bits):
        for p, g, m in zip(ps, gs, ms):
            m.mul_(0.9).add_(g)
            p.add_(m, alpha=-0.1)
        return bits ^ 0x55

    def make():
        tw.manual_seed(0)
        complexes = [tw.complex(tw.randn(n, 3), tw.randn(n, 3)) for n in (64, 5, 200)]
        grads = [tw.randn(n, 3, 2) for n in (64, 5, 200)]
        moments = [tw.zeros_like(c) for c in complexes]
        return complexes, grads, moments, tw.randn(33).view(tw.int32)

    eager, compiled = make(), make()
    f = tw.compile(update)
    for _ in range(4):
        want = update([tw.view_as_real(c) for c in eager[0]], eager[1], [tw.view_as_real(m) for m in eager[2]],
                      eager[3])
        got = f([tw.view_as_real(c) for c in compiled[0]], compiled[1], [tw.view_as_real(m) for m in compiled[2]],
                compiled[3])
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert f.variants, "compiled, not run eagerly"
    for a, b in zip(compiled[0] + compiled[2], eager[0] + eager[2]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
