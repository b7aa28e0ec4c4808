"""ZeroRedundancyOptimizer on two gloo ranks against the unsharded optimizer (and torch's partition)."""

import copy

import numpy as np
import pytest
from shard_harness import run_on_ranks

import tilewise as tw
from tilewise.distributed.optim import ZeroRedundancyOptimizer
from tilewise.distributed.optim.zero_redundancy_optimizer import partition_by_size

OPTIMIZERS = {
    "adamw": (tw.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "sgd_momentum": (tw.optim.SGD, dict(lr=1e-2, momentum=0.9)),
}


def _model(device="cpu") -> tw.nn.Module:
    tw.manual_seed(0)
    return tw.nn.Sequential(tw.nn.Linear(6, 16), tw.nn.Tanh(), tw.nn.Linear(16, 8), tw.nn.LayerNorm(8),
                            tw.nn.Linear(8, 3)).to(device)


def _train(model, opt, steps: int) -> None:
    for step in range(steps):
        tw.manual_seed(100 + step)  # the same batch on every rank: the gradients agree without DDP
        x = tw.randn(5, 6).to(next(model.parameters()).device)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def _numpy_state(state: dict) -> dict:
    return {k: {name: v.cpu().numpy() if isinstance(v, tw.Tensor) else v for name, v in s.items()}
            for k, s in state.items()}


def _every_configuration(rank, world_size, steps):
    """One spawn for all configurations (starting ranks costs more than running them)."""
    return {(name, bucket_view): _sharded_against_plain(rank, name, steps, bucket_view)
            for name in OPTIMIZERS for bucket_view in (False, True)}


def _sharded_against_plain(rank, name, steps, bucket_view, device="cpu"):
    cls, kwargs = OPTIMIZERS[name]
    model = _model(device)
    reference = copy.deepcopy(model)
    opt = ZeroRedundancyOptimizer(model.parameters(), cls, parameters_as_bucket_view=bucket_view, **kwargs)
    plain = cls(reference.parameters(), **kwargs)
    _train(model, opt, steps)
    _train(reference, plain, steps)
    index = {id(p): k for k, p in enumerate(model.parameters())}
    owned = sorted(index[id(p)] for p in opt.optim.state)
    opt.consolidate_state_dict(to=0)
    consolidated = _numpy_state(opt.state_dict()["state"]) if rank == 0 else None
    return dict(params=[p.detach().cpu().numpy() for p in model.parameters()],
                reference=[p.detach().cpu().numpy() for p in reference.parameters()],
                owned=owned, consolidated=consolidated, plain_state=_numpy_state(plain.state_dict()["state"]),
                groups=opt.state_dict()["param_groups"] if rank == 0 else None,
                plain_groups=plain.state_dict()["param_groups"])


@pytest.fixture(scope="module")
def two_rank_runs():
    return run_on_ranks(_every_configuration, 2, 3)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("bucket_view", [False, True])
def test_steps_equal_the_unsharded_optimizer(two_rank_runs, name, bucket_view):
    _check_against_plain([runs[name, bucket_view] for runs in two_rank_runs])


def _on_gpu(rank, world_size):
    return _sharded_against_plain(rank, "adamw", 3, False, "cuda")


@pytest.mark.cuda
def test_steps_on_two_gpus_over_nccl_equal_the_unsharded_optimizer():
    _check_against_plain(run_on_ranks(_on_gpu, 2, backend="cpu:gloo,cuda:nccl"))


def _check_against_plain(results):
    for result in results:
        for got, want in zip(result["params"], result["reference"]):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    owned = [set(r["owned"]) for r in results]
    assert owned[0] and owned[1] and not owned[0] & owned[1], "each rank keeps state for its own shard only"
    assert owned[0] | owned[1] == set(range(len(results[0]["params"])))
    consolidated, plain = results[0]["consolidated"], results[0]["plain_state"]
    assert sorted(consolidated) == sorted(plain)
    for k in plain:
        assert sorted(consolidated[k]) == sorted(plain[k])
        for key in plain[k]:
            np.testing.assert_allclose(consolidated[k][key], plain[k][key], rtol=1e-6, atol=1e-7)
    assert [g["params"] for g in results[0]["groups"]] == [g["params"] for g in results[0]["plain_groups"]]


def _torch_partition(sizes_per_group: list[list[int]], world_size: int) -> list[list[list[int]]]:
    """torch's own partition (its method, run on a stand-in object: no process group needed), as numels."""
    import torch  # here, not at the top: the spawned ranks import this module and need no torch
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZeRO

    zero = object.__new__(TorchZeRO)
    zero._partition_parameters_cache = []
    zero.world_size = world_size
    zero.param_groups = [{"params": [torch.empty(n) for n in sizes]} for sizes in sizes_per_group]
    parts = TorchZeRO._partition_parameters(zero)
    order = {id(p): (g, k) for g, group in enumerate(zero.param_groups) for k, p in enumerate(group["params"])}
    return [[[order[id(p)] for p in group["params"]] for group in groups] for groups in parts]


@pytest.mark.parametrize("sizes_per_group,world_size", [
    ([[10, 3, 7, 7, 1, 12]], 2), ([[5, 5, 5, 5, 5]], 3), ([[4, 9, 2], [8, 1, 1, 6]], 2), ([[1]], 4)])
def test_partition_is_torchs(sizes_per_group, world_size):
    params = [[tw.empty(n) for n in sizes] for sizes in sizes_per_group]
    order = {id(p): (g, k) for g, group in enumerate(params) for k, p in enumerate(group)}
    totals = [0] * world_size
    ours = [[] for _ in range(world_size)]
    for group in params:
        for rank, share in enumerate(partition_by_size(group, totals)):
            ours[rank].append([order[id(p)] for p in share])
    assert ours == _torch_partition(sizes_per_group, world_size)


def _add_group_and_load(rank, world_size):
    model = _model()
    layers = list(model.parameters())
    opt = ZeroRedundancyOptimizer(layers[:4], tw.optim.AdamW, lr=1e-2)
    opt.add_param_group({"params": layers[4:], "lr": 1e-3})
    _train(model, opt, 2)
    opt.consolidate_state_dict(to=1)
    whole = opt.state_dict() if rank == 1 else None
    shared = [whole]
    tw.distributed.broadcast_object_list(shared, src=1)
    fresh = ZeroRedundancyOptimizer(layers[:4], tw.optim.AdamW, lr=1e-2)
    fresh.add_param_group({"params": layers[4:], "lr": 1e-3})
    fresh.load_state_dict(shared[0])
    fresh.consolidate_state_dict(to=1)
    again = fresh.state_dict() if rank == 1 else None
    lrs = [g["lr"] for g in fresh.optim.param_groups]
    if rank != 1:
        return dict(lrs=lrs)
    return dict(lrs=lrs, whole=_numpy_state(whole["state"]), again=_numpy_state(again["state"]),
                n_groups=len(whole["param_groups"]), n_params=sum(len(g["params"]) for g in whole["param_groups"]))


def test_add_param_group_and_state_dict_round_trip():
    results = run_on_ranks(_add_group_and_load, 2)
    last = results[1]
    assert last["n_groups"] == 2 and last["n_params"] == len(list(_model().parameters()))
    assert sorted(last["whole"]) == sorted(last["again"]) == list(range(last["n_params"]))
    for k, state in last["whole"].items():
        for key, value in state.items():
            np.testing.assert_array_equal(last["again"][k][key], value)
    for result in results:
        assert result["lrs"] == [1e-2, 1e-3]


def test_overlap_with_ddp_is_not_supported():
    with pytest.raises(NotImplementedError, match="overlap_with_ddp"):
        ZeroRedundancyOptimizer(_model().parameters(), tw.optim.SGD, overlap_with_ddp=True, lr=0.1)


@pytest.mark.parametrize("params,error,match", [
    (tw.ones(2), TypeError, "iterable of Tensors"), ([], ValueError, "empty parameter list"),
    ([tw.ones(2), {"params": []}], TypeError, "Tensors or dicts"), ([{"lr": 1}], ValueError, "'params' key")])
def test_bad_params_are_refused_as_torch_refuses_them(params, error, match):
    with pytest.raises(error, match=match):
        ZeroRedundancyOptimizer(params, tw.optim.SGD, lr=0.1)
