"""tilewise.autocast against torch's own autocast, run live. torch keeps one list of operators per device type
(its CPU lists differ widely from its CUDA lists), and so does each declaration: on the CPU every operator with an
autocast policy on either device type, and a sample of others, runs its samples from the operator table under
tilewise's and torch's CPU autocast, for float16 and bfloat16, on float32, low-precision and mixed inputs; result
dtypes, values and gradients must match (a census makes sure a newly declared policy is run). torch's dispatcher
says which operators its lists name on each device type, checked against the declarations. Also: regions (nesting,
enabled=False, decorators, exceptions), what autocast leaves alone, the weight-cast cache, a module trained a step,
custom autograd Functions, errors, and tilewise.compile's autocast guard."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opinfo import check_op
from test_ops import OPINFOS

import tilewise as tw
from tilewise.amp.autocast_mode import _REGIONS, POLICIES
from tilewise.config import settings
from tilewise.ops.registry import AUTOCAST_DEVICE_TYPES, AUTOCAST_POLICIES, OPS, OVERLOADS, declare

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


# ---------------------------------------------------------------------------- the CPU policy, live against torch

def _exercised(info) -> set[str]:
    """The declared operators an operator-table entry calls, by name (as tests/test_op_rules.py counts them)."""
    names = {info.name, info.name.replace(".", "_"), *info.covers, *((info.torch_name,) if info.torch_name else ())}
    return {op.full_name for name in names for op in OVERLOADS.get(name, [OPS.get(name)]) if op is not None}


WITH_POLICY = {name for name, op in OPS.items() if op.autocast}
# operators with a policy that the live comparison does not run, and why
NOT_RUN_LIVE = {
    "rmatmul": "reached only through Tensor.__rmatmul__ with a non-tensor left operand; matmul's entries run it",
    "_lstm_layer": "tilewise's fused LSTM layer, whose table entry compares with a torch emulation, not torch's own "
                   "operator; tests/test_lstm_layer.py runs the layer under autocast",
    "rdiv": "no table entry (a reflected operator): CASES below runs it", "rpow": "as rdiv",
    "_cross_map_lrn2d": "nn.CrossMapLRN2d's operator, no table entry: CASES below runs the module",
}
# operators without a policy on either device type, run too: torch lists them on neither, on CUDA only (where
# tilewise has no policy yet), or reaches listed operators from them
OTHERS_RUN_LIVE = ("relu", "mean", "add", "mul", "gelu", "clamp", "where", "var", "embedding", "batch_norm",
                   "max_pool2d", "avg_pool2d", "hstack", "addmv", "addr", "linalg.vector_norm", "linalg.matrix_norm",
                   "nuclear_norm", "renorm")
LIVE_INFOS = [info for info in OPINFOS
              if (_exercised(info) & WITH_POLICY - set(NOT_RUN_LIVE)) or info.name in OTHERS_RUN_LIVE]
INPUTS = ("float32", "low", "mixed")  # every floating input in float32, in the autocast dtype, or only the first
MIXED_REFUSED = "torch refuses two floating dtypes here (its CPU lists do not promote this operator); tilewise " \
                "accepts them, outside autocast too"
NO_LOW_KERNEL = "torch's CPU has no bfloat16/float16 kernel for it and raises; tilewise computes it"
# where tilewise and torch part ways for reasons other than the autocast policy (or, for matrix_power, where no
# cast of the inputs expresses torch's): each fails today, and passing would mean the list should shrink
KNOWN_DIVERGENCES = {
    ("einsum", "mixed"): "tilewise's einsum refuses a float32 and a low-precision operand in a broadcast product, "
                         "which torch promotes (outside autocast too)",
    ("linalg.solve_ex", "low"): "tilewise raises RuntimeError for low-precision inputs to LAPACK-backed solvers, "
                                "torch's CPU NotImplementedError",
    **dict.fromkeys([("linalg.matrix_power", m) for m in INPUTS],
                    "n <= -2: torch inverts in float32 and multiplies in the autocast dtype, which no cast of the "
                    "inputs expresses"),
    **dict.fromkeys([("interpolate", "low"), ("interpolate", "mixed")],
                    "tilewise's low-precision bilinear and bicubic interpolation rounds otherwise than torch's CPU "
                    "kernels (outside autocast too)"),
    **dict.fromkeys([("pdist", "low"), ("pdist", "mixed"), ("affine_grid", "low"), ("affine_grid", "mixed")],
                    NO_LOW_KERNEL),
    **dict.fromkeys([("cov[int]", m) for m in INPUTS],
                    "an integer input: torch's cov makes it float32 and its mm runs in the autocast dtype; autocast "
                    "casts no integer input"),
}


def _live_case(info, autocast: str, inputs: str):
    samples = info.samples()
    name = f"{info.name}[{samples[0].name}]" if samples and samples[0].name == "int" else info.name
    reason = KNOWN_DIVERGENCES.get((name, inputs)) or KNOWN_DIVERGENCES.get((name, inputs, autocast))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(info, autocast, inputs, marks=marks, id=f"{info.name}-{autocast}-{inputs}")


LIVE = [_live_case(info, autocast, inputs) for info in LIVE_INFOS for autocast in ("bfloat16", "float16")
        for inputs in INPUTS]


def test_every_operator_with_an_autocast_policy_runs_live():
    run = set().union(*(_exercised(info) for info in LIVE_INFOS))
    missing = sorted(WITH_POLICY - run - set(NOT_RUN_LIVE))
    assert not missing, (f"operators with an autocast policy but no entry in the operator table (tests/opinfos/) to "
                         f"run them live against torch's autocast: {missing}")
    assert {info.name for info in LIVE_INFOS} >= set(OTHERS_RUN_LIVE)
    assert set(NOT_RUN_LIVE) <= WITH_POLICY, "NOT_RUN_LIVE names an operator without a policy: drop it"


@pytest.mark.parametrize("info, autocast, inputs", LIVE)
def test_cpu_autocast_matches_torchs_live(info, autocast, inputs):
    dtype = "float32" if inputs == "float32" else autocast
    for sample in info.samples():
        check_op(info, sample, dtype, 0, noncontiguous=False, autocast=autocast, mixed=inputs == "mixed")


# (name, function of (framework module, *tensors), input dtypes and shapes): what autocast leaves alone or where
# its casts meet, compared live with torch's CPU autocast
CASES = [
    ("matmul-mixed", lambda m, a, b: a @ b, [("bf16", (4, 8)), ("f32", (8, 3))]),
    ("rdiv", lambda m, x: 2.0 / x, [("bf16", (4, 5))]),
    ("rpow", lambda m, x: 2.0 ** x, [("bf16", (4, 5))]),
    ("cross_map_lrn2d", lambda m, x: m.nn.CrossMapLRN2d(3)(x), [("bf16", (1, 4, 3, 3))]),
    ("einsum-list", lambda m, a, b: m.einsum("ij,jk->ik", a, b), [("f32", (2, 3)), ("f16", (3, 4))]),
    ("prod-with-dtype", lambda m, x: x.prod(-1, dtype=m.float16), [("bf16", (4, 5))]),
    ("sum-with-dtype", lambda m, x: x.sum(dtype=m.float16), [("bf16", (4, 5))]),
    ("softmax-in-low", lambda m, x: x.softmax(-1), [("bf16", (4, 8))]),
    ("layer_norm-in-low", lambda m, x, w, b: m.nn.functional.layer_norm(x, (8,), w, b),
     [("bf16", (4, 8)), ("f32", (8,)), ("f32", (8,))]),
    ("add-promotes", lambda m, a, b: a + b, [("bf16", (4, 5)), ("f32", (4, 5))]),
    ("cat-promotes", lambda m, a, b: m.cat([a, b]), [("bf16", (2, 5)), ("f32", (3, 5))]),
    ("index_copy-promotes", lambda m, a, b: a.index_copy(0, m.tensor([2, 0]), b), [("f32", (3, 5)), ("bf16", (2, 5))]),
    ("linear-f64", lambda m, x, w: m.nn.functional.linear(x, w), [("f64", (4, 8)), ("f64", (3, 8))]),
    ("mse_loss-f64", lambda m, x, y: m.nn.functional.mse_loss(x, y), [("f64", (4, 5)), ("bf16", (4, 5))]),
    ("sum-int", lambda m, x: x.sum(), [("i64", (4, 5))]),
    ("prod-int", lambda m, x: x.prod(), [("i64", (4, 5))]),
    ("embedding", lambda m, i, w: m.nn.functional.embedding(i, w), [("i64", (3,)), ("f32", (4, 6))]),
    ("pad-reflect", lambda m, x: m.nn.functional.pad(x, (1, 2), mode="reflect"), [("bf16", (1, 2, 5))]),
    ("pad-reflect-3d", lambda m, x: m.nn.functional.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect"),
     [("bf16", (1, 1, 3, 3, 3))]),
    ("pad-replicate-3d", lambda m, x: m.nn.functional.pad(x, (1, 1, 1, 1, 1, 1), mode="replicate"),
     [("bf16", (1, 1, 3, 3, 3))]),
    ("pad-circular", lambda m, x: m.nn.functional.pad(x, (1, 1), mode="circular"), [("bf16", (1, 2, 5))]),
    ("pad-constant", lambda m, x: m.nn.functional.pad(x, (1, 1)), [("bf16", (1, 2, 5))]),
    ("max_pool3d", lambda m, x: m.nn.functional.max_pool3d(x, 2), [("bf16", (1, 1, 4, 4, 4))]),
    ("max_pool3d-indices", lambda m, x: m.nn.functional.max_pool3d(x, 2, return_indices=True)[0],
     [("bf16", (1, 1, 4, 4, 4))]),
    ("matrix_power-2", lambda m, x: m.linalg.matrix_power(x, 2), [("f32", (3, 3))]),
    ("matrix_power-1", lambda m, x: m.linalg.matrix_power(x, 1), [("f32", (3, 3))]),
    ("matrix_power-0", lambda m, x: m.linalg.matrix_power(x, 0), [("f32", (3, 3))]),
    ("inverse-bf16", lambda m, x: m.linalg.matrix_power(x + 2 * m.eye(3, dtype=x.dtype), -1), [("bf16", (3, 3))]),
]


@pytest.mark.parametrize("autocast", ["bfloat16", "float16"])
@pytest.mark.parametrize("name, fn, specs", CASES, ids=[c[0] for c in CASES])
def test_what_cpu_autocast_casts_and_leaves_alone_matches_torch(name, fn, specs, autocast):
    rng = np.random.default_rng(0)
    pairs = [_pair(spec, shape, rng) for spec, shape in specs]
    ours_in, theirs_in = [p[0] for p in pairs], [p[1] for p in pairs]
    try:
        with torch.autocast("cpu", dtype=getattr(torch, autocast)):
            theirs = fn(torch, *theirs_in)
    except RuntimeError as exc:
        with pytest.raises(type(exc)), tw.autocast("cpu", dtype=getattr(tw, autocast)):
            fn(tw, *ours_in)
        return
    with tw.autocast("cpu", dtype=getattr(tw, autocast)):
        ours = fn(tw, *ours_in)
    _close(ours, theirs, 2e-2, 2e-2, name)
    if not ours.dtype.is_floating_point:
        return
    cotangent = rng.standard_normal(tuple(ours.shape)).astype(np.float32)
    (ours.float() * tw.from_numpy(cotangent)).sum().backward()
    (theirs.float() * torch.from_numpy(cotangent)).sum().backward()
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        if a.requires_grad:
            assert a.grad is not None and a.grad.dtype is a.dtype, f"{name}: grad of input {k} is {a.grad}"
            _close(a.grad, b.grad, 3e-2, 3e-2, f"{name}: grad of input {k}")


# ---------------------------------------------------------------------------- the lists, from torch's dispatcher

def _torch_lists(dispatch_key: str) -> set[str]:
    """The aten operators (without overload) that torch registers an autocast kernel for under ``dispatch_key``."""
    names = torch._C._dispatch_get_all_op_names()
    return {n.removeprefix("aten::").split(".")[0] for n in names
            if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, dispatch_key)}


def _tilewise_policies(device_type: str) -> dict[str, set]:
    """Operator name (without overload) -> the policies its overloads declare for ``device_type``."""
    found: dict[str, set] = {}
    for op in OPS.values():
        found.setdefault(op.name, set()).add((op.autocast or {}).get(device_type))
    return found


def test_every_operator_on_torchs_cpu_list_has_a_cpu_policy():
    declared = _tilewise_policies("cpu")
    listed = {name for name in _torch_lists("AutocastCPU") if name in declared}
    without = sorted(name for name in listed if declared[name] == {None})
    assert not without, f"on torch's CPU autocast lists, without a CPU policy here: {without}"
    # the other way: a CPU policy on an operator torch does not list stands for the listed operators torch's
    # composite reaches (einsum -> bmm, cov -> mm, pad -> reflection_pad1d, ...), each checked live above
    emulated = sorted(name for name, policies in declared.items() if policies - {None} and name not in listed)
    assert emulated == CPU_POLICIES_OF_COMPOSITES, "a CPU policy on an operator torch's CPU lists do not name"


# operators whose torch counterparts are composites reaching listed operators (their policy is checked live)
CPU_POLICIES_OF_COMPOSITES = sorted({
    "einsum", "tensordot", "rmatmul", "chain_matmul", "linalg_multi_dot", "linalg_matrix_power", "matrix_power", "cov",
    "corrcoef", "affine_grid",  # torch's composites reach mm/bmm/matmul
    "_addmm_gelu",  # torch's _addmm_activation
    "_rnn_hidden_projection", "_lstm_layer",  # tilewise's recurrent kernels: torch's RNN layers reach linear
    "cross_entropy",  # torch's cross_entropy_loss
    "pad",  # reflection_pad1d/2d, replication_pad1d/2d/3d
    "lp_pool3d",  # avg_pool3d
    "max_unpool1d",  # max_unpool2d
    "adaptive_max_pool3d_with_indices", "fractional_max_pool2d_with_indices",
    "fractional_max_pool3d_with_indices",  # torch's operators of these names return the indices too
    "grid_sample",  # grid_sampler
    "local_response_norm",  # avg_pool3d, for inputs of 4 or more dims
    "istft",  # fft_irfft / fft_ifft
})


# on torch's CUDA lists, without a CUDA policy here: tilewise's CUDA policies are unchanged since they were first
# written, and these are what torch's dispatcher names beyond them (shrink this list, never grow it)
CUDA_POLICIES_MISSING: set[str] = set()


def test_every_operator_on_torchs_cuda_list_has_a_cuda_policy():
    declared = _tilewise_policies("cuda")
    listed = {name for name in _torch_lists("AutocastCUDA") if name in declared}
    without = {name for name in listed if declared[name] == {None}}
    assert without == CUDA_POLICIES_MISSING, (f"new: {sorted(without - CUDA_POLICIES_MISSING)}; has a CUDA policy "
                                              f"now (drop from CUDA_POLICIES_MISSING): "
                                              f"{sorted(CUDA_POLICIES_MISSING - without)}")


# torch's CUDA lists (ATen/autocast_mode.h), for every operator tilewise has under the same name
TORCH_CUDA_POLICY = {
    "lower": ["conv1d", "conv2d", "addmm", "matmul", "einsum", "mm", "linear", "baddbmm", "bmm",
              "scaled_dot_product_attention", "addbmm", "addmv", "addr", "chain_matmul", "conv_tbc",
              "linalg_multi_dot", "linalg_vecdot", "prelu"],
    "fp32": ["acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
             "sinh", "tan", "pow", "rpow", "rdiv", "softplus", "layer_norm", "rms_norm", "group_norm",
             "cosine_similarity", "nll_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
             "binary_cross_entropy_with_logits", "logsumexp", "interpolate", "prod", "softmax", "log_softmax",
             "cumprod", "cumsum", "sum", "norm", "cross_entropy", "normalize", "linalg_vector_norm",
             "linalg_matrix_norm", "native_layer_norm", "nuclear_norm", "renorm"],
    "promote": ["addcdiv", "addcmul", "atan2", "cross", "dot", "vdot", "index_put", "scatter_add", "bilinear",
                "tensordot", "grid_sample"],
    "banned": ["binary_cross_entropy"],
}


@pytest.mark.parametrize("policy", list(TORCH_CUDA_POLICY))
def test_declarations_follow_torchs_cuda_lists(policy):
    wrong = {name: OPS[name].autocast for name in TORCH_CUDA_POLICY[policy]
             if (OPS[name].autocast or {}).get("cuda") != policy}
    assert not wrong, f"declared with another CUDA autocast policy than torch's {policy!r}: {wrong}"


def test_every_policy_has_an_implementation():
    assert set(AUTOCAST_POLICIES) == set(POLICIES)
    for op in OPS.values():
        for device_type, policy in (op.autocast or {}).items():
            assert device_type in AUTOCAST_DEVICE_TYPES and (callable(policy) or policy in AUTOCAST_POLICIES), op


@pytest.mark.parametrize("autocast, error", [
    ("fp16", "unknown autocast policy 'fp16'; policies"),
    ({"tpu": "fp32"}, "unknown device type(s) ['tpu']"),
    ({"cuda": "lowest"}, "unknown autocast policy 'lowest' for 'cuda'"),
])
def test_a_declaration_with_a_bad_policy_says_what_is_valid(autocast, error):
    with pytest.raises(ValueError) as info:
        declare("_autocast_probe(Tensor self) -> Tensor", "composite", decomposition=lambda x: x, autocast=autocast)
    assert error in str(info.value) and "_autocast_probe" in str(info.value)
    assert "_autocast_probe" not in OPS


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


@pytest.mark.cuda  # without CUDA, CUDA autocast warns and stays off, as torch's does
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

def test_mlp_with_layer_norm_and_cross_entropy_matches_torchs_autocast():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                              torch.nn.Linear(16, 5))
    model = tw.nn.Sequential(tw.nn.Linear(8, 16), tw.nn.LayerNorm(16), tw.nn.GELU(), tw.nn.Linear(16, 5))
    model.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in ref.state_dict().items()})
    rng = np.random.default_rng(0)
    x, t = rng.standard_normal((6, 8)).astype(np.float32), rng.integers(0, 5, 6)

    with tw.autocast("cpu"):
        hidden = model[1](model[0](tw.from_numpy(x)))
        logits = model[3](model[2](hidden))
        loss = tw.nn.functional.cross_entropy(logits, tw.from_numpy(t))
    loss.backward()
    with torch.autocast("cpu"):
        ref_hidden = ref[1](ref[0](torch.from_numpy(x)))
        ref_logits = ref[3](ref[2](ref_hidden))
        ref_loss = torch.nn.functional.cross_entropy(ref_logits, torch.from_numpy(t))
    ref_loss.backward()

    assert hidden.dtype is tw.bfloat16 and logits.dtype is tw.bfloat16 and loss.dtype is tw.float32
    _close(hidden, ref_hidden, 3e-2, 3e-2, "layer norm")
    _close(logits, ref_logits, 3e-2, 3e-2, "logits")
    _close(loss, ref_loss, 1e-2, 1e-2, "loss")
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.grad.dtype is tw.float32, name
        _close(p.grad, q.grad, 5e-2, 5e-2, f"grad of {name}")


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
        return y.prod(-1), y.mean(-1)  # prod runs in float32 under CPU autocast, mean in the autocast dtype

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
