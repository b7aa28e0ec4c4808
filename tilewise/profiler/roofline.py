"""The roofline: what a device can move and compute, measured once, and where a kernel stands against it.

[Note: roofline] A kernel's time is bounded below by its bytes over the device's copy bandwidth and by its
FLOPs over the device's peak rate for its dtype; the bound that applies is the one its arithmetic intensity
(FLOPs per byte) puts it under: below the *ridge point* (peak rate over bandwidth) memory, above it compute.
The figures are measured, not taken from data sheets: on the CPU a large ``np.copyto`` (copy bandwidth,
bytes read plus bytes written) and a large GEMM per dtype through numpy's BLAS; on CUDA a device-to-device
copy and a cuBLASLt GEMM per dtype, timed with CUDA events. Each is the best of a few runs. Measuring takes
seconds, so the figures are kept on disk under ``$TILEWISE_CACHE_DIR/roofline-v1/``, one sealed, atomically
written entry per device (named by what identifies it: the CPU model and thread count, the GPU's name and
architecture) and measurement size; later processes read them.

A kernel's work is counted from its kernel IR, not from its time: minimum bytes are each buffer parameter's
bytes once per direction (read, written), and FLOPs are one per arithmetic node of the nests' expressions
(each distinct node once per element it is evaluated for) plus one per element folded by a reduction; a GEMM
library call is ``2*M*N*K`` FLOPs. x + y over N float32 elements is 12N bytes and N FLOPs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from tilewise.codegen.kernel_ir import Kernel, Nest, known
from tilewise.codegen.toolchain.cache import default_cache_dir
from tilewise.codegen.toolchain.cc import host_cpu
from tilewise.codegen.toolchain.disk import DiskCache
from tilewise.ops.expr import Expr

ROOFLINE_FORMAT_VERSION = 1
DEFAULT_SIZE = 256 << 20  # bytes per measurement: well beyond any last-level cache
GEMM_BYTES = 24 << 20  # at most this much for a GEMM's operands: large enough for BLAS to reach its peak
REPEATS = 5
GEMM_DTYPES_CPU = ("float32", "float64")
GEMM_DTYPES_CUDA = ("float32", "float16", "bfloat16")
NOT_ARITHMETIC = frozenset({"input", "scalar", "const", "cast"})
GEMM_OPS = frozenset({"mm", "bmm", "addmm", "_addmm_activation", "matmul", "baddbmm"})


@dataclass(frozen=True)
class Roofline:
    """A device's measured copy bandwidth (GB/s) and peak rates (GFLOP/s per dtype name)."""

    device: str  # "cpu", "cuda:0"
    name: str  # what the device is: the CPU model, the GPU's name
    copy_gbs: float
    peak_gflops: dict[str, float]
    size: int  # bytes per measurement
    origin: str = "measured"  # "measured" in this process, or "cache" (read from ``path``)
    path: str = ""

    def peak(self, dtype: str) -> tuple[str, float]:
        """The peak rate for ``dtype``, or for the fastest measured dtype of its width class when not measured."""
        if dtype in self.peak_gflops:
            return dtype, self.peak_gflops[dtype]
        fallback = "float32" if "float32" in self.peak_gflops else next(iter(self.peak_gflops))
        return fallback, self.peak_gflops[fallback]

    def ridge(self, dtype: str) -> float:
        """FLOPs per byte above which a kernel of ``dtype`` is compute bound."""
        return self.peak(dtype)[1] / self.copy_gbs

    def place(self, nbytes: int, flops: int, seconds: float, dtype: str) -> Placement:
        return Placement.of(self, nbytes, flops, seconds, dtype)

    def describe(self) -> str:
        peaks = ", ".join(f"{d} {_rate(g)}" for d, g in self.peak_gflops.items())
        return (f"{self.device} ({self.name}): copy {self.copy_gbs:.1f} GB/s, peak {peaks} "
                f"({'read from ' + self.path if self.origin == 'cache' else 'measured now'})")


@dataclass(frozen=True)
class Placement:
    """One timed step on the roofline: achieved rates, the bound that applies, and the fraction of it reached."""

    nbytes: int
    flops: int
    seconds: float
    intensity: float  # FLOPs per byte
    ridge: float
    bound: str  # "memory" or "compute"
    achieved_gbs: float
    achieved_gflops: float
    attainable_gflops: float
    fraction: float  # of the roofline at this intensity (of the bandwidth for a step without FLOPs)

    @classmethod
    def of(cls, roof: Roofline, nbytes: int, flops: int, seconds: float, dtype: str) -> Placement:
        seconds = max(seconds, 1e-12)
        intensity = flops / nbytes if nbytes else math.inf
        ridge = roof.ridge(dtype)
        peak = roof.peak(dtype)[1]
        attainable = min(peak, intensity * roof.copy_gbs)
        gbs, gflops = nbytes / seconds / 1e9, flops / seconds / 1e9
        fraction = gflops / attainable if flops else gbs / roof.copy_gbs
        return cls(nbytes, flops, seconds, intensity, ridge, "memory" if intensity < ridge else "compute",
                   gbs, gflops, attainable, fraction)

    def describe(self) -> str:
        return (f"{_size(self.nbytes)}, {_count(self.flops)}FLOP, {self.intensity:.3g} FLOP/B (ridge "
                f"{self.ridge:.3g}): {self.bound} bound; achieved {self.achieved_gbs:.2f} GB/s, "
                f"{_rate(self.achieved_gflops)} = {100 * self.fraction:.1f}% of the roofline{self._above()}")

    def _above(self) -> str:
        """Why a step can pass the roofline: the bytes counted are the fewest it must move to and from memory, so
        beating the measured copy bandwidth means it found operands still in the cache (a small step timed
        repeatedly); beating the compute peak means the peak was measured on a GEMM the device runs slower."""
        if self.fraction <= 1.0:
            return ""
        if self.bound == "memory":
            return " (above the memory roofline: the step read operands the cache still held from the step before)"
        return " (above the measured peak: the peak GEMM ran slower than this step)"


def _rate(gflops: float) -> str:
    return f"{gflops / 1e3:.2f} TFLOP/s" if gflops >= 1e3 else f"{gflops:.2f} GFLOP/s"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def _count(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} "


# ---------------------------------------------------------------------------- work counted from the kernel IR

def expression_ops(exprs: list[Expr]) -> int:
    """Arithmetic nodes among ``exprs`` and what they read, each distinct node once."""
    seen: set[int] = set()
    stack = list(exprs)
    count = 0
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        count += e.op not in NOT_ARITHMETIC
        stack.extend(e.srcs)
    return count


def nest_flops(nest: Nest) -> int:
    """FLOPs of one nest: its reductions and phased stores per element of the whole domain, its per-row stores
    per element of the kept dims, one combine per element folded."""
    if not known(*nest.shape):
        raise ValueError(f"nest over symbolic sizes {list(nest.shape)}: its FLOPs depend on the launch")
    everywhere = math.prod(nest.shape)
    per_row = math.prod(nest.shape[d] for d in nest.outer)
    phased = [r.value for r in nest.reductions] + [s.value for s in nest.stores if s.phase is not None]
    rows = [s.value for s in nest.stores if s.phase is None]
    return (expression_ops(phased) + len(nest.reductions)) * everywhere + expression_ops(rows) * per_row


def kernel_flops(kernel: Kernel) -> int:
    return sum(nest_flops(n) for n in kernel.nests)


def kernel_bytes(kernel: Kernel) -> int:
    """Minimum bytes a kernel moves: each buffer it reads once, each it writes once (a compiled kernel's
    ``values`` are the graph values its parameters hold)."""
    return sum(value.type.nbytes * (param.read + param.written) for param, value in zip(kernel.params, kernel.values))


def kernel_dtype(kernel: Kernel) -> str:
    """The dtype the kernel computes in, for its peak rate: that of its widest floating-point parameter."""
    floats = [p.dtype for p in kernel.params if p.dtype.is_floating_point]
    return max(floats, key=lambda d: d.itemsize).name if floats else "float32"


def gemm_flops(op: str, inputs: list, output) -> int:
    """2*M*N*K for a GEMM library call (batched: times the batch), from its operands' and result's shapes."""
    a = inputs[1] if op in ("addmm", "_addmm_activation", "baddbmm") else inputs[0]
    return 2 * output.type.numel * a.type.shape[-1]


# ---------------------------------------------------------------------------- measuring

def _best(run, repeats: int) -> float:
    run()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure_cpu(size: int = DEFAULT_SIZE, repeats: int = REPEATS) -> tuple[float, dict[str, float]]:
    """Copy GB/s (bytes read and written) of ``size`` bytes, and GEMM GFLOP/s per dtype on square matrices whose
    three operands take about ``size`` bytes (at least 64 x 64, at most ``GEMM_BYTES``)."""
    src = np.ones(max(size // 8, 1), dtype=np.float64)
    dst = np.empty_like(src)
    copy_gbs = 2 * src.nbytes / _best(lambda: np.copyto(dst, src), repeats) / 1e9
    peaks = {}
    for name in GEMM_DTYPES_CPU:
        dtype = np.dtype(name)
        n = max(64, int(math.sqrt(min(size, GEMM_BYTES) / (3 * dtype.itemsize))))
        a, b = np.ones((n, n), dtype=dtype), np.ones((n, n), dtype=dtype)
        out = np.empty((n, n), dtype=dtype)
        peaks[name] = 2 * n ** 3 / _best(lambda a=a, b=b, out=out: np.matmul(a, b, out=out), repeats) / 1e9
    return copy_gbs, peaks


def measure_cuda(index: int, size: int = DEFAULT_SIZE, repeats: int = REPEATS) -> tuple[float, dict[str, float]]:
    """Copy GB/s of a device-to-device copy and cuBLASLt GEMM GFLOP/s per dtype, timed with CUDA events."""
    from tilewise.backends.cuda.runtime import Event
    from tilewise.device import Device
    from tilewise.dtypes import from_name
    from tilewise.ops.creation import empty, ones

    device = Device("cuda", index)

    def best(run) -> float:
        run()
        times = []
        for _ in range(repeats):
            start, end = Event(enable_timing=True), Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    src = ones(max(size // 4, 1), device=device)
    dst = empty(max(size // 4, 1), device=device)
    copy_gbs = 2 * size / best(lambda: dst.copy_(src)) / 1e9
    peaks = {}
    for name in GEMM_DTYPES_CUDA:
        dtype = from_name(name)
        n = max(256, int(math.sqrt(size / (3 * dtype.itemsize))) // 256 * 256)
        a, b = ones(n, n, dtype=dtype, device=device), ones(n, n, dtype=dtype, device=device)
        peaks[name] = 2 * n ** 3 / best(lambda a=a, b=b: a @ b) / 1e9
    return copy_gbs, peaks


# ---------------------------------------------------------------------------- the cache

@dataclass(frozen=True)
class DeviceIdentity:
    device: str
    name: str
    key: dict = field(default_factory=dict)  # what the measurement depends on

    def entry(self, size: int) -> str:
        text = json.dumps({**self.key, "device": self.device, "size": size}, sort_keys=True)
        return f"{self.device.replace(':', '')}-{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def _cpu_identity() -> DeviceIdentity:
    from tilewise.backends.cpu.threads import get_num_threads

    name = _cpu_model()
    return DeviceIdentity("cpu", name, {"cpu": host_cpu(), "threads": get_num_threads(), "numpy": np.__version__,
                                        "blas_threads": os.environ.get("OMP_NUM_THREADS", "")})


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cuda_identity(index: int) -> DeviceIdentity:
    from tilewise.backends.cuda.runtime import get_device_properties

    props = get_device_properties(index)
    return DeviceIdentity(f"cuda:{index}", props.name, {"gpu": props.name, "arch": props.arch,
                                                       "memory": props.total_memory})


def _cache() -> DiskCache:
    return DiskCache(default_cache_dir() / f"roofline-v{ROOFLINE_FORMAT_VERSION}", "roofline cache")


def roofline(device: str = "cpu", size: int = DEFAULT_SIZE, refresh: bool = False) -> Roofline:
    """``device``'s roofline: read from the cache, else measured (seconds, at the default ``size``) and stored.

    >>> roof = roofline("cpu", size=1 << 20)  # doctest: +SKIP
    >>> roof.place(12 << 20, 1 << 20, 1e-3, "float32").bound  # doctest: +SKIP
    'memory'
    """
    found = None if refresh else cached_roofline(device, size)
    if found is not None:
        return found
    identity = _identity(device)
    if identity.device == "cpu":
        copy_gbs, peaks = measure_cpu(size)
    else:
        copy_gbs, peaks = measure_cuda(int(identity.device.partition(":")[2]), size)
    record = {"device": identity.device, "name": identity.name, "copy_gbs": copy_gbs, "peak_gflops": peaks,
              "size": size, **identity.key}
    path = _cache().write(identity.entry(size), json.dumps(record, sort_keys=True).encode())
    return Roofline(identity.device, identity.name, copy_gbs, peaks, size, "measured", str(path or ""))


def cached_roofline(device: str = "cpu", size: int = DEFAULT_SIZE) -> Roofline | None:
    """``device``'s roofline as stored by an earlier measurement, or None (nothing is measured)."""
    identity = _identity(device)
    cache, name = _cache(), identity.entry(size)
    stored = cache.read(name)
    if stored is None:
        return None
    try:
        data = json.loads(stored)
        return Roofline(identity.device, identity.name, float(data["copy_gbs"]),
                        {k: float(v) for k, v in data["peak_gflops"].items()}, size, "cache", str(cache.path_for(name)))
    except (ValueError, KeyError, TypeError, AttributeError):
        cache.report_damaged(cache.path_for(name), "it is not a roofline record")
        return None


def _identity(device) -> DeviceIdentity:
    kind, _, index = str(device).partition(":")
    if kind == "cpu":
        return _cpu_identity()
    if kind == "cuda":
        return _cuda_identity(int(index or 0))
    raise ValueError(f"roofline: no measurement for {device!r} devices; expected 'cpu' or 'cuda[:index]'")


# ---------------------------------------------------------------------------- CUDA occupancy

@dataclass(frozen=True)
class SMLimits:
    threads: int
    blocks: int
    registers: int
    shared: int  # bytes per SM usable by blocks
    shared_per_block_reserved: int = 1024


SM_LIMITS = {
    80: SMLimits(2048, 32, 65536, 164 << 10), 86: SMLimits(1536, 16, 65536, 100 << 10),
    87: SMLimits(1536, 16, 65536, 164 << 10), 89: SMLimits(1536, 24, 65536, 100 << 10),
    90: SMLimits(2048, 32, 65536, 228 << 10), 100: SMLimits(2048, 32, 65536, 228 << 10),
    120: SMLimits(1536, 32, 65536, 100 << 10),
}


def theoretical_occupancy(arch: str, block: int, registers: int, shared_bytes: int) -> tuple[float, str]:
    """Active warps per SM over the maximum, for blocks of ``block`` threads using ``registers`` per thread and
    ``shared_bytes`` per block, with what limits it (the CUDA occupancy calculator's rules: registers are
    allocated per warp in units of 256)."""
    number = int(arch.removeprefix("sm_").rstrip("af"))
    older = [k for k in SM_LIMITS if k <= number]
    limits = SM_LIMITS[max(older)] if older else SM_LIMITS[80]
    warps = math.ceil(block / 32)
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by = {"threads": limits.threads // (warps * 32), "blocks": limits.blocks,
          "registers": limits.registers // (per_warp * warps)}
    if shared_bytes:
        by["shared memory"] = limits.shared // (shared_bytes + limits.shared_per_block_reserved)
    limiter = min(by, key=by.get)
    return min(1.0, by[limiter] * warps * 32 / limits.threads), limiter
