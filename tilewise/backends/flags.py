"""torch's global backend flags: matmul precision, determinism, cuDNN and attention switches, thread counts.

[Note: backend flags] Training scripts set these through torch's spellings (``torch.backends.cuda.matmul.allow_tf32
= True``, ``torch.set_float32_matmul_precision("high")``, ``torch.use_deterministic_algorithms(True)``,
``torch.backends.cudnn.benchmark = True``); tilewise keeps their state here, in the backends layer, because the
backends are where each flag is read at the point of choice:
  - float32 matmul precision picks cuBLASLt's compute type (``backends/cuda/matmul.py``: CUBLAS_COMPUTE_32F, or
    32F_FAST_TF32 where TF32 is allowed); the reduced-precision-reduction switches mask cuBLASLt's split-K
    reduction schemes that sum in float16/bfloat16;
  - deterministic mode makes cuBLASLt's algorithm choice reproducible (the heuristic's first algorithm among those
    whose split-K reduction is not in place, instead of the fastest one timed) and makes the kernels that add with
    floating-point atomics (scatter_add, accumulating index_put, the backward of overlapping views) raise torch's
    error, or warn with ``warn_only``;
  - ``enable_cudnn_sdp(False)`` sends attention to its decomposition instead of cuDNN.
The CPU backend needs nothing in deterministic mode: numpy's kernels (``np.add.at`` for the accumulating
indexing ops included) and OpenBLAS at a fixed thread count give the same bits on every run. Compiled functions
guard :func:`gemm_numerics`, so changing these flags compiles again, as torch.compile guards its global state.
The precision state follows torch 2.13's model exactly, legacy and new API together: a precision per
(backend, op) pair (``fp32_precision``; a parent "all" entry propagates to its ops, "none" means "inherit"), beside
the legacy ``float32_matmul_precision``; the legacy setters write both, and the legacy getters raise torch's error
where the two disagree (a script that mixed the APIs); "all"-level settings are approximated (see
``set_fp32_precision``). The cuDNN flags steer convolutions (``backends/cuda/convolution.py``):
``enabled`` False sends them to their decomposition, ``benchmark`` times cuDNN's candidate plans of each new shape
instead of taking the heuristics' first, ``deterministic`` (or deterministic mode) leaves out the plans cuDNN marks
non-deterministic, and the conv precision (``allow_tf32``) lets float32 convolutions use TF32 tensor cores.
"""

from __future__ import annotations

import warnings

# ---------------------------------------------------------------------------------------------- float32 precision

PRECISIONS = ("ieee", "tf32", "bf16", "none")
BACKEND_PRECISIONS = {"generic": PRECISIONS, "cuda": ("ieee", "tf32", "none"), "mkldnn": PRECISIONS}
_OPS = ("all", "matmul", "conv", "rnn")
BACKEND_OPS = {"generic": ("all",), "cuda": _OPS, "mkldnn": _OPS}
MATMUL_PRECISIONS = ("highest", "high", "medium")
MIXED_APIS_LINK = "See also: https://pytorch.org/docs/main/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"

_fp32: dict[tuple[str, str], str] = {(backend, op): "none" for backend, ops in BACKEND_OPS.items() for op in ops}
_fp32["cuda", "conv"] = _fp32["cuda", "rnn"] = "tf32"  # torch's defaults: cuDNN may use TF32, cuBLAS may not
_legacy = {"matmul": "highest", "cudnn_tf32": True}


def _check_bool(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise RuntimeError(f"{what} expects a bool, but got {type(value).__name__}")
    return value


def get_fp32_precision(backend: str, op: str) -> str:
    """The precision stored for ``(backend, op)`` (``torch.backends.cuda.matmul.fp32_precision`` and friends)."""
    return _fp32[backend, op]


def set_fp32_precision(backend: str, op: str, precision: str) -> None:
    """torch's ``fp32_precision`` setter: an "all" entry propagates to the backend's ops (the generic one to every
    backend, "none" where a backend has no such precision), except "none", which resets the "all" entries only;
    "none" on an op inherits its backend's entry. (torch 2.13 also lets an op's entry set earlier survive some later
    "all" settings; that precedence is not reproduced: op-level settings and the legacy API behave exactly.)"""
    if precision not in PRECISIONS:
        raise RuntimeError(f"Unknown precision: {precision}")
    if precision not in BACKEND_PRECISIONS[backend]:
        raise RuntimeError(f"backend '{backend}' does not support precision '{precision}'")
    _changed()
    if op != "all":
        _fp32[backend, op] = _fp32[backend, "all"] if precision == "none" else precision
        return
    for target in (BACKEND_OPS if backend == "generic" else (backend,)):
        value = precision if precision in BACKEND_PRECISIONS[target] else "none"
        for target_op in BACKEND_OPS[target] if precision != "none" else ("all",):
            _fp32[target, target_op] = value


class OpPrecision:
    """An op's ``fp32_precision`` attribute holder (``tilewise.backends.cudnn.conv``,
    ``tilewise.backends.mkldnn.matmul``, ...), as torch's."""

    def __init__(self, backend: str, op: str) -> None:
        object.__setattr__(self, "key", (backend, op))

    def __getattr__(self, name: str):
        if name == "fp32_precision":
            return get_fp32_precision(*self.key)
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name: str, value) -> None:
        if name != "fp32_precision":
            raise AttributeError("Unknown attribute " + name)
        set_fp32_precision(*self.key, value)


def _resolved(backend: str, op: str) -> str:
    """The precision in force for ``(backend, op)``: its own entry, else its backend's, else the generic one."""
    for key in ((backend, op), (backend, "all"), ("generic", "all")):
        if _fp32[key] != "none":
            return _fp32[key] if _fp32[key] in BACKEND_PRECISIONS[backend] else "none"
    return "none"


def set_float32_matmul_precision(precision: str) -> None:
    """How float32 matrix products may round their inputs (torch.set_float32_matmul_precision): "highest" (full
    float32, the default), "high" (TF32 tensor cores on CUDA) or "medium" (as "high" on CUDA). It sets
    ``tilewise.backends.cuda.matmul.allow_tf32`` accordingly, and that flag sets it back.

    >>> import tilewise as tw
    >>> tw.set_float32_matmul_precision("high")
    >>> tw.backends.cuda.matmul.allow_tf32
    True
    >>> tw.set_float32_matmul_precision("highest")
    """
    if not isinstance(precision, str):
        raise RuntimeError(f"set_float32_matmul_precision expects a str, but got {type(precision).__name__}")
    if precision not in MATMUL_PRECISIONS:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "setFloat32MatmulPrecision call has no effect.", stacklevel=2)
        return
    _changed()
    _legacy["matmul"] = precision
    _fp32["cuda", "matmul"] = "ieee" if precision == "highest" else "tf32"
    _fp32["mkldnn", "matmul"] = {"highest": "ieee", "high": "tf32", "medium": "bf16"}[precision]


def get_float32_matmul_precision() -> str:
    """The float32 matmul precision: "highest", "high" or "medium" (torch.get_float32_matmul_precision)."""
    legacy = _legacy["matmul"]
    mkldnn = _resolved("mkldnn", "matmul")
    if ((_resolved("cuda", "matmul") == "tf32" and legacy == "highest") or (mkldnn == "bf16" and legacy != "medium")
            or (mkldnn == "tf32" and legacy != "high")):
        raise RuntimeError("tilewise is checking the matmul precision without a specific backend name, but the current "
                           "status indicates that you have used a mix of the legacy and new APIs to set the matmul "
                           "precision (set_float32_matmul_precision or allow_tf32, and fp32_precision). We suggest "
                           f"only using the new API for matmul precision. {MIXED_APIS_LINK}")
    return legacy


def cublas_allow_tf32() -> bool:
    """Whether float32 GEMMs may use TF32 (torch.backends.cuda.matmul.allow_tf32; False by default, as torch)."""
    allowed = _resolved("cuda", "matmul") == "tf32"
    if allowed != (_legacy["matmul"] != "highest"):
        raise RuntimeError("tilewise is checking whether TF32 is enabled for cuBLAS matmul, but the current status "
                           "indicates that you have used a mix of the legacy and new APIs to set the TF32 status for "
                           "cuBLAS matmul (allow_tf32 or set_float32_matmul_precision, and fp32_precision). We suggest "
                           f"only using the new API to set the TF32 flag. {MIXED_APIS_LINK}")
    return allowed


def set_cublas_allow_tf32(allow: bool) -> None:
    _check_bool(allow, "set_allow_tf32_cublas")
    _changed()
    _legacy["matmul"] = "high" if allow else "highest"
    _fp32["cuda", "matmul"] = "tf32" if allow else "ieee"


def tf32_matmul() -> bool:
    """What a float32 GEMM runs with: TF32 where the cuBLAS matmul precision in force says so (the GEMMs read this,
    not :func:`cublas_allow_tf32`, whose consistency check is for scripts that ask)."""
    return _resolved("cuda", "matmul") == "tf32"


def tf32_conv() -> bool:
    """What a float32 cuDNN convolution runs with: TF32 where the conv precision in force says so (torch's default:
    ``torch.backends.cudnn.allow_tf32`` is True)."""
    return _resolved("cuda", "conv") == "tf32"


def cudnn_allow_tf32() -> bool:
    """torch.backends.cudnn.allow_tf32 (True by default), refused where convolutions and RNNs were given
    different precisions through the new API."""
    legacy = _legacy["cudnn_tf32"]
    if not ((_resolved("cuda", "conv") == "tf32") == (_resolved("cuda", "rnn") == "tf32") == legacy):
        raise RuntimeError("tilewise is checking whether allow_tf32 is enabled for cuDNN without a specific operator "
                           "name, but the current flag(s) indicate that cuDNN conv and cuDNN RNN have different TF32 "
                           "flags. This combination indicates that you have used a mix of the legacy and new APIs to "
                           f"set the TF32 flags. We suggest only using the new API to set the TF32 flag(s). "
                           f"{MIXED_APIS_LINK}")
    return legacy


def set_cudnn_allow_tf32(allow: bool) -> None:
    _legacy["cudnn_tf32"] = _check_bool(allow, "set_allow_tf32_cudnn")
    _changed()
    _fp32["cuda", "conv"] = _fp32["cuda", "rnn"] = "tf32" if allow else "none"


# ---------------------------------------------------------------------------------------------- cuBLAS reductions

# (reduced precision allowed, split-K allowed) per low-precision dtype, torch's defaults
_reductions = {"fp16": (True, True), "bf16": (True, True)}
_fp16_accumulation = [False]


def reduced_precision_reduction(kind: str) -> tuple[bool, bool]:
    """(reduced-precision reduction allowed, split-K allowed) for "fp16" or "bf16" GEMMs."""
    return _reductions[kind]


def set_reduced_precision_reduction(kind: str, value) -> None:
    """torch's setter: a bool, or a tuple/list ``(allow_reduced_precision[, allow_splitk])``."""
    name = f"allow_{kind}_reduced_precision_reduction"
    _changed()

    def boolean(obj, which: str) -> bool:
        if isinstance(obj, bool):
            return obj
        raise TypeError(f"{name} expects a bool for {which}, but got {type(obj)!r}")

    if isinstance(value, bool):
        _reductions[kind] = (value, True)
        return
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} expects a bool or a tuple/list of bools, but got {type(value)!r}")
    if not value:
        raise TypeError(f"{name} expects at least one boolean argument")
    if len(value) > 2:
        raise TypeError(f"{name} expects at most two boolean arguments")
    allow = boolean(value[0], "allow_reduced_precision")
    _reductions[kind] = (allow, boolean(value[1], "allow_splitk") if len(value) == 2 else True)


def fp16_accumulation() -> bool:
    return _fp16_accumulation[0]


def set_fp16_accumulation(allow: bool) -> None:
    _fp16_accumulation[0] = _check_bool(allow, "set_allow_fp16_accumulation_cublas")


# ---------------------------------------------------------------------------------------------- cuDNN and attention

_cudnn = {"enabled": True, "benchmark": False, "deterministic": False}
_sdp = {"flash": True, "mem_efficient": True, "math": True, "cudnn": True}


def cudnn_flag(name: str) -> bool:
    return _cudnn[name]


def set_cudnn_flag(name: str, value: bool) -> None:
    _cudnn[name] = _check_bool(value, f"set_{name}_cudnn")
    _changed()


def sdp_enabled(kind: str) -> bool:
    """Whether scaled-dot-product attention may use ``kind``: "flash", "mem_efficient", "math" or "cudnn"."""
    return _sdp[kind]


def enable_sdp(kind: str, enabled: bool) -> None:
    _sdp[kind] = _check_bool(enabled, f"set_sdp_use_{kind}")


def _fill_attention_slot() -> None:
    from tilewise.ops import nn_functional

    nn_functional.ATTENTION_HOOKS.sdp_enabled = sdp_enabled  # the operator refuses as torch when all are off


_fill_attention_slot()


# ---------------------------------------------------------------------------------------------- what GEMMs read

_derived: dict[str, tuple] = {}  # emptied by every setter that changes a GEMM's numerics


def _changed() -> None:
    _derived.clear()


def conv_numerics() -> tuple:
    """What the flags make of a cuDNN convolution, as a cache key: (cuDNN enabled, TF32 for float32, deterministic
    (cuDNN's flag or deterministic mode), benchmark). Read at every convolution, so cached between flag changes."""
    found = _derived.get("conv")
    if found is None:
        found = _derived["conv"] = (_cudnn["enabled"], tf32_conv(), _cudnn["deterministic"] or _deterministic["mode"],
                                    _cudnn["benchmark"])
    return found


def gemm_numerics() -> tuple:
    """What the flags make of a GEMM, as a cache key: (TF32 for float32, (reduced-precision reduction, split-K) for
    float16 and for bfloat16, deterministic mode). Read at every GEMM call, so it is cached between flag changes."""
    found = _derived.get("gemm")
    if found is None:
        found = _derived["gemm"] = (tf32_matmul(), _reductions["fp16"], _reductions["bf16"], _deterministic["mode"])
    return found


# ---------------------------------------------------------------------------------------------- determinism

_deterministic = {"mode": False, "warn_only": False}
DEBUG_MODES = ("default", "warn", "error")


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Make operators deterministic where tilewise can, and make those it cannot raise (or warn, with
    ``warn_only``) instead of running (torch.use_deterministic_algorithms).

    >>> import tilewise as tw
    >>> tw.use_deterministic_algorithms(True, warn_only=True)
    >>> tw.are_deterministic_algorithms_enabled(), tw.is_deterministic_algorithms_warn_only_enabled()
    (True, True)
    >>> tw.use_deterministic_algorithms(False)
    """
    if not isinstance(mode, bool):
        raise TypeError(f"_set_deterministic_algorithms(): argument 'mode' (position 1) must be bool, not "
                        f"{type(mode).__name__}")
    if not isinstance(warn_only, bool):
        raise TypeError(f"_set_deterministic_algorithms(): argument 'warn_only' must be bool, not "
                        f"{type(warn_only).__name__}")
    _changed()
    _deterministic["mode"] = mode
    _deterministic["warn_only"] = warn_only


def are_deterministic_algorithms_enabled() -> bool:
    return _deterministic["mode"]


def is_deterministic_algorithms_warn_only_enabled() -> bool:
    return _deterministic["warn_only"]


def set_deterministic_debug_mode(debug_mode: str | int) -> None:
    """torch.set_deterministic_debug_mode: "default"/0 (off), "warn"/1 (deterministic, warn only), "error"/2."""
    if isinstance(debug_mode, str):
        if debug_mode not in DEBUG_MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`, but got "
                               f"{debug_mode}")
        debug_mode = DEBUG_MODES.index(debug_mode)
    elif not isinstance(debug_mode, int) or isinstance(debug_mode, bool):
        raise TypeError(f"debug_mode must be str or int, but got {type(debug_mode)}")
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode, expected 0, 1, or 2, but got {debug_mode}")
    use_deterministic_algorithms(debug_mode != 0, warn_only=debug_mode == 1)


def get_deterministic_debug_mode() -> int:
    if not _deterministic["mode"]:
        return 0
    return 1 if _deterministic["warn_only"] else 2


def alert_not_deterministic(caller: str) -> None:
    """Raise torch's error (or warn, with ``warn_only``) in deterministic mode: ``caller`` has no deterministic
    implementation in tilewise."""
    if not _deterministic["mode"]:
        return
    if _deterministic["warn_only"]:
        warnings.warn(f"{caller} does not have a deterministic implementation, but you set "
                      "'tilewise.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue to help "
                      "prioritize adding deterministic support for this operation.", stacklevel=3)
        return
    raise RuntimeError(f"{caller} does not have a deterministic implementation, but you set "
                       "'tilewise.use_deterministic_algorithms(True)'. You can turn off determinism just for this "
                       "operation, or you can use the 'warn_only=True' option, if that's acceptable for your "
                       "application. You can also file an issue to help prioritize adding deterministic support for "
                       "this operation.")


# ---------------------------------------------------------------------------------------------- process settings

_process = {"warn_always": False}


def set_warn_always(b: bool, /) -> None:
    """Repeat warnings torch gives once per process every time (torch.set_warn_always); kept and read back."""
    _process["warn_always"] = _check_bool(b, "setWarnOnlyOnce")


def is_warn_always_enabled() -> bool:
    return _process["warn_always"]


def set_flush_denormal(mode: bool) -> bool:
    """Whether the CPU now flushes denormal floats as asked (torch.set_flush_denormal). numpy offers no switch
    for the FTZ/DAZ bits, so flushing is refused (False, torch's answer on a CPU without them) and keeping
    denormals, which is how numpy computes, succeeds."""
    return not _check_bool(mode, "flush_denormal")
