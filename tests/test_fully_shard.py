"""fully_shard (FSDP2's API) on two gloo ranks against single-process training on the full batch."""

import copy

import numpy as np
import pytest
from shard_harness import run_on_ranks
from shard_models import Stack, batch, shard, stack

import tilewise as tw
from tilewise.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from tilewise.utils.checkpoint import checkpoint


def _loss(model, x, y):
    return (model(x) - y).square().mean()


def _numel(tensors) -> int:
    return sum(t.numel() for t in tensors)


def _state_numel(opt) -> int:
    return sum(v.numel() for s in opt.state.values() for v in s.values() if isinstance(v, tw.Tensor) and v.dim())


def _train_sharded(rank, world_size, steps, device="cpu"):
    reference = stack().to(device)
    model = shard(copy.deepcopy(reference))
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = tw.optim.AdamW(reference.parameters(), lr=1e-2)
    rows = slice(rank * 4, rank * 4 + 4)
    freed_between = []
    for step in range(steps):
        x, y = (t.to(device) for t in batch(step))
        ref_opt.zero_grad()
        _loss(reference, x, y).backward()
        ref_opt.step()
        opt.zero_grad()
        loss = _loss(model, x[rows], y[rows])
        gathered = [b._fsdp_state.group.unsharded for b in model.blocks]
        root_gathered = model._fsdp_state.group.unsharded
        loss.backward()
        leaves = [p.unsharded.numel() for s in model._fsdp_state.states for p in s.group.params]
        freed_between.append((gathered, root_gathered, leaves))
        opt.step()
    full = {name: p.full_tensor().cpu().numpy() for name, p in model.named_parameters()}
    return dict(full=full, reference={n: p.detach().cpu().numpy() for n, p in reference.named_parameters()},
                freed=freed_between, shard_shapes={n: tuple(p.shape) for n, p in model.named_parameters()},
                mine=_numel(model.parameters()) + _state_numel(opt),
                unsharded=_numel(reference.parameters()) + _state_numel(ref_opt),
                classes=[type(model).__name__, type(model.blocks[0]).__name__],
                is_fsdp=isinstance(model, FSDPModule))


@pytest.fixture(scope="module")
def trained():
    return run_on_ranks(_train_sharded, 2, 3)


def test_training_equals_single_process_on_the_full_batch(trained):
    _check_equal_training(trained)


@pytest.mark.cuda
def test_training_on_two_gpus_over_nccl_equals_single_gpu_training():
    results = run_on_ranks(_train_sharded, 2, 3, "cuda", backend="cpu:gloo,cuda:nccl")
    _check_equal_training(results, rtol=1e-4, atol=1e-5)  # GEMMs of 4 and of 8 rows may sum in other orders
    for result in results:
        for gathered, root_gathered, leaves in result["freed"]:
            assert gathered == [False, False, False] and root_gathered and all(n == 0 for n in leaves)


def _check_equal_training(results, rtol=1e-5, atol=1e-6):
    for result in results:
        assert sorted(result["full"]) == sorted(result["reference"])
        for name, want in result["reference"].items():
            np.testing.assert_allclose(result["full"][name], want, rtol=rtol, atol=atol, err_msg=name)


def test_each_rank_holds_its_rows_only(trained):
    for name, full in trained[0]["reference"].items():
        rows = full.shape[0]
        per_rank = -(-rows // 2)
        expected = [(min(per_rank, rows), *full.shape[1:]), (rows - min(per_rank, rows), *full.shape[1:])]
        assert [r["shard_shapes"][name] for r in trained] == expected, name
    assert trained[0]["classes"] == ["FSDPStack", "FSDPBlock"] and trained[0]["is_fsdp"]


def test_blocks_are_freed_after_forward_and_everything_after_backward(trained):
    for result in trained:
        for gathered, root_gathered, leaves in result["freed"]:
            assert gathered == [False, False, False] and root_gathered
            assert leaves and all(n == 0 for n in leaves)


def test_parameters_and_optimizer_state_are_about_half(trained):
    """The memory point of sharding: each rank keeps about half of the parameters and of AdamW's moments."""
    total = trained[0]["unsharded"]
    assert trained[0]["mine"] + trained[1]["mine"] == total
    one_row_each = sum(w.size // w.shape[0] for w in trained[0]["reference"].values())
    padding = 3 * one_row_each  # a rank holds at most one row more than half, of the parameter and both moments
    for result in trained:
        assert abs(result["mine"] - total / 2) <= padding / 2, (result["mine"], total, padding)
        assert result["mine"] < 0.55 * total


def _events_of(model, rank: int, iterations: int) -> list:
    """The all-gathers issued (by block, and whether asynchronously) and the block runs, in the order they
    happen, in the last of ``iterations`` training iterations."""
    events = []

    def logged(param_group, name):
        start = param_group.unshard

        def unshard(async_op=False):
            if not param_group.unsharded and not param_group.gathering:
                events.append(("issue", name, async_op))
            return start(async_op)
        return unshard

    for k, block in enumerate(model.blocks):
        block._fsdp_state.group.unshard = logged(block._fsdp_state.group, f"block{k}")
        block.fc1.register_forward_pre_hook(lambda m, a, k=k: events.append(("run", f"block{k}")))
        block.fc1.register_full_backward_hook(lambda m, gi, go, k=k: events.append(("backward", f"block{k}")))
    for step in range(iterations):
        events.clear()
        x, y = batch(step)
        _loss(model, x[rank * 4:rank * 4 + 4], y[rank * 4:rank * 4 + 4]).backward()
    return events


def _collective_order(rank, world_size):
    """In the learnt order (the second iteration), and in the order set by hand (in the first)."""
    learnt = _events_of(shard(stack()), rank, 2)
    by_hand = shard(stack())
    by_hand.blocks[0].set_modules_to_forward_prefetch([by_hand.blocks[1], by_hand.blocks[2]])
    by_hand.blocks[2].set_modules_to_backward_prefetch([by_hand.blocks[0]])
    return learnt, _events_of(by_hand, rank, 1)


class CheckpointsBlocks(Stack):
    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(self.norm(x))


def _with_activation_checkpointing(rank, world_size):
    x, y = batch(0)
    rows = slice(rank * 4, rank * 4 + 4)
    grads = []
    for cls in (Stack, CheckpointsBlocks):
        tw.manual_seed(0)
        model = shard(cls())
        for _ in range(2):  # the second iteration prefetches
            _loss(model, x[rows], y[rows]).backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    return grads


class SkipsBlocks(Stack):
    def forward(self, x):
        return self.head(self.norm(self.embed(x)))


def _accumulated_without_sync(rank, world_size):
    """Two micro-batches, the first without gradient sync, against one backward of both losses; and a block
    whose output is not used, whose parameters keep no gradient."""
    x, y = batch(0)
    rows = [slice(rank * 4, rank * 4 + 2), slice(rank * 4 + 2, rank * 4 + 4)]
    accumulated = shard(stack())
    accumulated.set_requires_gradient_sync(False)
    _loss(accumulated, x[rows[0]], y[rows[0]]).backward()
    synced_early = [p.grad is not None for p in accumulated.parameters()]
    accumulated.set_requires_gradient_sync(True)
    _loss(accumulated, x[rows[1]], y[rows[1]]).backward()
    at_once = shard(stack())
    (_loss(at_once, x[rows[0]], y[rows[0]]) + _loss(at_once, x[rows[1]], y[rows[1]])).backward()
    unused = shard(SkipsBlocks())
    unused(x[rows[0]]).sum().backward()
    return dict(synced_early=any(synced_early),
                accumulated=[p.grad.numpy() for p in accumulated.parameters()],
                at_once=[p.grad.numpy() for p in at_once.parameters()],
                unused_grads={n: p.grad is not None for n, p in unused.named_parameters()})


def _offloaded(rank, world_size):
    """CPUOffloadPolicy runs its copies (no-ops on a CPU) and trains as without it."""
    x, y = batch(0)
    grads = []
    for policy in (OffloadPolicy(), CPUOffloadPolicy()):
        model = shard(stack(), offload_policy=policy)
        _loss(model, x[rank * 4:rank * 4 + 4], y[rank * 4:rank * 4 + 4]).backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    return grads


def _more_checks(rank, world_size):
    """One spawn for the smaller checks (starting ranks costs more than running them)."""
    return dict(order=_collective_order(rank, world_size), refusals=_refusals(rank, world_size),
                mixed=_mixed_precision(rank, world_size), no_sync=_accumulated_without_sync(rank, world_size),
                checkpointed=_with_activation_checkpointing(rank, world_size), offloaded=_offloaded(rank, world_size))


def test_cpu_offload_policy_trains_as_without_it(checks):
    for plain, offloaded in (c["offloaded"] for c in checks):
        for got, want in zip(offloaded, plain):
            np.testing.assert_array_equal(got, want)


def test_activation_checkpointed_blocks_give_the_same_gradients(checks):
    for plain, checkpointed in (c["checkpointed"] for c in checks):
        for got, want in zip(checkpointed, plain):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_gradients_accumulate_without_sync_then_reduce_once(checks):
    for result in (c["no_sync"] for c in checks):
        assert not result["synced_early"]
        for got, want in zip(result["accumulated"], result["at_once"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_parameters_without_a_gradient_keep_none(checks):
    grads = checks[0]["no_sync"]["unused_grads"]
    assert grads["embed.weight"] and grads["norm.weight"] and grads["head.bias"]
    assert not any(grads[n] for n in grads if n.startswith("blocks."))


@pytest.fixture(scope="module")
def checks():
    return run_on_ranks(_more_checks, 2)


def test_the_next_blocks_all_gather_is_issued_before_the_current_block_runs(checks):
    learnt, by_hand = checks[0]["order"]
    assert learnt == [("issue", "block0", True), ("issue", "block1", True), ("run", "block0"),
                      ("issue", "block2", True), ("run", "block1"), ("run", "block2"),
                      ("issue", "block2", True), ("issue", "block1", True), ("backward", "block2"),
                      ("issue", "block0", True), ("backward", "block1"), ("backward", "block0")]
    assert by_hand == [("issue", "block0", False), ("issue", "block1", True), ("issue", "block2", True),
                       ("run", "block0"), ("run", "block1"), ("run", "block2"),
                       ("issue", "block2", True), ("issue", "block0", True), ("backward", "block2"),
                       ("issue", "block1", False), ("backward", "block1"), ("backward", "block0")]


def _refusals(rank, world_size):
    errors = {}
    shared = Stack(depth=2)
    shared.blocks[1].fc1 = shared.blocks[0].fc1
    fully_shard(shared.blocks[0])
    try:
        fully_shard(shared.blocks[1])
    except ValueError as e:
        errors["shared"] = str(e)
    top_down = Stack(depth=1)
    fully_shard(top_down)
    try:
        fully_shard(top_down.blocks[0])
    except ValueError as e:
        errors["top_down"] = str(e)
    try:
        fully_shard(top_down)
    except ValueError as e:
        errors["twice"] = str(e)
    try:
        fully_shard(Stack(), reshard_after_forward=2)
    except NotImplementedError as e:
        errors["int_reshard"] = str(e)
    tied = Stack(depth=1)  # a weight shared inside one group (the root's) is fine
    tied.blocks[0].fc2.bias = tied.embed.bias
    fully_shard(tied)
    tied(tw.randn(2, 5)).sum().backward()
    errors["tied_grad_shape"] = tuple(tied.embed.bias.grad.shape)
    return errors


def test_unsupported_uses_are_refused_clearly(checks):
    errors = checks[0]["refusals"]
    assert "parameter 'fc1.weight'" in errors["shared"] and "shared" in errors["shared"]
    assert "bottom-up" in errors["top_down"]
    assert "already sharded" in errors["twice"]
    assert "reshard_after_forward=2" in errors["int_reshard"]
    assert errors["tied_grad_shape"] == (4,)


def _mixed_precision(rank, world_size):
    reference = stack()
    model = shard(copy.deepcopy(reference), mp_policy=MixedPrecisionPolicy(param_dtype=tw.bfloat16,
                                                                              reduce_dtype=tw.float32))
    x, y = batch(0)
    out = model(x[rank * 4:rank * 4 + 4])
    (out.float() - y[rank * 4:rank * 4 + 4]).square().mean().backward()
    low = copy.deepcopy(reference).to(tw.bfloat16)
    (low(x.to(tw.bfloat16)).float() - y).square().mean().backward()
    return dict(out_dtype=str(out.dtype), param_dtypes={str(p.dtype) for p in model.parameters()},
                grad_dtypes={str(p.grad.dtype) for p in model.parameters()},
                grads={n: p.grad.numpy() for n, p in model.named_parameters()},
                low={n: p.grad.float().numpy() for n, p in low.named_parameters()})


def test_mixed_precision_gathers_in_param_dtype_and_keeps_float32_shards(checks):
    results = [c["mixed"] for c in checks]
    for rank, result in enumerate(results):
        assert result["out_dtype"] == str(tw.bfloat16)
        assert result["param_dtypes"] == {str(tw.float32)} and result["grad_dtypes"] == {str(tw.float32)}
        for name, low in result["low"].items():
            rows = -(-low.shape[0] // 2)
            np.testing.assert_allclose(result["grads"][name], low[rank * rows:(rank + 1) * rows], rtol=0.05,
                                       atol=0.02, err_msg=name)
