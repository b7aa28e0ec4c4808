"""cuDNN graphs kept on disk (see [Note: cuDNN plans on disk]): a graph built in one process is loaded by the next
instead of built, and computes the same values; an entry that cannot be loaded is built afresh."""

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F

pytestmark = pytest.mark.cuda


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """The plan cache in a directory of its own, and the graphs built so far forgotten (as in a new process)."""
    from tilewise.backends.cuda import attention, convolution, cudnn
    from tilewise.codegen.toolchain.disk import DiskCache

    monkeypatch.setattr(cudnn, "_plan_disk", [DiskCache(tmp_path, "cuDNN plan cache")])

    def forget():
        convolution.reset()
        attention._graphs.clear()

    forget()
    yield cudnn, forget, tmp_path
    forget()


def _step():
    rng = np.random.default_rng(0)
    x = tw.tensor(rng.standard_normal((4, 8, 16, 16)), dtype=tw.bfloat16, device="cuda").requires_grad_()
    w = tw.tensor(rng.standard_normal((16, 8, 3, 3)) * 0.1, dtype=tw.bfloat16, device="cuda").requires_grad_()
    q, k, v = (tw.tensor(rng.standard_normal((2, 4, 64, 64)), dtype=tw.bfloat16, device="cuda").requires_grad_()
               for _ in range(3))
    y = F.conv2d(x, w, padding=1)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (y.float().square().sum() + a.float().square().sum()).backward()
    return [t.detach().float().cpu().numpy() for t in (y, a, x.grad, w.grad, q.grad, k.grad, v.grad)]


def test_graphs_stored_by_one_process_are_loaded_by_the_next_and_compute_the_same(plans):
    cudnn, forget, _ = plans
    before = dict(cudnn._plan_stats)
    first = _step()
    stored = cudnn._plan_stats["stored"] - before["stored"]
    assert stored >= 5  # the convolution's three graphs and attention's two
    forget()
    second = _step()
    assert cudnn._plan_stats["loaded"] - before["loaded"] == stored
    assert cudnn._plan_stats["rejected"] == before["rejected"]
    for got, want in zip(second, first):
        np.testing.assert_array_equal(got, want)


def test_an_entry_that_cannot_be_loaded_is_built_afresh_and_replaced(plans):
    cudnn, forget, directory = plans
    first = _step()
    for path in directory.iterdir():  # sealed entries whose plans are not cuDNN's: they read, but do not load
        cudnn._plan_store().write(path.name, b'{"uids": [1, 2, 3]}\n' + b"not a plan")
    forget()
    before = dict(cudnn._plan_stats)
    second = _step()
    assert cudnn._plan_stats["loaded"] == before["loaded"]
    assert cudnn._plan_stats["rejected"] - before["rejected"] >= 5
    assert cudnn._plan_stats["built"] - before["built"] >= 5
    for got, want in zip(second, first):
        np.testing.assert_array_equal(got, want)


def test_plans_on_disk_can_be_turned_off(plans, monkeypatch):
    from tilewise.config import settings

    cudnn, _, directory = plans
    monkeypatch.setattr(settings, "cudnn_plans_on_disk", False)
    _step()
    assert not any(directory.iterdir())
