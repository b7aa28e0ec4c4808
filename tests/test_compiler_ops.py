"""Compiled versus eager for every operator in the op table, on the CPU (C target): outputs and gradients.

Each sample of each ``OpInfo`` becomes one function that calls the operator and then
``autograd.grad`` of its floating outputs with respect to its floating inputs; the function is run
eagerly and through ``tilewise.compile`` (one compile covers forward and backward) and the results must
agree. Operators whose result shape depends on values raise ``DataDependentError`` under compile; the
test checks that they do so instead of comparing.
"""

from __future__ import annotations

import numpy as np
import pytest
from opinfo import _build, _materialise
from opinfos.fft import OPINFOS as COMPLEX_OPINFOS
from test_ops import OPINFOS

import tilewise as tw
import tilewise.nn.functional as F
from tilewise.codegen.toolchain import nvrtc_available
from tilewise.compiler import DataDependentError, UnsupportedTargetError

# operators whose result shape (or, for one_hot without num_classes, an argument) depends on tensor values
DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "argwhere",
                  "repeat_interleave", "one_hot", "unique_consecutive", "bincount", "histc", "equal", "allclose",
                  "unravel_index", "quantile", "nanquantile", "nonzero_static", "histogram", "histogramdd"}
# complex tensors run eagerly: the compiler's targets have no complex types (test_complex_functions_refuse_compile)
EAGER_ONLY = [id(info) for info in COMPLEX_OPINFOS]
# composites that make index tensors from Python lists: on CUDA those start on the host, and the function runs
# eagerly (with the warning) rather than as one program
HOST_CONSTANTS = {"combinations", "embedding_bag", "pdist", "multilabel_margin_loss", "ctc_loss", "isin", "quantile",
                  "nanquantile"}
CASES = [(info, k) for info in OPINFOS if id(info) not in EAGER_ONLY for k in range(len(info.samples()))]
QUICK_SAMPLES = 3  # the default run compiles each operator's first samples; `-m slow` the rest (a quarter of the time)
CASES_QUICK_FIRST = [pytest.param(info, k, id=f"{info.name}-{k}", marks=() if k < QUICK_SAMPLES else pytest.mark.slow)
                     for info, k in CASES]


def _inputs(info, sample, seed: int, noncontiguous: bool):
    rng = np.random.default_rng(seed)
    made: list = []
    args = _materialise(sample.args, rng, "float32", made)
    kwargs = {k: _materialise(v, rng, "float32", made) for k, v in sample.kwargs.items()}
    tensors = []
    for array, spec in made:
        t = tw.from_numpy(array.copy())
        if noncontiguous and array.ndim:
            big = tw.zeros(*array.shape[:-1], array.shape[-1] * 2, dtype=t.dtype)
            big[..., ::2] = t
            t = big[..., ::2]
        wants_grad = info.grad and spec.grad and array.dtype.kind == "f"
        tensors.append(t.detach().requires_grad_(True) if wants_grad else t)
    return args, kwargs, tensors


def _program(info, args, kwargs, n: int, rng):
    op = info.resolve(tw, F)

    def run(*tensors):
        a = _build(args, None, lambda k: tensors[k], tw)
        kw = {k: _build(v, None, lambda i: tensors[i], tw) for k, v in kwargs.items()}
        out = op(*a, **kw)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, tw.Tensor)]
        if info.output_index is not None:
            outs = [outs[info.output_index]]
        diff = [o for o in outs if o.requires_grad and o.dtype.is_floating_point]
        inputs = [t for t in tensors if t.requires_grad]
        if not (info.grad and diff and inputs):
            return outs, []
        gouts = [tw.from_numpy(rng.standard_normal(tuple(o.shape)).astype(np.float32)).to(o.device, o.dtype)
                 for o in diff]
        grads = tw.autograd.grad(diff, inputs, gouts, allow_unused=True)
        return outs, [g for g in grads if g is not None]

    return run


def _compare(actual, expected, what: str, info) -> None:
    rtol, atol = (info.rtol or 1e-4) * 10, (info.atol or 1e-5) * 10
    assert len(actual) == len(expected), f"{what}: {len(actual)} values, eager gives {len(expected)}"
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype, f"{what}: {a.shape}/{a.dtype} vs eager {e.shape}/{e.dtype}"
        np.testing.assert_allclose(a.detach().float().numpy() if a.dtype.itemsize < 4 else a.detach().numpy(),
                                   e.detach().float().numpy() if e.dtype.itemsize < 4 else e.detach().numpy(),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


@pytest.mark.parametrize("info,k", CASES_QUICK_FIRST)
def test_compiled_matches_eager(info, k):
    sample = info.samples()[k]
    for noncontiguous in (False, True):
        if noncontiguous and not info.noncontiguous:
            continue
        args, kwargs, tensors = _inputs(info, sample, seed=k, noncontiguous=noncontiguous)
        eager = _program(info, args, kwargs, len(tensors), np.random.default_rng(7))
        try:
            tw.manual_seed(0)
            expected = eager(*tensors)
        except (RuntimeError, TypeError, ValueError, IndexError) as exc:
            pytest.skip(f"eager raises for this sample: {exc}")
        compiled = tw.compile(_program(info, args, kwargs, len(tensors), np.random.default_rng(7)))
        tw.manual_seed(0)
        try:
            actual = compiled(*tensors)
        except DataDependentError:
            if info.name in DATA_DEPENDENT:
                return
            raise
        where = f"{info.name}[{sample.name or k}] noncontiguous={noncontiguous}"
        _compare(actual[0], expected[0], f"{where}: outputs", info)
        _compare(actual[1], expected[1], f"{where}: gradients", info)


@pytest.mark.filterwarnings("ignore:tilewise.compile. running")
def test_complex_functions_run_between_compiled_segments():
    """Complex operators break the graph (fullgraph=True refuses them); the real parts around them compile."""
    from tilewise.compiler import UnsupportedTargetError

    x = tw.randn(4, 8)
    for fn in (lambda t: tw.fft.rfft(t * 2).abs() + 1, lambda t: (t * 1j).real * 3,
               lambda t: tw.view_as_complex(t.view(4, 4, 2)).imag.exp()):
        compiled = tw.compile(fn)
        for _ in range(2):
            np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-6, atol=1e-6)
        with pytest.raises(UnsupportedTargetError, match="complex"):
            tw.compile(fn, fullgraph=True)(x)


def _forward_only(info, args, kwargs):
    op = info.resolve(tw, F)

    def run(*tensors):
        a = _build(args, None, lambda k: tensors[k], tw)
        kw = {k: _build(v, None, lambda i: tensors[i], tw) for k, v in kwargs.items()}
        out = op(*a, **kw)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, tw.Tensor)]
        return outs if info.output_index is None else [outs[info.output_index]]

    return run


def _eager_grads(outs, tensors, info):
    diff = [o for o in outs if o.requires_grad and o.dtype.is_floating_point]
    inputs = [t for t in tensors if t.requires_grad]
    if not (info.grad and diff and inputs):
        return []
    rng = np.random.default_rng(11)
    gouts = [tw.from_numpy(rng.standard_normal(tuple(o.shape)).astype(np.float32)).to(o.device, o.dtype) for o in diff]
    return [g for g in tw.autograd.grad(diff, inputs, gouts, allow_unused=True) if g is not None]


@pytest.mark.parametrize("info,k", CASES_QUICK_FIRST)
def test_compiled_forward_is_differentiable(info, k):
    """The compiled function's outputs carry autograd history: backward runs the compiled backward program."""
    sample = info.samples()[k]
    args, kwargs, tensors = _inputs(info, sample, seed=k, noncontiguous=False)
    try:
        tw.manual_seed(0)
        expected = _forward_only(info, args, kwargs)(*tensors)
        expected_grads = _eager_grads(expected, tensors, info)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        pytest.skip(f"eager raises for this sample: {exc}")
    compiled = tw.compile(_forward_only(info, args, kwargs))
    tw.manual_seed(0)
    try:
        actual = compiled(*tensors)
    except DataDependentError:
        if info.name in DATA_DEPENDENT:
            return
        raise
    where = f"{info.name}[{sample.name or k}]"
    _compare(actual, expected, f"{where}: outputs", info)
    for a, e in zip(actual, expected):
        assert a.requires_grad == e.requires_grad, f"{where}: requires_grad {a.requires_grad}, eager {e.requires_grad}"
    _compare(_eager_grads(actual, tensors, info), expected_grads, f"{where}: gradients", info)


# ---------------------------------------------------------------------------- the CUDA target



def _on(device: str, tensors: list) -> list:
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


@pytest.mark.skipif(not nvrtc_available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("info,k", CASES, ids=[f"{i.name}-{k}" for i, k in CASES])
def test_cuda_kernels_compile(info, k):
    """Every fused kernel the CUDA target generates for the operator (forward and gradients) compiles."""
    from tilewise.codegen.toolchain import compile_cached
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    sample = info.samples()[k]
    args, kwargs, tensors = _inputs(info, sample, seed=k, noncontiguous=info.noncontiguous)
    fn = _program(info, args, kwargs, len(tensors), np.random.default_rng(7))
    try:
        tw.manual_seed(0)
        fn(*tensors)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        pytest.skip(f"eager raises for this sample: {exc}")
    try:
        traced = trace(fn, tuple(tensors), {})
    except DataDependentError:
        assert info.name in DATA_DEPENDENT
        return
    except UnsupportedTargetError as exc:  # runs eagerly under compile: no kernel to build
        assert "on the host and run" in str(exc), exc
        return
    low = lower_program(run_pipeline(traced.graph), CUDA_TARGET)
    assert sorted(low.sources) == sorted(kk.name for kk in low.kernels.values())
    for name, source in low.sources.items():
        assert f".entry {name}" in compile_cached(source, name, "sm_90").ptx


def _with_given_grads(info, args, kwargs, n: int):
    """Outputs and the gradients of the floating outputs for grad outputs passed after the ``n`` inputs."""
    forward = _forward_only(info, args, kwargs)

    def run(*tensors):
        outs = forward(*tensors[:n])
        diff = [o for o in outs if o.requires_grad and o.dtype.is_floating_point]
        inputs = [t for t in tensors[:n] if t.requires_grad]
        if not (info.grad and diff and inputs):
            return outs, []
        grads = tw.autograd.grad(diff, inputs, list(tensors[n:]), allow_unused=True)
        return outs, [g for g in grads if g is not None]

    return run


@pytest.mark.cuda
@pytest.mark.parametrize("info,k", CASES, ids=[f"{i.name}-{k}" for i, k in CASES])
def test_compiled_matches_eager_on_cuda(info, k):
    sample = info.samples()[k]
    args, kwargs, tensors = _inputs(info, sample, seed=k, noncontiguous=info.noncontiguous)
    tensors = _on("cuda", tensors)
    try:
        tw.manual_seed(0)
        outs = _forward_only(info, args, kwargs)(*tensors)
        rng = np.random.default_rng(7)
        gouts = [tw.from_numpy(rng.standard_normal(tuple(o.shape)).astype(np.float32)).to("cuda", o.dtype)
                 for o in outs if o.requires_grad and o.dtype.is_floating_point]
        fn = _with_given_grads(info, args, kwargs, len(tensors))
        tw.manual_seed(0)
        expected = fn(*tensors, *gouts)
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as exc:
        pytest.skip(f"eager raises for this sample: {exc}")
    compiled = tw.compile(_with_given_grads(info, args, kwargs, len(tensors)))
    for call in range(2):  # the second call replays a CUDA graph where the program can be captured
        tw.manual_seed(0)
        try:
            actual = compiled(*tensors, *gouts)
        except DataDependentError:
            if info.name in DATA_DEPENDENT:
                return
            raise
        assert compiled.eager_reason is None or "on the host and run" in compiled.eager_reason or (
            info.name in HOST_CONSTANTS and "tensors on cpu" in compiled.eager_reason), compiled.eager_reason
        if compiled.eager_reason is not None:
            return  # it ran eagerly, as intended: nothing of the compiler's to compare
        where = f"{info.name}[{sample.name or k}] call {call}"
        _compare([a.cpu() for a in actual[0]], [e.cpu() for e in expected[0]], f"{where}: outputs", info)
        _compare([a.cpu() for a in actual[1]], [e.cpu() for e in expected[1]], f"{where}: gradients", info)


def _in_memory_order(lib, array: np.ndarray):
    """``array`` as a tensor laid out in another order than row-major: channels-last for a 4-d one, else with its
    dims reversed in memory (a transposed matrix)."""
    if array.ndim == 4:
        return lib.from_numpy(array.copy()).contiguous(memory_format=lib.channels_last)
    if array.ndim < 2:
        return lib.from_numpy(array.copy())
    reverse = tuple(range(array.ndim))[::-1]
    return lib.from_numpy(np.ascontiguousarray(array.transpose(reverse))).permute(reverse)


def _layouts_of(lib, functional, info, sample):
    """What ``stride()`` and ``storage_offset()`` say of the results of one sample, on inputs in other orders."""
    rng = np.random.default_rng(0)
    made: list = []
    args = _materialise(sample.args, rng, "float32", made)
    kwargs = {k: _materialise(v, rng, "float32", made) for k, v in sample.kwargs.items()}
    tensors = [_in_memory_order(lib, array) for array, _ in made]
    op = info.resolve(lib, functional)

    def run(*ts):
        out = op(*_build(args, None, lambda k: ts[k], lib), **{k: _build(v, None, lambda i: ts[i], lib)
                                                                for k, v in kwargs.items()})
        return tuple((tuple(o.stride()), o.storage_offset()) if isinstance(o, lib.Tensor) else None
                     for o in (out if isinstance(out, (tuple, list)) else (out,)))

    return run, tensors


# operators whose eager results are not laid out as torch's on inputs in other orders (channels-last, transposed): what
# torch does that tilewise does not
STRIDES_NOT_TORCHS = {
    "einsum": "torch lays its result out by its own contraction path (operands permuted to its label order, a pair "
              "with nothing to sum multiplied element-wise in its operands' order); tilewise's is row-major",
    "nanquantile": "torch keeps a kept reduced dim (keepdim) as a size-1 dim of its sorted, transposed view through "
                   "its final transposes, which give that size-1 dim another stride",
}


@pytest.mark.parametrize("info", [i for i in OPINFOS if i.name not in STRIDES_NOT_TORCHS], ids=lambda i: i.name)
def test_eager_strides_are_torchs(info):
    """``stride()`` and ``storage_offset()`` of eager results answer what torch's do, on inputs laid out channels-last
    or transposed."""
    import torch
    import torch.nn.functional as TF

    compared = 0
    for sample in info.samples():
        run, tensors = _layouts_of(tw, F, info, sample)
        theirs, their_tensors = _layouts_of(torch, TF, info, sample)
        try:
            torch.manual_seed(0)
            want = theirs(*their_tensors)
        except Exception:  # a sample of an error: nothing to compare
            continue
        tw.manual_seed(0)
        assert run(*tensors) == want, f"{info.name}[{sample.name or sample.args}]"
        compared += 1
    if not compared:  # view, view_as_complex, conv_tbc: torch reads these through views their strides refuse
        pytest.skip(f"torch refuses every sample of {info.name} on inputs in these orders")


@pytest.mark.parametrize("info", [i for i in OPINFOS if id(i) not in EAGER_ONLY and i.reference is None],
                         ids=lambda i: i.name)
def test_compiled_strides_are_eagers(info):
    """Inside a compiled function, ``stride()`` and ``storage_offset()`` of every operator's results answer what
    eager answers, on inputs laid out channels-last or transposed (see [Note: eager strides of traced values] in
    compiler/formats.py), wherever eager answers as torch does (where it does not, the disagreement is eager's)."""
    import torch
    import torch.nn.functional as TF

    if info.name in HOST_CONSTANTS:  # fullgraph=True refuses their constants at the decompose pass (another matter)
        pytest.skip("its decomposition makes constants on the host")
    for sample in info.samples():
        run, tensors = _layouts_of(tw, F, info, sample)
        try:
            tw.manual_seed(0)
            eager = run(*tensors)
            theirs, their_tensors = _layouts_of(torch, TF, info, sample)
            torch.manual_seed(0)
            if theirs(*their_tensors) != eager:
                continue
        except Exception:  # a sample of an error, or one torch runs otherwise: nothing to compare
            continue
        try:
            tw.manual_seed(0)
            compiled = tw.compile(run, fullgraph=True)(*tensors)
        except (DataDependentError, UnsupportedTargetError):
            continue
        assert compiled == eager, f"{info.name}[{sample.name or sample.args}]"
