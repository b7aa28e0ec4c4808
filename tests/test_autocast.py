"""tilewise.autocast against torch. torch's CPU autocast lists differ from its CUDA lists, which tilewise follows
on every device type, so on the CPU the result dtypes are checked against an explicit table (tilewise's policy)
and the values and gradients against torch running the same computation with the casts written out. Also:
regions (nesting, enabled=False, decorators, exceptions), what autocast leaves alone, the weight-cast cache,
a module trained a step, custom autograd Functions, errors, and tilewise.compile's autocast guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw
from tilewise.amp.autocast_mode import _REGIONS, POLICIES
from tilewise.config import settings
from tilewise.ops.registry import AUTOCAST_POLICIES, OPS

TW_DTYPES = {"f32": tw.float32, "bf16": tw.bfloat16, "f16": tw.float16, "f64": tw.float64, "i64": tw.int64}
TORCH_DTYPES = {tw.float32: torch.float32, tw.bfloat16: torch.bfloat16, tw.float16: torch.float16,
                tw.float64: torch.float64, tw.int64: torch.int64}


def _array(spec: str, shape: tuple, rng) -> np.ndarray:
    if spec == "i64":
        return rng.integers(0, 4, size=shape)
    return rng.uniform(0.2, 1.5, size=shape).astype(np.float32)  # positive: log, pow and rsqrt are defined


def _pair(spec: str, shape: tuple, rng, grad: bool = True):
    """The same values as a tilewise and a torch tensor of dtype ``spec``, leaves that require grad if floating."""
    a = _array(spec, shape, rng)
    dtype = TW_DTYPES[spec]
    ours = tw.from_numpy(a).to(dtype)
    theirs = torch.from_numpy(a).to(TORCH_DTYPES[dtype])
    if grad and dtype.is_floating_point:
        ours.requires_grad_(True)
        theirs.requires_grad_(True)
    return ours, theirs


def _close(ours, theirs, rtol: float, atol: float, what: str = "") -> None:
    assert TORCH_DTYPES[ours.dtype] == theirs.dtype, f"{what}: dtype {ours.dtype} vs {theirs.dtype}"
    np.testing.assert_allclose(ours.detach().double().numpy(), theirs.detach().double().numpy(), rtol=rtol,
                               atol=atol, err_msg=what)


def _tolerance(dtype) -> float:
    return 2e-2 if dtype in (tw.bfloat16, tw.float16) else 1e-5


# ---------------------------------------------------------------------------- the policy, op by op

# (name, function of (framework module, *tensors), input dtypes and shapes, policy, result dtype under
# autocast("cpu") with bfloat16). The same function runs on tilewise under autocast and on torch without it,
# after the casts the policy implies.
def _F(m):
    return m.nn.functional


CASES = [
    # "lower": run in the autocast dtype, whatever floating dtypes come in
    ("linear", lambda m, x, w, b: _F(m).linear(x, w, b), [("f32", (4, 8)), ("f32", (3, 8)), ("f32", (3,))],
     "lower", tw.bfloat16),
    ("matmul", lambda m, a, b: a @ b, [("f32", (2, 4, 8)), ("f32", (8, 3))], "lower", tw.bfloat16),
    ("matmul-mixed", lambda m, a, b: a @ b, [("bf16", (4, 8)), ("f32", (8, 3))], "lower", tw.bfloat16),
    ("mm", lambda m, a, b: m.mm(a, b), [("f32", (4, 8)), ("f32", (8, 3))], "lower", tw.bfloat16),
    ("bmm", lambda m, a, b: m.bmm(a, b), [("f32", (2, 4, 8)), ("f32", (2, 8, 3))], "lower", tw.bfloat16),
    ("addmm", lambda m, s, a, b: m.addmm(s, a, b), [("f32", (3,)), ("f32", (4, 8)), ("f32", (8, 3))], "lower",
     tw.bfloat16),
    ("baddbmm", lambda m, s, a, b: m.baddbmm(s, a, b), [("f32", (2, 4, 3)), ("f32", (2, 4, 8)), ("f32", (2, 8, 3))],
     "lower", tw.bfloat16),
    ("einsum", lambda m, a, b: m.einsum("bij,bjk->bik", a, b), [("f32", (2, 4, 8)), ("f32", (2, 8, 3))], "lower",
     tw.bfloat16),
    ("conv2d", lambda m, x, w, b: _F(m).conv2d(x, w, b, padding=1),
     [("f32", (1, 2, 5, 5)), ("f32", (3, 2, 3, 3)), ("f32", (3,))], "lower", tw.bfloat16),
    ("sdpa", lambda m, q, k, v: _F(m).scaled_dot_product_attention(q, k, v),
     [("f32", (1, 2, 4, 8)), ("f32", (1, 2, 4, 8)), ("f32", (1, 2, 4, 8))], "lower", tw.bfloat16),
    # "fp32": low-precision inputs run in float32
    ("softmax", lambda m, x: x.softmax(-1), [("bf16", (4, 8))], "fp32", tw.float32),
    ("log_softmax", lambda m, x: _F(m).log_softmax(x, -1), [("bf16", (4, 8))], "fp32", tw.float32),
    ("layer_norm", lambda m, x, w, b: _F(m).layer_norm(x, (8,), w, b), [("bf16", (4, 8)), ("f32", (8,)),
                                                                       ("f32", (8,))], "fp32", tw.float32),
    ("group_norm", lambda m, x: _F(m).group_norm(x, 2), [("bf16", (2, 4, 3))], "fp32", tw.float32),
    ("cross_entropy", lambda m, x, t: _F(m).cross_entropy(x, t), [("bf16", (4, 5)), ("i64", (4,))], "fp32",
     tw.float32),
    ("nll_loss", lambda m, x, t: _F(m).nll_loss(x, t), [("bf16", (4, 5)), ("i64", (4,))], "fp32", tw.float32),
    ("mse_loss", lambda m, x, y: _F(m).mse_loss(x, y), [("bf16", (4, 5)), ("f32", (4, 5))], "fp32", tw.float32),
    ("kl_div", lambda m, x, y: _F(m).kl_div(x, y, reduction="batchmean"), [("bf16", (4, 5)), ("bf16", (4, 5))],
     "fp32", tw.float32),
    ("bce_with_logits", lambda m, x, y: _F(m).binary_cross_entropy_with_logits(x, y),
     [("bf16", (4, 5)), ("f32", (4, 5))], "fp32", tw.float32),
    ("exp", lambda m, x: x.exp(), [("bf16", (4, 5))], "fp32", tw.float32),
    ("log", lambda m, x: x.log(), [("bf16", (4, 5))], "fp32", tw.float32),
    ("pow", lambda m, x: x ** 3, [("bf16", (4, 5))], "fp32", tw.float32),
    ("rsqrt", lambda m, x: x.rsqrt(), [("f16", (4, 5))], "fp32", tw.float32),
    ("sum", lambda m, x: x.sum(), [("bf16", (4, 5))], "fp32", tw.float32),
    ("prod", lambda m, x: x.prod(-1), [("bf16", (4, 5))], "fp32", tw.float32),
    ("cumsum", lambda m, x: x.cumsum(0), [("bf16", (4, 5))], "fp32", tw.float32),
    ("logsumexp", lambda m, x: x.logsumexp(-1), [("bf16", (4, 5))], "fp32", tw.float32),
    ("norm", lambda m, x: x.norm(), [("bf16", (4, 5))], "fp32", tw.float32),
    ("softplus", lambda m, x: _F(m).softplus(x), [("bf16", (4, 5))], "fp32", tw.float32),
    ("sum-with-dtype", lambda m, x: x.sum(dtype=m.float16), [("bf16", (4, 5))], None, tw.float16),
    # "promote": several floating tensors meet in the widest of their dtypes
    ("addcmul", lambda m, s, a, b: m.addcmul(s, a, b), [("bf16", (4,)), ("f32", (4,)), ("bf16", (4,))], "promote",
     tw.float32),
    ("dot", lambda m, a, b: m.dot(a, b), [("bf16", (5,)), ("f32", (5,))], "promote", tw.float32),
    # no policy: the dtypes the op is given (and a decomposition that calls listed ops is not cast inside)
    ("relu", lambda m, x: x.relu(), [("bf16", (4, 5))], None, tw.bfloat16),
    ("mean", lambda m, x: x.mean(-1), [("bf16", (4, 5))], None, tw.bfloat16),
    ("add-promotes", lambda m, a, b: a + b, [("bf16", (4, 5)), ("f32", (4, 5))], None, tw.float32),
    ("gelu", lambda m, x: _F(m).gelu(x), [("bf16", (4, 5))], None, tw.bfloat16),
    # what autocast never touches: float64 and integer tensors
    ("linear-f64", lambda m, x, w: _F(m).linear(x, w), [("f64", (4, 8)), ("f64", (3, 8))], None, tw.float64),
    ("exp-f64", lambda m, x: x.exp(), [("f64", (4, 5))], None, tw.float64),
    ("sum-int", lambda m, x: x.sum(), [("i64", (4, 5))], None, tw.int64),
    ("embedding", lambda m, i, w: _F(m).embedding(i, w), [("i64", (3,)), ("f32", (4, 6))], None, tw.float32),
]


def _torch_casts(tensors: list, policy: str | None, dtype) -> list:
    """torch's inputs after the casts ``policy`` makes under autocast with ``dtype`` (on the CPU)."""
    eligible = [t.is_floating_point() and t.dtype != torch.float64 for t in tensors]
    if policy == "lower":
        target = [dtype if e else None for e in eligible]
    elif policy == "fp32":
        target = [torch.float32 if e else None for e in eligible]
    elif policy == "promote":
        widest = torch.float32 if any(e and t.dtype == torch.float32 for t, e in zip(tensors, eligible)) else dtype
        target = [widest if e else None for e in eligible]
    else:
        target = [None] * len(tensors)
    return [t.to(d) if d is not None else t for t, d in zip(tensors, target)]


@pytest.mark.parametrize("name, fn, specs, policy, result", CASES, ids=[c[0] for c in CASES])
def test_policy_forward_and_backward_match_torch_with_explicit_casts(name, fn, specs, policy, result):
    rng = np.random.default_rng(0)
    pairs = [_pair(spec, shape, rng) for spec, shape in specs]
    ours_in, theirs_in = [p[0] for p in pairs], [p[1] for p in pairs]
    with tw.autocast("cpu"):
        ours = fn(tw, *ours_in)
    theirs = fn(torch, *_torch_casts(theirs_in, policy, torch.bfloat16))
    assert ours.dtype is result, f"{name}: {ours.dtype}, expected {result}"
    tol = _tolerance(result)
    _close(ours, theirs, tol, tol, name)
    if not result.is_floating_point:
        return
    cotangent = rng.standard_normal(tuple(ours.shape)).astype(np.float32)
    (ours.float() * tw.from_numpy(cotangent)).sum().backward()
    (theirs.float() * torch.from_numpy(cotangent)).sum().backward()
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        if a.requires_grad:
            assert a.grad is not None and a.grad.dtype is a.dtype, f"{name}: grad of input {k} is {a.grad}"
            _close(a.grad, b.grad, 3e-2, 3e-2, f"{name}: grad of input {k}")


# torch's CUDA lists (ATen/autocast_mode.h), for every operator tilewise has under the same name
TORCH_CUDA_POLICY = {
    "lower": ["conv1d", "conv2d", "addmm", "matmul", "einsum", "mm", "linear", "baddbmm", "bmm",
              "scaled_dot_product_attention"],
    "fp32": ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
             "sinh", "tan", "pow", "rpow", "rdiv", "softplus", "layer_norm", "rms_norm", "group_norm",
             "cosine_similarity", "nll_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
             "binary_cross_entropy_with_logits", "logsumexp", "interpolate", "prod", "softmax", "log_softmax",
             "cumprod", "cumsum", "sum", "norm", "cross_entropy", "normalize"],
    "promote": ["addcdiv", "addcmul", "atan2", "cross", "dot", "index_put", "scatter_add"],
    "banned": ["binary_cross_entropy"],
}


@pytest.mark.parametrize("policy", list(TORCH_CUDA_POLICY))
def test_declarations_follow_torchs_cuda_lists(policy):
    wrong = {name: OPS[name].autocast for name in TORCH_CUDA_POLICY[policy] if OPS[name].autocast != policy}
    assert not wrong, f"declared with another autocast policy than torch's {policy!r}: {wrong}"


def test_every_policy_has_an_implementation():
    assert set(AUTOCAST_POLICIES) == set(POLICIES)
    assert {op.autocast for op in OPS.values()} <= {*AUTOCAST_POLICIES, None}


def test_inplace_ops_are_not_cast():
    a = np.random.default_rng(1).uniform(0.5, 1.5, (4, 5)).astype(np.float32)
    ours = tw.from_numpy(a).bfloat16()
    theirs = torch.from_numpy(a).bfloat16()
    with tw.autocast("cpu"):
        ours.exp_()
        ours.mul_(2)
    theirs.exp_().mul_(2)
    _close(ours, theirs, 1e-2, 1e-2)


def test_cast_happens_on_every_tensor_in_a_list_argument():
    a, b = tw.randn(2, 3), tw.randn(3, 4, dtype=tw.float16)
    with tw.autocast("cpu"):
        assert tw.einsum("ij,jk->ik", a, b).dtype is tw.bfloat16


# ---------------------------------------------------------------------------- regions

def _linear_dtype():
    return tw.nn.functional.linear(tw.ones(2, 3), tw.ones(4, 3)).dtype


def test_regions_nest_and_restore():
    assert not tw.is_autocast_enabled("cpu") and _linear_dtype() is tw.float32
    with tw.autocast("cpu"):
        assert tw.is_autocast_enabled("cpu") and not tw.is_autocast_enabled("cuda") and not tw.is_autocast_enabled()
        assert _linear_dtype() is tw.bfloat16 and tw.get_autocast_dtype("cpu") is tw.bfloat16
        with tw.autocast("cpu", dtype=tw.float16):
            assert _linear_dtype() is tw.float16 and tw.get_autocast_dtype("cpu") is tw.float16
            with tw.autocast("cpu", enabled=False):
                assert not tw.is_autocast_enabled("cpu") and _linear_dtype() is tw.float32
            assert _linear_dtype() is tw.float16
        assert _linear_dtype() is tw.bfloat16 and tw.get_autocast_dtype("cpu") is tw.bfloat16
    assert not tw.is_autocast_enabled("cpu") and _linear_dtype() is tw.float32
    assert tw.get_autocast_dtype("cpu") is tw.bfloat16 and tw.get_autocast_dtype("cuda") is tw.float16


def test_device_types_are_independent():
    with tw.autocast("cuda"):
        assert tw.is_autocast_enabled() and tw.is_autocast_enabled("cuda")
        assert _linear_dtype() is tw.float32  # CPU tensors are left alone under CUDA autocast
        with tw.autocast("cpu"):
            assert tw.is_autocast_enabled("cuda") and _linear_dtype() is tw.bfloat16
            with tw.autocast("cuda", enabled=False):
                assert not tw.is_autocast_enabled("cuda") and _linear_dtype() is tw.bfloat16
        assert _linear_dtype() is tw.float32 and tw.is_autocast_enabled("cuda")
    assert not tw.is_autocast_enabled("cuda")


def test_decorator_and_amp_alias():
    assert tw.amp.autocast is tw.autocast

    @tw.autocast("cpu")
    def inside():
        return _linear_dtype(), tw.is_autocast_enabled("cpu")

    @tw.amp.autocast("cpu", enabled=False)
    def switched_off():
        return _linear_dtype()

    assert inside() == (tw.bfloat16, True)
    assert not tw.is_autocast_enabled("cpu")
    with tw.autocast("cpu"):
        assert switched_off() is tw.float32
        assert _linear_dtype() is tw.bfloat16
    assert inside.__name__ == "inside"


def test_exceptions_restore_the_state():
    with pytest.raises(ValueError, match="boom"):
        with tw.autocast("cpu", dtype=tw.float16):
            raise ValueError("boom")
    assert not tw.is_autocast_enabled("cpu") and tw.get_autocast_dtype("cpu") is tw.bfloat16
    with tw.autocast("cpu"):
        with pytest.raises(ValueError, match="boom"):
            with tw.autocast("cpu", enabled=False):
                raise ValueError("boom")
        assert tw.is_autocast_enabled("cpu") and _linear_dtype() is tw.bfloat16

    @tw.autocast("cpu")
    def fails():
        raise KeyError("inside")

    with pytest.raises(KeyError):
        fails()
    assert not tw.is_autocast_enabled("cpu") and not _REGIONS.cache and _REGIONS.depth == 0
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        with tw.autocast("cpu"):
            tw.ones(2, 3) @ tw.ones(4, 5)  # an op that fails inside the Autocast key
    assert not tw.is_autocast_enabled("cpu") and _linear_dtype() is tw.float32


def test_backward_runs_without_autocast_and_grads_keep_their_dtype():
    x, w = tw.randn(4, 8), tw.randn(3, 8, requires_grad=True)
    seen = []
    with tw.autocast("cpu"):
        y = tw.nn.functional.linear(x, w)
        y.register_hook(lambda g: seen.append((g.dtype, tw.is_autocast_enabled("cpu"))))
        y.float().exp().sum().backward()  # inside the region: backward is still not cast
        assert tw.is_autocast_enabled("cpu")
    assert seen == [(tw.bfloat16, False)]
    assert w.grad.dtype is tw.float32


# ---------------------------------------------------------------------------- the weight-cast cache

def test_weight_casts_are_cached_within_the_outermost_region():
    x, w = tw.randn(4, 8), tw.randn(3, 8, requires_grad=True)
    with tw.autocast("cpu"):
        a = tw.nn.functional.linear(x, w)
        with tw.autocast("cpu", enabled=False):
            assert len(_REGIONS.cache) == 1  # kept until the outermost region exits
        b = tw.nn.functional.linear(x, w)
        assert len(_REGIONS.cache) == 1
        (a.float().sum() + b.float().sum()).backward()  # both uses reach the weight through the one cast
        with tw.no_grad():
            w.mul_(2)  # a new version of the weight: a new cast
        c = tw.nn.functional.linear(x, w)
        np.testing.assert_allclose(c.detach().float().numpy(), (a.detach().float() * 2).numpy(), rtol=1e-2,
                                   atol=1e-2)
    assert not _REGIONS.cache
    expected = torch.from_numpy(x.numpy()).bfloat16().float().sum(0) * 2
    np.testing.assert_allclose(w.grad.numpy(), expected.expand(3, 8).numpy(), rtol=1e-2, atol=1e-2)
    with tw.autocast("cpu", cache_enabled=False):
        tw.nn.functional.linear(x, w)
        assert not _REGIONS.cache and not tw.is_autocast_cache_enabled()
    assert tw.is_autocast_cache_enabled()


def test_cast_under_no_grad_is_not_reused_with_grad():
    x, w = tw.randn(4, 8), tw.randn(3, 8, requires_grad=True)
    with tw.autocast("cpu"):
        with tw.no_grad():
            tw.nn.functional.linear(x, w)
        y = tw.nn.functional.linear(x, w)
    assert y.requires_grad
    y.float().sum().backward()
    assert w.grad is not None


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_recomputes_under_the_forwards_autocast_state(use_reentrant):
    from tilewise.utils.checkpoint import checkpoint

    rng = np.random.default_rng(0)
    x, w1, w2 = (tw.from_numpy(rng.standard_normal(shape).astype(np.float32)).requires_grad_(True)
                 for shape in ((5, 8), (16, 8), (4, 16)))

    def segment(x):
        h = tw.nn.functional.layer_norm(tw.nn.functional.linear(x, w1), (16,)).relu()
        return tw.nn.functional.linear(h, w2)

    grads = []
    for checkpointed in (False, True):
        for t in (x, w1, w2):
            t.grad = None
        with tw.autocast("cpu"):
            y = checkpoint(segment, x, use_reentrant=use_reentrant) if checkpointed else segment(x)
            loss = y.float().logsumexp(-1).sum()
        loss.backward()
        grads.append([t.grad for t in (x, w1, w2)])
    for ours, plain in zip(*grads):
        assert ours.dtype is tw.float32
        np.testing.assert_array_equal(ours.numpy(), plain.numpy())


# ---------------------------------------------------------------------------- a module, forward and backward

def test_mlp_with_layer_norm_and_cross_entropy_matches_torch_with_explicit_casts():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                              torch.nn.Linear(16, 5))
    model = tw.nn.Sequential(tw.nn.Linear(8, 16), tw.nn.LayerNorm(16), tw.nn.GELU(), tw.nn.Linear(16, 5))
    model.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 5, 6)

    with tw.autocast("cpu"):
        logits = model(tw.from_numpy(x))
        loss = tw.nn.functional.cross_entropy(logits, tw.from_numpy(t))
    loss.backward()

    tf = torch.nn.functional
    lin1, norm, lin2 = ref[0], ref[1], ref[3]
    h = tf.linear(torch.from_numpy(x).bfloat16(), lin1.weight.bfloat16(), lin1.bias.bfloat16())
    h = tf.gelu(tf.layer_norm(h.float(), (16,), norm.weight, norm.bias))
    ref_logits = tf.linear(h.bfloat16(), lin2.weight.bfloat16(), lin2.bias.bfloat16())
    ref_loss = tf.cross_entropy(ref_logits.float(), torch.from_numpy(t))
    ref_loss.backward()

    assert logits.dtype is tw.bfloat16 and loss.dtype is tw.float32
    _close(logits, ref_logits, 2e-2, 2e-2, "logits")
    _close(loss, ref_loss, 1e-3, 1e-3, "loss")
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad.dtype is tw.float32, name
        _close(p.grad, q.grad, 3e-2, 3e-2, f"grad of {name}")


# ---------------------------------------------------------------------------- custom autograd Functions

class _Scale(tw.autograd.Function):
    @staticmethod
    @tw.amp.custom_fwd(device_type="cpu", cast_inputs=tw.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        ctx.seen = (x.dtype, w.dtype, tw.is_autocast_enabled("cpu"), (x @ w).dtype)
        return x @ w

    @staticmethod
    @tw.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ctx.seen_backward = tw.is_autocast_enabled("cpu")
        return g @ w.t(), x.t() @ g


class _Plain(tw.autograd.Function):
    @staticmethod
    @tw.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x):
        return x * 2

    @staticmethod
    @tw.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        ctx.seen_backward = (tw.is_autocast_enabled("cpu"), tw.get_autocast_dtype("cpu"))
        return g * 2


def test_custom_fwd_casts_inputs_and_custom_bwd_restores_the_forward_state():
    x = tw.randn(2, 3, dtype=tw.bfloat16, requires_grad=True)
    w = tw.randn(3, 4, requires_grad=True)
    with tw.autocast("cpu"):
        y = _Scale.apply(x, w)
    assert y.grad_fn.ctx.seen == (tw.float32, tw.float32, False, tw.float32)
    y.sum().backward()
    assert y.grad_fn.ctx.seen_backward is False and x.grad.dtype is tw.bfloat16 and w.grad.dtype is tw.float32
    with tw.autocast("cpu", dtype=tw.float16):
        z = _Plain.apply(tw.randn(3, requires_grad=True))
    z.sum().backward()
    assert z.grad_fn.ctx.seen_backward == (True, tw.float16)


# ---------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs, error, words", [
    ({"device_type": "tpu"}, RuntimeError, ["'tpu'", "'cuda'", "'cpu'"]),
    ({"device_type": "cuda:0"}, RuntimeError, ["'cuda:0'", "without an index"]),
    ({"device_type": 0}, ValueError, ["device_type", "str", "int"]),
    ({"device_type": "cpu", "dtype": tw.float64}, RuntimeError, ["float64", "float16", "bfloat16"]),
    ({"device_type": "cuda", "dtype": tw.int32}, RuntimeError, ["int32", "not a floating-point dtype", "bfloat16"]),
    ({"device_type": "cpu", "dtype": "half-ish"}, TypeError, ["'half-ish'", "float16", "bfloat16"]),
])
def test_bad_arguments_say_what_was_given_and_what_is_valid(kwargs, error, words):
    with pytest.raises(error) as info:
        tw.autocast(**kwargs)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(RuntimeError, match="'xla'"):
        tw.is_autocast_enabled("xla")


def test_binary_cross_entropy_runs_in_float32_under_cpu_autocast():
    p, t = tw.rand(4, dtype=tw.bfloat16), tw.rand(4)
    with tw.autocast("cpu"):
        assert tw.nn.functional.binary_cross_entropy(p, t).dtype is tw.float32
    with tw.autocast("cuda"):  # CPU tensors: untouched
        assert tw.nn.functional.binary_cross_entropy(p, t.bfloat16()).dtype is tw.bfloat16


@pytest.mark.cuda
def test_cuda_autocast_runs_matmuls_in_float16_and_refuses_binary_cross_entropy():
    x, w = tw.randn(4, 8, device="cuda"), tw.randn(3, 8, device="cuda", requires_grad=True)
    with tw.autocast("cuda"):
        y = tw.nn.functional.linear(x, w)
        assert y.dtype is tw.float16 and y.softmax(-1).dtype is tw.float32
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            tw.nn.functional.binary_cross_entropy(y.sigmoid(), tw.rand(4, 3, device="cuda"))
    y.float().sum().backward()
    assert w.grad.dtype is tw.float32


# ---------------------------------------------------------------------------- tilewise.compile

def test_compiled_function_is_guarded_on_autocast(capsys):
    rng = np.random.default_rng(0)
    w = tw.from_numpy(rng.standard_normal((3, 8)).astype(np.float32)).requires_grad_(True)
    x = tw.from_numpy(rng.standard_normal((4, 8)).astype(np.float32))

    def f(x):
        y = tw.nn.functional.linear(x, w)
        return y.softmax(-1), y.mean(-1)

    compiled = tw.compile(f)
    settings.log.add("recompiles")
    try:
        outside = compiled(x)
        for dtype, variants in ((tw.bfloat16, 2), (tw.float16, 3)):
            with tw.autocast("cpu", dtype=dtype):
                ours = compiled(x)
                eager = f(x)
                assert compiled(x)[1].dtype is dtype and len(compiled.variants) == variants
            assert [o.dtype for o in ours] == [tw.float32, dtype]
            for a, b in zip(ours, eager):
                np.testing.assert_allclose(a.detach().float().numpy(), b.detach().float().numpy(), rtol=1e-2,
                                           atol=1e-2)
        again = compiled(x)  # the first variant still fits a call outside autocast
        assert len(compiled.variants) == 3 and again[1].dtype is tw.float32
        np.testing.assert_array_equal(again[0].detach().numpy(), outside[0].detach().numpy())
    finally:
        settings.log.discard("recompiles")
    err = capsys.readouterr().err
    assert "the autocast guard failed: called under autocast('cpu', dtype=bfloat16), compiled under autocast off" \
        in err
    assert "compiled under autocast('cpu', dtype=bfloat16)" in err


def _training_losses(compiled: bool, steps: int = 3) -> list[float]:
    tw.manual_seed(0)
    model = tw.nn.Sequential(tw.nn.Linear(8, 16), tw.nn.LayerNorm(16), tw.nn.ReLU(), tw.nn.Linear(16, 4))
    opt = tw.optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    x = tw.from_numpy(rng.standard_normal((6, 8)).astype(np.float32))
    t = tw.from_numpy(rng.integers(0, 4, 6))

    def step(x, t):
        with tw.autocast("cpu"):
            loss = tw.nn.functional.cross_entropy(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = tw.compile(step) if compiled else step
    losses = [run(x, t).item() for _ in range(steps)]
    assert all(p.grad.dtype is tw.float32 for p in model.parameters())
    return losses


def test_compiled_training_step_with_autocast_inside_matches_eager():
    np.testing.assert_allclose(_training_losses(True), _training_losses(False), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("module", ["tilewise.amp", "tilewise.amp.autocast_mode"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
