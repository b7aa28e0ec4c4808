"""Discrete Fourier transforms (``tilewise.fft``): three primitives and torch's functions composed from them.

[Note: fft primitives] As in torch, every transform is one of three primitives over a list of (non-negative,
distinct) dims: ``_fft_c2c`` (complex to complex, forward or inverse), ``_fft_r2c`` (real to complex, the
one-sided half of the last dim when ``onesided``) and ``_fft_c2r`` (the Hermitian half of the last dim to
``last_dim_size`` real values). ``normalization`` is torch's code for the scale applied, whatever the
direction: 0 none, 1 by 1/sqrt(n), 2 by 1/n. The CPU runs numpy's pocketfft (as torch's CPU does), CUDA runs
cuFFT. The public functions only canonicalise ``n``/``s``, ``dim`` and ``norm`` with torch's errors, promote
the input (integers to the default float dtype, real to complex where a transform needs complex input), zero-pad
or slice the transformed dims, and call a primitive (run eagerly: ``compiles=False``, the compiler's targets have
no complex types): their gradients come from the primitives' derivatives,
torch's formulas (``fft_r2c_backward`` fills the discarded half with zeros before the inverse transform;
``fft_c2r_backward`` doubles the entries whose mirror image the one-sided input left out).
"""

from __future__ import annotations

from tilewise import dtypes
from tilewise import strides as S
from tilewise._warnings import warn_at_caller
from tilewise.layouts import in_format_of
from tilewise.ops.batching import shift_dims
from tilewise.ops.formulas import HELPERS
from tilewise.ops.registry import OPS, declare
from tilewise.tensor import Tensor

NONE, BY_ROOT_N, BY_N = 0, 1, 2


# ---------------------------------------------------------------- primitives

def _r2c_dtype(op, args):
    x = args[0]
    if x.dtype not in (dtypes.float32, dtypes.float64):
        raise RuntimeError(f"{op.name}: expected a float32 or float64 input, got {x.dtype.name}")
    out = x.dtype.to_complex()
    return out, out


def _c2r_dtype(op, args):
    x = args[0]
    if not x.dtype.is_complex:
        raise RuntimeError(f"{op.name}: expected a complex64 or complex128 input, got {x.dtype.name}")
    out = x.dtype.to_real()
    return out, out


def _c2c_dtype(op, args):
    x = args[0]
    if not x.dtype.is_complex:
        raise RuntimeError(f"{op.name}: expected a complex64 or complex128 input, got {x.dtype.name}")
    return x.dtype, x.dtype


declare("_fft_r2c(Tensor self, int[] dim, int normalization, bool onesided) -> Tensor", "other", dtype=_r2c_dtype,
        grad={"self": "fft_r2c_backward(grad, dim, normalization, onesided, self_shape)"}, fwd="auto_linear",
        method=False, public=False, compiles=False, batch=shift_dims)
declare("_fft_c2r(Tensor self, int[] dim, int normalization, int last_dim_size) -> Tensor", "other",
        dtype=_c2r_dtype, grad={"self": "fft_c2r_backward(grad, dim, normalization)"}, fwd="auto_linear", method=False,
        public=False, compiles=False, batch=shift_dims)
declare("_fft_c2c(Tensor self, int[] dim, int normalization, bool forward) -> Tensor", "other", dtype=_c2c_dtype,
        grad={"self": "OPS['_fft_c2c'](grad, dim, normalization, not forward)"}, fwd="auto_linear", method=False,
        public=False, compiles=False, batch=shift_dims)


def fft_r2c_backward(grad, dim, normalization, onesided, self_shape):
    """The adjoint of a real-to-complex transform: a one-sided result is completed with zeros (the half it left
    out) before the inverse complex transform, whose real part is the gradient."""
    if onesided:
        last = dim[-1]
        grad = resized(grad, (last,), (self_shape[last],))
    return OPS["_fft_c2c"](grad, dim, normalization, False).real


def fft_c2r_backward(grad, dim, normalization):
    """The adjoint of a complex-to-real transform: the one-sided real-to-complex transform of the gradient, with
    the entries whose mirror image lies outside the one-sided half doubled (1 .. n - onesided_length)."""
    from tilewise.ops.creation import ones

    out = OPS["_fft_r2c"](grad, dim, normalization, True)
    last = dim[-1]
    double_length = grad.shape[last] - out.shape[last]
    if double_length <= 0:
        return out
    scale = ones(out.shape[last], dtype=grad.dtype, device=grad.device)
    scale[1:1 + double_length] = 2.0
    return out * scale.view((-1,) + (1,) * (out.ndim - 1 - last))


HELPERS.update(fft_r2c_backward=fft_r2c_backward, fft_c2r_backward=fft_c2r_backward)


# ---------------------------------------------------------------- argument handling, as torch's SpectralOps.cpp

def on_parts(fn, x: Tensor, *args):
    """``fn(x, *args)`` for a real ``x``; for a complex one, ``fn`` applied to its real view (a trailing dim of
    2, so ``x``'s dims keep their indices), so that only real kernels run on every device."""
    if not x.dtype.is_complex:
        return fn(x, *args)
    return OPS["view_as_complex"](fn(OPS["view_as_real"](x), *args).contiguous())


def _pad_or_slice(x: Tensor, dims: tuple, sizes: tuple) -> Tensor:
    pad = [0, 0] * x.ndim
    for d, n in zip(dims, sizes):
        if x.shape[d] > n:
            x = x.narrow(d, 0, n)
        elif x.shape[d] < n:
            pad[2 * (x.ndim - 1 - d) + 1] = n - x.shape[d]
    return OPS["pad"](x, pad) if any(pad) else x


def resized(x: Tensor, dims: tuple, sizes: tuple) -> Tensor:
    """torch's resize_fft_input: the transformed dims cut (a view) or zero-padded (a copy in the format the input
    suggests, as torch's constant pad writes it) at the end to ``sizes``."""
    if all(x.shape[d] == n for d, n in zip(dims, sizes)):
        return x
    if not x.dtype.is_complex:
        return _pad_or_slice(x, dims, sizes)
    parts = _pad_or_slice(OPS["view_as_real"](x), dims, sizes)
    if all(x.shape[d] >= n for d, n in zip(dims, sizes)):
        return OPS["view_as_complex"](parts)  # cut only: the parts' view keeps the pairs view_as_complex reads
    source = x  # what torch pads: the input with its cuts made
    for d, n in zip(dims, sizes):
        if x.shape[d] > n:
            source = source.narrow(d, 0, n)
    return in_format_of(OPS["view_as_complex"](parts.contiguous()), source)


def norm_code(norm: str | None, forward: bool) -> int:
    """torch's norm_from_string: the scale of a transform in direction ``forward`` for the user's ``norm``."""
    if norm is None or norm == "backward":
        return NONE if forward else BY_N
    if norm == "forward":
        return BY_N if forward else NONE
    if norm == "ortho":
        return BY_ROOT_N
    raise RuntimeError(f'Invalid normalization mode: "{norm}"; valid modes are "backward", "forward" and "ortho"')


def promoted(x: Tensor, require_complex: bool, op: str) -> Tensor:
    """torch's promote_tensor_fft: integers become the default float dtype; float32 and float64 (complex when
    required) are the dtypes transforms take."""
    dtype = x.dtype
    if dtype.is_complex:
        return x
    if dtype.category < dtypes.FLOAT:
        dtype = dtypes.get_default_dtype()
    if dtype not in (dtypes.float32, dtypes.float64):
        raise RuntimeError(f"Unsupported dtype {dtypes.c10_name(dtype)} ({op}: transforms take float32, float64, "
                           "complex64 or complex128; convert with .float())")
    if require_complex:
        dtype = dtype.to_complex()
    return x if dtype is x.dtype else x.to(dtype)


def _wrapped_dim(dim: int, ndim: int) -> int:
    if ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    return S.normalize_dim(dim, ndim)


def _check_points(n: int) -> None:
    if n < 1:
        raise RuntimeError(f"Invalid number of data points ({n}) specified")


def shape_and_dims(x: Tensor, s, dim) -> tuple[list[int], list[int]]:
    """torch's canonicalize_fft_shape_and_dim_args: the transformed dims and their signal sizes."""
    ndim = x.ndim
    dims = None
    if dim is not None:
        dims = [_wrapped_dim(d, ndim) for d in ([dim] if isinstance(dim, int) else dim)]
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"FFT dims must be unique, got dim={list(dim)}")
    if s is not None:
        s = [s] if isinstance(s, int) else list(s)
        if dims is not None and len(dims) != len(s):
            raise RuntimeError(f"When given, dim and shape arguments must have the same length (got s={s} and "
                               f"dim={list(dim)})")
        if len(s) > ndim:
            raise RuntimeError(f"Got shape with {len(s)} values but input tensor only has {ndim} dimensions.")
        if dims is None:
            dims = list(range(ndim - len(s), ndim))
        shape = [x.shape[d] if n == -1 else n for d, n in zip(dims, s)]
    elif dims is None:
        dims, shape = list(range(ndim)), list(x.shape)
    else:
        shape = [x.shape[d] for d in dims]
    for n in shape:
        _check_points(n)
    return shape, dims


# ---------------------------------------------------------------- one-dimensional transforms

def _c2c(x, n, dim, norm, forward: bool, op: str):
    if not x.dtype.is_complex:
        raise RuntimeError(f"{op} expects a complex input tensor, but got {dtypes.c10_name(x.dtype)}")
    d = _wrapped_dim(dim, x.ndim)
    n = x.shape[d] if n is None else n
    _check_points(n)
    x = resized(x, (d,), (n,))
    return OPS["_fft_c2c"](x, (d,), norm_code(norm, forward), forward)


def _r2c(x, n, dim, norm, forward: bool, onesided: bool, op: str):
    if x.dtype.is_complex:
        raise RuntimeError(f"{op} expects a real input tensor, but got {dtypes.c10_name(x.dtype)}")
    x = promoted(x, False, op)
    d = _wrapped_dim(dim, x.ndim)
    n = x.shape[d] if n is None else n
    _check_points(n)
    x = resized(x, (d,), (n,))
    out = OPS["_fft_r2c"](x, (d,), norm_code(norm, forward), onesided)
    return out if forward else out.conj()


def _c2r(x, n, dim, norm, forward: bool, op: str):
    x = promoted(x, True, op)
    d = _wrapped_dim(dim, x.ndim)
    n = 2 * (x.shape[d] - 1) if n is None else n
    _check_points(n)
    x = resized(x, (d,), (n // 2 + 1,))
    if forward:
        x = x.conj()
    return OPS["_fft_c2r"](x, (d,), norm_code(norm, forward), n)


def _fft(x, n=None, dim=-1, norm=None):
    if x.dtype.is_complex:
        return _c2c(x, n, dim, norm, True, "fft")
    return _r2c(x, n, dim, norm, True, False, "fft")


def _ifft(x, n=None, dim=-1, norm=None):
    if x.dtype.is_complex:
        return _c2c(x, n, dim, norm, False, "ifft")
    return _r2c(x, n, dim, norm, False, False, "ifft")


def _rfft(x, n=None, dim=-1, norm=None):
    return _r2c(x, n, dim, norm, True, True, "rfft")


def _irfft(x, n=None, dim=-1, norm=None):
    return _c2r(x, n, dim, norm, False, "irfft")


def _hfft(x, n=None, dim=-1, norm=None):
    return _c2r(x, n, dim, norm, True, "hfft")


def _ihfft(x, n=None, dim=-1, norm=None):
    return _r2c(x, n, dim, norm, False, True, "ihfft")


# ---------------------------------------------------------------- n-dimensional transforms

def _fftn_c2c(x, s, dim, norm, forward: bool):
    shape, dims = shape_and_dims(x, s, dim)
    x = resized(promoted(x, True, "fftn"), dims, shape)
    return OPS["_fft_c2c"](x, tuple(dims), norm_code(norm, forward), forward)


def _fftn(x, s=None, dim=None, norm=None):
    return _fftn_c2c(x, s, dim, norm, True)


def _ifftn(x, s=None, dim=None, norm=None):
    return _fftn_c2c(x, s, dim, norm, False)


def _rfftn(x, s=None, dim=None, norm=None):
    if x.dtype.is_complex:
        raise RuntimeError(f"rfftn expects a real-valued input tensor, but got {dtypes.c10_name(x.dtype)}")
    shape, dims = shape_and_dims(x, s, dim)
    if not dims:
        raise RuntimeError("rfftn must transform at least one axis")
    x = resized(promoted(x, False, "rfftn"), dims, shape)
    return OPS["_fft_r2c"](x, tuple(dims), norm_code(norm, True), True)


def _irfftn(x, s=None, dim=None, norm=None):
    shape, dims = shape_and_dims(x, s, dim)
    if not dims:
        raise RuntimeError("irfftn must transform at least one axis")
    last_dim_size = 2 * (x.shape[dims[-1]] - 1) if s is None or list(s)[-1] == -1 else shape[-1]
    _check_points(last_dim_size)
    shape[-1] = last_dim_size // 2 + 1
    x = resized(promoted(x, True, "irfftn"), dims, shape)
    return OPS["_fft_c2r"](x, tuple(dims), norm_code(norm, False), last_dim_size)


def _hfftn(x, s=None, dim=None, norm=None):
    """The Hermitian transform of a half spectrum over ``dim`` (the last one halved): ``irfftn`` of the conjugate,
    scaled as a forward transform (torch's c2c over the other dims, then c2r of the conjugate, is the same sum)."""
    shape, dims = shape_and_dims(x, s, dim)
    if not dims:
        raise RuntimeError("hfftn must transform at least one axis")
    last_dim_size = 2 * (x.shape[dims[-1]] - 1) if s is None or list(s)[-1] == -1 else shape[-1]
    _check_points(last_dim_size)
    shape[-1] = last_dim_size // 2 + 1
    x = resized(promoted(x, True, "hfftn"), dims, shape)
    return OPS["_fft_c2r"](x.conj(), tuple(dims), norm_code(norm, True), last_dim_size)


def _ihfftn(x, s=None, dim=None, norm=None):
    """The inverse of :func:`_hfftn`: the one-sided inverse transform of a real signal, conjugated."""
    shape, dims = shape_and_dims(x, s, dim)
    if not dims:
        raise RuntimeError("ihfftn must transform at least one axis")
    if x.dtype.is_complex:
        raise RuntimeError(f"Only supports floating-point dtypes, but found: {dtypes.c10_name(x.dtype)}")
    x = resized(promoted(x, False, "ihfftn"), dims, shape)
    # as torch's: the last dim's one-sided transform, conjugated, then the others' inverse transform (the same
    # sum as one r2c over every dim, conjugated; this order gives torch's memory layout)
    half = OPS["_fft_r2c"](x, (dims[-1],), norm_code(norm, False), True).conj()
    if len(dims) == 1:
        return half
    return OPS["_fft_c2c"](half, tuple(dims[:-1]), norm_code(norm, False), False)


def _fft2(x, s=None, dim=(-2, -1), norm=None):
    return _fftn(x, s, dim, norm)


def _ifft2(x, s=None, dim=(-2, -1), norm=None):
    return _ifftn(x, s, dim, norm)


def _rfft2(x, s=None, dim=(-2, -1), norm=None):
    return _rfftn(x, s, dim, norm)


def _irfft2(x, s=None, dim=(-2, -1), norm=None):
    return _irfftn(x, s, dim, norm)


def _hfft2(x, s=None, dim=(-2, -1), norm=None):
    return _hfftn(x, s, dim, norm)


def _ihfft2(x, s=None, dim=(-2, -1), norm=None):
    return _ihfftn(x, s, dim, norm)


# ---------------------------------------------------------------- shifts

def _shifted(x, dim, inverse: bool):
    dims = list(range(x.ndim)) if dim is None else [S.normalize_dim(d, x.ndim, "fftshift")
                                                     for d in ([dim] if isinstance(dim, int) else dim)]
    if not dims:
        return x.clone()
    shifts = [(x.shape[d] + 1) // 2 if inverse else x.shape[d] // 2 for d in dims]
    return on_parts(lambda t: OPS["roll"](t, shifts, dims), x)


def _fftshift(x, dim=None):
    return _shifted(x, dim, False)


def _ifftshift(x, dim=None):
    return _shifted(x, dim, True)


_ONE_DIM = "(Tensor self, int? n=None, int dim=-1, str? norm=None) -> Tensor"
_N_DIM = "(Tensor self, int[1]? s=None, int[1]? dim=None, str? norm=None) -> Tensor"
_TWO_DIM = "(Tensor self, int[1]? s=None, int[1] dim=[-2,-1], str? norm=None) -> Tensor"
_SHIFT = "(Tensor self, int[1]? dim=None) -> Tensor"
TRANSFORMS = {
    "fft": (_ONE_DIM, _fft), "ifft": (_ONE_DIM, _ifft), "rfft": (_ONE_DIM, _rfft), "irfft": (_ONE_DIM, _irfft),
    "hfft": (_ONE_DIM, _hfft), "ihfft": (_ONE_DIM, _ihfft), "fftn": (_N_DIM, _fftn), "ifftn": (_N_DIM, _ifftn),
    "rfftn": (_N_DIM, _rfftn), "irfftn": (_N_DIM, _irfftn), "fft2": (_TWO_DIM, _fft2), "ifft2": (_TWO_DIM, _ifft2),
    "rfft2": (_TWO_DIM, _rfft2), "irfft2": (_TWO_DIM, _irfft2), "hfftn": (_N_DIM, _hfftn),
    "ihfftn": (_N_DIM, _ihfftn), "hfft2": (_TWO_DIM, _hfft2), "ihfft2": (_TWO_DIM, _ihfft2),
    "fftshift": (_SHIFT, _fftshift),
    "ifftshift": (_SHIFT, _ifftshift),
}
_SHIFTS = ("fftshift", "ifftshift")  # torch's CPU autocast lists every transform above, no shift; nor out= for shifts
_NOT_AUTOCAST = (*_SHIFTS, "hfftn", "ihfftn", "hfft2", "ihfft2")  # nor the Hermitian n-d transforms
for _name, (_signature, _decomposition) in TRANSFORMS.items():
    declare(f"fft_{_name}{_signature}", "composite", decomposition=_decomposition, method=False, function=False,
            autocast=None if _name in _NOT_AUTOCAST else {"cpu": "fp32"}, out=_name not in _SHIFTS)


# ---------------------------------------------------------------- short-time Fourier transform

_WARNED_ONCE: set[str] = set()  # torch's TORCH_WARN_ONCE: each of stft's warnings once per process

_NO_WINDOW = ("A window was not provided. A rectangular window will be applied,which is known to cause spectral "
              "leakage. Other windows such as torch.hann_window or torch.hamming_window are recommended to reduce "
              "spectral leakage.To suppress this warning and use a rectangular window, explicitly set "
              "`window=torch.ones(n_fft, device=<device>)`.")
_REAL_PAIRS = ("stft with return_complex=False is deprecated. In a future pytorch release, stft will return complex "
               "tensors for all inputs, and return_complex=False will raise an error.\nNote: you can still call "
               "torch.view_as_real on the complex output to recover the old return format.")


_LEGACY_TENSOR = {"uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long", "float16": "Half",
                  "float32": "Float", "float64": "Double"}


def _torch_type_string(t: Tensor) -> str:
    """How torch's messages name a tensor's type: ``torch.FloatTensor`` where a legacy tensor type has the dtype,
    ``CPUComplexFloatType`` otherwise."""
    cuda = t.device.type == "cuda"
    legacy = _LEGACY_TENSOR.get(t.dtype.name)
    if legacy is not None:
        return f"torch.{'cuda.' if cuda else ''}{legacy}Tensor"
    return f"{'CUDA' if cuda else 'CPU'}{dtypes.c10_name(t.dtype)}Type"


def _warn_once(message: str) -> None:
    if message not in _WARNED_ONCE:
        _WARNED_ONCE.add(message)
        warn_at_caller(message)


def _stft(x, n_fft, hop_length=None, win_length=None, window=None, center=True, pad_mode="reflect",
          normalized=False, onesided=None, return_complex=None, align_to_window=None):
    """torch.stft: frames of ``n_fft`` samples every ``hop_length`` (the signal first padded by ``n_fft // 2`` on
    each side with ``pad_mode`` when ``center``), each multiplied by the window (zero-padded to ``n_fft`` in the
    middle) and transformed; (batch,) freq, frames. With ``align_to_window`` (``center=False`` only) a window shorter
    than ``n_fft`` starts at each hop rather than the frame: the signal is zero-padded as the window is. Composed of
    pad, unfold, mul and the fft primitives, whose derivatives give its gradient."""
    if center and align_to_window is not None:
        raise RuntimeError("stft align_to_window should only be set when center = false")
    if center:
        signal_dim = x.ndim
        extended = x.reshape((1,) * (3 - signal_dim) + tuple(x.shape))
        x = OPS["pad"](extended, [n_fft // 2, n_fft // 2], pad_mode)
        x = x.reshape(tuple(x.shape[-signal_dim:]))
    if window is None:
        _warn_once(_NO_WINDOW)
    if return_complex is None:
        if not (x.dtype.is_complex or (window is not None and window.dtype.is_complex)):
            raise RuntimeError("stft requires the return_complex parameter be given for real inputs, and will further "
                               "require that return_complex=True in a future PyTorch release.")
        return_complex = True
    if not return_complex:
        _warn_once(_REAL_PAIRS)
    hop_length = n_fft // 4 if hop_length is None else hop_length
    win_length = n_fft if win_length is None else win_length

    def fail(message: str):
        shown = "None" if window is None else f"{_torch_type_string(window)}{{{list(window.shape)}}}"
        flag = lambda v: "None" if v is None else str(int(v))  # noqa: E731
        raise RuntimeError(f"stft({_torch_type_string(x)}{list(x.shape)}, n_fft={n_fft}, hop_length={hop_length}, "
                           f"win_length={win_length}, window={shown}, normalized={int(normalized)}, "
                           f"onesided={flag(onesided)}, return_complex={flag(return_complex)}, "
                           f"align_to_window={flag(align_to_window)}) : {message}")

    if not (x.dtype.is_floating_point or x.dtype.is_complex):
        fail("expected a tensor of floating point or complex values")
    if x.ndim not in (1, 2):
        fail("expected a 1D or 2D tensor")
    signal = x.unsqueeze(0) if x.ndim == 1 else x
    length = signal.shape[1]
    if n_fft <= 0 or n_fft > length:
        fail(f"expected 0 < n_fft < {length}, but got n_fft={n_fft}")
    if hop_length <= 0:
        fail(f"expected hop_length > 0, but got hop_length={hop_length}")
    if win_length <= 0 or win_length > n_fft:
        fail(f"expected 0 < win_length <= n_fft, but got win_length={win_length}")
    if window is not None and (window.ndim != 1 or window.shape[0] != win_length):
        fail(f"expected a 1D window tensor of size equal to win_length={win_length}, but got window with size "
             f"{list(window.shape)}")
    if win_length < n_fft:
        if window is None:
            from tilewise.ops.creation import ones

            window = ones(win_length, dtype=signal.dtype.to_real() if signal.dtype.is_complex else signal.dtype,
                          device=signal.device)
        left = (n_fft - win_length) // 2
        window = OPS["pad"](window, [left, n_fft - win_length - left])
        if align_to_window:
            signal = OPS["pad"](signal, [left, n_fft - win_length - left])
    frames = signal.unfold(-1, n_fft, hop_length)
    if window is not None:
        frames = frames * window
    complex_fft = frames.dtype.is_complex
    onesided = (not complex_fft) if onesided is None else onesided
    if complex_fft and onesided:
        raise RuntimeError("Cannot have onesided output if window or input is complex")
    normalization = BY_ROOT_N if normalized else NONE
    if complex_fft:
        out = OPS["_fft_c2c"](frames, (2,), normalization, True)
    else:
        out = OPS["_fft_r2c"](promoted(frames, False, "stft"), (2,), normalization, onesided)
    out = out.transpose(1, 2)
    if x.ndim == 1:
        out = out.squeeze(0)
    return out if return_complex else OPS["view_as_real"](out)


declare("stft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, "
        "bool center=True, str pad_mode=\"reflect\", bool normalized=False, bool? onesided=None, "
        "bool? return_complex=None, bool? align_to_window=None) -> Tensor", "composite", decomposition=_stft,
        out=False, compiles=False, autocast={"cpu": "fp32"})


# ---------------------------------------------------------------- inverse short-time Fourier transform

_ISTFT_NO_WINDOW = ("A window was not provided. A rectangular window will be applied.Please provide the same window "
                    "used by stft to make the inversion lossless.To suppress this warning and use a rectangular "
                    "window, explicitly set `window=torch.ones(n_fft, device=<device>)`.")
_ISTFT_PADDED = ("The length of signal is shorter than the length parameter. Result is being padded with zeros in the "
                 "tail. Please check your center and hop_length settings.")


def _overlap_add(frames: Tensor, hop_length: int, length: int) -> Tensor:
    """torch's unfold_backward of (batch, n_frames, n_fft) frames every ``hop_length`` samples: each frame summed
    into the ``length`` samples it covers; fold (col2im) over a height of 1, on the parts of a complex one."""
    batch, n_frames, n_fft = frames.shape
    if frames.dtype.is_complex:
        parts = OPS["view_as_real"](frames).permute(0, 3, 2, 1).reshape(batch, 2 * n_fft, n_frames)
        out = OPS["col2im"](parts, (1, length), (1, n_fft), 1, 0, (1, hop_length))
        return OPS["view_as_complex"](out.reshape(batch, 2, length).transpose(1, 2).contiguous())
    out = OPS["col2im"](frames.transpose(1, 2), (1, length), (1, n_fft), 1, 0, (1, hop_length))
    return out.reshape(batch, length)


def _istft(x, n_fft, hop_length=None, win_length=None, window=None, center=True, normalized=False, onesided=None,
           length=None, return_complex=False):
    """torch.istft: the inverse of stft by overlap-add. Each frame's inverse transform (one-sided c2r or c2c),
    times the window, is summed into the signal (fold), which is divided by the summed squared window (the
    envelope; torch's NOLA check refuses an envelope below 1e-11 anywhere in the kept samples), trimmed by
    ``n_fft // 2`` at each end when ``center`` (or to ``length``, zero-padded past the frames' end)."""
    hop_length = n_fft >> 2 if hop_length is None else hop_length
    win_length = n_fft if win_length is None else win_length
    if window is None:  # before any refusal, as torch warns
        _warn_once(_ISTFT_NO_WINDOW)
    if not x.dtype.is_complex:
        raise RuntimeError("istft requires a complex-valued input tensor matching the output from stft with "
                           "return_complex=True.")
    given_onesided = onesided  # torch's messages show the arguments as given

    def fail(message: str, sep: str = " : "):
        shown = "None" if window is None else f"{_torch_type_string(window)}{{{list(window.shape)}}}"
        flag = lambda v: "None" if v is None else str(int(v))  # noqa: E731
        raise RuntimeError(f"istft({_torch_type_string(x)}{list(x.shape)}, n_fft={n_fft}, "
                           f"hop_length={hop_length}, win_length={win_length}, window={shown}, center={int(center)}, "
                           f"normalized={int(normalized)}, onesided={flag(given_onesided)}, length="
                           f"{'None' if length is None else length}, return_complex={int(return_complex)}){sep}"
                           f"{message}")

    real_dims = x.ndim + 1  # torch checks the view_as_real of the input
    if real_dims < 3:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-real_dims}, {real_dims - 1}], but "
                         "got -3)")
    n_frames, fft_size = x.shape[-1], x.shape[-2]
    expected_len = n_fft + hop_length * (n_frames - 1)
    if x.numel() == 0:
        fail("input tensor cannot be empty.")
    if real_dims not in (3, 4):
        fail(f"expected a tensor with 3 or 4 dimensions, but got {real_dims}")
    onesided = fft_size != n_fft if onesided is None else onesided
    if onesided and n_fft // 2 + 1 != fft_size:
        fail("expected the frequency dimension (3rd to the last) of the input tensor to match n_fft / 2 + 1 when "
             f"onesided=True, but got {fft_size}")
    if not onesided and n_fft != fft_size:
        fail("expected the frequency dimension (3rd to the last) of the input tensor to match n_fft when "
             f"onesided=False, but got {fft_size}")
    if not 0 < hop_length <= win_length:
        fail("expected 0 < hop_length <= win_length")
    if not 0 < win_length <= n_fft:
        fail("expected 0 < win_length <= n_fft")
    if window is not None and (window.ndim != 1 or window.shape[0] != win_length):
        fail("Invalid window shape. window has to be 1D and length of `win_length`")
    if window is None:
        from tilewise.ops.creation import ones

        window = ones(win_length, dtype=x.dtype.to_real(), device=x.device)
    if win_length != n_fft:
        left = (n_fft - win_length) // 2
        window = OPS["pad"](window, [left, n_fft - win_length - left])
    signal = x.resolve_conj()
    signal = (signal.unsqueeze(0) if x.ndim == 2 else signal).transpose(1, 2)  # (channel, n_frames, fft_size)
    normalization = BY_ROOT_N if normalized else BY_N
    if return_complex:
        if onesided:
            raise RuntimeError("Cannot have onesided output if window or input is complex")
        frames = OPS["_fft_c2c"](signal, (2,), normalization, False)
    else:
        if window.dtype.is_complex:
            raise RuntimeError("Complex windows are incompatible with return_complex=False")
        if not onesided:
            signal = signal.narrow(-1, 0, n_fft // 2 + 1)
        frames = OPS["_fft_c2r"](signal, (2,), normalization, n_fft)
    y = _overlap_add(frames * window.view(1, 1, n_fft), hop_length, expected_len)
    squares = (window * window).view(1, 1, n_fft).expand(1, n_frames, n_fft)
    envelope = _overlap_add(squares, hop_length, expected_len)
    start = n_fft // 2 if center else 0
    end = start + length if length is not None else (expected_len - n_fft // 2 if center else expected_len)
    y, envelope = y[:, start:end], envelope[:, start:end]
    if bool((envelope.abs().min() < 1e-11).item()):
        fail(f"1\n[ {'CUDA' if x.device.type == 'cuda' else 'CPU'}BoolType{{}} ]", sep=" window overlap add min: ")
    y = y / envelope
    if x.ndim == 2:
        y = y.squeeze(0)
    if end > expected_len:
        _warn_once(_ISTFT_PADDED)
        y = OPS["pad"](y, [0, end - expected_len])
    return y


declare("istft(Tensor self, int n_fft, int? hop_length=None, int? win_length=None, Tensor? window=None, "
        "bool center=True, bool normalized=False, bool? onesided=None, int? length=None, "
        "bool return_complex=False) -> Tensor", "composite", decomposition=_istft, out=False, compiles=False,
        autocast={"cpu": "fp32"})
