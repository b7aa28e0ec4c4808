"""tilewise.fft and complex tensors against torch: what the op table (tests/opinfos/fft.py) does not cover —
argument errors, frequency helpers, gradients of real losses through transforms, promotion, printing — and the
CUDA path (cuFFT) against the CPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilewise as tw

TRANSFORMS_1D = ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")
TRANSFORMS_ND = ("fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn", "hfft2", "hfftn", "ihfft2",
                 "ihfftn")
REAL_ONLY = ("rfft", "ihfft", "rfft2", "rfftn", "ihfft2", "ihfftn")  # (torch's ihfft2 and ihfftn refuse complex
# input in other words)


def _signal(shape, complex_: bool, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if complex_:
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(np.result_type(dtype, np.complex64) if complex_ else dtype)


def _close(actual, expected, tol=1e-4):
    assert actual.dtype.name == str(expected.dtype).removeprefix("torch.")
    assert tuple(actual.shape) == tuple(expected.shape)
    np.testing.assert_allclose(actual.detach().cpu().numpy(), expected.detach().resolve_conj().numpy(), rtol=tol,
                               atol=tol)


def _both(name, a, **kwargs):
    return (getattr(tw.fft, name)(tw.from_numpy(a.copy()), **kwargs),
            getattr(torch.fft, name)(torch.from_numpy(a.copy()), **kwargs))


# ---------------------------------------------------------------------------------------------- values and errors

@pytest.mark.parametrize("kwargs", [{"n": 0}, {"dim": 2}, {"norm": "sideways"}, {"n": -3}])
@pytest.mark.parametrize("name", TRANSFORMS_1D)
def test_bad_arguments_raise_like_torch(name, kwargs):
    a = _signal((3, 4), False)
    with pytest.raises(Exception) as expected:
        getattr(torch.fft, name)(torch.from_numpy(a), **kwargs)
    with pytest.raises(type(expected.value)):
        getattr(tw.fft, name)(tw.from_numpy(a), **kwargs)


@pytest.mark.parametrize("kwargs", [{"dim": (0, 0)}, {"s": (2, 3, 4)}, {"s": (0, 2)}, {"s": (2,), "dim": (0, 1)},
                                    {"dim": ()}])
@pytest.mark.parametrize("name", TRANSFORMS_ND)
def test_bad_nd_arguments_raise_like_torch(name, kwargs):
    a = _signal((3, 4), False)
    try:
        expected = getattr(torch.fft, name)(torch.from_numpy(a), **kwargs)
    except Exception as exc:  # noqa: BLE001 — the test is that tilewise raises the same type
        with pytest.raises(type(exc)):
            getattr(tw.fft, name)(tw.from_numpy(a), **kwargs)
        return
    _close(getattr(tw.fft, name)(tw.from_numpy(a), **kwargs), expected)


@pytest.mark.parametrize("name", REAL_ONLY)
def test_real_transforms_refuse_complex_input(name):
    a = _signal((4, 4), True)
    with pytest.raises(RuntimeError) as expected:
        getattr(torch.fft, name)(torch.from_numpy(a))
    with pytest.raises(RuntimeError) as got:
        getattr(tw.fft, name)(tw.from_numpy(a))
    assert str(got.value) == str(expected.value)


def test_zero_dim_and_half_inputs_raise_like_torch():
    with pytest.raises(IndexError):
        tw.fft.fft(tw.tensor(1.0))
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        tw.fft.fft(tw.ones(3, dtype=tw.float16))


@pytest.mark.parametrize("dtype", ["int64", "bool", "float64"])
def test_integer_and_double_inputs_promote_like_torch(dtype):
    a = np.arange(6).reshape(2, 3).astype(dtype)
    for name in ("fft", "rfft", "fftn", "irfft", "hfft"):
        actual, expected = _both(name, a)
        _close(actual, expected, 1e-6)


def test_transforms_of_size_one_match_torch_and_empty_batches_give_empty_results():
    for name in TRANSFORMS_1D:
        if name not in ("irfft", "hfft"):  # 2 * (1 - 1) = 0 points: an error in both (test_bad_arguments...)
            actual, expected = _both(name, _signal((1,), False))
            _close(actual, expected)
        # torch's CPU (MKL) refuses an empty batch; its result is empty with the transformed dim's output size
        out = getattr(tw.fft, name)(tw.zeros(0, 4), n=6)
        assert tuple(out.shape) == (0, 4 if name in ("rfft", "ihfft") else 6)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("d", [1.0, 0.1])
@pytest.mark.parametrize("dtype", [None, tw.float64])
def test_frequencies_match_torch(n, d, dtype):
    torch_dtype = None if dtype is None else getattr(torch, dtype.name)
    _close(tw.fft.fftfreq(n, d, dtype=dtype), torch.fft.fftfreq(n, d, dtype=torch_dtype), 1e-7)
    _close(tw.fft.rfftfreq(n, d, dtype=dtype), torch.fft.rfftfreq(n, d, dtype=torch_dtype), 1e-7)


def test_frequencies_refuse_integer_and_complex_dtypes_like_torch():
    with pytest.raises(RuntimeError, match="floating point or complex"):
        tw.fft.fftfreq(4, dtype=tw.int64)
    with pytest.raises(NotImplementedError):
        torch.fft.fftfreq(4, dtype=torch.complex64)
    with pytest.raises(NotImplementedError):
        tw.fft.fftfreq(4, dtype=tw.complex64)


@pytest.mark.parametrize("dim", [None, 0, (1,), (0, 1)])
def test_shifts_match_torch_and_undo_each_other(dim):
    for complex_ in (False, True):
        a = _signal((5, 4), complex_)
        shifted, expected = _both("fftshift", a, dim=dim)
        _close(shifted, expected, 0)
        _close(tw.fft.ifftshift(shifted, dim=dim), torch.from_numpy(a), 0)


def test_transform_dims_keep_their_order_and_roundtrip():
    a = _signal((3, 4, 5, 2), False, np.float64)
    x = tw.from_numpy(a)
    spectrum = tw.fft.rfftn(x, dim=(3, 0, 2, 1))  # four dims: more than one cuFFT plan holds on CUDA
    _close(spectrum, torch.fft.rfftn(torch.from_numpy(a), dim=(3, 0, 2, 1)), 1e-9)
    back = tw.fft.irfftn(spectrum, s=(2, 3, 5, 4), dim=(3, 0, 2, 1))
    np.testing.assert_allclose(back.numpy(), a, atol=1e-12)


# ---------------------------------------------------------------------------------------------- gradients

def _loss_gradients(fn_tw, fn_torch, a):
    x = tw.from_numpy(a.copy()).requires_grad_(True)
    fn_tw(x).backward()
    xt = torch.from_numpy(a.copy()).requires_grad_(True)
    fn_torch(xt).backward()
    return x.grad, xt.grad


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "ihfft", "fft2", "rfftn", "fftn"])
def test_real_loss_of_a_spectrum_gives_torchs_gradient_for_a_real_signal(name):
    a = _signal((4, 6), False, np.float64)
    actual, expected = _loss_gradients(lambda x: getattr(tw.fft, name)(x).abs().sum(),
                                       lambda x: getattr(torch.fft, name)(x).abs().sum(), a)
    _close(actual, expected, 1e-9)


def test_power_spectrum_loss_gradient_matches_torch():
    a = _signal((3, 8), False, np.float64)

    def power(mod, x):
        spectrum = mod.fft.rfft(x, norm="ortho")
        return (spectrum.real ** 2 + spectrum.imag ** 2).mean() + mod.fft.irfft(spectrum * 2j, n=8).sum()

    actual, expected = _loss_gradients(lambda x: power(tw, x), lambda x: power(torch, x), a)
    _close(actual, expected, 1e-9)


@pytest.mark.parametrize("name", ["irfft", "hfft", "irfft2", "irfftn"])
def test_real_loss_of_a_hermitian_inverse_gives_torchs_gradient_for_a_complex_input(name):
    a = _signal((4, 5), True, np.float64)
    actual, expected = _loss_gradients(lambda x: (getattr(tw.fft, name)(x) ** 2).sum(),
                                       lambda x: (getattr(torch.fft, name)(x) ** 2).sum(), a)
    _close(actual, expected, 1e-9)


def test_complex_leaf_gradients_follow_torchs_convention():
    a = _signal((5,), True, np.float64)

    def loss(mod, z):
        return (z * z.conj() + z.exp() / (z + 3)).abs().sum() + z.angle().sum() + (z.real * z.imag).sum()

    actual, expected = _loss_gradients(lambda z: loss(tw, z), lambda z: loss(torch, z), a)
    _close(actual, expected, 1e-9)


def test_implicit_gradient_of_a_complex_output_is_refused():
    z = tw.tensor([1 + 1j], requires_grad=True)
    with pytest.raises(RuntimeError, match="real scalar"):
        (z * 2).sum().backward()


# ---------------------------------------------------------------------------------------------- complex dtypes

@pytest.mark.parametrize("pair", [("float32", "complex64"), ("float64", "complex64"), ("float16", "complex64"),
                                  ("int32", "complex128"), ("bool", "complex64"), ("complex64", "complex128")])
def test_promotion_matches_torch(pair):
    a, b = (getattr(tw, n) for n in pair)
    assert tw.promote_types(a, b).name == str(torch.promote_types(*(getattr(torch, n) for n in pair)))[6:]
    left, right = tw.ones(2, dtype=a), tw.ones(2, dtype=b)
    expected = torch.ones(2, dtype=getattr(torch, pair[0])) + torch.ones(2, dtype=getattr(torch, pair[1]))
    assert (left + right).dtype.name == str(expected.dtype)[6:]


def test_python_complex_scalars_and_zero_dim_tensors_promote_like_torch():
    for tw_value, torch_value in ((tw.ones(2) + 1j, torch.ones(2) + 1j),
                                  (tw.ones(2, dtype=tw.float64) + 1j, torch.ones(2, dtype=torch.float64) + 1j),
                                  (tw.ones(2, dtype=tw.float64) * tw.tensor(1j), torch.ones(2, dtype=torch.float64)
                                   * torch.tensor(1j)),
                                  (tw.arange(3) * 2j, torch.arange(3) * 2j)):
        _close(tw_value, torch_value, 0)


def test_tensor_data_printing_and_conversions_match_torch():
    data = [[1.5 + 2.25j, 3], [-1j, 1e-5 + 1j]]
    x, xt = tw.tensor(data), torch.tensor(data)
    assert x.dtype is tw.complex64 and x.is_complex() and tw.is_complex(x)
    assert repr(tw.tensor([1.5 + 2.25j, 3])) == repr(torch.tensor([1.5 + 2.25j, 3]))
    assert repr(tw.tensor([1 + 1j], dtype=tw.cdouble)).replace("tilewise", "torch") == \
        repr(torch.tensor([1 + 1j], dtype=torch.cdouble))
    assert x.tolist() == xt.tolist() and x[0, 0].item() == xt[0, 0].item()
    _close(x.to(tw.complex128), xt.to(torch.complex128), 0)
    _close(tw.ones(2, 3).to(tw.cfloat), torch.ones(2, 3).to(torch.cfloat), 0)
    _close(x.abs(), xt.abs(), 1e-6)
    _close(x.sum(0), xt.sum(0), 1e-6)
    _close(x.mean(), xt.mean(), 1e-6)


def test_real_and_imag_are_views_of_the_storage():
    z = tw.tensor([1 + 2j, 3 - 4j])
    z.real.mul_(10)
    z.imag.add_(1)
    assert z.tolist() == [10 + 3j, 30 - 3j]
    assert tw.view_as_real(z).shape == (2, 2)
    assert tw.view_as_complex(tw.view_as_real(z)).tolist() == z.tolist()


def test_real_of_a_real_tensor_is_itself_and_imag_refuses():
    x = tw.ones(3)
    assert tw.real(x) is x and x.conj() is x
    with pytest.raises(RuntimeError, match="non-complex"):
        x.imag  # noqa: B018


@pytest.mark.parametrize("bad", ["lt", "max", "amax", "maximum", "floor", "clamp", "sign", "relu", "remainder"])
def test_operators_without_a_complex_meaning_refuse_like_torch(bad):
    calls = {"lt": lambda m, z: z < z, "max": lambda m, z: z.max(), "amax": lambda m, z: z.amax(),
             "maximum": lambda m, z: m.maximum(z, z), "floor": lambda m, z: z.floor(),
             "clamp": lambda m, z: z.clamp(0, 1), "sign": lambda m, z: z.sign(), "relu": lambda m, z: z.relu(),
             "remainder": lambda m, z: z.remainder(2)}
    with pytest.raises(Exception) as expected:
        calls[bad](torch, torch.tensor([1 + 2j]))
    with pytest.raises(type(expected.value)):
        calls[bad](tw, tw.tensor([1 + 2j]))


def test_view_as_complex_refuses_what_torch_refuses():
    for make in (lambda m: m.ones(3, 3), lambda m: m.ones(3, 4)[:, ::2], lambda m: m.ones(3, 2, dtype=m.int64),
                 lambda m: m.ones(4)[1:].reshape(3, 1)[:2].expand(2, 2)):
        with pytest.raises(RuntimeError):
            torch.view_as_complex(make(torch))
        with pytest.raises(RuntimeError):
            tw.view_as_complex(make(tw))


def test_complex_refuses_mixed_or_integer_parts():
    with pytest.raises(RuntimeError):
        tw.complex(tw.ones(2), tw.ones(2, dtype=tw.float64))
    with pytest.raises(RuntimeError):
        tw.complex(tw.ones(2, dtype=tw.int64), tw.ones(2, dtype=tw.int64))


# ---------------------------------------------------------------------------------------------- CUDA

def _on_cuda(name, a, **kwargs):
    return getattr(tw.fft, name)(tw.from_numpy(a.copy()).cuda(), **kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", TRANSFORMS_1D + TRANSFORMS_ND)
def test_cuda_transforms_match_the_cpu(name, dtype):
    tol = 1e-4 if dtype is np.float32 else 1e-10
    for complex_ in (False, True):
        if complex_ and name in REAL_ONLY:
            continue
        a = _signal((3, 4, 6), complex_, dtype)
        for kwargs in ({}, {"norm": "ortho"}, {"norm": "forward"}):
            extra = {"n": 9} if name in TRANSFORMS_1D else {"s": (5, 3)}
            for args in (kwargs, {**kwargs, **extra}):
                gpu = _on_cuda(name, a, **args)
                cpu = getattr(tw.fft, name)(tw.from_numpy(a.copy()), **args)
                assert gpu.device.type == "cuda" and gpu.dtype is cpu.dtype and gpu.shape == cpu.shape
                np.testing.assert_allclose(gpu.cpu().numpy(), cpu.numpy(), rtol=tol, atol=tol * 10)


@pytest.mark.cuda
def test_cuda_transforms_of_more_than_three_dims_and_strided_inputs_match_the_cpu():
    a = _signal((3, 4, 5, 6, 2), False, np.float64)
    x = tw.from_numpy(a)
    xc = x.cuda()
    for fn in (lambda t: tw.fft.rfftn(t, dim=(4, 0, 2, 3)), lambda t: tw.fft.fftn(t),
               lambda t: tw.fft.irfftn(tw.fft.rfftn(t), s=t.shape), lambda t: tw.fft.fft(t.transpose(0, 3), dim=1)):
        np.testing.assert_allclose(fn(xc).cpu().numpy(), fn(x).numpy(), atol=1e-9)


@pytest.mark.cuda
def test_cuda_gradient_of_a_spectrum_loss_matches_the_cpu():
    a = _signal((4, 16), False, np.float32)
    grads = []
    for device in ("cpu", "cuda"):
        x = tw.from_numpy(a.copy()).to(device).requires_grad_(True)
        spectrum = tw.fft.rfft(x, norm="ortho")
        (spectrum.abs().sum() + (tw.fft.irfft(spectrum * spectrum.conj(), n=16) * 0.5).sum()
         + tw.fft.fft(x).angle().sum()).backward()
        grads.append(x.grad.cpu().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_complex_arithmetic_copies_and_reductions_match_the_cpu():
    a, b = _signal((3, 5), True, seed=1), _signal((5,), True, seed=2)
    for fn in (lambda x, y: x * y, lambda x, y: x / y, lambda x, y: x + y * 2, lambda x, y: x - 1.5, lambda x, y: -x,
               lambda x, y: x.abs(), lambda x, y: x.angle(), lambda x, y: x.conj(), lambda x, y: x.exp(),
               lambda x, y: x.sum(0), lambda x, y: x.sqrt(), lambda x, y: x.t().contiguous(),
               lambda x, y: x.to(tw.complex128), lambda x, y: x.real.to(tw.complex64), lambda x, y: x == x,
               lambda x, y: tw.complex(x.real, y.imag.expand(3, 5)), lambda x, y: tw.zeros(2, dtype=tw.cfloat,
                                                                                             device=x.device) + 1j):
        cpu = fn(tw.from_numpy(a.copy()), tw.from_numpy(b.copy()))
        gpu = fn(tw.from_numpy(a.copy()).cuda(), tw.from_numpy(b.copy()).cuda())
        assert gpu.dtype is cpu.dtype
        np.testing.assert_allclose(gpu.cpu().numpy(), cpu.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mul", "div", "add", "sub", "neg", "abs", "sgn", "exp"])
def test_real_forms_of_complex_pointwise_operators_match_their_complex_kernels(name):
    """The forms the CUDA backend computes complex arithmetic with (real operators on the parts), checked on the CPU
    against numpy's complex kernels, for complex, real and Python-number operands."""
    from tilewise import dispatch
    from tilewise.ops.complex import COMPLEX_REAL_FORMS, run_real_form
    from tilewise.ops.registry import OPS

    assert name in COMPLEX_REAL_FORMS
    op = OPS[name]
    z, w = tw.from_numpy(_signal((3, 4), True, seed=3)), tw.from_numpy(_signal((4,), True, seed=4))
    r = tw.from_numpy(_signal((4,), False, seed=5))
    operands = [(z,)] if len(op.tensor_idx) == 1 else [(z, w), (z, r), (r, w), (z, 2.5), (z, 0.5 - 2j)]
    for pair in operands:
        args = op.binder(*pair)
        expected = dispatch.call(op, args)
        actual = run_real_form(op, args, op.dtype_rule(op, args)[0], tw.device("cpu"))
        assert actual.dtype is expected.dtype and actual.shape == expected.shape
        np.testing.assert_allclose(actual.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- istft

ISTFT_CASES = [dict(n_fft=8), dict(n_fft=16, hop=4), dict(n_fft=16, hop=3, win=10), dict(n_fft=8, normalized=True),
               dict(n_fft=8, onesided=False), dict(n_fft=8, length=30), dict(n_fft=8, length=70),
               dict(n_fft=8, onesided=False, rc=True), dict(n_fft=8, wkind=None), dict(n_fft=8, dtype="float32"),
               dict(n_fft=12, hop=5, center=False, length=40, wkind=None), dict(n_fft=8, center=False, wkind=None),
               dict(n_fft=8, onesided=False, rc=True, cplx=True)]


def _istft_round_trip(lib, sig, n_fft, hop=None, win=None, wkind="hann", center=True, normalized=False,
                      onesided=None, length=None, rc=False, cplx=False, dtype="float64"):
    import warnings

    x = lib.tensor(sig.astype(dtype))
    if cplx:
        x = lib.complex(x, x.flip(-1))
    w = lib.hann_window(win or n_fft, dtype=getattr(lib, dtype)) if wkind == "hann" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = lib.stft(x, n_fft, hop, win, w, center=center, normalized=normalized, return_complex=True,
                        onesided=False if cplx else onesided).detach().requires_grad_()
        y = lib.istft(spec, n_fft, hop, win, w, center=center, normalized=normalized, onesided=onesided,
                      length=length, return_complex=rc)
    g = lib.tensor(np.linspace(-1, 1, y.numel() * (2 if y.dtype.is_complex else 1)).astype(dtype))
    g = lib.view_as_complex(g.reshape(*y.shape, 2)) if y.dtype.is_complex else g.reshape(y.shape)
    y.backward(g)
    return y.detach(), spec.grad


@pytest.mark.parametrize("shape", [(50,), (3, 50)])
@pytest.mark.parametrize("case", range(len(ISTFT_CASES)))
def test_istft_round_trip_and_gradient_match_torch(case, shape):
    """stft then istft gives the signal back (cut or zero-padded to ``length``); values, dtype, shape, strides and
    the spectrum's gradient are torch's."""
    sig = np.random.default_rng(case).standard_normal(shape)
    (y0, g0), (y1, g1) = (_istft_round_trip(lib, sig, **ISTFT_CASES[case]) for lib in (torch, tw))
    assert str(y1.dtype).split(".")[-1] == str(y0.dtype).split(".")[-1]
    assert tuple(y1.shape) == tuple(y0.shape) and y1.stride() == y0.stride()
    np.testing.assert_allclose(y1.numpy(), y0.numpy(), atol=1e-5)
    np.testing.assert_allclose(g1.numpy(), g0.numpy(), atol=1e-5)
    kept = min(shape[-1], y0.shape[-1])
    if ISTFT_CASES[case].get("center", True) and not ISTFT_CASES[case].get("cplx"):
        np.testing.assert_allclose(y1.numpy()[..., :kept].real, sig[..., :kept], atol=1e-5)


def _istft_errors(lib):
    import warnings

    x = lib.stft(lib.tensor(np.linspace(-1, 1, 20).astype("float32")), 8, window=lib.hann_window(8),
                 return_complex=True)
    calls = [(x, {"onesided": False}), (x, {"hop_length": 9}), (x, {"win_length": 9}), (x, {"window": lib.ones(3)}),
             (x, {"window": lib.zeros(8)}), (x, {"return_complex": True}), (x.real, {}), (x[:0], {}), (x[0], {}),
             (x[None, None], {}), (x, {"window": lib.ones(8, dtype=lib.complex64)}),
             (x, {"window": lib.hann_window(8), "center": False})]
    out = []
    for spec, kwargs in calls:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                lib.istft(spec, 8, **kwargs)
                out.append("ok")
            except Exception as e:  # noqa: BLE001 — the error's type and message are what is compared
                out.append(f"{type(e).__name__}: {e}")
    return out


def test_istft_errors_match_torch():
    """torch's checks, in its order and words: the complex input, emptiness, dims, the frequency size for the
    sidedness, hop and window lengths, the window's shape, the NOLA check (a zero window envelope), complex output
    from a one-sided spectrum, complex windows for a real output."""
    assert _istft_errors(tw) == _istft_errors(torch)
