"""Loading cubins and launching their kernels.

[Note: kernel launch]
A :class:`Module` is a cubin loaded with ``cuModuleLoadData`` into a device's primary context; a
:class:`Function` is one kernel in it. On its first launch a function reads its parameter layout from the
driver (``cuFuncGetParamInfo``: offset and size of each parameter), so each launch can check the argument
count and sizes and pack the values the cheap way: a byte buffer laid out exactly like the device-side
parameter block, and a numpy uint64 array of the addresses of its parameters (a ``void**``) handed to
``cuLaunchKernel``. Both are made once per function and thread; the driver copies the values during the
call, so the next launch may overwrite them. Packing is one ``struct.pack_into`` with a format built once
per tuple of argument types; anything that format cannot take goes through a slow path that checks each
argument and says which one is wrong.
Arguments: a Python int fills a parameter of any integer size (device pointers are ints), a Python float
fills a float (4 bytes) or double (8 bytes) parameter, a numpy scalar must have the parameter's exact
size, and ``bytes`` pass a struct by value.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilewise._cuda_api import CudaError, check, driver_api
from tilewise.backends.cuda.runtime.device import call_in_context, ensure_context

Dim3 = int | Sequence[int]
_FLOAT_FORMATS = {2: "e", 4: "f", 8: "d"}


@dataclass(frozen=True)
class FunctionAttributes:
    """What the driver reports about a loaded kernel (per thread: registers, local; per block: shared)."""

    num_regs: int
    shared_size_bytes: int
    local_size_bytes: int
    const_size_bytes: int
    max_threads_per_block: int


class Module:
    """A cubin (or PTX) image loaded on one device.

    >>> from tilewise.codegen.toolchain.nvrtc import compile_cuda
    >>> k = compile_cuda('extern "C" __global__ void one(float* o) { *o = 1.f; }', "one")  # doctest: +SKIP
    >>> fn = Module(k.cubin).get_function("one")  # doctest: +SKIP
    >>> launch(fn, grid=1, block=1, args=[device_pointer])  # doctest: +SKIP
    """

    def __init__(self, image: bytes, device: int | None = None) -> None:
        self.device = ensure_context(device)
        self.handle = int(check(driver_api().cuModuleLoadData(image), "cuModuleLoadData"))
        self._functions: dict[str, Function] = {}

    def get_function(self, name: str) -> Function:
        """The kernel called ``name`` (its lowered name for C++ kernels)."""
        function = self._functions.get(name)
        if function is None:
            ensure_context(self.device)
            try:
                handle = check(driver_api().cuModuleGetFunction(self.handle, name.encode()), "cuModuleGetFunction")
            except CudaError as exc:
                raise KeyError(f"no kernel named {name!r} in this module ({exc.status_name})") from exc
            function = self._functions[name] = Function(self, name, handle)
        return function

    def __del__(self) -> None:
        if getattr(self, "handle", 0):
            with contextlib.suppress(Exception):  # at interpreter shutdown the driver may be gone
                call_in_context(self.device, driver_api().cuModuleUnload, self.handle)


def load_module(image: bytes, device: int | None = None) -> Module:
    """Load a cubin (or PTX text as bytes ending in NUL) on ``device`` (default: current)."""
    return Module(image, device)


class Function:
    """One kernel of a loaded :class:`Module`."""

    def __init__(self, module: Module, name: str, handle: Any) -> None:
        self.module = module  # keeps the module loaded while the function lives
        self.name = name
        self.handle = int(handle)
        self._driver_handle = handle  # the CUfunction object: the bindings take it faster than an int
        self._layout: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
        self._attributes: FunctionAttributes | None = None
        self._packers: dict[tuple[type, ...], struct.Struct | None] = {}
        self._arity = -1  # the parameter count, once the slow path has read the layout
        self._per_thread = threading.local()

    def __repr__(self) -> str:
        return f"Function({self.name!r}, device={self.module.device})"

    def __call__(self, grid: Dim3, block: Dim3, *args: Any, shared_mem: int = 0, stream: int = 0) -> None:
        launch(self, grid, block, args, shared_mem=shared_mem, stream=stream)

    @property
    def parameter_layout(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(offsets, sizes, total bytes) of the kernel's parameters, read once from the driver."""
        if self._layout is None:
            self._layout = self._read_layout()
        return self._layout

    def _read_layout(self) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        ensure_context(self.module.device)
        cu, offsets, sizes = driver_api(), [], []
        while True:
            result = cu.cuFuncGetParamInfo(self.handle, len(offsets))
            if int(result[0]) != 0:
                break
            offsets.append(int(result[1]))
            sizes.append(int(result[2]))
        total = max((o + s for o, s in zip(offsets, sizes)), default=0)
        return tuple(offsets), tuple(sizes), total

    def _scratch(self) -> tuple[ctypes.Array, np.ndarray, int]:
        """This thread's parameter buffer, the uint64 addresses of the parameters in it, and the address of
        that array (the ``void**``); made once per thread."""
        scratch = getattr(self._per_thread, "scratch", None)
        if scratch is None:
            offsets, _, total = self.parameter_layout
            buffer = (ctypes.c_char * max(total, 1))()
            addresses = np.array(offsets, dtype=np.uint64) + np.uint64(ctypes.addressof(buffer))
            scratch = self._per_thread.scratch = (buffer, addresses, addresses.ctypes.data if len(offsets) else 0)
        return scratch

    def attributes(self) -> FunctionAttributes:
        """Registers, static shared/local/constant memory and the block-size limit, from cuFuncGetAttribute."""
        if self._attributes is None:
            attr = driver_api().CUfunction_attribute
            self._attributes = FunctionAttributes(
                num_regs=self._attribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS),
                shared_size_bytes=self._attribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES),
                local_size_bytes=self._attribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES),
                const_size_bytes=self._attribute(attr.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES),
                max_threads_per_block=self._attribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            )
        return self._attributes

    def _attribute(self, which: Any) -> int:
        ensure_context(self.module.device)
        return int(check(driver_api().cuFuncGetAttribute(which, self.handle), "cuFuncGetAttribute"))

    def set_max_dynamic_shared_memory(self, nbytes: int) -> None:
        """Allow launches with up to ``nbytes`` of dynamic shared memory (needed above 48 KiB)."""
        ensure_context(self.module.device)
        attribute = driver_api().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(driver_api().cuFuncSetAttribute(self.handle, attribute, nbytes), "cuFuncSetAttribute")


def _dim3(value: Dim3, what: str) -> tuple[int, int, int]:
    if type(value) is int and value > 0:  # the common case, kept cheap: launches are on the hot path
        return value, 1, 1
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, got {value!r}")
    padded = [int(d) for d in dims] + [1, 1]
    return padded[0], padded[1], padded[2]


_INT_FORMATS = {1: "b", 2: "h", 4: "i", 8: "q"}
_UINT_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _format_for(kind: type, size: int) -> str | None:
    """The struct code that packs an argument of type ``kind`` into a ``size``-byte parameter, or None (slow path)."""
    if kind is float:
        return _FLOAT_FORMATS.get(size)
    if kind is int or kind is bool:
        return _INT_FORMATS.get(size)
    if issubclass(kind, np.generic):
        dtype = np.dtype(kind)
        if dtype.itemsize != size:
            return None  # the slow path reports the size mismatch
        if dtype.kind == "f":
            return _FLOAT_FORMATS.get(size)
        if dtype.kind in "iu":
            return (_INT_FORMATS if dtype.kind == "i" else _UINT_FORMATS).get(size)
    return None


def _build_packer(
    layout: tuple[tuple[int, ...], tuple[int, ...], int], kinds: tuple[type, ...]
) -> struct.Struct | None:
    offsets, sizes, _ = layout
    codes, position = ["<"], 0
    for kind, offset, size in zip(kinds, offsets, sizes):
        code = _format_for(kind, size)
        if code is None:
            return None
        codes.append(f"{offset - position}x{code}" if offset > position else code)
        position = offset + size
    return struct.Struct("".join(codes))


def _encode(arg: Any, size: int, index: int, kernel: str) -> bytes:
    """One argument as the bytes of its parameter, with an error that says what is wrong (the slow path)."""
    if isinstance(arg, (bytes, bytearray, np.generic, np.ndarray)):
        data = arg.tobytes() if isinstance(arg, (np.generic, np.ndarray)) else bytes(arg)
    elif isinstance(arg, float):
        if size not in _FLOAT_FORMATS:
            raise TypeError(f"argument {index} of kernel {kernel!r} is a float, but the parameter is {size} bytes")
        data = struct.pack("<" + _FLOAT_FORMATS[size], arg)
    elif hasattr(arg, "__index__"):
        try:
            data = int(arg).to_bytes(size, "little", signed=int(arg) < 0)
        except OverflowError as exc:
            raise TypeError(
                f"argument {index} of kernel {kernel!r} ({arg}) does not fit its {size}-byte parameter"
            ) from exc
    else:
        raise TypeError(
            f"argument {index} of kernel {kernel!r} has type {type(arg).__name__}: pass an int (a device "
            f"pointer or integer), a float, a numpy scalar or bytes"
        )
    if len(data) != size:
        raise TypeError(
            f"argument {index} of kernel {kernel!r} is {len(data)} bytes ({type(arg).__name__}), "
            f"but the kernel parameter is {size} bytes"
        )
    return data


def _pack_slowly(function: Function, args: Sequence[Any], buffer: ctypes.Array) -> None:
    offsets, sizes, _ = function.parameter_layout
    for index, (arg, offset, size) in enumerate(zip(args, offsets, sizes)):
        ctypes.memmove(ctypes.addressof(buffer) + offset, _encode(arg, size, index, function.name), size)


def pack_arguments(function: Function, args: Sequence[Any]) -> tuple[ctypes.Array, np.ndarray]:
    """(parameter buffer, uint64 array of the address of each parameter in it): the ``void**`` for a launch.

    The buffer is this thread's scratch buffer of ``function`` and is overwritten by its next launch.
    """
    _pack(function, args)
    buffer, addresses, _ = function._scratch()
    return buffer, addresses


def _pack(function: Function, args: Sequence[Any]) -> int:
    """Pack ``args`` into this thread's scratch buffer of ``function``; return the ``void**`` address."""
    buffer, _, params = function._scratch()
    packer = function._packers.get(tuple(map(type, args)))
    if packer is not None and len(args) == function._arity:
        try:
            packer.pack_into(buffer, 0, *args)
            return params
        except struct.error:
            pass  # a value the format cannot take (say, an unsigned int above 2**31): the slow path handles it
    _pack_checked(function, args, buffer)
    return params


def _pack_checked(function: Function, args: Sequence[Any], buffer: ctypes.Array) -> None:
    layout = function.parameter_layout
    function._arity = len(layout[1])
    if len(args) != function._arity:
        raise TypeError(f"kernel {function.name!r} takes {function._arity} arguments, got {len(args)}")
    kinds = tuple(map(type, args))
    if kinds not in function._packers:
        function._packers[kinds] = _build_packer(layout, kinds)
    packer = function._packers[kinds]
    try:
        if packer is None:
            raise struct.error("no fast path for these argument types")
        packer.pack_into(buffer, 0, *args)
    except struct.error:
        _pack_slowly(function, args, buffer)


def launch(
    function: Function, grid: Dim3, block: Dim3, args: Sequence[Any] = (), shared_mem: int = 0, stream: int = 0
) -> None:
    """Launch ``function`` on a ``grid`` of ``block``-sized blocks, ordered on ``stream`` (int or Stream)."""
    ensure_context(function.module.device)
    gx, gy, gz = _dim3(grid, "grid")
    bx, by, bz = _dim3(block, "block")
    params = _pack(function, args)
    check(
        driver_api().cuLaunchKernel(
            function._driver_handle, gx, gy, gz, bx, by, bz, shared_mem, int(stream), params, 0
        ),
        "cuLaunchKernel",
    )
