"""Write-backs and view outputs without copy steps ([Note: memory planning] in ``compiler/lowering/memory.py``): a
value written back into an input is stored straight into the input's memory where its kernel reads the input only
at the element it stores, before storing it (a batch norm's running statistics, updated in the epilogue of the
reduction that reads them), and an output that is a view of a kernel's result laying it out row-major (a batch
norm's per-channel statistics leaving a channels-last program) is that result's own buffer. Kernel and copy counts of
programs lowered for CUDA; values on the C target against torch and eager; the cases that must keep their copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.compiler.composites import _channels_last_positions, _compile, _permuted
from tilewise.compiler.targets import get_target
from tilewise.ops.registry import OPS


def _copies(programs) -> int:
    return sum(len(p.plan.copies) for p in programs)


def _bn_args(channels_last: bool, dtype=tw.bfloat16, shape=(8, 64, 14, 14)):
    rng = np.random.default_rng(0)
    x = tw.from_numpy(rng.standard_normal(shape).astype(np.float32))
    if channels_last:
        x = x.to(memory_format=tw.channels_last)
    c = shape[1]
    w, b, rm = (tw.from_numpy(rng.standard_normal(c).astype(np.float32)) for _ in range(3))
    rv = tw.from_numpy(rng.uniform(0.5, 2, c).astype(np.float32))
    return x.to(dtype), w, b, rm, rv


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_the_fused_batch_norm_program_copies_nothing(channels_last, training):
    """The eager composite's program for CUDA: the running statistics' updates land in the module's buffers, and
    the statistics it returns are the buffers their kernels write (no copy step around its kernels)."""
    op = OPS["native_batch_norm"]
    args = (*_bn_args(channels_last), training, 0.1, 1e-5)
    last = _channels_last_positions(op, args)
    fn = _compile(op, args, last)
    tensors = [_permuted(a, True) if k in last else a for k, a in enumerate(args) if type(a) is tw.Tensor]
    with tw.no_grad():
        _, programs, _ = fn.lowered(get_target("cuda"), *tensors)
    assert _copies(programs) == 0, "\n".join(p.plan.describe() for p in programs)
    (program,) = programs
    written = {program.plan.of[v] for _, v in program.fused.writes}
    assert written == {program.plan.of[i] for i, _ in program.fused.writes}  # the inputs' own buffers
    assert len(program.fused.writes) == (2 if training else 0)


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_running_statistics_written_in_place_match_torch(channels_last):
    """Compiled on the C target, where the same plan writes the running statistics in place."""
    x, w, b, rm, rv = _bn_args(channels_last, tw.float32)
    tx = torch.from_numpy(x.numpy().copy())
    if channels_last:
        tx = tx.contiguous(memory_format=torch.channels_last)
    tw_, tb, trm, trv = (torch.from_numpy(a.numpy().copy()) for a in (w, b, rm, rv))

    def step(x, w, b, rm, rv):
        return OPS["native_batch_norm"](x, w, b, rm, rv, True, 0.1, 1e-5)

    compiled = tw.compile(step)
    for _ in range(2):  # the second call updates the statistics the first call wrote
        got = compiled(x, w, b, rm, rv)
        want = torch.native_batch_norm(tx, tw_, tb, trm, trv, True, 0.1, 1e-5)
    assert _copies(compiled.programs()) == 0
    for ours, theirs in ((got[0], want[0]), (got[1], want[1]), (got[2], want[2]), (rm, trm), (rv, trv)):
        np.testing.assert_allclose(ours.numpy().reshape(-1), theirs.numpy().reshape(-1), rtol=1e-5, atol=1e-5)


def _check(fn, *args, copies: int | None = None):
    """``fn`` compiled on the C target against eager on copies of the arguments: results and every argument."""
    eager_args = [a.clone() for a in args]
    want = fn(*eager_args)
    compiled = tw.compile(fn)
    got = compiled(*args)
    for ours, theirs in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(args, eager_args):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-5)
    if copies is not None:
        assert _copies(compiled.programs()) == copies, "\n".join(p.plan.describe() for p in compiled.programs())
    return compiled


def test_a_statistic_read_inside_its_reduction_is_updated_in_place():
    def f(s, x):
        s.copy_(((x - s) ** 2).mean(0))  # s[j] read in the sum over the rows, stored once the row is summed
        return s + 1

    _check(f, tw.rand(64), tw.randn(300, 64), copies=0)


def test_a_write_back_reading_other_elements_keeps_its_copy():
    def flipped(s, x):
        s.copy_(x.sum(0) + s.flip(0))  # s[63 - j] read where s[j] is stored
        return x * 1

    def read_later(s, x):
        s.add_(x.sum(0))
        return x * s.flip(0)  # the old s... read after: here the new one, as eager reads it

    _check(flipped, tw.rand(64), tw.randn(30, 64), copies=1)
    _check(read_later, tw.rand(64), tw.randn(30, 64))


def test_one_tensor_given_twice_is_written_back_correctly():
    def f(a, b):
        a.mul_(2)
        b.add_(a.sum(0, keepdim=True))
        return a + b

    x = tw.randn(8, 16)
    want_x = x.clone()
    want = f(want_x, want_x)
    got = tw.compile(f)(x, x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.numpy(), want_x.numpy(), rtol=1e-5, atol=1e-5)


def test_an_output_viewing_an_input_written_back_sees_the_new_values():
    def f(x, y):
        v = x.view(-1)
        x.add_(y.sum(0))
        return v, x.sum(0, keepdim=True).permute(1, 0)

    x = tw.randn(16)
    _check(lambda x, y: f(x.view(4, 4), y), x, tw.randn(5, 4, 4))


@pytest.mark.parametrize("view", [
    lambda t: t.view(-1), lambda t: t.permute(1, 0, 2), lambda t: t.unsqueeze(0).expand(2, 1, 8, 16),
], ids=["reshape", "permute_of_size_one", "expand"])
def test_view_outputs_of_a_kernel_result(view):
    """A reshape, or a permute that moves only dims of size 1, is the kernel's buffer (no copy); an expand is not
    all of it densely and stays a copy (or an aliasing output over it)."""
    def f(x):
        return view(x.sum(0, keepdim=True) * 2)

    compiled = _check(f, tw.randn(5, 8, 16))
    if view(tw.zeros(1, 8, 16)).numel() == 8 * 16:
        assert _copies(compiled.programs()) == 0


def test_a_transposed_output_keeps_eagers_strides():
    def f(x):
        return (x * 2).t(), (x + 1).view(4, 8)

    _check(f, tw.randn(8, 4))


def test_two_outputs_viewing_one_value():
    def f(x):
        y = x.sum(0) * 2
        return y.view(4, 4), y.view(2, 8), y

    _check(f, tw.randn(3, 16))


@pytest.mark.cuda
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_the_fused_batch_norm_on_cuda_matches_the_cpu(channels_last):
    """The eager composite on CUDA (its program writing the running statistics in place and returning its
    kernels' buffers) against the CPU: outputs, their strides and the running statistics, over two calls."""
    import tilewise.nn as nn

    x = _bn_args(channels_last, tw.float32)[0]
    cpu, gpu = nn.BatchNorm2d(64), nn.BatchNorm2d(64).to("cuda")
    xc = x.to("cuda")
    for _ in range(2):
        want, got = cpu(x), gpu(xc)
    assert got.stride() == want.stride()
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(gpu, name).cpu().numpy(), getattr(cpu, name).numpy(), rtol=1e-5,
                                   atol=1e-6)
    assert gpu.num_batches_tracked.item() == 2
    out = OPS["native_batch_norm"](xc, gpu.weight, gpu.bias, gpu.running_mean, gpu.running_var, True, 0.1, 1e-5)
    want = OPS["native_batch_norm"](x, cpu.weight, cpu.bias, cpu.running_mean, cpu.running_var, True, 0.1, 1e-5)
    for ours, theirs in zip(out, want):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride()
        np.testing.assert_allclose(ours.cpu().detach().numpy(), theirs.detach().numpy(), rtol=1e-4, atol=1e-4)


def test_a_fused_batch_norm_on_slices_of_one_buffer_updates_them_as_eager_and_torch():
    """A fused composite's program runs on windows of sliced arguments ([Note: fused calls on slices]); batch
    norm writes its running statistics, here slices of one larger buffer (rows 1 and 2: windows at offsets 8
    and 16): the values land in the buffer as eager's do, and the version counters stay where torch leaves
    them (its kernels update running statistics without bumping them)."""
    import torch

    from tilewise.compiler import composites

    tw.manual_seed(0)
    x = tw.randn(4, 8, 3, 3)
    versions, results = [], []
    for fused in (False, True):
        stats = tw.zeros(3, 8)
        stats[2] = 1.0
        mean, var = stats[1], stats[2]
        args = (x, None, None, mean, var, True, 0.1, 1e-5)
        out = composites.run_fused(OPS["native_batch_norm"], args) if fused else OPS["native_batch_norm"](*args)
        assert out is not None
        versions.append((mean._version, stats._version))
        results.append(stats.numpy().copy())
    theirs = torch.zeros(3, 8)
    theirs[2] = 1.0
    torch.native_batch_norm(torch.from_numpy(x.numpy()), None, None, theirs[1], theirs[2], True, 0.1, 1e-5)
    assert versions == [(theirs[1]._version, theirs._version)] * 2
    np.testing.assert_allclose(results[0], theirs.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(results[1], theirs.numpy(), rtol=1e-6, atol=1e-7)
