"""tilewise.compile's CUDA target: schedules (checked anywhere) and programs, graphs and numerics (on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.compiler.capture import trace
from tilewise.compiler.passes import run_pipeline
from tilewise.compiler.program import lower_program
from tilewise.compiler.targets import CUDA_TARGET


def cuda_plans(fn, *args):
    low = lower_program(run_pipeline(trace(fn, args, {}).graph), CUDA_TARGET)
    return low, [ns.cuda for s in low.schedules for ns in s.nests]


# ---------------------------------------------------------------------------- schedules (no GPU needed)

def test_seed_chain_is_one_vectorised_elementwise_kernel():
    low, plans = cuda_plans(lambda x: x.relu() * 0.5 + 1, tw.randn(4096, 4096))
    (plan,) = plans
    assert len(low.kernels) == 1 and plan.strategy == "elements" and plan.vector == 4
    assert "tw_vec<float, 4>" in low.source


def test_an_optimizer_update_over_many_parameters_is_one_body_in_one_kernel():
    """AdamW over parameters of several shapes: one kernel whose nests (one per parameter) share one body,
    each block picking its nest's buffers and length; NVRTC compiles it."""
    from tilewise.codegen.toolchain import compile_cached

    params = [tw.randn(*shape).requires_grad_() for shape in ((64, 256), (256,), (256, 64), (64,), (64, 256))]
    for p in params:
        p.grad = tw.randn(*p.shape)
    opt = tw.optim.AdamW(params, lr=1e-3)
    opt.init_state()
    low, plans = cuda_plans(lambda: opt.step())
    update = max(low.schedules, key=lambda s: len(s.nests))
    assert len(update.nests) == len(params)
    source = low.sources[update.kernel.name]
    assert f"one body for {len(params)} nests" in source and source.count("tw_n = ") == len(params)
    assert source.count("if (e < tw_n)") == 1
    compile_cached(source, update.kernel.name, "sm_90")


def test_bf16_softmax_keeps_its_row_in_registers():
    low, plans = cuda_plans(lambda x: x.float().softmax(-1).bfloat16(), tw.randn(64, 4096).bfloat16())
    (plan,) = plans
    assert len(low.kernels) == 1
    assert (plan.strategy, plan.vector, plan.in_registers) == ("rows", 8, True)
    assert plan.team * plan.vector * plan.steps >= 4096


def test_residual_layer_norm_is_one_kernel():
    w, b = tw.randn(768), tw.randn(768)
    low, plans = cuda_plans(lambda x, r: F.layer_norm(x + r, (768,), w, b), tw.randn(64, 768), tw.randn(64, 768))
    assert len(low.kernels) == 1 and plans[0].strategy == "rows" and plans[0].in_registers


def test_sum_over_the_leading_dim_reads_columns_a_vector_per_lane():
    """Each lane folds a 16-byte vector of adjacent columns (4 float32, 8 bfloat16), each with its own
    accumulator; the block's 8 warps take other rows of the same 32 x vector columns."""
    for dtype, vector in ((tw.float32, 4), (tw.bfloat16, 8)):
        _, (plan,) = cuda_plans(lambda x: x.float().sum(0), tw.randn(8192, 768).to(dtype))
        assert (plan.strategy, plan.vector, plan.vector_dim) == ("columns", vector, 1)
        assert plan.rows_per_block == 32 * vector and plan.team == 8


def test_columns_of_several_phases_or_odd_widths_take_one_per_lane():
    _, (plan,) = cuda_plans(lambda x: x.softmax(0), tw.randn(512, 768))  # a later phase reads the totals
    assert (plan.strategy, plan.vector, plan.rows_per_block) == ("columns", 1, 32)
    _, (plan,) = cuda_plans(lambda x: x.sum(0), tw.randn(4096, 766))
    assert (plan.strategy, plan.vector) == ("columns", 2)
    _, (plan,) = cuda_plans(lambda x: x.sum(0), tw.randn(4096, 765))
    assert (plan.strategy, plan.vector, plan.rows_per_block) == ("columns", 1, 32)


def test_long_columns_of_few_groups_are_not_folded_in_phases():
    """A softmax down 4096 rows of 768 columns in phases would run on 768 / 32 = 24 blocks, each walking every
    row three times: the statistics are reductions split across the GPU instead, the normalisation an
    element-wise pass (the batch norms of a channels-last ResNet's later stages are the case that matters)."""
    low, plans = cuda_plans(lambda x: x.softmax(0), tw.randn(4096, 768))
    assert len(plans) > 1 and all(p.blocks >= 96 for p in plans)
    assert all(s.nests[0].nest.phases <= 1 for s in low.schedules)


def test_a_reduction_reads_columns_where_most_of_its_bytes_run_along_them():
    """A channels-last batch norm's gradient statistics with one operand laid out channels-first (a max pool's
    scattered gradient): three of four operands run along the channels, so the nest reads columns, with 16-byte
    vectors along the channels, not rows with vectors that gather a 2-byte element per 128-byte line."""
    shape = (8, 64, 28, 28)
    x, dy = (tw.randn(*shape).bfloat16().to(memory_format=tw.channels_last) for _ in range(2))
    g = tw.randn(*shape).bfloat16()  # contiguous: channels-first

    def stats(x, dy, g):
        d = (dy.float() + g.float()) * (x > 0)
        return d.sum((0, 2, 3)), (d * x.float()).sum((0, 2, 3))

    low, plans = cuda_plans(stats, x, dy, g)
    (plan,) = plans
    assert plan.strategy == "columns" and plan.vector == 8
    from tilewise.codegen.toolchain import compile_cached

    compile_cached(low.source, low.schedules[0].kernel.name, "sm_90")


def _column_step(x):
    """A bias-gradient-like nest: an element-wise store and two column reductions over the same rows."""
    y = (x.float() * 2).tanh()
    return y.to(x.dtype), y.sum(0), y.amax(0)


def test_vector_column_nests_compile():
    """Per-lane accumulators, the shared-memory meeting of the warps, part-major partials: NVRTC compiles
    the kernels for bf16 (8 lanes), fp32 (4) and a width only 2 divides, split or not."""
    from tilewise.codegen.toolchain import compile_cached

    for shape, dtype, vector in (((8192, 768), tw.bfloat16, 8), ((4096, 766), tw.float32, 2),
                                 ((64, 40), tw.float32, 4)):
        low, plans = cuda_plans(_column_step, tw.randn(*shape).to(dtype))
        (plan,) = [p for p in plans if p.strategy == "columns"]
        assert plan.vector == vector and (plan.split > 1) == (shape[0] > 64)
        for sched in low.schedules:
            compile_cached(low.source, sched.kernel.name, "sm_90")


def test_few_column_groups_split_the_reduction_across_blocks():
    """A bias gradient (768 bf16 columns over 8192 rows) is 3 groups of 256 columns: too few blocks for the
    GPU, so each group's rows are shared among blocks and the last one combines the partials."""
    low, (plan,) = cuda_plans(lambda x: x.float().sum(0), tw.randn(8192, 768).bfloat16())
    assert plan.split > 1 and plan.blocks == 3 * plan.split and plan.chunk * plan.split >= 8192
    assert low.schedules[0].scratch_bytes > 0 and "atomicAdd" in low.source
    _, (plan,) = cuda_plans(lambda x: x.sum(0), tw.randn(64, 768))
    assert plan.split == 1  # rows too few to share


def test_a_whole_tensor_sum_is_split_across_blocks():
    low, (plan,) = cuda_plans(lambda x: (x * x).sum(), tw.randn(1 << 22))
    assert plan.split > 1 and plan.blocks == plan.split
    assert low.schedules[0].scratch_bytes > 0 and "atomicAdd" in low.source


def test_a_kernel_writing_in_place_of_its_input_drops_restrict_there_only():
    def step(p, g):
        p.sub_(g * 0.1)

    low, _ = cuda_plans(step, tw.randn(1024), tw.randn(1024))
    (kernel,) = low.kernels.values()
    signature = low.source.split(f" {kernel.name}(", 1)[1].split(")", 1)[0].split(", ")
    buffers = [low.plan.of[v] for v in kernel.values]
    shared = [buffers.count(b) > 1 for b in buffers]
    assert sum(shared) == 2, "p is read and written in place"
    for declaration, is_shared in zip(signature, shared):  # g's pointer keeps its __restrict__
        assert ("__restrict__" in declaration) != is_shared, declaration


def _fp8_cast_both_ways(x, amax):
    """Float8Linear's cast of an operand: scaled, saturated, stored as it is and transposed (the backward GEMM's
    layout), one kernel."""
    scale = 448.0 / amax.float().clamp(min=1e-12)
    q = (x.float() * scale).clamp(-448.0, 448.0).to(tw.float8_e4m3fn)
    return q, q.t().contiguous()


def _fp8_cast_of_an_activation(x, amax, dtype=tw.float8_e4m3fn):
    """Float8Linear's cast of a [batch, sequence, features] activation (of a gradient: e5m2), the transposed copy
    made from the tensor's own shape: [features, batch, sequence], which ``float8.linear.transposed_matrix`` then
    views as the matrix [features, tokens]."""
    from tilewise.float8.linear import amax_to_scale, cast_to_float8

    q = cast_to_float8(x, amax_to_scale(amax, dtype), dtype)
    return q, q.permute(2, 0, 1).contiguous()


def _e5m2_cast_of_a_gradient(x, amax):
    return _fp8_cast_of_an_activation(x, amax, tw.float8_e5m2)


def _transposing_cases():
    return [  # (function, arguments, the transposed dim)
        (lambda x: x.t().contiguous(), (tw.randn(8192, 768).to(tw.bfloat16),), 0),
        (lambda x: x.transpose(1, 2).contiguous(), (tw.randn(4, 37, 65),), 1),
        (lambda x, y: (x + y.t()) * 2, (tw.randn(50, 33), tw.randn(33, 50)), 0),
        (_fp8_cast_both_ways, (tw.randn(300, 200).to(tw.bfloat16), tw.tensor(3.0)), 0),
    ]


def test_an_elementwise_nest_with_a_transposed_access_goes_through_tiles():
    """[Note: transposing tiles]: a cast stored both as it is and transposed, a transposing copy, a sum with a
    transposed operand are tiled over the transposed dim, each thread a block of elements in registers (no
    shared memory, no barrier); NVRTC compiles each."""
    from tilewise.codegen.toolchain import compile_cached

    for fn, args, dim in _transposing_cases():
        low, plans = cuda_plans(fn, *args)
        tiled = [p for p in plans if p.strategy == "tiles"]
        assert tiled and all(p.tile_dim == dim for p in tiled), plans
        assert "__syncthreads();" not in low.source and "tw_smem" not in low.source
        for sched in low.schedules:
            compile_cached(low.source, sched.kernel.name, "sm_90")


def test_a_tiled_float8_cast_takes_its_scale_once_a_block_and_converts_each_value_once():
    """The scale is worked out before the loops over a thread's elements, and one conversion of each element
    feeds both the row-major and the transposed copy."""
    low, _ = cuda_plans(_fp8_cast_both_ways, tw.randn(300, 200).to(tw.bfloat16), tw.tensor(3.0))
    source = low.source[low.source.index("tiles"):]
    loop = source.index("for (int tw_u")
    assert "tw_h_0 =" in source[:loop] and "1.0f /" in source[:loop] and "1.0f /" not in source[loop:]
    assert "__nv_cvt_fp8_to_halfraw" not in source  # no float8 -> float -> float8 round trip before a store
    assert source.count("tw_float_to_e4m3(") == 1


@pytest.mark.parametrize("rows, cols", [(1024, 3072), (3072, 768)])
def test_a_tiled_float8_cast_moves_whole_vectors_without_shared_memory_or_spills(rows, cols):
    """GPT-2's MLP and projection activations cast to e4m3 both ways (the cast ran at 0.8 TB/s when each thread
    moved one element per row: 2-byte loads, 1-byte stores, a shared-memory transpose): each thread an 8 x 8
    block, bfloat16 read 16 bytes at a time, both FP8 copies written 8 bytes at a time, the lanes of a warp
    filling whole sectors; in SASS no byte store, no shared memory, no barrier, no local memory."""
    import re

    from tilewise.codegen.schedule import SECTOR
    from tilewise.codegen.toolchain import compile_cached
    from tilewise.codegen.toolchain.sass import disassemble, find_binary_utility, resource_usage

    low, plans = cuda_plans(_fp8_cast_both_ways, tw.randn(rows, cols).to(tw.bfloat16), tw.tensor(3.0))
    (plan,) = [p for p in plans if p.strategy == "tiles"]
    shape = plan.tile
    assert (shape.rows, shape.cols) == (8, 8) and shape.lanes_r * shape.lanes_c == 32
    assert shape.lanes_c * shape.cols >= SECTOR and shape.lanes_r * shape.rows >= SECTOR  # FP8 bytes per row
    assert plan.blocks * shape.block_rows * shape.block_cols >= rows * cols
    (sched,) = [s for s in low.schedules if any(ns.cuda is plan for ns in s.nests)]
    kernel = compile_cached(low.sources[sched.kernel.name], sched.kernel.name, "sm_90")
    usage = resource_usage(kernel.cubin)[sched.kernel.name]
    assert usage.local_bytes == 0 and usage.registers <= 128, usage
    if find_binary_utility("nvdisasm") is None:
        pytest.skip("nvdisasm not installed")
    sass = disassemble(kernel.cubin)
    assert "LDG.E.128" in sass and "STG.E.64" in sass
    assert not re.search(r"STG\.E\.U8|\bSTS\b|\bLDS\b|\bBAR\b", sass)


def _tile_host_cases():
    """(name, function, inputs) run on the host through ``cuda_on_host``: the cases above, ragged sizes that
    narrow the vectors, batch dims, broadcast and strided operands, positions, NaN, infinities and overflow."""
    g = tw.Generator().manual_seed(0)

    def randn(*shape):
        return tw.randn(*shape, generator=g)

    specials = randn(128, 64) * 3
    specials[3, 5], specials[7, 9], specials[1, 2], specials[2, 1], specials[5, 5] = (
        float("nan"), -float("nan"), float("inf"), -float("inf"), 1e30)
    cases = [(f"case{k}", fn, dict(zip(("x", "amax") if fn is _fp8_cast_both_ways else ("x", "y"), args)))
             for k, (fn, args, _) in enumerate(_transposing_cases())]
    cases += [
        ("fp8 GPT-2 rows", _fp8_cast_both_ways, dict(x=(randn(256, 768) * 3).bfloat16(), amax=tw.tensor(2.5))),
        ("fp8 specials", _fp8_cast_both_ways, dict(x=specials.bfloat16(), amax=tw.tensor(2.5))),
        ("e5m2 saturating", _e5m2_cast_both_ways, dict(x=specials.bfloat16(), amax=tw.tensor(2.5))),
        ("fp8 3-d activation", _fp8_cast_of_an_activation, dict(x=(randn(2, 64, 96) * 3).bfloat16(),
                                                                 amax=tw.tensor(2.5))),
        ("e5m2 3-d gradient", _e5m2_cast_of_a_gradient, dict(x=(specials.reshape(4, 32, 64) * 1e3).bfloat16(),
                                                             amax=tw.tensor(2.5))),
        ("e5m2 overflowing", lambda x: (x.t().contiguous().to(tw.float8_e5m2), x.to(tw.float8_e5m2).t().contiguous()),
         dict(x=specials * 1e4)),
        ("fp8 copy", lambda x: x.t().contiguous(), dict(x=(randn(96, 40) * 100).to(tw.float8_e4m3fn))),
        ("bias", lambda x, b: (x + b).t().contiguous(), dict(x=randn(64, 96), b=randn(96))),
        ("row scale", lambda x, b: (x * b).t().contiguous(), dict(x=randn(64, 96), b=randn(64, 1))),
        ("positions", lambda x: (x.t() + tw.arange(64, device=x.device)).contiguous(), dict(x=randn(64, 96))),
        ("strided", lambda x, y: (x.t() + y[:, ::2]).contiguous(), dict(x=randn(64, 96), y=randn(96, 128))),
        ("int64", lambda x: x.t().contiguous(), dict(x=tw.arange(64 * 96).reshape(64, 96))),
        ("mixed dtypes", lambda x, y: ((x.t().float() + y).contiguous(),
                                       (x.t().float() + y).to(tw.float8_e4m3fn).contiguous()),
         dict(x=randn(64, 96).bfloat16(), y=randn(96, 64))),
    ]
    bf16_nans = np.full((64, 48), 0x3F80, np.uint16)  # NaNs with payloads: a copy keeps them, as eager's does
    bf16_nans[1, 2], bf16_nans[3, 4], bf16_nans[5, 6] = 0x7FA0, 0xFFC1, 0x7F81
    e5m2_nans = np.full((64, 48), 0x38, np.uint8)
    e5m2_nans[1, 2], e5m2_nans[3, 4], e5m2_nans[5, 6] = 0x7D, 0xFE, 0x7E
    cases += [("bfloat16 NaN payloads", lambda x: x.t().contiguous(),
               dict(x=tw.from_numpy(bf16_nans.view(np.int16)).view(tw.bfloat16))),
              ("e5m2 NaN payloads", lambda x: x.t().contiguous(),
               dict(x=tw.from_numpy(e5m2_nans).view(tw.float8_e5m2)))]
    for shape in [(31, 33), (33, 31), (1000, 17), (2, 3, 70, 45)]:
        for dtype in [tw.float32, tw.bfloat16, tw.float64, tw.int8, tw.bool]:
            cases.append((f"copy {shape} {dtype.name}", lambda x: x.transpose(-1, -2).contiguous(),
                          dict(x=(randn(*shape) * 50).to(dtype))))
    return cases


def _e5m2_cast_both_ways(x, amax):
    scale = 57344.0 / amax.float().clamp(min=1e-12)
    q = (x.float() * scale).clamp(-57344.0, 57344.0).to(tw.float8_e5m2)
    return q, q.t().contiguous()


@pytest.mark.parametrize("case", range(len(_tile_host_cases())), ids=[c[0] for c in _tile_host_cases()])
def test_tiled_kernels_run_on_the_host_match_eager_bit_for_bit(case, tmp_path_factory):
    """[Note: transposing tiles] without a GPU: each tiled kernel's CUDA C, compiled for the host with a shim of
    CUDA's names (``cuda_on_host``), writes every element where eager puts it, bit for bit."""
    from cuda_on_host import COMPILER, run_on_host

    if COMPILER is None:
        pytest.skip("no C++ compiler")
    _, fn, inputs = _tile_host_cases()[case]
    got, sched = run_on_host(fn, tmp_path_factory.getbasetemp(), **inputs)
    assert any(ns.cuda.strategy == "tiles" for ns in sched.nests)
    want = fn(*inputs.values())
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.tobytes() == w.contiguous().numpy().tobytes()


def test_elementwise_nests_without_a_transposed_access_are_not_tiled():
    for fn, args in ((lambda x, b: x * 2 + b, (tw.randn(64, 96), tw.randn(96))),  # broadcast along rows
                     (lambda x, b: x * b, (tw.randn(64, 96), tw.randn(64, 1))),  # constant along the inner dim
                     (lambda x: x.t().contiguous(), (tw.randn(3, 500),))):  # too narrow to tile
        _, plans = cuda_plans(fn, *args)
        assert all(p.strategy == "elements" for p in plans), plans


def test_a_program_replays_a_graph_where_copying_costs_less_than_launching():
    """A training step's gradients are outputs: 249 MB for GPT-2, copied in a tenth of a millisecond, against
    hundreds of launches; a composite of two kernels over a large activation launches them instead."""
    from tilewise.compiler.program_cuda import GRAPH_COPY_BYTES, CudaExternStep, worth_a_graph

    kernel, call = object(), CudaExternStep.__new__(CudaExternStep)
    assert worth_a_graph(GRAPH_COPY_BYTES, [kernel])
    assert worth_a_graph(249_000_000, [kernel] * 500 + [call] * 144)
    assert not worth_a_graph(51_000_000, [kernel] * 3)
    assert worth_a_graph(51_000_000, [call] * 3 + [kernel] * 20)
    # an eager composite's graph lives as long as the process: it holds at most what it is given
    assert worth_a_graph(GRAPH_COPY_BYTES, [kernel], GRAPH_COPY_BYTES)
    assert not worth_a_graph(20_000_000, [kernel] * 20, GRAPH_COPY_BYTES)


@pytest.mark.cuda
def test_eager_composites_keep_no_large_graph_buffers():
    """A batch norm over a 12.8 MB activation cost less to copy than to launch; its graph held the copies for
    good (a ResNet-50 kept 0.3-0.6 GiB that way after training eagerly)."""
    from tilewise.compiler import composites as fused

    def bn_step(x, bn):
        y = bn(x)
        y.float().sum().backward()

    bn = tw.nn.BatchNorm2d(1024).cuda()
    tw.cuda.empty_cache()
    before = tw.cuda.memory_allocated()
    for _ in range(4):  # captured, if at all, from the second call; bf16 activations, float32 statistics
        bn_step(tw.randn(64, 1024, 7, 7, device="cuda", dtype=tw.bfloat16, requires_grad=True), bn)
    tw.cuda.synchronize()
    tw.cuda.empty_cache()
    assert tw.cuda.memory_allocated() - before <= fused.ARENA_KEEP["cuda"] + (4 << 20)
    for fn in fused._programs.values():
        for program in fn.programs() if fn is not None else ():
            runtime = program.runtime
            staged = sum(b.nbytes for b in runtime.staging.values())
            assert all(staged + sum(b.nbytes for b in g.outputs) <= fused.GRAPH_BYTES for g in runtime.graphs.values())


# ---------------------------------------------------------------------------- programs on the GPU

def _close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(a.detach().cpu().float().numpy(), b.detach().cpu().float().numpy(), rtol=rtol,
                               atol=atol)


def _runtime(f):
    (program,) = f.programs()
    return program.runtime


@pytest.mark.cuda
def test_seed_chain_on_cuda_launches_one_kernel():
    f = tw.compile(lambda x: x.relu() * 0.5 + 1)
    for _ in range(3):
        x = tw.randn(1024, 1024, device="cuda")
        _close(f(x), x.relu() * 0.5 + 1)
    assert not _runtime(f).graphs, "one kernel: nothing to gain from a graph"


@pytest.mark.cuda
def test_a_program_of_several_steps_replays_a_graph_with_fresh_arguments():
    def f(x):
        return (x.softmax(-1) * x.sum(0)).amax(0)  # a row reduction, a column reduction, then another

    compiled = tw.compile(f)
    for _ in range(4):
        x = tw.randn(64, 128, device="cuda")
        _close(compiled(x), f(x), 1e-5, 1e-6)
    runtime = _runtime(compiled)
    assert sum(p.kernel_count for p in compiled.programs()) >= 2
    assert len(runtime.graphs) == 1 and not runtime.why_not


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(64, 4096), (1000, 100), (3, 70000)])
def test_softmax_on_cuda(shape):
    f = tw.compile(lambda x: x.softmax(-1))
    x = tw.randn(*shape, device="cuda")
    _close(f(x), x.softmax(-1), 1e-5, 1e-7)


@pytest.mark.cuda
def test_bf16_softmax_and_layer_norm_on_cuda():
    x = tw.randn(256, 4096, device="cuda").bfloat16()
    f = tw.compile(lambda x: x.float().softmax(-1).bfloat16())
    _close(f(x), x.float().softmax(-1).bfloat16(), 1e-2, 1e-3)
    w, b = tw.randn(4096, device="cuda"), tw.randn(4096, device="cuda")
    g = tw.compile(lambda x, r: F.layer_norm(x.float() + r.float(), (4096,), w, b).bfloat16())
    r = tw.randn(256, 4096, device="cuda").bfloat16()
    _close(g(x, r), F.layer_norm(x.float() + r.float(), (4096,), w, b).bfloat16(), 2e-2, 2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("n", [1000, 1 << 22, 12345679])
def test_split_whole_tensor_sum_on_cuda(n):
    f = tw.compile(lambda x: (x * x).sum())
    x = tw.randn(n, device="cuda", dtype=tw.float64)
    for _ in range(3):  # the counters are left zeroed for the next launch and the next replay
        _close(f(x), (x * x).sum(), 1e-10, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(8192, 768), (5000, 100), (3000, 33)])
def test_split_column_sums_with_element_stores_on_cuda(shape):
    f = tw.compile(lambda x: ((x * 2).tanh(), (x * 2).tanh().sum(0)))
    x = tw.randn(*shape, device="cuda")
    for _ in range(3):  # launches and replays reuse the zeroed counters
        y, s = f(x)
        _close(y, (x * 2).tanh())
        _close(s, (x * 2).tanh().sum(0), 1e-4, 1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("shape, dtype", [((8192, 768), tw.bfloat16), ((4096, 766), tw.float32),
                                          ((300, 40), tw.float32), ((2, 1000, 3072), tw.bfloat16)])
def test_vector_column_sums_and_maxima_on_cuda(shape, dtype):
    """A lane's vector of columns, each its own accumulator, against eager; several times over, since the
    split's counters must be left zeroed for the next launch and replay."""
    f = tw.compile(_column_step)
    x = tw.randn(*shape, device="cuda").to(dtype)
    expected = _column_step(x)
    for _ in range(3):
        for got, want in zip(f(x), expected):
            _close(got, want, 2e-2 if dtype == tw.bfloat16 else 1e-5, 1e-2 if dtype == tw.bfloat16 else 1e-4)


@pytest.mark.cuda
def test_column_and_middle_reductions_on_cuda():
    x = tw.randn(8192, 768, device="cuda")
    _close(tw.compile(lambda x: x.sum(0))(x), x.sum(0), 1e-4, 1e-4)
    y = tw.randn(10, 20, 30, device="cuda")
    _close(tw.compile(lambda y: y.amax(1) - y.amin(1))(y), y.amax(1) - y.amin(1))
    _close(tw.compile(lambda y: y.var(-1))(y), y.var(-1), 1e-5, 1e-6)


@pytest.mark.cuda
def test_matmul_inside_a_compiled_function_is_captured():
    w = tw.randn(512, 256, device="cuda")

    def f(x):
        return (x @ w).relu().sum(-1)

    compiled = tw.compile(f)
    for _ in range(3):
        x = tw.randn(128, 512, device="cuda")
        _close(compiled(x), f(x), 1e-4, 1e-3)
    assert len(_runtime(compiled).graphs) == 1


@pytest.mark.cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_whole_training_step_on_cuda_matches_eager(optimizer):
    def make():
        tw.manual_seed(0)
        model = tw.nn.Sequential(tw.nn.Linear(64, 128), tw.nn.GELU(), tw.nn.Linear(128, 10)).to("cuda")
        opt = (tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
               else tw.optim.AdamW(model.parameters(), lr=1e-2))
        return model, opt

    data = [(tw.randn(32, 64, device="cuda"), tw.randint(0, 10, (32,), device="cuda")) for _ in range(6)]
    losses = {}
    for mode in ("eager", "compiled"):
        model, opt = make()

        def step(x, y, model=model, opt=opt):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        run = tw.compile(step) if mode == "compiled" else step
        losses[mode] = [float(run(x, y).item()) for x, y in data]
    np.testing.assert_allclose(losses["compiled"], losses["eager"], rtol=1e-4, atol=1e-5)


def test_a_long_row_is_split_even_when_its_elements_are_stored_too():
    def norm_and_scaled(g):
        c = g.clone()
        return c, (c * c).sum().sqrt()

    _, plans = cuda_plans(norm_and_scaled, tw.randn(589824))
    assert [p.split > 1 for p in plans] == [True]


def _guarded_softmax(x):
    """A softmax that subtracts 0 from a row that is all -inf (attention's masked rows)."""
    m = x.amax(-1, keepdim=True)
    e = (x - tw.where(m == float("-inf"), 0.0, m)).exp()
    return e / e.sum(-1, keepdim=True)


def test_a_long_row_softmax_sums_its_exponentials_in_the_pass_that_finds_the_max():
    """Rows too long for registers: the softmax reads its row twice (max with the rescaled sum, then the
    normalisation), not three times; with the knob off it takes the three passes. NVRTC compiles both."""
    from tilewise.codegen.schedule import Knobs, schedule_cuda
    from tilewise.codegen.toolchain import compile_cached

    low, (plan,) = cuda_plans(lambda x: x.float().softmax(-1).bfloat16(), tw.randn(64, 100000).bfloat16())
    (sched,) = low.schedules
    assert plan.online and not plan.in_registers and sched.nests[0].nest.phases == 2
    assert "online softmax" in sched.describe()
    plain = schedule_cuda(sched.kernel, Knobs(online=False))
    assert not plain.nests[0].cuda.online and plain.nests[0].nest.phases == 3
    compile_cached(low.source, sched.kernel.name, "sm_90")
    _, (guarded,) = cuda_plans(_guarded_softmax, tw.randn(64, 100000))
    assert guarded.online
    _, (kept,) = cuda_plans(lambda x: x.softmax(-1), tw.randn(64, 4096))
    assert kept.in_registers and not kept.online  # one pass over memory already: rescaling would only add work


def test_a_few_long_rows_of_logsumexp_fold_max_and_sum_in_one_split_pass():
    """max and the sum of exp(x - max) in one phase: a few long rows are then split across blocks, whose
    partial (max, sum) pairs the row's last block combines."""
    from tilewise.codegen.toolchain import compile_cached

    low, (plan,) = cuda_plans(lambda x: (x - x.amax(1, keepdim=True)).exp().sum(1).log(), tw.randn(8, 200000))
    assert plan.online and plan.split > 1 and low.schedules[0].nests[0].nest.phases == 1
    compile_cached(low.source, low.schedules[0].kernel.name, "sm_90")


def test_a_one_hot_compare_reads_positions_not_a_buffer_of_them():
    """cross_entropy's gradient selects the target's column by comparing positions with it: an integer arange
    read by a kernel is its index (no buffer, no launch to fill one), so the bf16 logits keep 16-byte
    vectors (an int32 buffer beside them would allow 4 lanes, not 8)."""
    x = tw.randn(64, 1000).bfloat16().requires_grad_()
    target = tw.randint(0, 1000, (64,))

    def loss_and_grad(x, t):
        loss = F.cross_entropy(x.float(), t)
        loss.backward()
        return loss.detach()

    graph = run_pipeline(trace(loss_and_grad, (x, target), {}).graph)
    low = lower_program(graph, CUDA_TARGET)
    loads = [ld for k in low.kernels.values() for nest in k.nests for ld in nest.loads]
    assert any(ld.iota == (0, 1) for ld in loads)
    assert not any(v.op == "arange" for k in low.kernels.values() for v in k.values)
    rows = [ns.cuda for s in low.schedules for ns in s.nests if ns.cuda.strategy == "rows"]
    assert max(p.vector for p in rows) == 8
    assert "(arange, int32)" in "\n".join(str(k) for k in low.kernels.values())


def test_a_cross_entropy_gradient_over_long_rows_is_two_passes_with_the_row_constants_taken_once():
    """The loss and its gradient over a 50k vocabulary: max with the rescaled sum, then the gradient. The
    target's share of q is known (no third reduction summing the one-hot row); the per-row target, weight
    and ``1 / sum`` are computed before the loop, not per element; the bf16 gradient is converted once."""
    x = tw.empty(16, 50304, dtype=tw.bfloat16).requires_grad_()

    def loss_and_grad(x, t):
        loss = F.cross_entropy(x.float(), t)
        loss.backward()
        return loss.detach()

    low = lower_program(run_pipeline(trace(loss_and_grad, (x, tw.zeros(16, dtype=tw.int64)), {}).graph), CUDA_TARGET)
    (sched,) = [s for s in low.schedules if s.nests[0].nest.shape[-1] == 50304]
    nest = sched.nests[0].nest
    assert sched.nests[0].cuda.online and nest.phases == 2 and len(nest.reductions) == 2
    source = low.sources[sched.kernel.name]
    body = source.split("__global__", 1)[1]
    last_loop = body.rsplit("for (int j", 1)[1]
    assert " / " not in last_loop and "h1_" in last_loop  # 1 / sum is taken once, before the loop
    assert "__bfloat162float(__float2bfloat16_rn(" not in last_loop


@pytest.mark.cuda
def test_online_softmax_and_cross_entropy_over_long_rows_on_cuda():
    """Rows with leading -inf (a thread's first elements all masked), a row all -inf, many long bf16 rows with
    a loss and its gradient, and a few split rows: as eager computes them in two passes."""
    x = tw.randn(16, 70000, device="cuda") * 4
    x[3, :40000] = float("-inf")
    x[5] = float("-inf")
    f = tw.compile(lambda x: (x.softmax(-1), x.log_softmax(-1), _guarded_softmax(x)))
    for got, want in zip(f(x), (x.softmax(-1), x.log_softmax(-1), _guarded_softmax(x))):
        _close(got[:5], want[:5], 1e-5, 1e-7)
        _close(got[6:], want[6:], 1e-5, 1e-7)
        assert bool(got[5].isnan().all().item()) == bool(want[5].isnan().all().item())

    logits = (tw.randn(1100, 9000, device="cuda") * 3).bfloat16().requires_grad_()
    target = tw.randint(0, 9000, (1100,), device="cuda")

    def loss_and_grad(x, t):
        loss = F.cross_entropy(x.float(), t)
        loss.backward()
        return loss.detach()

    want = loss_and_grad(logits, target)
    want_grad, logits.grad = logits.grad, None
    got = tw.compile(loss_and_grad)(logits, target)
    _close(got, want, 1e-5, 1e-6)
    _close(logits.grad, want_grad, 1e-2, 1e-6)

    few = tw.randn(8, 200000, device="cuda") * 4
    lse = tw.compile(lambda x: (x - x.amax(1, keepdim=True)).exp().sum(1).log())
    _close(lse(few), (few - few.amax(1, keepdim=True)).exp().sum(1).log(), 1e-5, 1e-6)


@pytest.mark.cuda
def test_split_sum_with_element_stores_on_cuda():
    f = tw.compile(lambda g: ((g * 2).exp(), (g * g).sum().sqrt()))
    g = tw.randn(589824, device="cuda")
    for _ in range(2):
        a, b = f(g)
        _close(a, (g * 2).exp(), 1e-5, 1e-6)
        _close(b, (g * g).sum().sqrt(), 1e-5, 1e-6)


def _epilogue_graph(fn, *args):
    from tilewise.compiler.lowering.epilogues import gemm_epilogues

    return gemm_epilogues(run_pipeline(trace(fn, args, {}).graph))


def test_linear_bias_gelu_becomes_one_gemm_with_its_epilogue():
    w, b = tw.randn(32, 16), tw.randn(32)
    graph = _epilogue_graph(lambda x: F.gelu(F.linear(x, w, b), approximate="tanh"), tw.randn(8, 16))
    assert [n.op for n in graph.body if n.kind != "view"] == ["_addmm_activation"]
    assert graph.body[-1].args[-1] is True  # use_gelu
    graph = _epilogue_graph(lambda x: F.linear(x, w, b).relu(), tw.randn(8, 16))
    assert [n.op for n in graph.body if n.kind != "view"] == ["_addmm_activation"]
    graph = _epilogue_graph(lambda x: F.linear(x, w, b), tw.randn(8, 16))
    assert [n.op for n in graph.body if n.kind != "view"] == ["addmm"]


def test_a_linear_layer_over_a_3d_input_takes_the_epilogue_through_its_reshape():
    """F.linear over [batch, time, features] multiplies a 2-D view and views the product back before the bias
    is added: the bias (and the activation) still join the GEMM, whose result is viewed instead."""
    w, b = tw.randn(32, 16), tw.randn(32)
    x = tw.randn(2, 4, 16)
    graph = _epilogue_graph(lambda x: F.linear(x, w, b), x)
    assert [n.op for n in graph.body if n.kind != "view"] == ["addmm"]
    assert graph.outputs[0].op == "view" and graph.outputs[0].type.shape == (2, 4, 32)
    graph = _epilogue_graph(lambda x: F.gelu(F.linear(x, w, b), approximate="tanh"), x)
    assert [n.op for n in graph.body if n.kind != "view"] == ["_addmm_activation"]
    from tilewise.compiler.program import build_program
    from tilewise.compiler.targets import C_TARGET

    program = build_program(graph, C_TARGET)  # the C target runs the rewritten graph: it means what the original did
    expected = F.gelu(F.linear(x, w, b), approximate="tanh")
    by_shape = {t.shape: np.ascontiguousarray(t.numpy()).reshape(-1) for t in (x, w, b)}
    (out,) = program.run([by_shape[i.type.shape] for i in graph.inputs], frozenset())
    np.testing.assert_allclose(np.asarray(out).reshape(2, 4, 32), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_an_epilogue_is_not_taken_when_the_product_is_read_elsewhere():
    w, b = tw.randn(32, 16), tw.randn(32)

    def f(x):
        y = x @ w.t()
        return (y + b).relu(), y.sum()

    graph = _epilogue_graph(f, tw.randn(8, 16))
    assert "mm" in [n.op for n in graph.body] and "_addmm_activation" not in [n.op for n in graph.body]
    graph = _epilogue_graph(lambda x: F.gelu(F.linear(x, w, b)), tw.randn(8, 16))  # exact GELU: no epilogue
    assert "_addmm_activation" not in [n.op for n in graph.body]


def _mlp_step(x, w1, b1, w2):
    """A linear + GELU(tanh) + linear block's gradients: the pre-activation is read again by the backward."""
    h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
    loss = (F.linear(h, w2) ** 2).sum()
    return tw.autograd.grad(loss, [x, w1, b1, w2])


def _mlp_args(device="cpu", dtype=None, rows=(4, 6), features=(16, 32, 8)):
    d_in, d_hidden, d_out = features
    made = [tw.randn(*rows, d_in), tw.randn(d_hidden, d_in) * 0.3, tw.randn(d_hidden), tw.randn(d_out, d_hidden) * 0.3]
    return [t.to(device, dtype or tw.float32).requires_grad_() for t in made]


def test_a_training_steps_linear_gelu_takes_gelu_epilogues_that_keep_its_input():
    """Where GELU's input is read again by its backward, the forward becomes one call writing the GELU and its
    input, and the backward's product and GELU derivative another; both mean what the nodes they replace did
    (the C target runs their decompositions)."""
    from tilewise.compiler.program import build_program
    from tilewise.compiler.targets import C_TARGET

    args = _mlp_args()
    graph = _epilogue_graph(_mlp_step, *args)
    ops = [n.op for n in graph.body]
    assert ops.count("_addmm_gelu") == 1 and ops.count("_mm_gelu_backward") == 1
    assert "gelu" not in ops and "gelu_backward" not in ops
    program = build_program(graph, C_TARGET)
    outs = program.run([np.ascontiguousarray(a.detach().numpy()).reshape(-1) for a in args], frozenset())
    for out, expected in zip(outs, _mlp_step(*args)):
        np.testing.assert_allclose(np.asarray(out).reshape(expected.shape), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_gelu_epilogues_are_not_taken_for_the_exact_gelu():
    def exact(x, w1, b1, w2):
        loss = (F.linear(F.gelu(F.linear(x, w1, b1)), w2) ** 2).sum()
        return tw.autograd.grad(loss, [x, w1, b1, w2])

    ops = [n.op for n in _epilogue_graph(exact, *_mlp_args()).body]
    assert "_addmm_gelu" not in ops and "_mm_gelu_backward" not in ops and "gelu_backward" in ops


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gelu_epilogues_with_a_second_matrix_on_cuda(dtype):
    """The eager kernels of _addmm_gelu and _mm_gelu_backward take cuBLASLt's GELU_AUX_BIAS and DGELU epilogues
    where the operands fit, and their decomposition where they do not (a row of 20 elements)."""
    from tilewise.backends.cuda import matmul
    from tilewise.ops.registry import OPS

    dt = getattr(tw, dtype)
    tol = 2e-3 if dtype == "float32" else 3e-2
    for n in (3072, 20):
        bias, x = tw.randn(n, device="cuda").to(dt), tw.randn(256, 768, device="cuda").to(dt)
        w = (tw.randn(n, 768, device="cuda") * 0.03).to(dt)
        out, pre = tw._addmm_gelu(bias, x, w.t())
        want_out, want_pre = OPS["_addmm_gelu"].decomposition(bias, x, w.t())
        _close(pre, want_pre, tol, tol)
        _close(out, want_out, tol, tol)
        grad_out = (tw.randn(256, 768, device="cuda") * 0.1).to(dt)
        grad = tw._mm_gelu_backward(grad_out, w.t(), pre)
        want = OPS["_mm_gelu_backward"].decomposition(grad_out, w.t(), pre)
        _close(grad, want, tol, tol * float(want.abs().max()))
    taken = {key[9] for key in matmul._plans if key[1] is dt}
    assert {"gelu_aux_bias", "dgelu"} <= taken, taken


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_compiled_mlp_step_runs_its_gelu_as_two_gemm_epilogues_on_cuda(dtype):
    dt = getattr(tw, dtype)
    args = _mlp_args("cuda", dt, rows=(4, 64), features=(128, 512, 64))
    compiled = tw.compile(_mlp_step)
    tol = 2e-3 if dtype == "float32" else 5e-2
    expected = _mlp_step(*args)
    for _ in range(3):  # the first run chooses the algorithms, the later ones replay the CUDA graph
        for got, want in zip(compiled(*args), expected):
            _close(got, want, tol, tol * float(want.abs().max()))
    (program,) = compiled.programs()
    calls = [s.describe() for s in program.steps if hasattr(s, "node")]
    assert any(c.startswith("call _addmm_gelu [into its buffer]") for c in calls), calls
    assert any(c.startswith("call _mm_gelu_backward [into its buffer]") for c in calls), calls
    assert all(s.capturable for s in program.steps if getattr(s, "node", None) is not None
               and s.node.op in ("_addmm_gelu", "_mm_gelu_backward"))


def test_addmm_activation_with_gelu_is_the_tanh_approximation():
    b, m1, m2 = tw.randn(5), tw.randn(3, 4), tw.randn(4, 5)
    expected = F.gelu(tw.addmm(b, m1, m2), approximate="tanh")
    np.testing.assert_allclose(tw._addmm_activation(b, m1, m2, use_gelu=True).numpy(), expected.numpy(), rtol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_linear_bias_gelu_on_cuda_is_one_cublaslt_call(dtype):
    dt = getattr(tw, dtype)
    w, b = tw.randn(3072, 768, device="cuda").to(dt) * 0.03, tw.randn(3072, device="cuda").to(dt)

    def f(x):
        return F.gelu(F.linear(x, w, b), approximate="tanh")

    compiled = tw.compile(f)
    x = tw.randn(256, 768, device="cuda").to(dt)
    tol = 1e-3 if dtype == "float32" else 3e-2
    for _ in range(2):
        _close(compiled(x), f(x), tol, tol)
    (program,) = compiled.programs()
    assert program.kernel_count == 0 and [s.node.op for s in program.steps] == ["_addmm_activation"]


# ---------------------------------------------------------------------------- eager composites, compiled

def test_a_composite_runs_as_its_compiled_decomposition_once_per_signature():
    """The mechanism the CUDA backend uses for ``FUSED`` composites, exercised with the C target."""
    from tilewise.compiler import composites as fused
    from tilewise.dispatch import STATE
    from tilewise.ops.registry import OPS

    def program_of(op, args):  # earlier CUDA tests may have compiled other signatures of the same operator
        return fused._programs[(STATE.grad_enabled, *fused._key(op, args))]

    op = OPS["softmax"]
    x = tw.randn(6, 50)
    out = fused.run_fused(op, (x, 1, None))
    _close(out, op.decomposition(x, 1, None))
    compiled = program_of(op, (x, 1, None))
    assert sum(p.kernel_count for p in compiled.programs()) == 1
    y = tw.randn(6, 50)
    _close(fused.run_fused(op, (y, 1, None)), op.decomposition(y, 1, None))
    assert len(compiled.variants) == 1, "same signature: the program is reused"
    for name in ("_softmax_backward_data", "_log_softmax_backward_data"):
        backward = OPS[name]
        args = (tw.randn(6, 50), tw.randn(6, 50).softmax(1), 1, tw.float32)
        # grad * out - out * sum(grad * out) cancels: the summation order shows at about 1e-6
        _close(fused.run_fused(backward, args), backward.decomposition(*args), 1e-5, 1e-5)
        kernels = sum(p.kernel_count for p in program_of(backward, args).programs())
        assert kernels == 1, f"{name}: one read, one write"
        # once compiled, a call with the same key runs the variant without its guards, unless tensors share memory
        variant, last = fused._variants[(STATE.grad_enabled, *fused._key(backward, args))]
        assert variant is program_of(backward, args).variants[0] and not last
        same = tw.randn(6, 50).softmax(1)
        aliased = (same, same, 1, tw.float32)
        _close(fused.run_fused(backward, aliased), backward.decomposition(*aliased), 1e-5, 1e-5)
    ln = OPS["native_layer_norm"]
    w, b = tw.randn(50), tw.randn(50)
    for got, want in zip(fused.run_fused(ln, (x, [50], w, b, 1e-5)), ln.decomposition(x, [50], w, b, 1e-5)):
        _close(got, want, 1e-5, 1e-6)
    # cross entropy, forward and backward, with an ignored target, class weights and label smoothing
    loss, loss_backward = OPS["_cross_entropy_loss"], OPS["_cross_entropy_backward"]
    target = tw.tensor([3, -100, 49, 0, 7, 7])
    for rest in ((None, "mean", -100, 0.0), (tw.rand(50), "sum", -100, 0.1), (None, "none", -100, 0.0)):
        args = (x, target, *rest)
        want, logp = loss.decomposition(*args)
        for got, ref in zip(fused.run_fused(loss, args), (want, logp)):
            _close(got, ref, 1e-5, 1e-6)
        grad_args = (tw.randn(*want.shape), logp, *args[1:])
        _close(fused.run_fused(loss_backward, grad_args), loss_backward.decomposition(*grad_args), 1e-5, 1e-6)
        backward = program_of(loss_backward, grad_args)
        assert sum(p.kernel_count for p in backward.programs()) <= 4
        # q, the target distribution, is computed in the kernel that reads it: nothing of the logits' size is kept
        assert all(p.plan.arena_bytes < x.numel() * 4 for p in backward.programs())  # (its arena is shared)


@pytest.mark.cuda
def test_eager_softmax_and_layer_norm_on_cuda_are_one_kernel_each():
    from tilewise.compiler import composites as fused

    x = tw.randn(64, 1000, device="cuda", requires_grad=True)
    w, b = tw.randn(1000, device="cuda"), tw.randn(1000, device="cuda")
    y = F.layer_norm(x.softmax(-1), (1000,), w, b)
    y.sum().backward()
    ref = x.detach().cpu().requires_grad_(True)
    yr = F.layer_norm(ref.softmax(-1), (1000,), w.cpu(), b.cpu())
    yr.sum().backward()
    _close(y, yr, 1e-4, 1e-4)
    _close(x.grad, ref.grad, 1e-3, 1e-4)
    names = {op.name for (_, op, _), f in fused._programs.items() if f is not None}
    assert {"softmax", "native_layer_norm"} <= names or {"softmax", "layer_norm"} <= names
    assert {"_softmax_backward_data", "_layer_norm_backward"} <= names


@pytest.mark.cuda
def test_eager_cross_entropy_on_cuda_runs_compiled_forward_and_backward():
    from tilewise.compiler import composites as fused

    logits = tw.randn(256, 5000, device="cuda").to(tw.bfloat16).requires_grad_(True)
    target = tw.randint(0, 5000, (256,), device="cuda")
    target[5] = -100
    with tw.autocast(device_type="cuda", dtype=tw.bfloat16):
        loss = F.cross_entropy(logits, target)
    loss.backward()
    ref = logits.detach().cpu().float().requires_grad_(True)
    want = F.cross_entropy(ref, target.cpu())
    want.backward()
    _close(loss, want, 1e-4, 1e-4)
    _close(logits.grad.float(), ref.grad, 1e-2, 1e-5)
    names = {op.name for (_, op, _), f in fused._programs.items() if f is not None}
    assert {"_cross_entropy_loss", "_cross_entropy_backward"} <= names


# ---------------------------------------------------------------------------- library calls inside graphs

def _gpt_step(device: str):
    from tilewise.models import gpt

    tw.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)).to(device)
    opt = tw.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        tw.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def test_every_library_call_of_a_gpt_training_step_can_write_into_its_planned_buffer():
    """Embedding lookup and its backward, cross_entropy's gather (its scatter becomes a select over positions),
    the q/k/v split's backward (a cat) and clip_grad_norm_'s cat are library calls in the compiled step: each
    has a kernel into a given output, so a CUDA graph can hold the whole step (GEMMs go to cuBLASLt, which
    writes into the buffer too)."""
    from tilewise.backends.cuda import _load_kernels
    from tilewise.backends.cuda.kernels import INTO
    from tilewise.compiler.lowering.fusion import fusion_kind

    _load_kernels()
    compiled = tw.compile(_gpt_step("cpu"))
    for _ in range(2):
        compiled(tw.randint(0, 64, (4, 16)), tw.randint(0, 64, (4, 16)))
    calls = {n.opdef.full_name for p in compiled.programs() for n in p.graph.body
             if n.op not in ("fused", "getitem") and fusion_kind(n) == "extern"}
    library = {"mm", "bmm", "addmm", "_addmm_activation"}
    assert {"index.Tensor", "index_put", "gather", "cat"} <= calls  # the step really has such calls
    assert not calls - library - set(INTO)


@pytest.mark.cuda
def test_a_gpt_training_step_replays_as_one_cuda_graph_and_matches_eager():
    data = [(tw.randint(0, 64, (4, 16), device="cuda"), tw.randint(0, 64, (4, 16), device="cuda")) for _ in range(5)]
    step = _gpt_step("cuda")
    eager = [float(step(x, y).item()) for x, y in data]
    compiled = tw.compile(_gpt_step("cuda"))
    losses = [float(compiled(x, y).item()) for x, y in data]
    np.testing.assert_allclose(losses, eager, rtol=1e-4, atol=1e-5)
    runtimes = [p.runtime for p in compiled.programs()]
    assert all(r.graphs and not r.why_not for r in runtimes[-1:]), [r.why_not for r in runtimes]
    steps = [s.describe() for s in compiled.programs()[-1].steps]
    assert not [s for s in steps if "[eager]" in s], steps
    launches = [s for s in compiled.programs()[-1].steps if hasattr(s, "function")]
    assert len({id(s.function) for s in launches}) < len(launches)  # the two layers' kernels are loaded once
    assert [s for s in steps if " as " in s]


def test_kernels_that_differ_only_in_name_share_one_name_made_from_their_text():
    from tilewise.compiler.program_cuda import shared_name

    body = "{ out[threadIdx.x] = a[threadIdx.x] * 2.0f; }"
    unit = 'extern "C" __global__ void NAME(const float* a, float* out) ' + body
    first, second = shared_name("k3_mul", unit.replace("NAME", "k3_mul")), \
        shared_name("k17_mul", unit.replace("NAME", "k17_mul"))
    assert first == second and first[0].startswith("mul_") and f" {first[0]}(" in first[1]
    other = shared_name("k3_mul", unit.replace("NAME", "k3_mul").replace("2.0f", "3.0f"))
    assert other[0] != first[0] and other[0].startswith("mul_")
    assert shared_name("odd", "void odd(); void odd() {}") == ("odd", "void odd(); void odd() {}")


@pytest.mark.cuda
def test_a_bad_index_inside_a_replayed_graph_is_reported_with_its_operator():
    table = tw.randn(10, 8, device="cuda")

    def f(idx, w):
        return (F.embedding(idx, table) * w).sum(-1).softmax(-1)

    compiled = tw.compile(f)
    w = tw.randn(8, device="cuda")
    for _ in range(3):
        compiled(tw.randint(0, 10, (4, 5), device="cuda"), w)
    assert _runtime(compiled).graphs
    bad = tw.randint(0, 10, (4, 5), device="cuda")
    bad[1, 2] = 12
    with pytest.raises(IndexError, match=r"index.*12 is out of bounds.*size 10"):
        compiled(bad, w)
        tw.cuda.synchronize()
    np.testing.assert_allclose(compiled(bad.clamp(0, 9), w).cpu().numpy(), f(bad.clamp(0, 9), w).cpu().numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_a_cat_laid_out_in_place_on_cuda():
    ws = [tw.randn(5, 3, device="cuda") for _ in range(6)]

    def norms(extra):
        scalars = [w.square().sum().sqrt().reshape(1) for w in ws]
        return tw.cat(scalars + [extra, (ws[0] * 2).reshape(15), (ws[1] * 3).reshape(15)]).exp()

    compiled = tw.compile(norms)
    for _ in range(3):  # the third call replays a graph
        extra = tw.randn(2, device="cuda")
        _close(compiled(extra), norms(extra))
    assert len(compiled.programs()[0].plan.cat_copies) == 1 and _runtime(compiled).graphs


@pytest.mark.cuda
def test_cross_entropy_with_a_target_out_of_range_still_raises_when_compiled():
    """The loss's one-hot scatter is a select in the compiled step; its gather still checks the targets."""
    x = tw.randn(6, 50, device="cuda", requires_grad=True)

    def step(x, y):
        loss = F.cross_entropy(x, y)
        loss.backward()
        return loss.detach()

    compiled = tw.compile(step)
    compiled(x, tw.randint(0, 50, (6,), device="cuda"))
    bad = tw.randint(0, 50, (6,), device="cuda")
    bad[3] = 57
    # torch on CUDA stops at a device-side assert (RuntimeError); the compiled step reports the gather's bounds
    # error, which is torch's RuntimeError for a gather
    with pytest.raises(RuntimeError, match=r"57 is out of bounds"):
        compiled(x, bad)
        tw.cuda.synchronize()


@pytest.mark.cuda
def test_a_kernel_that_fails_to_compile_raises_before_the_step_updates_the_callers_tensors(monkeypatch):
    """A compile error is raised before the program runs: the parameters and the optimizer's state, which the
    step updates in place, are as they were."""
    from tilewise.codegen.toolchain import KernelCompileError
    from tilewise.codegen.toolchain.cache import KernelCache

    compile_cached, refused = KernelCache.compile, []

    def refusing(cache, source, names, *args, **kwargs):  # every compile, on the pool's threads too, comes here
        if "lerp" in str(names):  # AdamW's moment update
            refused.append(names)
            raise KernelCompileError([names], "sm_90", "NVRTC_ERROR_COMPILATION", "refused by the test", source,
                                     "kernel.cu")
        return compile_cached(cache, source, names, *args, **kwargs)

    monkeypatch.setattr(KernelCache, "compile", refusing)
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.Linear(16, 32), tw.nn.GELU(), tw.nn.Linear(32, 4)).to("cuda")
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().cpu().numpy().copy() for p in model.parameters()]

    @tw.compile
    def step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    with pytest.raises(KernelCompileError, match="refused by the test"):
        step(tw.randn(8, 16, device="cuda"))
    assert refused
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.detach().cpu().numpy(), b)
    assert all(float(s["exp_avg"].abs().sum().item()) == 0 for s in opt.state.values())


@pytest.mark.cuda
@pytest.mark.parametrize("case", range(4))
def test_transposing_tiles_on_cuda_match_eager_exactly(case):
    fn, args, _ = _transposing_cases()[case]
    args = tuple(a.to("cuda") for a in args)
    f = tw.compile(fn)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for _ in range(2):
        got = f(*args)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, want):
            assert g.shape == e.shape and g.dtype == e.dtype
            assert tw.equal(g.view(tw.uint8) if g.dtype == tw.float8_e4m3fn else g,
                            e.view(tw.uint8) if e.dtype == tw.float8_e4m3fn else e)


@pytest.mark.cuda
@pytest.mark.parametrize("case", range(len(_tile_host_cases())), ids=[c[0] for c in _tile_host_cases()])
def test_tiled_kernels_on_cuda_match_eager_on_the_cpu_bit_for_bit(case):
    """The host-run cases of the tiled kernels on the GPU, compiled, against the CPU's eager results: the same
    bits, float8 conversions (saturation, overflow) included, NaN's sign aside: the GPU's arithmetic on a NaN gives
    the positive canonical NaN (so does torch's CUDA multiply), where the CPU keeps the operand's sign."""
    _, fn, inputs = _tile_host_cases()[case]
    want = fn(**inputs)
    got = tw.compile(fn)(*(v.to("cuda") for v in inputs.values()))
    want, got = (w if isinstance(w, tuple) else (w,) for w in (want, got))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        g = g.cpu().contiguous()
        w = w.contiguous()
        nan = w.float().isnan().numpy().reshape(-1)
        assert np.array_equal(g.float().isnan().numpy().reshape(-1), nan)
        gb, wb = (np.frombuffer(t.numpy().tobytes(), np.uint8).reshape(t.numel(), -1) for t in (g, w))
        assert gb[~nan].tobytes() == wb[~nan].tobytes()


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(1, 1), (31, 33), (32, 32), (33, 31), (1000, 17), (17, 1000), (2, 3, 70, 45)])
@pytest.mark.parametrize("dtype", [tw.float32, tw.bfloat16, tw.float64, tw.int8, tw.bool])
def test_transposing_copies_on_cuda_at_ragged_sizes(shape, dtype):
    """Tiles cut at the edges and a batch dim: every element of a transposing copy and of a sum with a
    transposed operand lands where eager puts it."""
    x = (tw.randn(*shape, device="cuda") * 50).to(dtype)
    def fn(x):
        return x.transpose(-1, -2).contiguous(), x != 0

    f = tw.compile(fn)
    for got, want in zip(f(x), fn(x)):
        assert got.shape == want.shape and tw.equal(got, want)
