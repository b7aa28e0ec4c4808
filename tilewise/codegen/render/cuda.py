"""The CUDA C target: the data that makes ``cstyle`` emit CUDA, and the CUDA reduction schedule.

Pointwise kernels come entirely from ``cstyle``; only the tables below differ from the C target. A
reduction is where CUDA's execution model shapes the loop itself, so its schedule lives here: one block
per output row (warp shuffles, then one shared-memory step across warps) when the reduced elements are
adjacent in memory, or 32 outputs per block across ``threadIdx.x`` with the reduced elements spread over
``threadIdx.y`` when the outputs are the adjacent ones; either may split a long reduction over
``blockIdx.y``, writing partial results in the accumulator dtype for a second pass to combine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewise import dtypes
from tilewise.codegen.render.cstyle import (
    SUFFIX,
    Language,
    Source,
    compute_of,
    kind_of,
    literal,
    load_code,
    store_code,
)
from tilewise.dtypes import DType

_FP8_HEADER = "#include <cuda_fp8.h>"

# maximum/minimum propagate NaN, as torch's do. From sm_80 a float has an instruction for exactly that
# (``max.NaN.f32``: one FMNMX where the portable form takes two NaN tests, a compare and selects), which is
# what keeps a half-width row max at memory speed; doubles, and older GPUs, take the portable form.
_MINMAX_NAN = """{{FN}} {{T}} tw_{name}_{{S}}({{T}} a, {{T}} b) {{{{
#if __CUDA_ARCH__ >= 800
    if (sizeof({{T}}) == 4) {{{{
        float r;
        asm("{ptx}.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"((float)a), "f"((float)b));
        return r;
    }}}}
#endif
    return a != a ? a : (b != b ? b : (a {cmp} b ? a : b));
}}}}"""

CUDA = Language(
    name="cuda",
    kernel_prefix='extern "C" __global__ void __launch_bounds__({block})',
    helper_prefix="static __device__ __forceinline__",
    restrict="__restrict__",
    type_names={
        "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
        "int64": "long long", "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
        "float64": "double", "float8_e4m3fn": "__nv_fp8_storage_t", "float8_e5m2": "__nv_fp8_storage_t",
    },
    headers={"float16": "#include <cuda_fp16.h>", "bfloat16": "#include <cuda_bf16.h>",
             "float8_e4m3fn": _FP8_HEADER, "float8_e5m2": _FP8_HEADER},
    loads={
        "float16": "__half2float({0})",
        "bfloat16": "__bfloat162float({0})",
        "float8_e4m3fn": "__half2float(__half(__nv_cvt_fp8_to_halfraw({0}, __NV_E4M3)))",
        "float8_e5m2": "__half2float(__half(__nv_cvt_fp8_to_halfraw({0}, __NV_E5M2)))",
    },
    stores={
        ("float16", "float"): "__float2half_rn({0})", ("float16", "double"): "__double2half({0})",
        ("bfloat16", "float"): "__float2bfloat16_rn({0})", ("bfloat16", "double"): "__double2bfloat16({0})",
        # e4m3fn has no infinity: torch saturates out-of-range values (and infinities) to +-448
        ("float8_e4m3fn", "float"): "__nv_cvt_float_to_fp8({0}, __NV_SATFINITE, __NV_E4M3)",
        ("float8_e4m3fn", "double"): "__nv_cvt_double_to_fp8({0}, __NV_SATFINITE, __NV_E4M3)",
        ("float8_e5m2", "float"): "__nv_cvt_float_to_fp8({0}, {sat}, __NV_E5M2)",
        ("float8_e5m2", "double"): "__nv_cvt_double_to_fp8({0}, {sat}, __NV_E5M2)",
    },
    math={"rsqrt": "rsqrt{f}({0})", "erfinv": "erfinv{f}({0})", "isinf": "(isinf({0}) != 0)"},
    helpers={"maximum:float": _MINMAX_NAN.format(name="maximum", ptx="max", cmp=">"),
             "minimum:float": _MINMAX_NAN.format(name="minimum", ptx="min", cmp="<")},
    constants={("inf", "float"): "__int_as_float(0x7f800000)", ("nan", "float"): "__int_as_float(0x7fc00000)",
               ("inf", "double"): "__longlong_as_double(0x7ff0000000000000LL)",
               ("nan", "double"): "__longlong_as_double(0x7ff8000000000000LL)"},
    element_loop=("const {idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {{", "}"),
    prelude="""#ifndef TW_VEC_DEFINED
#define TW_VEC_DEFINED
template <typename T, int N> struct __align__(sizeof(T) * N) tw_vec { T v[N]; };
#endif""",
    max_vector=8,
)

ROW, COLUMN = "row", "column"
ARG_COMBINERS = ("argmax", "argmin")
COMBINERS = ("add", "mul", "max", "min", "or", "and", *ARG_COMBINERS)

_SHUFFLE = """#ifndef TW_SHUFFLE_DEFINED
#define TW_SHUFFLE_DEFINED
template <typename T> static __device__ __forceinline__ T tw_shfl_down(T v, int s) {
    return __shfl_down_sync(0xffffffffu, v, s);
}
template <> __device__ __forceinline__ bool tw_shfl_down<bool>(bool v, int s) {
    return __shfl_down_sync(0xffffffffu, (int)v, s) != 0;
}
#endif"""


@dataclass(frozen=True)
class ReductionKernel:
    """Reduce ``n_inner`` elements per output with ``combiner``, accumulating in ``acc``.

    The input is addressed as ``in[outer_offset(row) + inner_offset(j)]`` from ``outer_rank`` sizes and
    strides and ``inner_rank`` sizes and strides (run-time arguments); ``j`` is the row-major index over the
    reduced dims, which is what argmax/argmin report. Outputs are contiguous: element ``row * gridDim.y +
    blockIdx.y``. ``output`` is the value dtype written (None: indices only); ``indices`` adds an int64
    index output (argmax/argmin, max.dim/min.dim). ``vector`` > 1 (a ``ROW`` reduction of one contiguous
    inner dim whose rows start aligned, with ``chunk`` a multiple of it) reads with 16-byte loads; its loop is
    unrolled ``unroll`` times, the trips a thread makes over a row of the planned length (up to 4), so that
    all of a short row's loads are in flight at once.
    Parameters: [value out], [index out], in, n_outer, n_inner, chunk (elements per blockIdx.y), outer
    sizes, outer strides, inner sizes, inner strides.
    """

    name: str
    combiner: str
    input: DType
    acc: DType
    output: DType | None
    indices: bool = False
    outer_rank: int = 0
    inner_rank: int = 1
    index: str = "int64"
    mode: str = ROW
    block: tuple[int, int] = (256, 1)
    vector: int = 1  # ROW over one contiguous inner dim only: elements per 16-byte load
    unroll: int = 4  # with vector > 1: trips of the vector loop unrolled (loads in flight per thread)

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1]


def identity(combiner: str, acc: DType) -> object:
    """The value a reduction of nothing gives."""
    if combiner in ("add", "or"):
        return 0
    if combiner in ("mul", "and"):
        return 1
    positive = combiner in ("min", "argmin")
    if acc.is_floating_point:
        return float("inf") if positive else float("-inf")
    if acc is dtypes.bool_:
        return 1 if positive else 0
    info = dtypes.iinfo(acc)
    return info.max if positive else info.min


def _combine(combiner: str, acc: DType, a: str, b: str, source: Source) -> str:
    suffix = SUFFIX[acc.name]
    if combiner == "add":
        return f"({a} + {b})" if acc is not dtypes.bool_ else f"({a} || {b})"
    if combiner == "mul":
        return f"({a} * {b})" if acc is not dtypes.bool_ else f"({a} && {b})"
    if combiner == "or":
        return f"({a} || {b})"
    if combiner == "and":
        return f"({a} && {b})"
    if kind_of(acc) == "float":
        name = "maximum" if combiner == "max" else "minimum"
        source.need_helper(name, acc)
        return f"tw_{name}_{suffix}({a}, {b})"
    if acc is dtypes.bool_:
        return f"({a} || {b})" if combiner == "max" else f"({a} && {b})"
    cmp = ">" if combiner == "max" else "<"
    return f"({a} {cmp} {b} ? {a} : {b})"


def _arg_helper(kernel: ReductionKernel, source: Source) -> str:
    """``tw_take_<combiner>_<S>(v1, i1, v2, i2)``: whether (v2, i2) wins over (v1, i1); NaN wins, ties go
    to the lower index, index -1 marks "nothing yet"."""
    lang = source.lang
    c = lang.ctype(kernel.acc)
    name = f"tw_take_{kernel.combiner}_{SUFFIX[kernel.acc.name]}"
    cmp = ">" if kernel.combiner == "argmax" else "<"
    nan = "" if not kernel.acc.is_floating_point else (
        "    const bool n1 = v1 != v1, n2 = v2 != v2;\n    if (n1 || n2) return n2 && (!n1 || i2 < i1);\n")
    body = (f"{lang.helper_prefix} bool {name}({c} v1, long long i1, {c} v2, long long i2) {{\n"
            f"    if (i2 < 0) return false;\n    if (i1 < 0) return true;\n{nan}"
            f"    return v2 {cmp} v1 || (v2 == v1 && i2 < i1);\n}}")
    guard = f"TW_HELPER_{name.upper()}"
    source.helpers[name] = f"#ifndef {guard}\n#define {guard}\n{body}\n#endif"
    return name


def _decompose(var: str, prefix: str, rank: int, idx: str, target: str) -> list[str]:
    """Lines adding the offset of row-major index ``var`` over ``prefix`` sizes/strides to ``target``."""
    if rank == 0:
        return []
    if rank == 1:
        return [f"{target} += {var} * {prefix}stride0;"]
    lines = [f"{{ {idx} rem = {var};"]
    for d in range(rank - 1, -1, -1):
        coord = "rem" if d == 0 else f"rem % {prefix}size{d}"
        lines.append(f"  {target} += ({coord}) * {prefix}stride{d};" + (f" rem /= {prefix}size{d};" if d else ""))
    lines.append("}")
    return lines


def render_reduction(kernel: ReductionKernel) -> str:
    """CUDA C source of a reduction kernel (see :class:`ReductionKernel`)."""
    if kernel.combiner not in COMBINERS:
        raise ValueError(f"unknown reduction combiner {kernel.combiner!r}; combiners: {COMBINERS}")
    source = Source(CUDA)
    source.need_storage(kernel.input)
    if kernel.output is not None:
        source.need_storage(kernel.output)
    plan = _Plan(kernel, source)
    body = _row_body(plan) if kernel.mode == ROW else _column_body(plan)
    head = f'extern "C" __global__ void __launch_bounds__({kernel.threads}) {kernel.name}({", ".join(plan.params())})'
    return source.text(f"{_SHUFFLE}\n{head} {{\n" + "\n".join("    " + ln for ln in body) + "\n}")


class _Plan:
    """The pieces every reduction schedule is assembled from."""

    def __init__(self, kernel: ReductionKernel, source: Source) -> None:
        self.kernel = kernel
        self.source = source
        self.idx = "int" if kernel.index == "int32" else "long long"
        self.acc = CUDA.ctype(kernel.acc)
        self.arg = kernel.combiner in ARG_COMBINERS
        self.ident = literal(identity(kernel.combiner, kernel.acc), kernel.acc, CUDA)
        self.take = _arg_helper(kernel, source) if self.arg else ""

    def params(self) -> list[str]:
        k, idx = self.kernel, self.idx
        params = []
        if k.output is not None:
            params.append(f"{CUDA.ctype(k.output)}* __restrict__ out")
        if k.indices:
            params.append("long long* __restrict__ out_index")
        params += [f"const {CUDA.ctype(k.input)}* __restrict__ in", f"{idx} n_outer", f"{idx} n_inner", f"{idx} chunk"]
        for prefix, rank in (("o", k.outer_rank), ("i", k.inner_rank)):
            params += [f"{idx} {prefix}size{d}" for d in range(rank)]
            params += [f"{idx} {prefix}stride{d}" for d in range(rank)]
        return params

    def load(self, offset: str) -> str:
        return self.convert(f"in[base + {offset}]")

    def convert(self, stored: str) -> str:
        k = self.kernel
        loaded = load_code(CUDA, k.input, stored)
        if k.acc is dtypes.bool_ and k.input is not dtypes.bool_:
            return f"({loaded} != 0)"
        return f"({self.acc})({loaded})"

    def combine(self, a: tuple[str, str], b: tuple[str, str]) -> str:
        """A statement folding (b value, b index) into (a value, a index)."""
        if self.arg:
            return f"if ({self.take}({a[0]}, {a[1]}, {b[0]}, {b[1]})) {{ {a[0]} = {b[0]}; {a[1]} = {b[1]}; }}"
        return f"{a[0]} = {_combine(self.kernel.combiner, self.kernel.acc, a[0], b[0], self.source)};"

    def start(self) -> list[str]:
        lines = [f"{self.acc} acc = {self.ident};"]
        return lines + (["long long acc_i = -1;"] if self.arg else [])

    def accumulate(self, first: str, stride: str) -> list[str]:
        """Each thread folds elements first, first + stride, ... below ``end``; 4 independent loads per trip."""
        idx, unroll = self.idx, 1 if self.arg else 4
        lines = [f"{idx} j = {first};"]

        def element(j: str, k: str) -> list[str]:
            return [f"{idx} off{k} = 0;", *_decompose(j, "i", self.kernel.inner_rank, idx, f"off{k}"),
                    f"const {self.acc} v{k} = {self.load(f'off{k}')};"]

        if unroll > 1:
            lines.append(f"for (; j + {unroll - 1} * {stride} < end; j += {unroll} * {stride}) {{")
            for k in range(unroll):
                lines += ["    " + ln for ln in element(f"(j + {k} * {stride})", str(k))]
            lines += ["    " + self.combine(("acc", "acc_i"), (f"v{k}", "j")) for k in range(unroll)]
            lines.append("}")
        lines += [f"for (; j < end; j += {stride}) {{", *("    " + ln for ln in element("j", "")),
                  "    " + self.combine(("acc", "acc_i"), ("v", "j")), "}"]
        return lines

    def accumulate_vectors(self, threads: int) -> list[str]:
        """Row schedule over a contiguous row: 16-byte loads of ``vector`` elements, then the scalar tail.
        ``begin`` is a multiple of ``vector`` and the row start is aligned (the caller checked)."""
        idx, v = self.idx, self.kernel.vector
        vt = f"tw_vec<{CUDA.ctype(self.kernel.input)}, {v}>"
        # nvcc unrolls this loop 4 times by itself, which a row of 2 or 3 trips per thread never enters: its
        # loads then go one at a time (a bf16 row of 4096 read by 256 threads ran at 78% of copy, 88% unrolled)
        lines = [f"const {idx} vend = begin + (end - begin) / {v} * {v};",
                 f"#pragma unroll {self.kernel.unroll}",
                 f"for ({idx} j = begin + ({idx})threadIdx.x * {v}; j < vend; j += {threads * v}) {{",
                 f"    const {vt} w = *reinterpret_cast<const {vt}*>(in + base + j);"]
        if self.arg:  # ties go to the lower index: fold in order
            for k in range(v):
                lines += [f"    const {self.acc} v{k} = {self.convert(f'w.v[{k}]')};",
                          "    " + self.combine(("acc", "acc_i"), (f"v{k}", f"(j + {k})"))]
        else:  # a pairwise tree: log2(v) dependent steps where a chain into acc takes v
            names = [f"v{k}" for k in range(v)]
            lines += [f"    {self.acc} {n} = {self.convert(f'w.v[{k}]')};" for k, n in enumerate(names)]
            while len(names) > 1:
                lines += ["    " + self.combine((names[k], ""), (names[k + 1], "")) for k in range(0, len(names), 2)]
                names = names[::2]
            lines.append("    " + self.combine(("acc", "acc_i"), (names[0], "")))
        lines.append("}")
        lines += [f"for ({idx} j = vend + threadIdx.x; j < end; j += {threads}) {{",
                  f"    const {self.acc} v = {self.load('j')};",
                  "    " + self.combine(("acc", "acc_i"), ("v", "j")), "}"]
        return lines

    def write(self, where: str) -> list[str]:
        k, lines = self.kernel, []
        if k.output is not None:
            lines.append(f"out[{where}] = {store_code(CUDA, k.output, 'acc', k.acc)};")
        if k.indices:
            lines.append(f"out_index[{where}] = acc_i < 0 ? 0 : acc_i;")
        return lines

    def shuffle(self) -> list[str]:
        lines = ["for (int s = 16; s > 0; s >>= 1) {", f"    const {self.acc} o = tw_shfl_down(acc, s);"]
        if self.arg:
            lines.append("    const long long o_i = tw_shfl_down(acc_i, s);")
        return lines + ["    " + self.combine(("acc", "acc_i"), ("o", "o_i")), "}"]


def _row_body(plan: _Plan) -> list[str]:
    k, idx = plan.kernel, plan.idx
    threads = k.block[0]
    warps = max(threads // 32, 1)
    lines = [f"const {idx} row = blockIdx.x;", f"{idx} base = 0;", *_decompose("row", "o", k.outer_rank, idx, "base"),
             f"const {idx} begin = ({idx})blockIdx.y * chunk;",
             f"const {idx} end = begin + chunk < n_inner ? begin + chunk : n_inner;", *plan.start()]
    if k.vector > 1:
        lines += plan.accumulate_vectors(threads)
    else:
        lines += plan.accumulate("begin + threadIdx.x", str(threads))
    lines += plan.shuffle()
    lines += [f"__shared__ {plan.acc} warp_acc[{warps}];",
              "const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;", "if (lane == 0) warp_acc[warp] = acc;"]
    if plan.arg:
        lines += [f"__shared__ long long warp_i[{warps}];", "if (lane == 0) warp_i[warp] = acc_i;"]
    lines += ["__syncthreads();", "if (warp != 0) return;", f"acc = lane < {warps} ? warp_acc[lane] : {plan.ident};"]
    if plan.arg:
        lines.append(f"acc_i = lane < {warps} ? warp_i[lane] : -1;")
    lines += plan.shuffle()
    return lines + ["if (lane != 0) return;", *plan.write("row * gridDim.y + blockIdx.y")]


def _column_body(plan: _Plan) -> list[str]:
    k, idx = plan.kernel, plan.idx
    bx, by = k.block
    lines = [f"const {idx} col = ({idx})blockIdx.x * {bx} + threadIdx.x;", f"{idx} base = 0;",
             f"const {idx} begin = ({idx})blockIdx.y * chunk;",
             f"const {idx} end = begin + chunk < n_inner ? begin + chunk : n_inner;", *plan.start(),
             "if (col < n_outer) {", *("    " + ln for ln in _decompose("col", "o", k.outer_rank, idx, "base")),
             *("    " + ln for ln in plan.accumulate("begin + threadIdx.y", str(by))), "}",
             f"__shared__ {plan.acc} sm[{by}][{bx + 1}];", "sm[threadIdx.y][threadIdx.x] = acc;"]
    if plan.arg:
        lines += [f"__shared__ long long sm_i[{by}][{bx + 1}];", "sm_i[threadIdx.y][threadIdx.x] = acc_i;"]
    lines += ["__syncthreads();", f"for (int s = {by // 2}; s > 0; s >>= 1) {{", "    if (threadIdx.y < s) {",
              f"        {plan.acc} acc = sm[threadIdx.y][threadIdx.x], o = sm[threadIdx.y + s][threadIdx.x];"]
    if plan.arg:
        lines.append("        long long acc_i = sm_i[threadIdx.y][threadIdx.x];")
        lines.append("        const long long o_i = sm_i[threadIdx.y + s][threadIdx.x];")
    lines += ["        " + plan.combine(("acc", "acc_i"), ("o", "o_i")), "        sm[threadIdx.y][threadIdx.x] = acc;"]
    if plan.arg:
        lines.append("        sm_i[threadIdx.y][threadIdx.x] = acc_i;")
    lines += ["    }", "    __syncthreads();", "}", "if (threadIdx.y != 0 || col >= n_outer) return;",
              "acc = sm[0][threadIdx.x];"]
    if plan.arg:
        lines.append("acc_i = sm_i[0][threadIdx.x];")
    return lines + plan.write("col * gridDim.y + blockIdx.y")


def accumulator(combiner: str, input_dtype: DType, compute: DType) -> DType:
    """The dtype a reduction accumulates in: the op's compute dtype (bool for any/all)."""
    if combiner in ("or", "and"):
        return dtypes.bool_
    if combiner in ARG_COMBINERS:
        return compute_of(input_dtype)
    return compute
