"""Samples for complex views and constructors and the fft transforms (``tw.fft.*`` against ``torch.fft.*``)."""

from __future__ import annotations

from opinfo import OpInfo, Sample, T

from opinfos.linalg import well_conditioned


def _real_and_complex(shape=(4, 6), **kwargs):
    return [Sample((T(shape),), dict(kwargs), name="real"),
            Sample((T(shape, "complex"),), dict(kwargs), name="complex")]


def one_dim(real=True, complex_=True):
    """1-d transforms: default, padded and cut signals, another dim, each norm, a 3-d and a 1-d input."""
    kinds = (["float"] if real else []) + (["complex"] if complex_ else [])
    samples = []
    for kind in kinds:
        samples += [Sample((T((4, 6), kind),), name=f"{kind}"),
                    Sample((T((4, 6), kind),), {"n": 9}, name=f"{kind}-padded"),
                    Sample((T((4, 6), kind),), {"n": 3, "dim": 0}, name=f"{kind}-cut-dim0"),
                    Sample((T((5,), kind),), {"norm": "ortho"}, name=f"{kind}-ortho"),
                    Sample((T((2, 3, 5), kind),), {"dim": 1, "norm": "forward"}, name=f"{kind}-forward")]
    return lambda: samples


def n_dim(two=False):
    samples = []
    for kind in ("float", "complex"):
        samples += [Sample((T((4, 6), kind),), name=f"{kind}"),
                    Sample((T((3, 4, 5), kind),), {"s": (5, 3)}, name=f"{kind}-s"),
                    Sample((T((3, 4, 5), kind),), {"dim": (0, 2), "norm": "ortho"}, name=f"{kind}-dims-ortho"),
                    Sample((T((3, 4, 6), kind),), {"s": (-1, 7), "dim": (2, 0), "norm": "forward"},
                           name=f"{kind}-s-dims-forward")]
        if not two:
            samples.append(Sample((T((3, 4, 5), kind),), {"dim": 1}, name=f"{kind}-one-dim"))
    return lambda: samples


def transform(name: str, samples, **kwargs) -> OpInfo:
    return OpInfo(f"fft.{name}", samples, covers=(f"fft_{name}",), atol=1e-4, **kwargs)


OPINFOS = [
    OpInfo("view_as_real", lambda: [Sample((T((3, 4), "complex"),)), Sample((T((), "complex"),), name="0-dim")]),
    OpInfo("view_as_complex", lambda: [Sample((T((3, 2)),)), Sample((T((2, 3, 2)),), name="3d")],
           noncontiguous=False),
    OpInfo("real", lambda: [Sample((T((3, 4), "complex"),)), Sample((T((3, 4)),), name="real-input")]),
    OpInfo("imag", lambda: [Sample((T((3, 4), "complex"),))]),
    OpInfo("conj", lambda: _real_and_complex()),
    OpInfo("conj_physical", lambda: _real_and_complex()),
    OpInfo("angle", lambda: [Sample((T((3, 4), "complex"),))]),
    OpInfo("angle", lambda: [Sample((T((3, 4)),))], grad=False),
    OpInfo("complex", lambda: [Sample((T((3, 4)), T((3, 4)))), Sample((T((3, 4)), T((4,))), name="broadcast")]),
    OpInfo("polar", lambda: [Sample((T((3, 4), "positive"), T((3, 4))))]),
    OpInfo("abs", lambda: [Sample((T((3, 4), "complex"),), name="complex")], covers=("abs",)),
    OpInfo("mul", lambda: [Sample((T((3, 4), "complex"), T((3, 4), "complex")), name="complex"),
                           Sample((T((3, 4)), T((4,), "complex")), name="real-complex"),
                           Sample((T((3, 4), "complex"), 1.5), name="complex-scalar")]),
    OpInfo("div", lambda: [Sample((T((3, 4), "complex"), T((3, 4), "complex", 0.5, 2)), name="complex"),
                           Sample((T((3, 4)), T((4,), "complex", 0.5, 2)), name="real-complex")]),
    OpInfo("add", lambda: [Sample((T((3, 4), "complex"), T((3, 4))), name="complex-real")]),
    OpInfo("exp", lambda: [Sample((T((3, 4), "complex"),), name="complex")]),
    OpInfo("sum", lambda: [Sample((T((3, 4), "complex"),), name="complex"),
                           Sample((T((3, 4), "complex"), 1), name="complex-dim")]),
    OpInfo("mean", lambda: [Sample((T((3, 4), "complex"),), name="complex")]),
    OpInfo("linalg.vander", lambda: [Sample((T((3,), "complex"),), {"N": 4}, name="complex")]),
    # complex matrices: the CPU's solvers (the CUDA ones refuse them)
    OpInfo("linalg.det", lambda: [Sample((T((3, 3), "complex"),), name="complex"),
                                  Sample((T((2, 3, 3), "complex"),), name="complex-batch")], wrap=well_conditioned()),
    OpInfo("linalg.slogdet", lambda: [Sample((T((3, 3), "complex"),), name="complex")], wrap=well_conditioned()),
    OpInfo("logdet", lambda: [Sample((T((3, 3), "complex"),), name="complex")], wrap=well_conditioned()),
    OpInfo("linalg.inv", lambda: [Sample((T((3, 3), "complex"),), name="complex")], wrap=well_conditioned()),
    OpInfo("linalg.solve", lambda: [Sample((T((3, 3), "complex"), T((3, 2), "complex")), name="complex"),
                                    Sample((T((3, 3), "complex"), T((2, 3), "complex")), {"left": False},
                                           name="complex-right")], wrap=well_conditioned()),
    OpInfo("adjoint", lambda: [Sample((T((2, 3, 4), "complex"),), name="complex")]),
    OpInfo("linalg.eigvals", lambda: [Sample((T((3, 3), "complex"),), name="complex")]),
    transform("fft", one_dim()), transform("ifft", one_dim()),
    transform("rfft", one_dim(complex_=False)), transform("ihfft", one_dim(complex_=False)),
    transform("irfft", one_dim()), transform("hfft", one_dim()),
    transform("fftn", n_dim()), transform("ifftn", n_dim()), transform("rfftn", lambda: [
        s for s in n_dim()() if s.name.startswith("float")]),
    transform("irfftn", n_dim()),
    transform("fft2", n_dim(two=True)), transform("ifft2", n_dim(two=True)),
    transform("rfft2", lambda: [s for s in n_dim(two=True)() if s.name.startswith("float")]),
    transform("irfft2", n_dim(two=True)),
    transform("hfftn", n_dim()), transform("hfft2", n_dim(two=True)),
    transform("ihfftn", lambda: [s for s in n_dim()() if s.name.startswith("float")]),
    transform("ihfft2", lambda: [s for s in n_dim(two=True)() if s.name.startswith("float")]),
    transform("fftshift", lambda: [*_real_and_complex((4, 7)), Sample((T((4, 7)),), {"dim": 0}, name="dim")]),
    transform("ifftshift", lambda: [*_real_and_complex((4, 7)), Sample((T((4, 7)),), {"dim": (1,)}, name="dim")]),
    OpInfo("stft", lambda: [
        Sample((T((2, 20)), 8), {"hop_length": 2, "window": T((8,), "positive"), "return_complex": True}),
        Sample((T((20,)), 8), {"hop_length": 3, "win_length": 5, "window": T((5,), "positive"), "normalized": True,
                               "pad_mode": "constant", "return_complex": True}, name="1d-short-window-normalized"),
        Sample((T((2, 20)), 6), {"hop_length": 4, "window": T((6,), "positive"), "center": False,
                                 "onesided": False, "return_complex": True}, name="not-centered-twosided"),
        Sample((T((2, 20), "complex"), 8), {"hop_length": 2, "window": T((8,), "positive")}, name="complex"),
        Sample((T((2, 20)), 8), {"hop_length": 4, "window": T((8,), "positive"), "return_complex": False},
               name="real-pairs")], atol=1e-4),
    OpInfo("istft", lambda: [
        Sample((T((2, 5, 11), "complex"), 8), {"hop_length": 2, "window": T((8,), "positive")}),
        Sample((T((5, 11), "complex"), 8), {"hop_length": 3, "win_length": 5, "window": T((5,), "positive"),
                                            "normalized": True, "length": 30}, name="1d-short-window-normalized"),
        Sample((T((2, 6, 9), "complex"), 6), {"hop_length": 4, "window": T((6,), "positive"), "center": False,
                                              "onesided": False, "return_complex": True},
               name="not-centered-twosided-complex"),
        Sample((T((2, 5, 11), "complex"), 8), {"window": T((8,), "positive"), "length": 60}, name="padded")],
           atol=1e-4),
]
