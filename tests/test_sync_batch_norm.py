"""SyncBatchNorm: on ranks of a gloo process group, each holding part of a batch, the outputs, running statistics
and gradients equal torch's BatchNorm run by one process on the whole batch (the weight and bias gradients once
summed over the ranks, as DDP does); outside a group it is a batch norm; torch's errors and conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from shard_harness import run_on_ranks

import tilewise as tw

C = 3


def _batch(sizes, seed=0):
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    return (rng.standard_normal((n, C, 4, 5)).astype(np.float32) * 2 + 1,
            rng.standard_normal((n, C, 4, 5)).astype(np.float32),
            rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32))


def _reference(sizes, steps, momentum):
    """torch's BatchNorm2d on the whole batch: outputs, input gradients, parameter gradients, running stats."""
    x_all, g_all, w, b = _batch(sizes)
    bn = torch.nn.BatchNorm2d(C, momentum=momentum)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(w))
        bn.bias.copy_(torch.tensor(b))
    out = []
    for step in range(steps):
        x = torch.tensor(x_all * (step + 1), requires_grad=True)
        bn.weight.grad = bn.bias.grad = None
        y = bn(x)
        (y * torch.tensor(g_all)).sum().backward()
        out.append({"y": y.detach().numpy(), "dx": x.grad.numpy(), "dw": bn.weight.grad.numpy(),
                    "db": bn.bias.grad.numpy(), "mean": bn.running_mean.numpy().copy(),
                    "var": bn.running_var.numpy().copy()})
    return out


def _on_rank(rank, world_size, sizes, steps, momentum, device="cpu"):
    import tilewise as tw
    import tilewise.distributed as dist

    x_all, g_all, w, b = _batch(sizes)
    start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
    model = tw.nn.SyncBatchNorm.convert_sync_batchnorm(tw.nn.Sequential(tw.nn.BatchNorm2d(C, momentum=momentum)))
    model = model.to(device)
    bn = model[0]
    with tw.no_grad():
        bn.weight.copy_(tw.tensor(w))
        bn.bias.copy_(tw.tensor(b))
    out = []
    for step in range(steps):
        x = tw.tensor(x_all[start:stop] * (step + 1), device=device, requires_grad=True)
        bn.weight.grad = bn.bias.grad = None
        y = model(x)
        (y * tw.tensor(g_all[start:stop], device=device)).sum().backward()
        # a rank whose batch was empty has no gradients (None, as in torch)
        grads = tw.cat([p.grad if p.grad is not None else tw.zeros(C, device=device) for p in (bn.weight, bn.bias)])
        dist.all_reduce(grads)  # what DDP does to parameter gradients
        dx = x.grad.cpu().numpy() if x.grad is not None else np.zeros(x.shape, np.float32)  # None where empty
        out.append({"y": y.detach().cpu().numpy(), "dx": dx, "dw": grads[:C].cpu().numpy(),
                    "db": grads[C:].cpu().numpy(), "mean": bn.running_mean.cpu().numpy().copy(),
                    "var": bn.running_var.cpu().numpy().copy(), "type": type(bn).__name__})
    return out


@pytest.mark.parametrize("sizes", [(3, 5), (2, 4, 0)], ids=["uneven", "one-rank-empty"])
def test_statistics_and_gradients_span_every_rank(sizes):
    _check_against_one_process(sizes, run_on_ranks(_on_rank, len(sizes), sizes, 2, 0.3))


@pytest.mark.cuda
def test_on_two_gpus_over_nccl():
    sizes = (3, 5)
    _check_against_one_process(sizes, run_on_ranks(_on_rank, 2, sizes, 2, 0.3, "cuda",
                                                   backend="cpu:gloo,cuda:nccl"))


def _check_against_one_process(sizes, results, steps=2, momentum=0.3):
    want = _reference(sizes, steps, momentum)
    for rank, got in enumerate(results):
        start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
        for step in range(steps):
            ours, theirs = got[step], want[step]
            assert ours["type"] == "SyncBatchNorm"
            for key in ("y", "dx"):
                np.testing.assert_allclose(ours[key], theirs[key][start:stop], rtol=1e-4, atol=1e-5,
                                           err_msg=f"rank {rank} step {step} {key}")
            for key in ("dw", "db", "mean", "var"):
                np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-4, atol=1e-5,
                                           err_msg=f"rank {rank} step {step} {key}")


def _eval_on_rank(rank, world_size):
    import tilewise as tw

    bn = tw.nn.SyncBatchNorm(C)
    with tw.no_grad():
        bn.running_mean.copy_(tw.tensor([0.5, -1.0, 2.0]))
        bn.running_var.copy_(tw.tensor([2.0, 0.5, 1.0]))
    bn.eval()
    x = tw.tensor(_batch((2,))[0][:1] + rank)  # a different batch on each rank: nothing is synchronised
    return bn(x).detach().numpy(), bn.running_mean.numpy()


def test_in_eval_mode_each_rank_uses_the_running_statistics():
    results = run_on_ranks(_eval_on_rank, 2)
    for rank, (y, mean) in enumerate(results):
        bn = torch.nn.BatchNorm2d(C).eval()
        with torch.no_grad():
            bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
            bn.running_var.copy_(torch.tensor([2.0, 0.5, 1.0]))
        want = bn(torch.tensor(_batch((2,))[0][:1] + rank)).detach().numpy()
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mean, [0.5, -1.0, 2.0])


def test_without_a_process_group_it_is_a_batch_norm():
    x, g, w, b = _batch((4,))
    ours, theirs = tw.nn.SyncBatchNorm(C, momentum=None), torch.nn.SyncBatchNorm(C, momentum=None)
    for step in range(2):
        y_ours = ours(tw.tensor(x * (step + 1)))
        theirs_y = torch.nn.functional.batch_norm(torch.tensor(x * (step + 1)), theirs.running_mean,
                                                  theirs.running_var, theirs.weight, theirs.bias, True,
                                                  1.0 / (step + 1), theirs.eps)
        np.testing.assert_allclose(y_ours.detach().numpy(), theirs_y.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(), rtol=1e-5)
    assert repr(ours) == repr(theirs)


def test_conversion_shares_parameters_and_buffers_and_skips_instance_norm():
    for lib in (torch, tw):
        model = lib.nn.Sequential(lib.nn.Conv2d(3, 4, 3), lib.nn.BatchNorm2d(4, momentum=0.2).eval(),
                                  lib.nn.InstanceNorm2d(4), lib.nn.Sequential(lib.nn.BatchNorm1d(5, affine=False)))
        converted = lib.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        assert [type(m).__name__ for m in converted.modules()] == [
            "Sequential", "Conv2d", "SyncBatchNorm", "InstanceNorm2d", "Sequential", "SyncBatchNorm"]
        assert converted[1].weight is model[1].weight and converted[1].running_var is model[1].running_var
        assert not converted[1].training and converted[1].momentum == 0.2
        assert converted[3][0].weight is None
        single = lib.nn.BatchNorm3d(2)
        assert type(lib.nn.SyncBatchNorm.convert_sync_batchnorm(single)).__name__ == "SyncBatchNorm"


@pytest.mark.parametrize("shape,message", [((3,), "expected at least 2D input (got 1D input)"),
                                           ((2, 0, 3), "SyncBatchNorm number of input channels should be non-zero")])
def test_bad_input_raises_torchs_errors(shape, message):
    for lib in (torch, tw):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            lib.nn.SyncBatchNorm(3)(lib.zeros(shape))


def _cnn(lib):
    nn = lib.nn
    lib.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(C, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(4, 2))
    rng = np.random.default_rng(3)
    with lib.no_grad():
        for p in model.parameters():
            p.copy_(lib.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.5))
    return model


def _ddp_on_rank(rank, world_size, steps, compiled):
    from compiled_steps import compiled_if

    import tilewise as tw

    x_all, _, _, _ = _batch((4,) * world_size)
    labels = np.arange(len(x_all)) % 2
    model = tw.nn.parallel.DistributedDataParallel(tw.nn.SyncBatchNorm.convert_sync_batchnorm(_cnn(tw)))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    part = slice(4 * rank, 4 * rank + 4)

    @compiled_if(tw, compiled)
    def step(x, y):
        loss = tw.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach()

    losses = [step(tw.tensor(x_all[part]), tw.tensor(labels[part])).item() for _ in range(steps)]
    return losses, {name: v.detach().numpy().copy() for name, v in model.module.state_dict().items()}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_data_parallel_training_with_converted_batch_norms_equals_one_process_on_the_whole_batch(compiled):
    """Compiled, the collectives sit inside the step (the functional all_reduce that a compiled program holds on a
    GPU; on gloo the step runs as compiled segments around them)."""
    steps = 3
    results = run_on_ranks(_ddp_on_rank, 2, steps, compiled, timeout=120)
    x_all, _, _, _ = _batch((4, 4))
    labels = np.arange(len(x_all)) % 2
    model = _cnn(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(torch.tensor(x_all)), torch.tensor(labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
    for rank, (losses, state) in enumerate(results):
        assert len(losses) == steps and np.isfinite(losses).all()
        for name, want in model.state_dict().items():
            np.testing.assert_allclose(state[name], want.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"rank {rank} {name}")
