"""The operator test table: sample inputs per operator, and the one helper that checks tilewise against torch.

An ``OpInfo`` names an operator (as called: ``tw.<name>`` / ``torch.<name>``, or a method, or an
``F.<name>``), and a ``samples`` function returning ``Sample``s whose arguments may hold ``T(...)``
placeholders. ``check_op`` materialises each placeholder as the same random numpy array for both
frameworks (optionally non-contiguous), runs forward on both, compares, then backpropagates the same
random output gradient and compares every input gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest


@dataclass(frozen=True)
class Named:
    """A library's own constant, by name: ``Named("channels_last")`` is ``tw.channels_last`` for tilewise and
    ``torch.channels_last`` for torch."""

    name: str


@dataclass
class T:
    """A tensor placeholder: shape, kind ('float', 'int', 'bool', 'index' in [0, high), 'prob' in (0,1),
    'distinct', 'ties', 'nan' / 'one_nan': distinct floats with NaNs, and 'complex': parts in [low, high] of the
    complex dtype whose parts are the sample dtype, see ``make``)."""

    shape: tuple
    kind: str = "float"
    low: float = -2.0
    high: float = 2.0
    grad: bool = True
    dtype: str | None = None  # overrides the sample dtype (e.g. 'int64' for indices)

    def make(self, rng: np.random.Generator, dtype: str) -> np.ndarray:
        shape = tuple(self.shape)
        if self.kind == "float":
            return rng.uniform(self.low, self.high, size=shape).astype(self.dtype or dtype)
        if self.kind == "complex":
            parts = rng.uniform(self.low, self.high, size=(*shape, 2)).astype(self.dtype or dtype)
            return np.asarray(parts[..., 0] + 1j * parts[..., 1])
        if self.kind == "positive":
            return rng.uniform(max(self.low, 0.1), max(self.high, 0.2), size=shape).astype(self.dtype or dtype)
        if self.kind == "prob":
            return rng.uniform(0.05, 0.95, size=shape).astype(self.dtype or dtype)
        if self.kind == "int":
            return rng.integers(int(self.low), int(self.high) + 1, size=shape).astype(self.dtype or "int64")
        if self.kind == "index":
            return rng.integers(0, int(self.high), size=shape).astype(self.dtype or "int64")
        if self.kind == "plane_index":  # distinct indices in [0, high) within each slice over the dims after `low`
            lead, plane = shape[:int(self.low)], shape[int(self.low):]
            size = int(np.prod(plane)) if plane else 1
            rows = [rng.permutation(int(self.high))[:size] for _ in range(int(np.prod(lead)) if lead else 1)]
            return np.stack(rows).reshape(shape).astype(self.dtype or "int64")
        if self.kind == "bool":
            return rng.random(size=shape) < 0.5
        if self.kind == "distinct":  # floats without ties (for sort/max tie-breaking)
            return _distinct(rng, shape).astype(self.dtype or dtype)
        if self.kind == "ties":  # whole numbers in [low, high] as floats: many equal elements
            return rng.integers(int(self.low), int(self.high) + 1, size=shape).astype(self.dtype or dtype)
        if self.kind == "nan":  # distinct floats with NaN and +-inf at random places: ties among those only
            return _with_specials(rng, _distinct(rng, shape)).astype(self.dtype or dtype)
        if self.kind == "one_nan":  # distinct floats; about half the innermost slices hold one NaN, none more
            return _with_one_nan_per_row(rng, _distinct(rng, shape)).astype(self.dtype or dtype)
        raise ValueError(self.kind)


def _distinct(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    return rng.permutation(n).reshape(shape) / max(n, 1) * 4 - 2


def _with_specials(rng: np.random.Generator, values: np.ndarray) -> np.ndarray:
    draw = rng.random(values.shape)
    values = np.where(draw < 0.2, np.nan, values)
    return np.where((draw >= 0.2) & (draw < 0.3), np.where(draw < 0.25, np.inf, -np.inf), values)


def _with_one_nan_per_row(rng: np.random.Generator, values: np.ndarray) -> np.ndarray:
    if values.ndim == 0 or values.size == 0:
        return values
    rows = values.reshape(-1, values.shape[-1]).copy()
    chosen = np.flatnonzero(rng.random(rows.shape[0]) < 0.5)
    rows[chosen, rng.integers(0, rows.shape[1], chosen.size)] = np.nan
    return rows.reshape(values.shape)


@dataclass
class Sample:
    args: tuple
    kwargs: dict = field(default_factory=dict)
    name: str = ""


@dataclass
class OpInfo:
    name: str
    samples: Callable[[], list[Sample]]
    call: str = "function"  # "function" (tw.name / torch.name), "method", or "F" (nn.functional)
    torch_name: str | None = None
    grad: bool = True
    dtypes: tuple[str, ...] = ("float32", "float64")
    rtol: float | None = None
    atol: float | None = None
    noncontiguous: bool = True
    covers: tuple[str, ...] = ()  # further declared operators this entry exercises
    output_index: int | None = None  # compare only this output of a tuple result (e.g. values of max.dim)
    # an operator torch does not have: (torch, torch.nn.functional) -> the same computation in torch's ops
    reference: Callable | None = None
    # torch's CPU and CUDA kernels choose different indices among equal values (their order is unspecified);
    # tilewise chooses the CPU's on every device, so the reference always runs on the CPU
    torch_on_cpu: bool = False
    # (function, module) -> function, applied on both sides: conditions inputs (a well-conditioned or symmetric
    # matrix) or outputs (singular vectors with a fixed sign), written with methods both frameworks share
    wrap: Callable | None = None

    def resolve(self, module, functional):
        fn = self._resolve(module, functional)
        return self.wrap(fn, module) if self.wrap is not None else fn

    def _resolve(self, module, functional):
        if self.reference is not None and module.__name__ == "torch":
            return self.reference(module, functional)
        name = self.torch_name if (self.torch_name and module.__name__ == "torch") else self.name
        if self.call == "method":
            return lambda x, *a, **k: getattr(x, name)(*a, **k)
        if self.call == "F":
            return getattr(functional, name)
        found = module
        for part in name.split("."):  # "linalg.solve", "fft.rfft": tw.linalg.solve / torch.linalg.solve
            found = getattr(found, part)
        return found


def _materialise(value, rng, dtype, made: list):
    if isinstance(value, T):
        arr = value.make(rng, dtype)
        made.append((arr, value))
        return ("__tensor__", len(made) - 1)
    if isinstance(value, (list, tuple)):  # nested too: cat([T(...), T(...)], 1)
        return type(value)(_materialise(v, rng, dtype, made) for v in value)
    return value


def _build(value, arrays, make_tensor, lib=None):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tensor__":
        return make_tensor(value[1])
    if isinstance(value, Named):
        if lib is None:  # the compiled-versus-eager tests build tilewise arguments only
            import tilewise as lib
        return getattr(lib, value.name)
    if isinstance(value, (list, tuple)):
        return type(value)(_build(v, arrays, make_tensor, lib) for v in value)
    return value


def tolerances(dtype: str, info: OpInfo) -> tuple[float, float]:
    base = {"float32": (1e-4, 1e-5), "float64": (1e-7, 1e-9), "bfloat16": (2e-2, 2e-2),
            "float16": (2e-3, 2e-3)}.get(dtype, (1e-5, 1e-6))
    return info.rtol or base[0], info.atol or base[1]


def to_numpy(x):
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().resolve_conj()
        if x._is_zerotensor():
            x = torch.zeros(x.shape, dtype=x.dtype)
        if x.dtype == torch.bfloat16:
            x = x.float()
        return x.numpy()
    return np.asarray(x.detach().float().numpy() if x.dtype.name == "bfloat16" else x.detach().numpy())


def _random_like(rng, e, dtype: str) -> np.ndarray:
    """An output gradient for torch's output ``e``: standard normal values, complex ones for a complex output."""
    values = rng.standard_normal(tuple(e.shape)).astype(dtype)
    if e.is_complex():
        values = np.asarray(values + 1j * rng.standard_normal(tuple(e.shape)).astype(dtype))
    return values


def _flatten_outputs(out):
    if isinstance(out, (tuple, list)):
        return [o for o in out]
    return [out]


LOW_PRECISION = ("bfloat16", "float16")
# a few units in the last place of the autocast dtype on sums of the samples' magnitude (products of tens of
# terms up to 4 reach 16 to 32, where bfloat16's unit in the last place is 0.125), whose rounding order differs
AUTOCAST_TOLERANCES = {"bfloat16": (2e-2, 1e-1), "float16": (5e-3, 2e-2)}


def _forward_context(lib, device: str, autocast: str | None):
    """``lib.autocast(device type, dtype=autocast)``, or no context when ``autocast`` is None."""
    if autocast is None:
        return contextlib.nullcontext()
    return lib.autocast(device.split(":")[0], dtype=getattr(lib, autocast))


def check_op(info: OpInfo, sample: Sample, dtype: str, seed: int, noncontiguous: bool, device: str = "cpu",
             autocast: str | None = None, mixed: bool = False):
    """Compare one sample's forward and backward with torch's. ``autocast`` (``"bfloat16"`` or ``"float16"``) runs
    both forwards under their framework's autocast for ``device``'s type with that dtype, compared at that dtype's
    tolerance; ``dtype`` may then be a low-precision one too (floating inputs are drawn in float32 and cast; with
    ``mixed``, only the first floating input is cast and the others stay float32). If torch's forward raises,
    tilewise's must raise the same type of error."""
    import torch
    import torch.nn.functional as TF

    import tilewise as tw
    import tilewise.nn.functional as F

    rng = np.random.default_rng(seed)
    made: list = []
    drawn = "float32" if dtype in LOW_PRECISION else dtype
    args = _materialise(sample.args, rng, drawn, made)
    kwargs = {k: _materialise(v, rng, drawn, made) for k, v in sample.kwargs.items()}
    arrays = [m[0] for m in made]
    floating = [k for k, (a, spec) in enumerate(made) if a.dtype.kind == "f" and spec.dtype is None]
    lowered = set(floating[:1] if mixed else floating) if dtype in LOW_PRECISION else set()

    def grad_wanted(k):
        arr, spec = made[k]
        return info.grad and spec.grad and arr.dtype.kind in "fc"

    def tw_tensor(k):
        a = arrays[k]
        t = tw.from_numpy(a.copy())
        if k in lowered:
            t = t.to(getattr(tw, dtype))
        if noncontiguous and a.ndim:
            big = tw.zeros(*a.shape[:-1], a.shape[-1] * 2, dtype=t.dtype)
            big[..., ::2] = t
            t = big[..., ::2]
            assert not t.is_contiguous() or a.shape[-1] <= 1 or a.size == 0
        t = t.to(device)
        if grad_wanted(k):
            t = t.detach().requires_grad_(True)
        return t

    def torch_tensor(k):
        a = arrays[k]
        t = torch.from_numpy(a.copy()).to("cpu" if info.torch_on_cpu else device)
        if k in lowered:
            t = t.to(getattr(torch, dtype))
        if grad_wanted(k):
            t.requires_grad_(True)
        return t

    tw_made, torch_made = {}, {}
    tw_args = _build(args, arrays, lambda k: tw_made.setdefault(k, tw_tensor(k)), tw)
    tw_kwargs = {k: _build(v, arrays, lambda i: tw_made.setdefault(i, tw_tensor(i)), tw) for k, v in kwargs.items()}
    th_args = _build(args, arrays, lambda k: torch_made.setdefault(k, torch_tensor(k)), torch)
    th_kwargs = {k: _build(v, arrays, lambda i: torch_made.setdefault(i, torch_tensor(i)), torch)
                 for k, v in kwargs.items()}

    try:
        with _forward_context(torch, device, autocast):
            expected = info.resolve(torch, TF)(*th_args, **th_kwargs)
    except Exception as exc:
        if autocast is None:
            raise
        with pytest.raises(type(exc)), _forward_context(tw, device, autocast):
            info.resolve(tw, F)(*tw_args, **tw_kwargs)
        return
    with _forward_context(tw, device, autocast):
        actual = info.resolve(tw, F)(*tw_args, **tw_kwargs)
    exp_list, act_list = _flatten_outputs(expected), _flatten_outputs(actual)
    if info.output_index is not None:
        exp_list, act_list = [exp_list[info.output_index]], [act_list[info.output_index]]
    assert len(exp_list) == len(act_list), f"{info.name}: {len(act_list)} outputs, torch gives {len(exp_list)}"
    rtol, atol = tolerances(dtype, info)
    if autocast is not None:
        low_rtol, low_atol = AUTOCAST_TOLERANCES[autocast]
        rtol, atol = max(rtol, low_rtol), max(atol, low_atol)
    where = f"{info.name}[{sample.name or sample.args}] dtype={dtype}{' (first input)' if mixed else ''} seed={seed} " \
            f"noncontig={noncontiguous}"
    if autocast is not None:
        where += f" under autocast({device.split(':')[0]!r}, dtype={autocast})"
    for e, a in zip(exp_list, act_list):
        if not isinstance(e, torch.Tensor):
            assert e == a, f"{where}: {a} != {e}"
            continue
        assert tuple(a.shape) == tuple(e.shape), f"{where}: shape {tuple(a.shape)} != torch {tuple(e.shape)}"
        assert a.dtype.name == str(e.dtype).removeprefix("torch."), f"{where}: dtype {a.dtype} != torch {e.dtype}"
        np.testing.assert_allclose(to_numpy(a.cpu()), to_numpy(e.cpu()), rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=f"{where}: forward mismatch")

    grad_inputs = [k for k in range(len(arrays)) if grad_wanted(k) and k in tw_made]
    diff_outs = [(e, a) for e, a in zip(exp_list, act_list)
                 if isinstance(e, torch.Tensor) and e.requires_grad and (e.dtype.is_floating_point or e.is_complex())]
    if not (info.grad and grad_inputs and diff_outs):
        return
    gouts = [_random_like(rng, e, drawn) for e, _ in diff_outs]
    th_inputs = [torch_made[k] for k in grad_inputs]
    try:
        th_gouts = [torch.from_numpy(g).to(e.device, e.dtype) for g, (e, _) in zip(gouts, diff_outs)]
        th_grads = torch.autograd.grad([e for e, _ in diff_outs], th_inputs, th_gouts, allow_unused=True)
    except RuntimeError as exc:  # the oracle cannot differentiate it here (e.g. an older torch on the GPU host, or
        # a backward kernel without this low-precision dtype on the CPU)
        if "derivative for" in str(exc) and "is not implemented" in str(exc):
            return
        if isinstance(exc, NotImplementedError) and autocast is not None and "not implemented for" in str(exc):
            return
        raise
    tw_inputs = [tw_made[k] for k in grad_inputs]
    tw_gouts = [tw.from_numpy(g.copy()).to(device, a.dtype) for g, (_, a) in zip(gouts, diff_outs)]
    tw_grads = tw.autograd.grad([a for _, a in diff_outs], tw_inputs, tw_gouts, allow_unused=True)
    for k, eg, ag in zip(grad_inputs, th_grads, tw_grads):
        if eg is None:
            assert ag is None or np.allclose(to_numpy(ag.cpu()), 0), f"{where}: input {k} grad should be None/0"
            continue
        assert ag is not None, f"{where}: input {k} got no gradient (torch has one)"
        assert tuple(ag.shape) == tuple(eg.shape), f"{where}: grad shape {tuple(ag.shape)} != {tuple(eg.shape)}"
        if autocast is not None:  # a gradient comes back in its input's dtype, whatever autocast cast it to
            assert ag.dtype.name == str(eg.dtype).removeprefix("torch."), \
                f"{where}: grad dtype {ag.dtype} != torch {eg.dtype}"
        np.testing.assert_allclose(to_numpy(ag.cpu()), to_numpy(eg.cpu()), rtol=rtol * 10, atol=atol * 10,
                                   equal_nan=True, err_msg=f"{where}: gradient mismatch for input {k}")
