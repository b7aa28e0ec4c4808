"""Bad input: each class of mistake raises an error that names the operator, the values involved and what
would be valid — never a crash, a silent wrap, or a message from a layer the user never called."""

from __future__ import annotations

import re

import pytest
import torch

import tilewise as tw
import tilewise.nn.functional as F  # noqa: N812 — torch's spelling
from tilewise.device import Device
from tilewise.tensor import Tensor


def raises(exc_type, *fragments: str):
    """pytest.raises that checks every fragment appears in the message (fragments are literal text)."""
    return pytest.raises(exc_type, match="(?s)" + "".join(f"(?=.*{re.escape(f)})" for f in fragments))


X = tw.ones(2, 3)


# ---------------------------------------------------------------------------- shapes and broadcasting

@pytest.mark.parametrize("op", ["add", "mul", "maximum", "atan2"])
def test_broadcast_mismatch(op):
    with raises(RuntimeError, f"{op}:", "[2, 3]", "[4]", "cannot be broadcast", "equal or 1"):
        getattr(tw, op)(X, tw.ones(4))


def test_broadcast_mismatch_with_autograd_and_operator_syntax():
    with raises(RuntimeError, "mul:", "[2, 3]", "[3, 2]", "equal or 1"):
        X.requires_grad_(False) * tw.ones(3, 2, requires_grad=True)
    with raises(RuntimeError, "add_:", "[2]", "[3, 2]"):
        tw.ones(2).add_(tw.ones(3, 2))


def test_matmul_shape_mismatch():
    with raises(RuntimeError, "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"):
        tw.mm(X, tw.ones(2, 3))
    with raises(RuntimeError, "mat1 and mat2 shapes cannot be multiplied (2x3 and 5x4)"):
        X @ tw.ones(5, 4)
    with raises(RuntimeError, "both arguments to matmul need to be at least 1D, but they are 0D and 2D"):
        tw.matmul(tw.tensor(1.0), X)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_mm_and_bmm_name_the_operand_of_the_wrong_rank_in_torch_words(requires_grad):
    matrix = tw.ones(2, 3, requires_grad=requires_grad)
    with raises(RuntimeError, "batch1 must be a 3D tensor"):
        tw.bmm(matrix, tw.ones(3, 2))
    with raises(RuntimeError, "batch2 must be a 3D tensor"):
        tw.ones(4, 2, 3).bmm(tw.ones(3, 2))
    with raises(RuntimeError, "self must be a matrix"):
        tw.mm(matrix.unsqueeze(0), tw.ones(1, 3, 2))
    with raises(RuntimeError, "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [3, 3]."):
        tw.bmm(tw.ones(2, 2, 3), tw.ones(3, 3, 2))
    with raises(RuntimeError, "Expected size for first two dimensions of batch2 tensor to be: [2, 3] but got: [2, 2]."):
        tw.bmm(tw.ones(2, 2, 3), tw.ones(2, 2, 2))


@pytest.mark.parametrize("call,fragments", [
    (lambda: X.view(4), ("shape '[4]' is invalid for input of size 6",)),
    (lambda: X.reshape(5), ("shape '[5]' is invalid for input of size 6",)),
    (lambda: X.view(-1, -1), ("only one dimension can be inferred",)),
    (lambda: X.t().view(6), ("view size is not compatible", "Use .reshape")),
    (lambda: X.expand(4, 3, 3), ("expanded size of the tensor (3)", "existing size (2)", "[4, 3, 3]", "[2, 3]")),
    (lambda: X.expand(-1, -1, 3), ("(-1)", "leading, non-existing dimension 0")),
    (lambda: X.unfold(1, 4, 1), ("unfold", "dimension 1 is 3", "size is 4")),
    (lambda: X.narrow(1, 2, 3), ("narrow()", "start (2)", "length (3)", "size (3)")),
    (lambda: X.chunk(0), ("chunk", "greater than 0", "0")),
    (lambda: X.split([1, 2], 0), ("split_with_sizes", "sum exactly to 2", "[1, 2]")),
    (lambda: tw.cat([X, tw.ones(3, 3)], 1), ("Sizes of tensors must match except in dimension 1", "Expected size 2 "
                                              "but got size 3 for tensor number 1")),
    (lambda: X.as_strided((4, 4), (3, 1)), ("as_strided", "[4, 4]", "[3, 1]", "13 elements", "has 6")),
])
def test_bad_shapes(call, fragments):
    with raises((RuntimeError, IndexError), *fragments):
        call()


# ---------------------------------------------------------------------------- dtypes

def test_mm_dtype_mismatch():
    with raises(RuntimeError, "expected m1 and m2 to have the same dtype, but got: float != double"):
        tw.mm(X, tw.ones(3, 2, dtype=tw.float64))
    with raises(RuntimeError, "expected m1 and m2 to have the same dtype, but got: float != double"):
        X @ tw.ones(3, 2, dtype=tw.float64)
    with raises(RuntimeError, "expected scalar type BFloat16 but found Float"):
        tw.bmm(tw.ones(1, 2, 3, dtype=tw.bfloat16), tw.ones(1, 3, 2))


@pytest.mark.parametrize("call,fragments", [
    (lambda: tw.bitwise_and(X, X), ("bitwise_and", "integer and bool", "float32")),
    (lambda: tw.ones(2, dtype=tw.int64).mean(), ("mean()", "floating point", "int64", "dtype=")),
    (lambda: tw.ones(2, dtype=tw.int64).add_(1.5), ("add_", "float32", "int64", "can't be cast")),
    (lambda: tw.promote_types(tw.float8_e5m2, tw.float16), ("Float8", "float8_e5m2", "float16")),
    (lambda: X.to(3.5), ("to()", "device, dtype or tensor", "3.5")),
    (lambda: tw.tensor([1.0]).to("complex64"), ("complex64",)),
    (lambda: tw.tensor([[1, 2], [3]]), ("tensor()", "not rectangular")),
])
def test_bad_dtypes(call, fragments):
    with raises((RuntimeError, TypeError, ValueError), *fragments):
        call()


BOOL_ARITHMETIC = {
    "mask - mask": lambda lib, m: m - m,
    "sub(mask, True)": lambda lib, m: lib.sub(m, True),
    "True - mask": lambda lib, m: True - m,
    "mask - 1": lambda lib, m: m - 1,
    "ints - mask": lambda lib, m: m.long() - m,
    "1.5 - mask": lambda lib, m: 1.5 - m,
    "mask.sub_(mask)": lambda lib, m: m.clone().sub_(m),
    "-mask": lambda lib, m: -m,
    "mask // mask": lambda lib, m: m // m,
    "floor_divide(mask, True)": lambda lib, m: lib.floor_divide(m, True),
    "mask.floor_divide_(mask)": lambda lib, m: m.clone().floor_divide_(m),
    "mask % mask": lambda lib, m: m % m,
    "remainder(mask, True)": lambda lib, m: lib.remainder(m, True),
    "mask.remainder_(mask)": lambda lib, m: m.clone().remainder_(m),
    "fmod(mask, mask)": lambda lib, m: lib.fmod(m, m),
    "div(mask, mask, floor)": lambda lib, m: lib.div(m, m, rounding_mode="floor"),
    "mask ** mask": lambda lib, m: m ** m,
    # accepted by torch
    "mask ** True": lambda lib, m: m ** True,
    "mask // ints": lambda lib, m: m // lib.tensor([1, 2]),
    "mask % ints": lambda lib, m: m % lib.tensor([1, 2]),
    "mask / True": lambda lib, m: m / True,
    "mask + mask": lambda lib, m: m + m,
    "mask * mask": lambda lib, m: m * m,
}


@pytest.mark.parametrize("name", list(BOOL_ARITHMETIC))
def test_bool_arithmetic_is_accepted_or_refused_like_torch(name):
    call = BOOL_ARITHMETIC[name]
    try:
        expected = call(torch, torch.tensor([True, False]))
    except RuntimeError as exc:  # NotImplementedError is a RuntimeError, in torch as here
        with pytest.raises(type(exc)):
            call(tw, tw.tensor([True, False]))
        return
    ours = call(tw, tw.tensor([True, False]))
    assert str(ours.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1]
    assert ours.tolist() == expected.tolist()


def test_bool_arithmetic_errors_name_the_op_the_dtypes_and_the_fix():
    mask = tw.tensor([True, False])
    with raises(RuntimeError, "sub:", "two bool tensors", "bool and bool", "logical_xor()"):
        mask - mask
    with raises(RuntimeError, "sub:", "with a bool tensor", "int64 and bool", "logical_not()", ".long()"):
        tw.tensor([1, 2]) - mask
    with raises(RuntimeError, "neg:", "bool tensor", "logical_not()"):
        tw.neg(mask)
    with raises(NotImplementedError, "floor_divide:", "bool and bool", ".long()"):
        mask // mask
    with raises(NotImplementedError, "remainder:", "bool and bool", ".long()"):
        mask % True


def test_round_with_decimals_needs_a_floating_tensor_as_torch():
    with pytest.raises(NotImplementedError, match="round_cpu"):
        torch.round(torch.tensor([1, 2]), decimals=1)
    with raises(NotImplementedError, '"round"', "decimals=1", "'Long'", ".float()"):
        tw.round(tw.tensor([1, 2]), decimals=1)
    assert tw.round(tw.tensor([1, 2])).dtype == tw.int64


# ---------------------------------------------------------------------------- devices

def fake_cuda(t: Tensor) -> Tensor:
    """The same storage labelled as a CUDA tensor: enough to check the dispatcher without a GPU."""
    return Tensor._make(t._storage, t._shape, t._strides, t._offset, t._dtype, Device("cuda"))


@pytest.mark.parametrize("call", [
    lambda c: X + c,
    lambda c: tw.mm(X, c.t()),
    lambda c: tw.cat([X, c]),
    lambda c: tw.where(X > 0, c, X),
])
def test_tensors_on_two_devices(call):
    with raises(RuntimeError, "same device", "cpu", "cuda:0", ".to(device)"):
        call(fake_cuda(X))


def test_zero_dim_cpu_tensor_may_join_another_device():
    from tilewise.dispatch import device_of
    from tilewise.ops.registry import OPS

    assert device_of(OPS["add"], (fake_cuda(X), tw.tensor(2.0), 1)) == Device("cuda")


def test_device_without_backend_names_the_op_and_the_fix():
    if "cuda" in __import__("tilewise.dispatch", fromlist=["BACKENDS"]).BACKENDS:
        pytest.skip("a CUDA backend is registered here")
    with raises(RuntimeError, "exp:", "cuda:0", "[cuda]"):
        fake_cuda(X).exp()


@pytest.mark.parametrize("spec,fragments", [
    ("tpu", ("unknown device type 'tpu'", "cpu, cuda")),
    ("cuda:x", ("invalid device string 'cuda:x'", "cuda:0")),
])
def test_bad_device_strings(spec, fragments):
    with raises(ValueError, *fragments):
        tw.device(spec)
    with raises((ValueError, TypeError), *fragments):
        tw.zeros(2, device=spec)


# ---------------------------------------------------------------------------- dims

@pytest.mark.parametrize("call,op,bad", [
    (lambda: X.sum(5), "sum", "5"),
    (lambda: X.transpose(0, 3), "transpose", "3"),
    (lambda: X.squeeze(4), "squeeze", "4"),
    (lambda: X.unsqueeze(5), "unsqueeze", "5"),
    (lambda: X.softmax(3), "softmax", "3"),
    (lambda: tw.cat([X, X], 2), "cat", "2"),
    (lambda: X.movedim(0, 2), "movedim", "2"),
    (lambda: X.size(-3), "size", "-3"),
])
def test_dim_out_of_range(call, op, bad):
    with raises(IndexError, "Dimension out of range", "[-2, 1]" if op != "unsqueeze" else "[-3, 2]",
                f"got {bad}"):
        call()


@pytest.mark.parametrize("call,fragments", [
    (lambda: X.permute(0, 0), ("permute", "repeated dim", "[0, 0]")),
    (lambda: X.permute(0), ("permute", "1 dims", "2-d tensor")),
    (lambda: X.sum((0, 0)), ("dim 0 appears multiple times in the list of dims",)),
    (lambda: X.diagonal(0, 1, 1), ("diagonal", "cannot be identical", "1, 1")),
    (lambda: X.flatten(1, 0), ("flatten()", "start_dim 1", "end_dim 0")),
])
def test_bad_dim_combinations(call, fragments):
    with raises(RuntimeError, *fragments):
        call()


# ---------------------------------------------------------------------------- indices

@pytest.mark.parametrize("call,fragments", [
    (lambda: X[5], ("index 5", "out of bounds", "dimension 0", "size 2")),
    (lambda: X[-3], ("index -3", "out of bounds", "size 2")),
    (lambda: X[0, 0, 0], ("too many indices", "dimension 2")),
    (lambda: X[tw.tensor([0, 4])], ("index 4", "out of bounds", "dimension 0", "size 2")),
    (lambda: X[tw.ones(3, dtype=tw.bool)], ("mask [3]", "[2, 3]")),
    (lambda: X[1.5], ("valid indices", "float")),
    (lambda: X.select(1, 3), ("index 3", "out of bounds", "dimension 1", "size 3")),
    (lambda: X.index_select(1, tw.tensor([0, 3])), ("index_select()", "index 3", "dimension 1", "size 3")),
    (lambda: tw.zeros(2, 3).index_put_((tw.tensor([5]),), tw.tensor(1.0)), ("index 5", "size 2")),
    (lambda: F.cross_entropy(tw.ones(3, 4), tw.tensor([0, 1, 9])), ("cross_entropy", "9", "C=4", "0..3")),
    (lambda: F.embedding(tw.tensor([0, 7]), tw.ones(5, 2)), ("index 7", "out of bounds", "size 5")),
])
def test_out_of_range_indices_are_checked(call, fragments):
    with raises(IndexError, *fragments):
        call()


@pytest.mark.parametrize("call,fragments", [
    (lambda: X.gather(1, tw.tensor([[0, 5], [1, 2]])), ("index 5", "dimension 1", "size 3")),
    (lambda: X.gather(1, tw.tensor([[0, -5], [1, 2]])), ("index -5", "size 3")),
    (lambda: tw.zeros(2, 3).scatter(1, tw.tensor([[0, 9]]), 1.0), ("index 9", "size 3")),
])
def test_out_of_range_gather_and_scatter_indices_raise_runtime_error(call, fragments):
    """torch's gather and scatter refuse a bad index with RuntimeError, not IndexError."""
    with raises(RuntimeError, *fragments):
        call()


NEGATIVE_INDEX_CALLS = {
    "index_select": lambda lib: lib.ones(2, 3).index_select(1, lib.tensor([0, -1])),
    "index_add": lambda lib: lib.zeros(2, 3).index_add(1, lib.tensor([-1]), lib.ones(2, 1)),
    "index_copy": lambda lib: lib.zeros(2, 3).index_copy(1, lib.tensor([-1]), lib.ones(2, 1)),
    "embedding": lambda lib: lib.nn.functional.embedding(lib.tensor([0, -1]), lib.ones(3, 2)),
}


@pytest.mark.parametrize("op", list(NEGATIVE_INDEX_CALLS))
def test_negative_indices_are_refused_where_torch_refuses_them(op):
    """Unlike x[index] (and index_fill, take), these do not count negative indices from the end."""
    error = RuntimeError if op == "index_add" else IndexError  # torch's index_add of a 2-D tensor: RuntimeError
    with pytest.raises(error if op == "index_add" else (RuntimeError, IndexError)):
        NEGATIVE_INDEX_CALLS[op](torch)
    size, dim = (3, 0) if op == "embedding" else (3, 1)
    with raises(error, f"{op}()", "index -1", f"dimension {dim}", f"size {size}", "valid indices are 0..2"):
        NEGATIVE_INDEX_CALLS[op](tw)


def test_x_index_reports_the_indexed_dimension():
    """x[0, 7] fails in dimension 1 of x, as torch reports it."""
    with raises(IndexError, "index 7", "dimension 1", "size 3"):
        X[0, 7]


# ---------------------------------------------------------------------------- autograd misuse

@pytest.mark.parametrize("call,fragments", [
    (lambda: tw.ones(2).sum().backward(), ("element 0 of tensors does not require grad", "grad_fn")),
    (lambda: tw.ones(2, dtype=tw.int64).requires_grad_(), ("floating point", "int64")),
    (lambda: tw.tensor([1, 2], requires_grad=True), ("floating point", "int64")),
    (lambda: tw.ones(2, requires_grad=True).numpy(), ("numpy()", "requires grad", "detach()")),
    (lambda: (tw.ones(2, requires_grad=True) * 2).backward(), ("implicitly created only for scalar", "[2]")),
    (lambda: tw.autograd.grad(tw.ones(2, requires_grad=True).sum(), tw.ones(2)), ("does not require grad",)),
    (lambda: (tw.ones(2, requires_grad=True) * 2).requires_grad_(False), ("leaf variables", "detach()")),
    (lambda: tw.ones(2).register_hook(lambda g: g), ("hook", "doesn't require gradient")),
    (lambda: tw.ones(2).retain_grad(), ("retain_grad", "requires_grad=False")),
])
def test_non_differentiable_misuse(call, fragments):
    with raises(RuntimeError, *fragments):
        call()


def test_assigning_grad_of_wrong_shape():
    x = tw.ones(2, requires_grad=True)
    with raises(RuntimeError, "[3]", "[2]", "shape"):
        x.grad = tw.ones(3)


# ---------------------------------------------------------------------------- argument types

@pytest.mark.parametrize("call,fragments", [
    (lambda: tw.add(X, "a"), ("add()", "argument 'other'", "Tensor", "str 'a'")),
    (lambda: tw.exp([1, 2]), ("exp()", "argument 'self'", "Tensor", "list [1, 2]")),
    (lambda: X.view("a"), ("view()", "argument 'size'", "tuple of ints", "str 'a'")),
    (lambda: X.sum(dim=1.5), ("sum()", "argument 'dim'", "tuple of ints", "float 1.5")),
    (lambda: X.sum(dim=0, keepdim=2), ("sum()", "argument 'keepdim'", "bool", "int 2")),
    (lambda: X.transpose(0, "1"), ("transpose()", "argument 'dim1'", "int", "str '1'")),
    (lambda: tw.cat(X), ("cat()", "argument 'tensors' (position 1) must be tuple of Tensors, not Tensor",)),
    (lambda: tw.add(X, X, beta=2), ("add()", "unexpected keyword argument 'beta'")),
    (lambda: tw.zeros(2, dtype="float99"), ("float99", "valid dtypes")),
    (lambda: tw.clamp(X, "lo"), ("clamp", "'min'", "str 'lo'")),
])
def test_wrong_argument_types(call, fragments):
    with raises(TypeError, *fragments):
        call()
