"""Every generated CUDA kernel compiles (NVRTC, sm_90, no GPU needed), and the shared C-style renderer computes
what numpy computes (its C target, built with the host compiler, against the CPU backend).

The kernels are the ones the CUDA backend would launch: every pointwise operator x every dtype its dtype
rule accepts, in the contiguous-vector, strided/broadcast and by-value-scalar specialisations; every
reduction x dtype in the row, column and split (two-pass) schedules; the arg-reductions; every cast
between two dtypes. Kernels are compiled many to one NVRTC program, which is what makes this affordable. The
default run leaves out specialisations that repeat what others check (see [Note: the quick kernel compiles]).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tilewise as tw
from tilewise import dtypes
from tilewise.backends.cuda.kernels.pointwise import (
    CONTIGUOUS,
    PTR,
    STRIDED,
    VALUE,
    kernel_prefix,
    kernel_specs,
    op_geometry,
    pointwise_kernel,
)
from tilewise.backends.cuda.kernels.reduction import reduction_specs
from tilewise.codegen.render import C
from tilewise.codegen.render.cstyle import compute_of
from tilewise.codegen.render.cuda import accumulator
from tilewise.codegen.render.kernel_c import render_program as render_c_program
from tilewise.codegen.render.kernel_cuda import render_source
from tilewise.codegen.schedule import schedule_c, schedule_cuda
from tilewise.codegen.toolchain import nvrtc_available
from tilewise.ops.expr import Expr
from tilewise.ops.registry import OPS

pytestmark = pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")

ALL_DTYPES = tuple(d for d in dtypes.ALL if not d.is_complex)  # complex kernels run on the real parts
# the MX scale and packed FP4 dtypes are storage formats: no arithmetic, no order (torch, and the dispatcher, refuse
# every operator on them but casts, copies, == and !=), so no other pointwise, reduction, scan or sort kernel is made
ARITHMETIC_DTYPES = tuple(d for d in ALL_DTYPES if d not in (dtypes.float8_e8m0fnu, dtypes.float4_e2m1fn_x2))
STR_CHOICES = {"approximate": ("none", "tanh")}
BATCH = 120


def _placeholder(dtype):
    return tw.zeros((4, 8), dtype=dtype) if dtype.category else tw.zeros((4, 8), dtype=dtypes.uint8).bool()


def _variants(op, dtype):
    """Bound argument tuples covering each expression variant of ``op`` with tensors of ``dtype``."""
    base, choices = [], []
    for p in op.schema.params:
        if p.type == "Tensor":
            base.append(_placeholder(dtype))
        elif p.name in STR_CHOICES:
            base.append(None)
            choices.append((len(base) - 1, STR_CHOICES[p.name]))
        elif p.has_default:
            base.append(p.default)
        else:
            base.append(0.5)
    out = [tuple(base)]
    for k, values in choices:
        out = [a[:k] + (v,) + a[k + 1:] for a in out for v in values]
    return out


# [Note: the quick kernel compiles] The default run compiles every operator's expression for every dtype in the
# strided and by-value specialisations (the ones whose code depends on the operator and the operand types); the
# contiguous scalar and vector ones differ from those in their loads and stores alone, which depend on the dtype,
# so ``ALL_SPECIALISATIONS`` keep them in the default run for every dtype. The test marked ``slow`` compiles all.
ALL_SPECIALISATIONS = frozenset({"add", "mul", "abs", "where", "clamp", "eq", "copysign", "gelu"})


def _pointwise_specs(every: bool = True):
    specs = []
    for op in OPS.values():
        if op.kind != "pointwise":
            continue
        for dtype in ALL_DTYPES if op.name in ("eq", "ne") else ARITHMETIC_DTYPES:
            for args in _variants(op, dtype):
                try:
                    compute, expr, scalars, described, out = op_geometry(op, args)
                except (TypeError, RuntimeError):
                    continue  # the dtype rule rejects this dtype, as it would on any device
                described = [(PTR, dtype, (4, 8), (8, 1)) for _ in described]
                name = kernel_prefix(op, expr)
                if every or op.name in ALL_SPECIALISATIONS:
                    contiguous = kernel_specs(name, (expr,), compute, described, scalars, out)
                    specs += [s for s in (contiguous.scalar, contiguous.vector) if s is not None]
                strided = [(PTR, dtype, (4, 8), (1, 4))] + [(PTR, dtype, (8,), (1,)) for _ in described[1:]]
                specs.append(kernel_specs(name, (expr,), compute, strided, scalars, out).scalar)
                if len(described) > 1:
                    valued = [(PTR, dtype, (4, 8), (8, 1))] + [(VALUE, float) for _ in described[1:]]
                    specs.append(kernel_specs(name, (expr,), compute, valued, scalars, out).scalar)
    return specs


def _cast_specs():
    specs = []
    identity = Expr("input", (), 0)
    for src in ALL_DTYPES:
        for dst in ALL_DTYPES:
            for saturate in (False, True) if dst.is_float8 else (False,):
                out = (dst, (4, 8), (8, 1))
                name = f"copy{'_sat' if saturate else ''}"
                got = kernel_specs(name, (identity,), compute_of(src), [(PTR, src, (4, 8), (1, 4))], (), out, saturate)
                specs.append(got.scalar)
    return specs


REDUCE_COMBINERS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min", "any": "or", "all": "and"}


def _reduction_specs():
    specs = []
    # rows (vector and scalar), columns, a split row, split columns, two reduced dims, short rows (columns),
    # rows over a transposed input, and a 0-d input
    geometries = [((64, 512), (512, 1), (1,)), ((512, 64), (64, 1), (0,)), ((1 << 20,), (1,), (0,)),
                  ((8192, 64), (64, 1), (0,)), ((4, 6, 8), (48, 8, 1), (0, 2)), ((4096, 4), (4, 1), (1,)),
                  ((96, 80), (1, 96), (1,)), ((), (), ())]
    for op_name, combiner in REDUCE_COMBINERS.items():
        op = OPS[op_name]
        for dtype in ARITHMETIC_DTYPES:
            try:
                out_dtype, compute = op.dtype_rule(op, (_placeholder(dtype), None, False, None)[:len(op.schema.params)])
            except (TypeError, RuntimeError):
                continue
            acc = accumulator(combiner, dtype, compute)
            for shape, strides, dims in geometries:
                passes, *_ = reduction_specs(op_name, combiner, dtype, shape, strides, dims, acc, out_dtype, False, 132)
                specs += [k for p in passes for k in (p.spec, p.vector) if k is not None]
    for name, combiner, values in (("argmax", "argmax", False), ("argmin", "argmin", False), ("max", "argmax", True),
                                   ("min", "argmin", True)):
        for dtype in ARITHMETIC_DTYPES:
            if dtype.is_float8:
                continue
            for shape, strides, dims in (((64, 512), (512, 1), (1,)), ((512, 64), (64, 1), (0,)),
                                         ((8, 6, 50), (1, 400, 8), (2,)), ((), (), ())):
                acc = accumulator(combiner, dtype, dtype)
                passes, *_ = reduction_specs(name, combiner, dtype, shape, strides, dims, acc,
                                             dtype if values else None, True, 132)
                specs += [k for p in passes for k in (p.spec, p.vector) if k is not None]
    return specs


def _name(spec) -> str:
    """A kernel's name: a schedule's kernel's, or a template spec's own."""
    return spec.kernel.name if hasattr(spec, "kernel") else spec.name


def _compile_all(specs, render) -> int:
    unique = {}
    for spec in specs:
        if _name(spec) not in unique:
            try:
                unique[_name(spec)] = render(spec)
            except TypeError:
                continue  # arithmetic numpy and torch reject for this dtype (bool subtraction, ...)
    shadowing = {name: found for name, source in unique.items() if (found := _shadowed_parameters(source))}
    assert shadowing == {}, "kernel bodies that hide a parameter (the parameter's value is never read)"
    return _compile_sources(unique)


def _compile_sources(sources: dict[str, str]) -> int:
    """Compile the kernels in batches, a batch per core at a time (NVRTC runs outside the GIL); every kernel must
    reach the PTX."""
    from tilewise.codegen.toolchain import compile_cuda

    names = sorted(sources)

    def compile_batch(batch):
        compiled = compile_cuda("\n".join(sources[n] for n in batch), batch, "sm_90")
        return [n for n in batch if f".entry {n}(" not in compiled.ptx]

    batches = [names[start:start + BATCH] for start in range(0, len(names), BATCH)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for missing in pool.map(compile_batch, batches):
            assert not missing, f"kernels missing from the PTX: {missing[:5]}"
    return len(names)


def test_every_pointwise_expression_compiles_for_every_dtype():
    """The quick subset (see [Note: the quick kernel compiles])."""
    count = _compile_all(_pointwise_specs(every=False), render_source)
    assert count > 500


@pytest.mark.slow
def test_every_pointwise_kernel_compiles():
    count = _compile_all(_pointwise_specs(), render_source)
    assert count > 2000


def test_every_cast_compiles():
    float8 = sum(d.is_float8 for d in ALL_DTYPES)
    expected = len(ALL_DTYPES) ** 2 + float8 * len(ALL_DTYPES)  # every pair, and the saturating fp8 variants
    assert _compile_all(_cast_specs(), render_source) == expected


def test_every_reduction_kernel_compiles():
    assert _compile_all(_reduction_specs(), render_source) > 100


def test_every_scan_kernel_compiles():
    from tilewise.backends.cuda.kernels.scan import render_scan

    sources = {}
    for op_name, combiner in (("cumsum", "add"), ("cumprod", "mul")):
        op = OPS[op_name]
        for dtype in ARITHMETIC_DTYPES:
            try:
                out_dtype, compute = op.dtype_rule(op, (_placeholder(dtype), 0, None))
            except (TypeError, RuntimeError):
                continue
            for rank in (1, 3):
                name = f"tw_{op_name}_{dtype.name}_r{rank}"
                sources[name] = render_scan(name, combiner, dtype, compute, out_dtype, rank)
    from tilewise.codegen.toolchain import compile_cuda

    names = sorted(sources)
    compiled = compile_cuda("\n".join(sources[n] for n in names), names, "sm_90")
    assert all(f".entry {n}(" in compiled.ptx for n in names)


@pytest.mark.parametrize("ranks", [pytest.param((1, 3), marks=pytest.mark.slow), (3,)], ids=["every-rank", "rank-3"])
def test_every_sort_and_running_extreme_kernel_compiles(ranks):
    """Rank 3 alone by default: the ranks differ in a kernel's index arithmetic only, not in its keys or values."""
    from tilewise.backends.cuda.kernels.radix import (
        render_radix_histogram,
        render_radix_scatter,
        render_radix_select_count,
        render_radix_select_take,
        render_radix_zero,
    )
    from tilewise.backends.cuda.kernels.scan import (
        FINISH,
        REDUCE,
        extreme_carrier,
        render_extreme_carries,
        render_extreme_segment,
        render_running_extreme,
    )
    from tilewise.backends.cuda.kernels.sort import render_select_block, render_sort_block
    from tilewise.backends.cuda.kernels.sort_keys import MODES

    sources = {"tw_radix_zero": render_radix_zero("tw_radix_zero")}
    for dtype in ARITHMETIC_DTYPES:
        for rank in ranks:
            sources[f"tw_sort_{dtype.name}_r{rank}"] = render_sort_block(f"tw_sort_{dtype.name}_r{rank}", dtype, rank)
            for kind, render in (("histogram", render_radix_histogram), ("select_count", render_radix_select_count),
                                 ("select_take", render_radix_select_take)):
                name = f"tw_radix_{kind}_{dtype.name}_r{rank}"
                sources[name] = render(name, dtype, rank)
            for mode in MODES:
                name = f"tw_select_{mode}_{dtype.name}_r{rank}"
                sources[name] = render_select_block(name, dtype, rank, mode)
                name = f"tw_radix_scatter_{mode}_{dtype.name}_r{rank}"
                sources[name] = render_radix_scatter(name, dtype, rank, mode)
            for combiner in ("max", "min"):
                name = f"tw_cum{combiner}_{dtype.name}_r{rank}"
                sources[name] = render_running_extreme(name, combiner, dtype, rank)
                for mode in (REDUCE, FINISH):
                    name = f"tw_cum{combiner}_{mode}_{dtype.name}_r{rank}"
                    sources[name] = render_extreme_segment(name, combiner, dtype, rank, mode)
        for combiner in ("max", "min"):
            carrier = extreme_carrier(dtype)
            sources[f"tw_cum{combiner}_carries_{carrier.name}"] = render_extreme_carries(
                f"tw_cum{combiner}_carries_{carrier.name}", combiner, carrier)
    assert _compile_sources(sources) == len(sources)


def test_sort_block_fits_default_shared_memory():
    """A block's pairs (8-byte keys at most, 4-byte indices) fit the 48 KiB a launch gets without opting in."""
    from tilewise.backends.cuda.kernels.sort import MAX_THREADS
    from tilewise.backends.cuda.kernels.sort_keys import CHUNK, key_bits

    assert max(CHUNK * (key_bits(d) // 8 + 4) for d in ALL_DTYPES) <= 48 * 1024
    assert CHUNK // 2 >= MAX_THREADS


def test_sorting_ops_have_cuda_kernels():
    """sort, topk, cummax and cummin run on the device (argsort, kthvalue and median compose sort). In a fresh
    interpreter: a module imported by another test would register its kernels whether or not the loader does."""
    import sys

    script = ("from tilewise.backends.cuda import _load_kernels; from tilewise.backends.cuda.kernels import KERNELS; "
              "_load_kernels(); "
              "print(sorted({'sort', 'topk', 'cummax', 'cummin'} - set(KERNELS)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"no CUDA kernel registered for {result.stdout.strip()}"


def test_every_searchsorted_nonzero_repeat_interleave_kernel_compiles():
    """searchsorted (each dtype, both output dtypes, with and without a sorter), and the counting kernels of
    nonzero and repeat_interleave."""
    from tilewise.backends.cuda.kernels.search import (
        render_nonzero_count,
        render_nonzero_write,
        render_repeat_positions,
        render_repeats_ends,
        render_repeats_total,
        render_scan_tiles,
        render_searchsorted,
    )
    from tilewise.codegen.toolchain import compile_cuda

    rendered = [render_scan_tiles()]
    for dtype in ALL_DTYPES:
        rendered.append(render_nonzero_count(dtype))
        rendered += [render_nonzero_write(dtype, rank) for rank in (1, 2, 4)]
        rendered += [render_searchsorted(dtype, out, rank, sorter) for out in (dtypes.int32, dtypes.int64)
                     for rank in (1, 3) for sorter in (False, True)]
        if dtype.category == dtypes.INT:
            rendered += [render_repeats_total(dtype), render_repeats_ends(dtype)]
    rendered += [render_repeat_positions(out) for out in (dtypes.int32, dtypes.int64)]
    sources = dict(rendered)
    assert len(sources) == len(rendered) > 150
    names = sorted(sources)
    for start in range(0, len(names), BATCH):
        batch = names[start:start + BATCH]
        ptx = compile_cuda("\n".join(sources[n] for n in batch), batch, "sm_90").ptx
        missing = [n for n in batch if f".entry {n}(" not in ptx]
        assert not missing, f"kernels missing from the PTX: {missing[:5]}"


def test_every_random_draw_randperm_and_multinomial_kernel_compiles():
    """Each Philox draw for the dtypes it fills (randperm's sort keys included), and the multinomial kernels,
    one program each (each carries the Philox source); no multiply-add is contracted into an FMA, which would
    round differently from numpy."""
    from tilewise.backends.cuda.kernels.random import (
        render_draw,
        render_multinomial_cdf,
        render_multinomial_check,
        render_multinomial_one_by_one,
        render_multinomial_search,
    )
    from tilewise.codegen.toolchain import compile_cuda

    floats = [d for d in ALL_DTYPES if d.is_floating_point]
    rendered = [render_draw(f"{kind}_{'f64' if d is dtypes.float64 else 'f32'}", d)
                for kind in ("uniform", "normal") for d in floats]
    rendered += [render_draw(kind, d) for kind in ("randint_32", "randint_64") for d in ALL_DTYPES]
    rendered += [render_draw("sortable_32", dtypes.int32)]
    rendered += [render() for render in (render_multinomial_check, render_multinomial_one_by_one,
                                         render_multinomial_cdf, render_multinomial_search)]
    for name, source in rendered:
        ptx = compile_cuda(source, name, "sm_90").ptx
        assert f".entry {name}(" in ptx
        assert "fma.rn" not in ptx, name


def test_searchsorted_nonzero_repeat_interleave_randperm_multinomial_have_cuda_kernels():
    """searchsorted, nonzero, repeat_interleave's positions, randperm and multinomial run on the device, in a
    fresh interpreter (see test_sorting_ops_have_cuda_kernels)."""
    import sys

    script = ("from tilewise.backends.cuda import _load_kernels; from tilewise.backends.cuda.kernels import KERNELS; "
              "_load_kernels(); "
              "print(sorted({'searchsorted', 'nonzero', 'repeat_interleave.Tensor', 'randperm', 'multinomial'} "
              "- set(KERNELS)))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"no CUDA kernel registered for {result.stdout.strip()}"


def test_vector_path_uses_16_byte_accesses():
    from tilewise.codegen.toolchain import compile_cuda

    spec = kernel_specs("add", (OPS["add"].expr,), dtypes.float32, [(PTR, dtypes.float32, (1024,), (1,))] * 2,
                        ("alpha",), (dtypes.float32, (1024,), (1,))).vector
    assert spec is not None and spec.nests[0].cuda.vector == 4
    ptx = compile_cuda(render_source(spec), spec.kernel.name, "sm_90").ptx
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx
    assert "st.global.v4.f32" in ptx


def test_short_half_width_rows_keep_their_loads_in_flight():
    """A bf16 row of 4096 read by 256 threads is two 16-byte loads per thread: the vector loop is unrolled twice
    so both are issued before either is folded, and the fold is one NaN-propagating max per pair of values
    (the portable NaN tests and selects cost the kernel 16 points of copy bandwidth on an H200)."""
    from tilewise.codegen.toolchain import compile_cuda

    passes, *_ = reduction_specs("amax", "max", dtypes.bfloat16, (8192, 4096), (4096, 1), (1,), dtypes.float32,
                                 dtypes.bfloat16, False, 132)
    spec = passes[0].vector
    plan = spec.nests[0].cuda
    assert (spec.block, plan.strategy, plan.vector, plan.unroll) == (256, "rows", 8, 2)
    ptx = compile_cuda(render_source(spec), spec.kernel.name, "sm_90").ptx
    body = ptx[ptx.index(".entry"):]
    assert "max.NaN.f32" in body and "setp.nan" not in body
    assert body.count("ld.global.nc.v4") >= 3  # the unrolled pair, then the remainder loop's one


def test_spin_kernel_compiles():
    from tilewise.backends.cuda.kernels import _SPIN
    from tilewise.codegen.toolchain import compile_cuda

    assert ".entry tw_spin(" in compile_cuda(_SPIN, "tw_spin", "sm_90").ptx


# ---------------------------------------------------------------------------------------------- C target

def _build_c(source: str, tmp_path, name: str):
    path = tmp_path / f"{name}.c"
    path.write_text(source)
    lib = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-o", str(lib), str(path), "-lm"],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("op_name", ["add", "mul", "sigmoid", "where.self", "remainder", "floor_divide", "maximum",
                                     "gelu", "special_erfcx", "special_log_ndtr", "special_i1e",
                                     "special_xlog1py"])
def test_c_target_matches_numpy(op_name, tmp_path):
    """The renderer's index arithmetic, broadcasting and type rules, run on the host through the C target."""
    op = OPS[op_name]
    rng = np.random.default_rng(0)
    a = rng.uniform(-3, 3, (5, 7)).astype(np.float32)
    b = rng.uniform(0.5, 3, (7,)).astype(np.float32)
    tensors = [a, b] if len(op.tensor_idx) >= 2 else [a]
    if op_name == "where.self":
        tensors = [a > 0, a, b]
    args = list(_variants(op, dtypes.float32)[0])
    for pos, k in enumerate(op.tensor_idx):
        args[k] = tw.from_numpy(tensors[pos]) if pos < len(tensors) else None
    args = tuple(args)
    expected = tw.backends.cpu.run(op, args, tw.device("cpu"))._np() if hasattr(tw, "backends") else None
    compute, expr, scalars, described, out = op_geometry(op, args)
    at = np.ascontiguousarray(a.T).T  # a transposed (strided) layout of the same values
    inputs = [at if t is a else t for t in tensors]
    described = [(PTR, dtypes.from_numpy(t.dtype), t.shape, tuple(s // t.itemsize for s in t.strides)) for t in inputs]
    specs = kernel_specs("c_" + op.name, (expr,), compute, described, scalars, out)
    kernel = specs.scalar.kernel
    assert any(a.name.startswith("stride_in") for a in kernel.arguments)  # the transposed operand is strided
    lib = _build_c(render_c_program([schedule_c(kernel)], C), tmp_path, kernel.name)
    result = np.empty(out[1], out[0].np)
    c_args = [result.ctypes.data_as(ctypes.c_void_p)]
    c_args += [t.ctypes.data_as(ctypes.c_void_p) for t in inputs]
    c_args += [ctypes.c_float(float(args[op.param_names().index(s)])) for s in scalars]
    c_args += [ctypes.c_longlong(v) for v in specs.tail]
    getattr(lib, kernel.name)(*c_args)
    np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)


def _shadowed_parameters(source: str) -> list[str]:
    """Kernel parameters that a declaration in the body hides (legal C, and a wrong value read silently)."""
    import re

    head, _, body = source.partition(") {")
    params = {m.group(1) for m in re.finditer(r"(\w+)\s*(?:,|$)", head.rpartition("(")[2])}
    declared = set(re.findall(r"\bconst\s+[\w ]+?\s+(\w+)\s*=", body))
    return sorted(params & declared)


@pytest.mark.parametrize("first", [True, False], ids=["number-first", "number-second"])
def test_cuda_kernels_never_shadow_a_by_value_operand(first):
    """``2.0 - x`` on CUDA read as ``x - x``: the number's argument was named like the renderer's first load."""
    tensor = (PTR, dtypes.float32, (3, 4), (4, 1))
    described = [(VALUE, float), tensor, tensor] if first else [tensor, (VALUE, float), tensor]
    expr = Expr("sub", (Expr("input", (), 0), Expr("mul", (Expr("input", (), 1), Expr("input", (), 2)))))
    specs = kernel_specs("sub_value", (expr,), dtypes.float32, described, (), (dtypes.float32, (3, 4), (4, 1)))
    for sched in (specs.scalar, specs.vector):
        if sched is not None:
            assert _shadowed_parameters(render_source(sched)) == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("first", [True, False], ids=["number-first", "number-second"])
def test_c_target_runs_by_value_operands_beside_loads(first, tmp_path):
    """A Python number among the operands travels by value; its argument's name must not be one the renderer
    gives a load (``2.0 - x`` once read as ``x - x``)."""
    a = np.arange(-3, 9, dtype=np.float32).reshape(3, 4)
    tensor = (PTR, dtypes.float32, a.shape, (4, 1))
    described = [(VALUE, float), tensor] if first else [tensor, (VALUE, float)]
    expr = Expr("sub", (Expr("input", (), 0), Expr("input", (), 1)))
    specs = kernel_specs("c_sub_value", (expr,), dtypes.float32, described, (), (dtypes.float32, a.shape, (4, 1)))
    kernel = specs.scalar.kernel
    lib = _build_c(render_c_program([schedule_c(kernel)], C), tmp_path, kernel.name)
    result = np.empty(a.shape, np.float32)
    c_args = [result.ctypes.data_as(ctypes.c_void_p), a.ctypes.data_as(ctypes.c_void_p), ctypes.c_float(2.5)]
    c_args += [ctypes.c_longlong(v) for v in specs.tail]
    getattr(lib, kernel.name)(*c_args)
    np.testing.assert_array_equal(result, 2.5 - a if first else a - 2.5)


def test_c_target_renders_the_same_kernel_ir():
    """One eager kernel IR, rendered for CUDA and for C: the same index arithmetic and expression statements."""
    kernel = pointwise_kernel("k", (OPS["exp"].expr,), dtypes.float32, [(dtypes.float32, STRIDED)],
                              (), (dtypes.bfloat16, CONTIGUOUS), 2, "long long")
    cuda = render_source(schedule_cuda(kernel))
    c = render_c_program([schedule_c(kernel)], C)
    for text in (cuda, c):
        assert "in0[stride_in0_0 * d0 + stride_in0_1 * d1]" in text
    assert "= expf(x0" in cuda and "= tw_exp_f32(x0" in c  # the C target's own expf ([Note: the C target's expf])
    assert "out0[size1 * d0 + d1]" in c and "out0[e]" in cuda  # CUDA reads a contiguous index as the flat position


def _c_reduction(name, combiner, x: np.ndarray, dims, acc, output, indices, tmp_path):
    """Run the eager CUDA reduction's kernel IR for ``x`` through the C target: (values, positions)."""
    from tilewise.backends.cuda.kernels.reduction import reduction_specs

    dtype = dtypes.from_numpy(x.dtype)
    strides = tuple(s // x.itemsize for s in x.strides)
    passes, out_shape, _, _ = reduction_specs(name, combiner, dtype, x.shape, strides, dims, acc, output, indices, 132)
    assert len(passes) == 1  # small enough not to be split (splitting is the CUDA schedule's own)
    kernel = passes[0].spec.kernel
    lib = _build_c(render_c_program([schedule_c(kernel)], C), tmp_path, kernel.name)
    base = x.base if x.base is not None else x
    offset = (x.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    values = np.zeros(out_shape, output.np) if output is not None else None
    positions = np.zeros(out_shape, np.int64) if indices else None
    c_args = [a.ctypes.data_as(ctypes.c_void_p) for a in (values, positions) if a is not None]
    c_args.append(ctypes.c_void_p(base.ctypes.data + offset))
    c_args += [ctypes.c_longlong(v) for v in passes[0].tail]
    getattr(lib, kernel.name)(*c_args)
    return values, positions


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("op_name", ["sum", "prod", "amax", "amin", "any", "all"])
@pytest.mark.parametrize("layout", ["rows", "columns", "transposed", "two_dims", "everything"])
def test_c_target_runs_the_eager_reduction_kernel_ir(op_name, layout, tmp_path):
    """The eager reductions' kernel IR (symbolic sizes and strides, the reduced dims' order, the accumulator and
    output dtypes) computes torch's answer, run on the host through the C target."""
    import torch

    rng = np.random.default_rng(1)
    base = rng.integers(-3, 4, (6, 10, 7)).astype(np.float32) / 2
    base[1, 2, 3] = np.nan if op_name in ("amax", "amin", "sum") else base[1, 2, 3]
    views = {"rows": (base[0], (1,)), "columns": (base[0], (0,)), "transposed": (base[0].T, (1,)),
             "two_dims": (base.transpose(1, 0, 2), (0, 2)), "everything": (base[:, ::2], (0, 1, 2))}
    x, dims = views[layout]
    if op_name in ("any", "all"):
        x = (x > 0) if op_name == "any" else (x > -1.5)
    op = OPS[op_name]
    out_dtype, compute = op.dtype_rule(op, (tw.from_numpy(np.ascontiguousarray(x)), list(dims), False, None)
                                       [:len(op.schema.params)])
    acc = accumulator(REDUCE_COMBINERS[op_name], dtypes.from_numpy(x.dtype), compute)
    values, _ = _c_reduction(op_name, REDUCE_COMBINERS[op_name], x, dims, acc, out_dtype, False, tmp_path)
    t = torch.from_numpy(np.ascontiguousarray(x))
    kept = [d for d in range(t.ndim) if d not in dims]
    flat = t.permute(*kept, *dims).reshape(*[t.shape[d] for d in kept], -1)  # the reduced dims as one, in order
    expected = getattr(torch, op_name)(flat, dim=-1).numpy()
    np.testing.assert_allclose(values.astype(np.float64), expected.astype(np.float64), rtol=1e-6, equal_nan=True)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no host C compiler")
@pytest.mark.parametrize("combiner", ["argmax", "argmin"])
@pytest.mark.parametrize("layout", ["rows", "columns", "everything", "int"])
def test_c_target_runs_the_eager_arg_reduction_kernel_ir(combiner, layout, tmp_path):
    """argmax/argmin (and max.dim/min.dim's values) as the eager kernel IR computes them: the first NaN wins, ties
    go to the first position, positions are row-major over the reduced dims; run on the host, against torch."""
    import torch

    rng = np.random.default_rng(2)
    x = rng.integers(-2, 3, (9, 40)).astype(np.float32)
    x[3, [5, 17]] = np.nan
    x[:, 30] = 9 if combiner == "argmax" else -9  # a tie with the column below
    x[:, 33] = x[:, 30]
    if layout == "int":
        x = np.nan_to_num(x, nan=0).astype(np.int32)
    view, dims = {"rows": (x, (1,)), "columns": (x, (0,)), "everything": (x.T, (0, 1)), "int": (x, (1,))}[layout]
    dtype = dtypes.from_numpy(view.dtype)
    values, positions = _c_reduction("max", combiner, view, dims, dtype, dtype, True, tmp_path)
    t = torch.from_numpy(np.ascontiguousarray(view))
    if len(dims) == 1:
        got = (torch.max if combiner == "argmax" else torch.min)(t, dim=dims[0])
        np.testing.assert_array_equal(values, got.values.numpy())
        np.testing.assert_array_equal(positions, got.indices.numpy())
    else:
        np.testing.assert_array_equal(positions, getattr(torch, combiner)(t).numpy())
