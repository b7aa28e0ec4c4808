"""Sharded checkpoints: saved by two fully_shard ranks and loaded by one process, saved by one and loaded by
two, and the full-state helpers that gather a whole state on rank 0."""

import json
import os

import numpy as np
import pytest
from shard_harness import run_on_ranks
from shard_models import batch, shard, stack

import tilewise as tw
import tilewise.distributed.checkpoint as dcp
from tilewise.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _step(model, opt, rows=slice(None)) -> None:
    device = next(model.parameters()).device
    x, y = (t.to(device) for t in batch(0))
    opt.zero_grad()
    (model(x[rows]) - y[rows]).square().mean().backward()
    opt.step()


def _numpy(state):
    if isinstance(state, tw.Tensor):
        return state.detach().cpu().numpy()
    if isinstance(state, dict):
        return {k: _numpy(v) for k, v in state.items()}
    return state


def _save_on_two(rank, world_size, directory, device="cpu"):
    model = shard(stack().to(device))
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt, slice(rank * 4, rank * 4 + 4))
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=directory)
    full_model, full_optim = get_state_dict(model, opt, options=FULL_ON_RANK0)
    if rank == 0:
        tw.save({"model": full_model, "optim": full_optim}, os.path.join(directory, "..", "full.safetensors"))
    return dict(full_model=_numpy(full_model), full_optim=_numpy(full_optim))


def _fresh_single():
    tw.manual_seed(123)  # other values than the checkpoint's, so that a load that misses something shows
    model = type(stack())()
    return model, tw.optim.AdamW(model.parameters(), lr=1e-2)


def test_saved_on_two_ranks_loads_on_one(tmp_path):
    directory = tmp_path / "ckpt"
    _check_loads_on_one(tmp_path, directory, run_on_ranks(_save_on_two, 2, str(directory)))


@pytest.mark.cuda
def test_saved_on_two_gpus_loads_on_one_cpu_process(tmp_path):
    directory = tmp_path / "ckpt"
    results = run_on_ranks(_save_on_two, 2, str(directory), "cuda", backend="cpu:gloo,cuda:nccl")
    _check_loads_on_one(tmp_path, directory, results)


def _check_loads_on_one(tmp_path, directory, results):
    full_model, full_optim = results[0]["full_model"], results[0]["full_optim"]
    assert results[1]["full_model"] == {} and results[1]["full_optim"] == {}
    index = json.loads((directory / "metadata.json").read_text())
    weight = index["tensors"]["model.blocks.0.fc1.weight"]
    assert weight["shape"] == [22, 7]
    assert sorted((c["file"], c["offsets"], c["sizes"]) for c in weight["chunks"]) == [
        ("__0_0.distcp", [0, 0], [11, 7]), ("__1_0.distcp", [11, 0], [11, 7])]
    assert sorted(os.listdir(directory)) == ["__0_0.distcp", "__1_0.distcp", "metadata.json"]

    model, opt = _fresh_single()
    model_state, optim_state = get_model_state_dict(model), get_optimizer_state_dict(model, opt)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    set_optimizer_state_dict(model, opt, optim_state)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), full_model[name], err_msg=name)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            np.testing.assert_array_equal(opt.state[p][key].numpy(), full_optim["state"][name][key])
    assert [g["lr"] for g in opt.param_groups] == [1e-2]

    gathered = tw.load(tmp_path / "full.safetensors")  # the full state rank 0 wrote with tilewise.save
    reference, _ = _fresh_single()
    reference.load_state_dict(gathered["model"])
    for name, p in reference.named_parameters():
        np.testing.assert_array_equal(p.detach().numpy(), full_model[name])


def _load_on_two(rank, world_size, directory):
    tw.manual_seed(123)
    model = shard(type(stack())())
    opt = tw.optim.AdamW(model.parameters(), lr=5e-3)
    model_state, optim_state = get_model_state_dict(model), get_optimizer_state_dict(model, opt)
    dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
    set_optimizer_state_dict(model, opt, optim_state)
    full_model = _numpy(get_model_state_dict(model, options=FULL_ON_RANK0))
    return dict(shards={n: (p._fsdp_shard.start, p.detach().numpy()) for n, p in model.named_parameters()},
                moments={n: opt.state[p]["exp_avg"].numpy() for n, p in model.named_parameters()},
                lr=opt.param_groups[0]["lr"], full_model=full_model)


def _both_loads_on_two(rank, world_size, directory, full_path):
    return dict(checkpoint=_load_on_two(rank, world_size, directory),
                full=_set_full_on_two(rank, world_size, full_path))


@pytest.fixture(scope="module")
def loaded_on_two(tmp_path_factory):
    """A model trained one step in this process, saved as a checkpoint and as a full state with tilewise.save;
    both loaded by two fully_shard ranks (one spawn)."""
    directory = tmp_path_factory.mktemp("one_process")
    model = stack()
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt)
    dcp.save({"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=directory)
    tw.save(model.state_dict(), directory / "full.safetensors")
    return model, opt, run_on_ranks(_both_loads_on_two, 2, str(directory), str(directory / "full.safetensors"))


def test_saved_on_one_process_loads_on_two_ranks(loaded_on_two):
    model, opt, runs = loaded_on_two
    results = [r["checkpoint"] for r in runs]
    for result in results:
        assert result["lr"] == 1e-2
        for name, p in model.named_parameters():
            start, rows = result["shards"][name]
            np.testing.assert_array_equal(rows, p.detach().numpy()[start:start + rows.shape[0]], err_msg=name)
            np.testing.assert_array_equal(result["moments"][name],
                                          opt.state[p]["exp_avg"].numpy()[start:start + rows.shape[0]])
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(results[0]["full_model"][name], p.detach().numpy())
    assert sum(r["shards"]["blocks.0.fc1.weight"][1].shape[0] for r in results) == 22


def test_full_state_dict_loads_into_a_sharded_model_through_set_model_state_dict(loaded_on_two):
    model, _, runs = loaded_on_two
    for result in (r["full"] for r in runs):
        for name, p in model.named_parameters():
            start, rows = result[name]
            np.testing.assert_array_equal(rows, p.detach().numpy()[start:start + rows.shape[0]])


def _set_full_on_two(rank, world_size, path):
    tw.manual_seed(5)
    model = shard(type(stack())())
    set_model_state_dict(model, tw.load(path), options=StateDictOptions(full_state_dict=True))
    return {n: (p._fsdp_shard.start, p.detach().numpy()) for n, p in model.named_parameters()}


def test_load_errors_name_the_key(tmp_path):
    dcp.save({"w": tw.ones(2, 3)}, checkpoint_id=tmp_path)
    with pytest.raises(RuntimeError, match="size mismatch for 'w'"):
        dcp.load({"w": tw.zeros(3, 3)}, checkpoint_id=tmp_path)
    with pytest.raises(RuntimeError, match="'v' is not in the checkpoint"):
        dcp.load({"v": tw.zeros(1)}, checkpoint_id=tmp_path)
    with pytest.raises(FileNotFoundError, match="metadata.json"):
        dcp.load({"w": tw.zeros(2, 3)}, checkpoint_id=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="checkpoint_id"):
        dcp.save({"w": tw.ones(1)})


@pytest.mark.parametrize("module", ["tilewise.distributed.checkpoint.api", "tilewise.distributed.fsdp.api",
                                    "tilewise.distributed.fsdp.fully_shard",
                                    "tilewise.distributed.optim.zero_redundancy_optimizer"])
def test_module_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
