"""Operators save for backward what torch saves, so in-place idioms work and fail as in torch.

For every differentiable operator of the table (``tests/opinfos``) and each tensor it takes or returns, the
test runs the operator, changes that tensor in place, then backpropagates, in tilewise and in torch: both must
raise the same error (the version counter's "modified by an inplace operation", naming the tensor as torch
does, or the in-place check's own), or both must succeed with the same gradients. An operator that saves its
output where torch saves its input breaks an idiom torch users rely on, like the ResNet block's
``out += identity`` after a batch norm. ``DIFFERENCES`` lists, with the reason, the cases that still differ;
they are strict expected failures, so fixing one shows here.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from opinfo import _build, _materialise
from test_ops import OPINFOS

import tilewise as tw
import tilewise.nn.functional as F

MAX_OUTPUTS = 3  # outputs changed in place, per sample (ops with fewer skip the rest)

DIFFERENCES = {
    "unfold output 0: 0": "an in-place write into overlapping windows: torch adds twice where windows overlap (its "
                          "forward and gradient both), tilewise writes the out-of-place result once",
    **dict.fromkeys(["einsum input 0: 18", "einsum input 1: 18,ellipsis-broadcast"],
                    "which operand a contraction copies (and so does not keep) follows each library's own "
                    "contraction path"),
    **dict.fromkeys([
        "masked_select input 0: 0,1,broadcast-self", "masked_select input 1: 0,1,broadcast-self",
        "pad input 0: 10,3d,6,7,9,reflect-negative", "stft input 0: real-pairs"],
        "torch keeps a tensor whose shape alone its formula needs (or a mask tilewise turns into positions); "
        "tilewise's formula does not read it, so the gradient is right and the change is not an error"),
    **dict.fromkeys([
        "grid_sample input 1: 0,border-align,reflection,reflection-align,nearest,bicubic,bicubic-border,"
        "bicubic-reflection-align,3d,3d-reflection,3d-border-align,3d-nearest,nearest-border-align,empty-batch",
        "conv_tbc input 2: 0,pad",
        "grid_sampler input 1: 0,border-align,reflection,bicubic", "grid_sampler_2d input 1: 0,border-align,"
        "reflection,bicubic", "grid_sampler_3d input 1: 0,border-align,reflection"],
        "torch's kernel keeps this input; tilewise's composite keeps what it computed from it (the sampling "
        "positions and weights; the bias it broadcast), so the gradient is right and the change is not an error"),
    **dict.fromkeys(["fold input 0: 0,dilation-pad-stride,unbatched"],
                    "tilewise's fold gathers its windows through a permuted view of the input, which its backward "
                    "keeps; torch's col2im keeps nothing, so tilewise refuses a write torch allows (never a wrong "
                    "gradient)"),
    **dict.fromkeys([
        "multi_margin_loss input 2: weight", "pdist input 0: 0,p1,p3,one-row",
        "ctc_loss input 1: padded-mean,padded-sum,padded-none", "rrelu input 0: training-fixed-slope",
        "bilinear input 2: 0,no-bias-3d,unbatched",
        "embedding_bag input 0: per-sample-weights,mode0-per-sample-weights"],
        "torch's kernel keeps this input; tilewise's composite keeps what it derived from it (rows it gathered, "
        "a copy laid out for a matmul, or the slopes alone), so the gradient is right and the change is not an "
        "error"),
    **dict.fromkeys([f"embedding_bag output {k}: mode0,mode0-padding-last-offset,mode1,mode1-padding-last-offset,mode2,"
                     "mode2-padding-last-offset,mode0-per-sample-weights,mode1-freq" for k in (1, 2)],
                    "torch's kernel keeps offset2bag and bag_size for its backward; tilewise's output is "
                    "nn.functional.embedding_bag's, whose backward reads neither, so the gradient is right and the "
                    "change is not an error"),
    "ctc_loss output 0: padded-none,infeasible": "torch's backward reads its loss; tilewise's reads the "
                                                 "recursion's values",
    **dict.fromkeys(["combinations input 0: 0,1,2", "put input 2: 0,accumulate"],
                    "a composite of indexing, which keeps positions rather than the values torch's kernel keeps"),
    "ldexp output 0: 0": "torch keeps the result for the exponent's gradient even when the exponent (an integer "
                         "tensor here) needs none; tilewise keeps what the gradients wanted read",
    **dict.fromkeys(["dist input 0: 0,p1-broadcast,inf,p3.5", "dist input 1: 0,p1-broadcast,inf,p3.5",
                     "cdist input 0: 0,batched-p1,broadcast-p3,inf,p-half",
                     "cdist input 1: 0,batched-p1,broadcast-p3,inf,p-half"],
                    "torch's kernel keeps both inputs; tilewise's composite keeps their difference (the norm's "
                    "input), so the gradient is right and the change is not an error"),
    **dict.fromkeys(["tensordot input 0: all", "tensordot input 1: all"],
                    "a contraction of every dim permutes both operands into a copy laid out for one matrix product, "
                    "which is what tilewise keeps; torch's matmul keeps the operands' views"),
    **dict.fromkeys(["linalg.householder_product input 0: 0,batch,no_reflectors",
                     "linalg.householder_product input 1: no_reflectors",
                     "linalg.householder_product output 0: 0,batch,no_reflectors", "orgqr input 0: 0",
                     "orgqr output 0: 0"],
                    "torch's kernel keeps its input and result; tilewise's composite keeps the reflectors it built "
                    "from the input (new tensors, not views), so the gradient is right and the change is not an "
                    "error"),
    "linalg.solve output 0: batched-vector": "torch lays out a batch of vector solutions as one column-major "
                                             "matrix; tilewise copies its solver's result (the tensor it keeps) into "
                                             "that layout, so the gradient is right and the change is not an error",
    "ormqr output 0: left,left-transpose,right,right-transpose,wide,batch-right,0":
        "torch's backward keeps ormqr's result; tilewise's recomputes the products before each reflector from the "
        "inputs, so the gradient is right and the change is not an error",
    **dict.fromkeys(["kron input 0: 0,1,2", "kron input 1: 0,1,2"],
                    "a composite of reshapes and a product, which keeps both factors; torch's kron keeps neither"),
    **dict.fromkeys([f"linalg.lu output {k}: 3x3,batch,1x1,tall,wide,batch-square" for k in range(3)],
                    "torch's lu keeps P, L and U for its backward; tilewise unpacks them from the packed factors its "
                    "factorization keeps, so the gradient is right and the change is not an error"),
    "linalg.lu_solve output 0: left-adjoint,right,right-adjoint":
        "torch's lu_solve keeps its result; tilewise's composite ends in a product with the permutation, which "
        "keeps the factor it multiplied, so the gradient is right and the change is not an error",
    **dict.fromkeys(["linalg.vander input 0: 0,batch-wider", "linalg.vander output 0: 0,batch-wider"],
                    "torch's vander keeps x and reads its own powers anew; tilewise's is a cumulative product, which "
                    "keeps its result and not x: a write torch refuses goes through, and one torch allows is refused "
                    "(never a wrong gradient)"),
}


def _differences() -> dict[tuple[str, str, str, int], str]:
    table = {}
    for entry, reason in DIFFERENCES.items():
        head, samples = entry.split(": ")
        op, kind, index = head.split()
        for sample in samples.split(","):
            table[(op, sample, kind, int(index))] = reason
    return table


def _mutate(lib, t) -> None:
    """Change ``t`` in place (and so bump its version); integer and boolean tensors keep their values."""
    if t.dtype.is_floating_point:
        t.add_(0.25)
    else:
        t.mul_(lib.ones((), dtype=t.dtype))


class Run:
    """One framework's forward, in-place change and backward of one sample: ``error`` or ``grads`` after."""

    def __init__(self, lib, functional, info, sample, target):
        self.lib, self.error, self.grads, self.skipped, self.node = lib, None, None, False, ""
        rng = np.random.default_rng(0)
        made: list = []
        args = _materialise(sample.args, rng, "float64", made)
        kwargs = {k: _materialise(v, rng, "float64", made) for k, v in sample.kwargs.items()}
        self.leaves, self.values = {}, {}

        def make(k):
            if k not in self.values:
                arr, spec = made[k]
                leaf = lib.from_numpy(arr.copy())
                if info.grad and spec.grad and arr.dtype.kind == "f":
                    self.leaves[k] = leaf.requires_grad_(True)
                    self.values[k] = leaf.clone()  # not a leaf, so it may change in place
                else:
                    self.values[k] = leaf
            return self.values[k]

        self.run(info.resolve(lib, functional), _build(args, None, make, lib),
                 {k: _build(v, None, make, lib) for k, v in kwargs.items()}, target)

    def run(self, fn, args, kwargs, target):
        lib = self.lib
        kind, index = target
        try:
            out = fn(*args, **kwargs)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if outs and isinstance(outs[0], lib.Tensor) and outs[0].grad_fn is not None:
                self.node = outs[0].grad_fn.name()
            changed = self.values.get(index) if kind == "input" else outs[index] if index < len(outs) else None
            diff = [o for o in outs if isinstance(o, lib.Tensor) and o.requires_grad and o.dtype.is_floating_point]
            if changed is None or not isinstance(changed, lib.Tensor) or not diff or not self.leaves:
                self.skipped = True
                return
            _mutate(lib, changed)
            gouts = [lib.from_numpy(np.linspace(-1, 1, o.numel()).reshape(tuple(o.shape))) for o in diff]
            self.grads = lib.autograd.grad(diff, list(self.leaves.values()), gouts, allow_unused=True)
        except RuntimeError as exc:
            self.error = str(exc)


def _cases():
    known = _differences()
    cases = []
    for info in OPINFOS:
        if not info.grad or "float64" not in info.dtypes or info.reference is not None:
            continue  # ops torch does not have save nothing to compare
        for k, sample in enumerate(info.samples()):
            label = sample.name or str(k)
            inputs = _count_placeholders(sample)
            for target in [("input", j) for j in range(inputs)] + [("output", j) for j in range(MAX_OUTPUTS)]:
                reason = known.get((info.name, label, *target))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                cases.append(pytest.param(info, k, target, marks=marks,
                                          id=f"{info.name}-{label}-{target[0]}{target[1]}"))
    return cases


def _count_placeholders(sample) -> int:
    made: list = []
    rng = np.random.default_rng(0)
    _materialise(sample.args, rng, "float64", made)
    for v in sample.kwargs.values():
        _materialise(v, rng, "float64", made)
    return len(made)


def _kind_of_error(message: str) -> str:
    for kind in ("modified by an inplace operation", "refers to a single memory location",
                 "is a view and is being modified inplace", "leaf Variable that requires grad"):
        if kind in message:
            return kind
    return message


def _check_same_error(ours: str, theirs: str, where: str) -> None:
    assert _kind_of_error(ours) == _kind_of_error(theirs), f"{where}: tilewise raises\n{ours}\ntorch raises\n{theirs}"
    if "modified by an inplace operation" in theirs:  # the same versions, and a node named where torch names one
        versions = r"is at version \d+; expected version \d+"
        assert re.search(versions, ours).group() == re.search(versions, theirs).group(), (where, ours, theirs)
        assert ("which is output" in ours) == ("which is output" in theirs), (where, ours, theirs)
        assert ours.startswith("one of the variables needed for gradient computation has been modified by an "
                               "inplace operation: [tilewise."), ours


@pytest.mark.parametrize("info,k,target", _cases())
def test_in_place_after_forward_matches_torch(info, k, target):
    sample = info.samples()[k]
    theirs = Run(torch, TF, info, sample, target)
    if theirs.skipped or (info.name == "scaled_dot_product_attention" and "Attention" not in theirs.node):
        return  # torch ran its math fallback, whose saved tensors are those of its decomposition
    ours = Run(tw, F, info, sample, target)
    where = f"{info.name}[{sample.name or k}]: {target[0]} {target[1]} changed in place after the forward"
    if theirs.error is not None:
        assert ours.error is not None, f"{where}: torch raises, tilewise does not. torch:\n{theirs.error}"
        _check_same_error(ours.error, theirs.error, where)
        return
    assert ours.error is None, f"{where}: tilewise raises, torch does not:\n{ours.error}"
    for g_ours, g_theirs in zip(ours.grads, theirs.grads):
        if g_theirs is None:
            assert g_ours is None or not g_ours.numpy().any(), where
            continue
        np.testing.assert_allclose(g_ours.numpy(), g_theirs.numpy(), rtol=1e-7, atol=1e-9, err_msg=where)


# ---------------------------------------------------------------------------- the error's words

def _message(lib, make):
    with pytest.raises(RuntimeError) as err:
        make(lib)
    return re.sub(r"torch\.(Float|Double)Tensor", lambda m: f"tilewise.float{32 if m[1] == 'Float' else 64}",
                  str(err.value)).split(" Hint:")[0]


@pytest.mark.parametrize("case", ["saved-output", "saved-input", "saved-leaf-input", "batch-norm-input"])
def test_the_version_error_names_tensor_and_node_as_torch(case):
    def make(lib):
        x = lib.ones(2, 3, requires_grad=True)
        w = lib.ones(3)
        if case == "saved-output":
            y = (x * 2).exp()
            y.add_(1)
        elif case == "saved-input":
            h = x * 2
            y = h.sin()
            h.mul_(2)
        elif case == "saved-leaf-input":
            y = x * w
            w.add_(1)
        else:
            h = x * 2
            y = lib.nn.functional.batch_norm(h, None, None, training=True)
            h.add_(1)
        y.sum().backward()

    assert _message(tw, make) == _message(torch, make)


# ---------------------------------------------------------------------------- the ResNet block

def _resnet_block(lib, inplace: bool):
    nn = lib.nn

    class BasicBlock(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels)
            self.relu = nn.ReLU(inplace=inplace)
            self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels)

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += identity
            return self.relu(out)

    return BasicBlock(3)


def _block_results(lib, compiled: bool, train: bool, steps: int = 2):
    block = _resnet_block(lib, inplace=True)
    rng = np.random.default_rng(0)
    with lib.no_grad():
        for p in block.parameters():
            p.copy_(lib.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.3))
    block.train(train)

    def step(x):
        out = block(x * 1.0)
        (out * out).sum().backward()
        return out.detach()

    fn = tw.compile(step) if compiled else step
    results = []
    for _ in range(steps):
        x = lib.from_numpy(rng.standard_normal((2, 3, 5, 5)).astype(np.float32)).requires_grad_(True)
        for p in block.parameters():
            p.grad = None
        out = fn(x)
        results.append([out, x.grad, *(p.grad for p in block.parameters()), block.bn1.running_mean,
                        block.bn2.running_var])
    return [[t.detach().numpy() for t in r] for r in results]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_resnet_block_with_in_place_residual_and_relu(compiled, train):
    """``relu(inplace=True)`` after batch norm and ``out += identity``: the idiomatic block trains as in torch."""
    for ours, theirs in zip(_block_results(tw, compiled, train), _block_results(torch, False, train)):
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("module,shape", [("BatchNorm1d", (4, 3)), ("BatchNorm1d", (4, 3, 5)),
                                          ("BatchNorm2d", (2, 3, 4, 5)), ("BatchNorm3d", (2, 3, 2, 3, 4)),
                                          ("InstanceNorm1d", (2, 3, 5)), ("InstanceNorm2d", (2, 3, 4, 5)),
                                          ("InstanceNorm3d", (2, 3, 2, 3, 4)), ("GroupNorm", (2, 4, 5)),
                                          ("LayerNorm", (2, 3, 5)), ("RMSNorm", (2, 3, 5))])
@pytest.mark.parametrize("options", [{}, {"affine": False}, {"track_running_stats": False},
                                     {"affine": True, "track_running_stats": True}],
                         ids=["default", "no-affine", "no-running-stats", "affine-running-stats"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_normalization_output_changes_in_place_as_in_torch(module, shape, options, train):
    """The layer's output changed in place (relu(inplace=True)), its input, and a second forward before
    backward (as siamese nets do): each works or fails as in torch, with torch's outputs, gradients and running
    statistics."""
    def build(lib):
        if module == "GroupNorm":
            return lib.nn.GroupNorm(2, shape[1], affine=options.get("affine", True))
        if module in ("LayerNorm", "RMSNorm"):
            return getattr(lib.nn, module)(shape[-1], elementwise_affine=options.get("affine", True))
        return getattr(lib.nn, module)(shape[1], **options)

    x = np.random.default_rng(1).standard_normal(shape)
    for change in ("output", "input", "second-forward"):
        outcomes = []
        for lib in (torch, tw):
            layer = build(lib).double().train(train)
            leaf = lib.from_numpy(x.copy()).requires_grad_(True)
            h = leaf * 1.0
            try:
                out = layer(h)
                if change == "output":
                    out.relu_()
                elif change == "input":
                    h.add_(1)
                else:
                    out = out + layer(h * 2)
                (out * out).sum().backward()
                stats = [getattr(layer, name, None) for name in ("running_mean", "running_var")]
                outcomes.append(np.concatenate([leaf.grad.numpy().ravel(), out.detach().numpy().ravel(),
                                                *(t.numpy() for t in stats if t is not None)]))
            except RuntimeError as exc:
                outcomes.append(_kind_of_error(str(exc)))
        ours, theirs = outcomes[1], outcomes[0]
        assert type(ours) is type(theirs), f"{module} {options} {change}: tilewise {ours!r}, torch {theirs!r}"
        if isinstance(theirs, str):
            assert ours == theirs
        else:
            np.testing.assert_allclose(ours, theirs, rtol=1e-7, atol=1e-9, err_msg=f"{module} {options} {change}")
