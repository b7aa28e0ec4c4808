"""Matrix products. ``mm`` and ``bmm`` are the primitives (a library call on CUDA); everything else composes."""

from __future__ import annotations

import math

from tilewise import dtypes
from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.dtypes import c10_name, compute_dtype, type_meta_name
from tilewise.ops.batching_rules import leading_batch_first_only, matrix_product
from tilewise.ops.registry import OPS, declare
from tilewise.tensor import Tensor


def check_mm_shapes(op: str, a, b) -> None:
    """mm multiplies matrices [n, m] @ [m, p]; bmm multiplies batches of them, [b, n, m] @ [b, m, p]. The
    messages are torch's, word for word (which name bmm's operands batch1 and batch2, and show the shapes)."""
    sa, sb = a._shape, b._shape
    rank = 2 if op == "mm" else 3
    if len(sa) == rank == len(sb) and sa[-1] == sb[-2] and (rank == 2 or sa[0] == sb[0]):
        return  # the common case, checked without building the messages
    if a.ndim != rank or b.ndim != rank:
        names = ("self", "mat2") if op == "mm" else ("batch1", "batch2")
        wrong = names[0] if a.ndim != rank else names[1]
        raise RuntimeError(f"{wrong} must be a matrix" if op == "mm" else f"{wrong} must be a 3D tensor")
    if op == "bmm":
        raise RuntimeError(bmm_mismatch_text(a.shape[0], a.shape[-1], b.shape[:2]))
    raise RuntimeError(mm_mismatch_text(a.shape, b.shape))


def mm_mismatch_text(sa, sb) -> str:
    """torch's words for matrices whose inner sizes differ."""
    return f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, sa))} and {'x'.join(map(str, sb))})"


def bmm_mismatch_text(batch: int, inner: int, got) -> str:
    """torch's words for batches of matrices whose batch or inner sizes differ."""
    return (f"Expected size for first two dimensions of batch2 tensor to be: [{batch}, {inner}] but got: "
            f"[{got[0]}, {got[1]}].")


def matmul_operands(op, args):
    """Shapes, then one dtype for both operands: library GEMMs take one dtype."""
    a, b = args[0], args[1]
    check_mm_shapes(op.name, a, b)
    if a.dtype is dtypes.bool_ and b.dtype is dtypes.bool_:
        kernel = _BOOL_KERNELS[op.name][a.device.type == "cuda"]
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')
    if a.dtype is not b.dtype:
        raise RuntimeError(_DTYPE_MISMATCH[op.name](a.dtype, b.dtype))
    return a.dtype, compute_dtype(a.dtype)


# the kernels torch names when it refuses bool operands, on the CPU and on CUDA
_BOOL_KERNELS = {"mm": ("addmm_impl_cpu_", "addmm_cuda"), "bmm": ("bmm", "bmm_cuda")}
# torch's own words for operands of two dtypes, which differ between its mm and bmm kernels
_DTYPE_MISMATCH = {
    "mm": lambda a, b: ("expected m1 and m2 to have the same dtype, but got: "
                        f"{type_meta_name(a)} != {type_meta_name(b)}"),
    "bmm": lambda a, b: f"expected scalar type {c10_name(a)} but found {c10_name(b)}",
}


declare("mm(Tensor self, Tensor mat2) -> Tensor", "matmul", dtype=matmul_operands, autocast="lower",
        grad={"self": "grad.mm(conj_if_complex(mat2.t()))", "mat2": "conj_if_complex(self.t()).mm(grad)"},
        fwd="self_t.mm(mat2) + self.mm(mat2_t)",
        batch=matrix_product)
declare("bmm(Tensor self, Tensor mat2) -> Tensor", "matmul", dtype=matmul_operands, autocast="lower",
        grad={"self": "grad.bmm(conj_if_complex(mat2.transpose(1, 2)))",
              "mat2": "conj_if_complex(self.transpose(1, 2)).bmm(grad)"},
        fwd="self_t.bmm(mat2) + self.bmm(mat2_t)", batch=matrix_product)


def _check_matmul(a, b):
    for name, x in (("self", a), ("other", b)):
        if not isinstance(x, Tensor):
            raise TypeError(f"matmul: argument '{name}' must be a Tensor, got {type(x).__name__} {x!r} (use * to "
                            "multiply by a number)")
    sa, sb = a._shape, b._shape
    if len(sa) >= 2 and len(sb) >= 2 and sa[-1] == sb[-2]:
        return  # the common case
    if a.ndim == 0 or b.ndim == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.ndim}D and {b.ndim}D")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise RuntimeError(_matmul_mismatch_text(a, b))  # batch dims that do not broadcast raise in it first


def _matmul_mismatch_text(a, b) -> str:
    """torch's words for operands whose inner sizes differ, which follow the kernel its matmul picks by rank."""
    sa, sb = a.shape, b.shape
    if b.ndim == 1:
        if a.ndim == 1:
            return (f"inconsistent tensor size, expected tensor [{sa[0]}] and src [{sb[0]}] to have the same number "
                    f"of elements, but got {sa[0]} and {sb[0]} elements respectively")
        rows = math.prod(sa[:-1])
        return f"size mismatch, got input ({rows}), mat ({rows}x{sa[-1]}), vec ({sb[0]})"
    if b.ndim == 2:
        return mm_mismatch_text((math.prod(sa[:-1]), sa[-1]), sb)
    batch = math.prod(S.broadcast_shapes(sa[:-2], sb[:-2], op=""))
    return bmm_mismatch_text(batch, sa[-1], (batch, sb[-2]))


def private(view: Tensor) -> Tensor:
    """A view of a product no one else holds, made the result itself: no view of anything, as torch's matmul
    returns an ``_unsafe_view`` (so ``.grad`` takes it without a copy, and an in-place write needs no rebase)."""
    view._base = None
    return view


def _matmul(a, b):
    _check_matmul(a, b)
    sa, sb = a._shape, b._shape  # the tuples themselves: ``shape`` builds a Size per read, on every call
    ra, rb = len(sa), len(sb)
    if ra == 2 and rb == 2:
        return a.mm(b)
    if ra == 1 and rb == 1:
        return _dot(a, b)
    if ra == 1:
        return private(_matmul(a.unsqueeze(0), b).squeeze(-2))
    if rb == 1:
        check_matrix_vector_dtypes("matmul", a, b)
        return private(_matmul(a, b.unsqueeze(-1)).squeeze(-1))
    if rb == 2:  # fold the batch dims of a into rows: one GEMM
        return rows_times_matrix(a, b)
    batch = tuple(S.broadcast_shapes(sa[:-2], sb[:-2], op=""))
    count = math.prod(batch)  # not -1 in the reshapes: ambiguous where a matrix dim is 0
    a3 = a.expand(batch + sa[-2:]).reshape(count, *sa[-2:])
    b3 = b.expand(batch + sb[-2:]).reshape(count, *sb[-2:])
    return private(a3.bmm(b3).view(batch + (sa[-2], sb[-1])))


def rows_times_matrix(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for a matrix ``b``, every leading dim of ``a`` folded into the rows of one GEMM."""
    sa = a._shape
    return private(a.reshape(math.prod(sa[:-1]), sa[-1]).mm(b).view(sa[:-1] + (b._shape[-1],)))


declare("matmul(Tensor self, Tensor other) -> Tensor", "composite", decomposition=_matmul, dunder=("matmul",),
        autocast="lower")
declare("rmatmul(Tensor self, Tensor other) -> Tensor", "composite", decomposition=lambda a, b: _matmul(b, a),
        method=False, dunder=("rmatmul",), public=False, autocast="lower")


def _linear(x, weight, bias=None):
    out = x.matmul(weight.t())
    return out + bias if bias is not None else out


# One autograd node with its own derivative, so that eager training reaches the backend's linear (on CUDA one
# cuBLASLt call with the bias as its epilogue) instead of recording a product and a separate bias add.
declare("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", "composite", decomposition=_linear,
        grad={"input": "linear_input_grad(grad, weight)", "weight": "linear_weight_grad(grad, input, weight_shape)",
              "bias": "grad"}, fwd="linear(input_t, weight) + linear(input, weight_t, bias_t)", method=False,
        autocast="lower", batch=leading_batch_first_only)
# the product is the sum's first operand, so that the result is row-major whatever self's order (torch's is)
def _addmm(s, m1, m2, beta=1, alpha=1):
    """torch's checks in its order and words (the matrices, their product's shape, the dtypes, then ``self``
    expanded to the product's shape), then the product and the sum."""
    for name, m in (("mat1", m1), ("mat2", m2)):
        if m.ndim != 2:
            raise RuntimeError(f"{name} must be a matrix, got {m.ndim}-D tensor")
    if m1.shape[1] != m2.shape[0]:
        raise RuntimeError(mm_mismatch_text(m1.shape, m2.shape))
    if s.dtype is not m2.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {c10_name(s.dtype)} and "
                           f"{c10_name(m2.dtype)}")
    if m1.dtype is not m2.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {c10_name(m1.dtype)} and "
                           f"{c10_name(m2.dtype)}")
    return m1.mm(m2) * alpha + s.expand(m1.shape[0], m2.shape[1]) * beta


declare("addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", "composite",
        decomposition=_addmm, autocast="lower")


def _addmm_activation(s, m1, m2, beta=1, alpha=1, use_gelu=False):
    out = m1.mm(m2) * alpha + s * beta
    return OPS["gelu"](out, approximate="tanh") if use_gelu else out.relu()


# GELU's tanh approximation, as torch's CUDA implementation (a cuBLASLt epilogue) computes it; torch's CPU
# implementation applies the exact GELU. The CUDA target of the compiler turns mm + bias + activation into it.
declare("_addmm_activation(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1, "
        "bool use_gelu=False) -> Tensor", "composite", decomposition=_addmm_activation, method=False, autocast="lower")


# A linear layer with GELU (tanh) in a training step, as the CUDA target of the compiler runs it: the forward
# keeps GELU's input for the backward, and the backward's product and GELU's derivative are one GEMM
# (cuBLASLt's GELU_AUX_BIAS and DGELU epilogues).
def _addmm_gelu(s, m1, m2):
    pre = OPS["addmm"](s, m1, m2)
    return OPS["gelu"](pre, approximate="tanh"), pre


def _mm_gelu_backward(m1, m2, pre):
    check_mm_shapes("mm", m1, m2)
    if tuple(pre.shape) != (m1.shape[0], m2.shape[1]):
        raise RuntimeError(f"_mm_gelu_backward: preactivation has shape {list(pre.shape)}; it must be the product's "
                           f"shape [{m1.shape[0]}, {m2.shape[1]}] (mat1 {list(m1.shape)} @ mat2 {list(m2.shape)})")
    return OPS["gelu_backward"](m1.mm(m2), pre, "tanh")


declare("_addmm_gelu(Tensor self, Tensor mat1, Tensor mat2) -> (Tensor output, Tensor preactivation)", "composite",
        decomposition=_addmm_gelu, method=False, autocast={"cpu": "lower"})  # torch's _addmm_activation
declare("_mm_gelu_backward(Tensor mat1, Tensor mat2, Tensor preactivation) -> Tensor",
        "composite", decomposition=_mm_gelu_backward, method=False)
declare("baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor", "composite",
        decomposition=lambda s, b1, b2, beta=1, alpha=1: b1.bmm(b2) * alpha + s * beta, autocast="lower")
def _outer(a, b):
    if a.ndim != 1 or b.ndim != 1:
        which, other = ("self", a) if a.ndim != 1 else ("vec2", b)
        raise RuntimeError(f"outer: Expected 1-D argument {which}, but got {other.ndim}-D (shapes {list(a.shape)} and "
                           f"{list(b.shape)})")
    return a.unsqueeze(1) * b.unsqueeze(0)


declare("outer(Tensor self, Tensor vec2) -> Tensor", "composite", decomposition=_outer, aliases=("ger",))


def _dot(a, b):
    if a.ndim != 1 or b.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {a.ndim}D and {b.ndim}D tensors")
    if a.dtype is not b.dtype:  # torch converts neither (under autocast, its promote policy made them one)
        raise RuntimeError(f"dot : expected both vectors to have same dtype, but found {c10_name(a.dtype)} and "
                           f"{c10_name(b.dtype)}")
    if a.shape != b.shape:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a.shape[0]}] and src [{b.shape[0]}] to "
                           f"have the same number of elements, but got {a.shape[0]} and {b.shape[0]} elements "
                           "respectively")
    if a.dtype is dtypes.bool_:
        raise NotImplementedError('"dot" not implemented for \'Bool\'')
    # an integer dot product keeps its dtype (and wraps), as torch's: sum alone would widen it to int64
    return (a * b).sum(dtype=a.dtype)


declare("dot(Tensor self, Tensor tensor) -> Tensor", "composite", decomposition=_dot,
        autocast={"cuda": "promote"})


def _vdot(a, b):
    """The dot product with the first vector conjugated (a plain dot product for real vectors)."""
    return _dot(a.conj() if a.dtype.is_complex else a, b)


declare("vdot(Tensor self, Tensor other) -> Tensor", "composite", decomposition=_vdot, autocast={"cuda": "promote"})


def _mv(matrix, vec):
    if matrix.ndim != 2 or vec.ndim != 1:
        raise RuntimeError(f"mv: vector + matrix @ vector expected, got 1, {matrix.ndim}, {vec.ndim} (shapes "
                           f"{list(matrix.shape)} and {list(vec.shape)}): mv multiplies an [n, m] matrix by an [m] "
                           "vector")
    if matrix.shape[1] != vec.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({matrix.shape[0]}), mat ({matrix.shape[0]}x"
                           f"{matrix.shape[1]}), vec ({vec.shape[0]})")
    check_matrix_vector_dtypes("mv", matrix, vec)
    return matrix.matmul(vec)


def check_matrix_vector_dtypes(op: str, matrix: Tensor, vec: Tensor) -> None:
    """torch's addmv check, which names its output (of the vector's dtype), the matrix and the vector."""
    if matrix.dtype is not vec.dtype:
        raise RuntimeError(f"addmv input tensors must have the same dtype, but got {c10_name(vec.dtype)}, "
                           f"{c10_name(matrix.dtype)}, and {c10_name(vec.dtype)} ({op}: got {matrix.dtype.name} for "
                           f"the matrix and {vec.dtype.name} for the vector; convert one with .to())")


declare("mv(Tensor self, Tensor vec) -> Tensor", "composite", decomposition=_mv, autocast={"cuda": "lower"})


def _tensordot_dims(a, b, dims) -> tuple[list[int], list[int]]:
    """torch.tensordot's ``dims``: a count of trailing/leading dims, or two lists of dims (a tensor of either)."""
    if isinstance(dims, Tensor):
        dims = dims.item() if dims.numel() == 1 else dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        return list(range(-dims, 0)), list(range(dims))  # torch's (its errors name a's dims from the end)
    if not isinstance(dims, (list, tuple)) or len(dims) != 2:
        raise RuntimeError(f"tensordot expects dims to be an int, or a pair of lists of dims, got {dims!r}")
    dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("both dimension lists should have same length")
    return dims_a, dims_b


def _tensordot(a, b, dims=2):
    """Contract dims of a with dims of b: both are permuted so the contracted dims meet, then one matrix product."""
    if a.dtype is not b.dtype:
        raise RuntimeError("both inputs should have same dtype")
    dims_a, dims_b = _tensordot_dims(a, b, dims)
    for da, db in zip(dims_a, dims_b):  # the dims as given in the message, as torch's
        size_a, size_b = a.shape[S.normalize_dim(da, a.ndim)], b.shape[S.normalize_dim(db, b.ndim)]
        if size_a != size_b:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {size_a} in dim {da} "
                               f"and second has size {size_b} in dim {db}")
    dims_a = [S.normalize_dim(d, a.ndim, "tensordot") for d in dims_a]
    dims_b = [S.normalize_dim(d, b.ndim, "tensordot") for d in dims_b]
    free_a = [d for d in range(a.ndim) if d not in dims_a]
    free_b = [d for d in range(b.ndim) if d not in dims_b]
    size = S.numel(tuple(a.shape[d] for d in dims_a))  # sizes spelled out: -1 cannot be inferred beside a 0
    left = a.permute((*free_a, *dims_a)).reshape(S.numel(tuple(a.shape[d] for d in free_a)), size)
    right = b.permute((*dims_b, *free_b)).reshape(size, S.numel(tuple(b.shape[d] for d in free_b)))
    return left.mm(right).reshape(tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b))


def _tensordot_autocast_on_cpu(op, args) -> str | None:
    """torch's tensordot is one mm, which its CPU autocast list lowers, unless every dim of both is contracted (or
    the two dtypes differ, which it refuses)."""
    a, b, dims = args
    dims_a, dims_b = _tensordot_dims(a, b, dims)
    return None if a.dtype is not b.dtype or (len(dims_a) == a.ndim and len(dims_b) == b.ndim) else "lower"


declare("tensordot(Tensor a, Tensor b, Any dims=2) -> Tensor", "composite", decomposition=_tensordot, method=False,
        autocast={"cuda": "promote", "cpu": _tensordot_autocast_on_cpu})


def _inner(a, b):
    """torch.inner: a scalar operand multiplies; otherwise the sum of products along both last dims (a dot product
    for vectors), the result shaped ``a.shape[:-1] + b.shape[:-1]``."""
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    if a.shape[-1] != b.shape[-1]:
        raise RuntimeError(f"inner() the last dimension must match on both input tensors but got shapes "
                           f"{list(a.shape)} and {list(b.shape)}")
    return _tensordot(a, b, ([-1], [-1]))


declare("inner(Tensor self, Tensor other) -> Tensor", "composite", decomposition=_inner)


def _chain_matmul(matrices):
    """Deprecated in torch for linalg.multi_dot: the product of two-dimensional matrices, in the cheapest order."""
    warn_at_caller("tilewise.chain_matmul is deprecated and will be removed in a future PyTorch release. Use "
                   "tilewise.linalg.multi_dot instead, which accepts a list of two or more tensors rather than "
                   "multiple parameters.")
    if not matrices:
        raise RuntimeError("chain_matmul(): Expected one or more matrices")
    for t in matrices:
        if t.ndim != 2:
            raise RuntimeError(f"chain_matmul: Tensor dimension is {t.ndim}, expected 2 instead.")
    if len(matrices) == 1:
        return matrices[0].clone()
    return OPS["linalg_multi_dot"](list(matrices))


def chain_autocast_on_cpu(op, args) -> str | None:
    """torch's chain_matmul and linalg.multi_dot are chains of mm, which its CPU autocast list lowers, after checking
    that every matrix has one dtype; one matrix is returned as is."""
    tensors = args[0]
    return "lower" if len(tensors) > 1 and len({t.dtype for t in tensors}) == 1 else None


declare("chain_matmul(Tensor[] matrices) -> Tensor", "composite", decomposition=_chain_matmul, method=False,
        varargs=True, autocast={"cpu": chain_autocast_on_cpu, "cuda": "lower"})
