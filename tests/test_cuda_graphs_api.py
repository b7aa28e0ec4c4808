"""tilewise.cuda.CUDAGraph / graph / graph_pool_handle (torch.cuda.graphs): on a fake driver without a GPU — the
capture's driver calls, its memory in the graph's pool, pools shared between graphs, the errors — and on a GPU
(marked ``cuda``) torch's recipe of capturing a whole eager training step and replaying it."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_runtime import FakeCaptureDriver, install_fake_graphs

import tilewise as tw


class FakeGraphDriver(FakeCaptureDriver):
    def cuGraphLaunch(self, executable, stream):
        return self._ok(f"launch on {stream:#x}")


@pytest.fixture
def fake_gpu(monkeypatch):
    """The capture machinery over a fake driver and a fake-backed allocator; a side stream that needs no GPU."""
    from tilewise.backends.cuda.runtime.stream import Stream

    driver = FakeGraphDriver()
    allocator = install_fake_graphs(monkeypatch, driver)
    import importlib

    api = importlib.import_module("tilewise.cuda.graphs")
    monkeypatch.setattr(api, "_synchronize", lambda: None)
    monkeypatch.setattr(api, "_empty_cache", lambda: None)
    return driver, allocator, Stream.from_handle(0x5EED, 0)


def test_a_block_is_captured_on_the_side_stream_with_its_memory_in_the_graphs_pool(fake_gpu):
    driver, allocator, side = fake_gpu
    g = tw.cuda.CUDAGraph()
    with tw.cuda.graph(g, stream=side):
        assert tw.cuda.is_current_stream_capturing()
        ptr = allocator.malloc(4096, side.handle)  # what an operator inside the block allocates
    assert not tw.cuda.is_current_stream_capturing()
    (segment,) = allocator.segments()
    assert segment.pool_id == g.pool()[1] != 0 and segment.ptr <= ptr < segment.ptr + segment.size
    assert driver.calls == ["begin", "end", "instantiate"]
    g.replay()
    assert driver.calls[-1] == "launch on 0x0"  # the current stream after the block: the default one
    g.reset()
    assert driver.calls[-2:] == ["destroy exec", "destroy graph"]
    with pytest.raises(RuntimeError, match="Called CUDAGraph::replay without a preceding successful capture"):
        g.replay()


def test_graphs_sharing_a_pool_keep_it_until_the_last_is_reset(fake_gpu):
    _, allocator, side = fake_gpu
    first, second = tw.cuda.CUDAGraph(), tw.cuda.CUDAGraph()
    with tw.cuda.graph(first, stream=side):
        pass
    shared = first.pool()
    with tw.cuda.graph(second, pool=shared, stream=side):
        pass
    assert second.pool() == shared and second.pool().pool is shared.pool
    first.reset()
    assert not shared.pool.released, "the second graph still replays in it"
    second.reset()
    assert shared.pool.released
    handle = tw.cuda.graph_pool_handle()
    third = tw.cuda.CUDAGraph()
    with tw.cuda.graph(third, pool=handle, stream=side):
        pass
    assert third.pool().pool is handle.pool


def test_an_error_inside_the_block_ends_the_capture_and_is_the_one_raised(fake_gpu):
    driver, _, side = fake_gpu
    g = tw.cuda.CUDAGraph()
    with pytest.raises(ZeroDivisionError), tw.cuda.graph(g, stream=side):
        1 / 0  # noqa: B018
    assert driver.calls == ["begin", "end", "destroy graph"] and not tw.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    with tw.cuda.graph(g, stream=side):  # the same graph object captures afterwards
        pass


def test_misuse_gets_clear_errors(fake_gpu):
    _, _, side = fake_gpu
    g = tw.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="must be captured on a non-default stream"):
        g.capture_begin()
    with pytest.raises(RuntimeError, match="capture_end\\(\\) without a capture_begin"):
        g.capture_end()
    with pytest.raises(RuntimeError, match="pool\\(\\) is known only once capture_begin"):
        g.pool()
    with tw.cuda.graph(g, stream=side):
        pass
    with pytest.raises(RuntimeError, match="already been captured: call reset"), tw.cuda.graph(g, stream=side):
        pass
    with pytest.raises(ValueError, match="capture_error_mode"):
        tw.cuda.CUDAGraph().capture_begin(capture_error_mode="loose")


@pytest.mark.cuda
def test_a_whole_eager_training_step_captured_and_replayed_trains_as_eager():
    """torch's recipe (docs: CUDA Graphs, whole-network capture): warm up on a side stream, capture forward,
    backward and optimizer step, then feed each batch by copying into the static inputs and replay."""
    tw.manual_seed(0)
    make = lambda: tw.nn.Sequential(tw.nn.Linear(16, 32), tw.nn.ReLU(), tw.nn.Linear(32, 4)).cuda()  # noqa: E731
    model, twin = make(), make()
    twin.load_state_dict(model.state_dict())
    opt, twin_opt = (tw.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin))
    rng = np.random.default_rng(0)
    batches = [(tw.tensor(rng.standard_normal((8, 16), dtype=np.float32), device="cuda"),
                tw.tensor(rng.standard_normal((8, 4), dtype=np.float32), device="cuda")) for _ in range(6)]
    static_input, static_target = batches[0][0].clone(), batches[0][1].clone()
    side = tw.cuda.Stream()
    side.wait_stream(tw.cuda.current_stream())
    with tw.cuda.stream(side):
        for data, target in batches[:3]:  # warm-up steps, eager, on the side stream
            for m, o in ((model, opt), (twin, twin_opt)):
                o.zero_grad(set_to_none=True)
                tw.nn.functional.mse_loss(m(data), target).backward()
                o.step()
    tw.cuda.current_stream().wait_stream(side)
    g = tw.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with tw.cuda.graph(g):
        static_loss = tw.nn.functional.mse_loss(model(static_input), static_target)
        static_loss.backward()
        opt.step()
    for data, target in batches[3:]:
        static_input.copy_(data)
        static_target.copy_(target)
        g.replay()
        twin_opt.zero_grad(set_to_none=True)
        loss = tw.nn.functional.mse_loss(twin(data), target)
        loss.backward()
        twin_opt.step()
        np.testing.assert_allclose(static_loss.item(), loss.item(), rtol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(a.detach().cpu().numpy(), b.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
