"""An LSTM layer's time loop on CUDA, below the dispatcher: the kernels of ``_lstm_layer`` and its backward.

[Note: the LSTM time loop on raw buffers] Run through the dispatcher, each time step of a layer is a hidden
projection and a cell, each a full operator call: the host spends longer per step than the GPU does. Here the
whole loop of one layer and direction (see [Note: an LSTM layer as one operator] in ops/nn_recurrent.py) runs on
raw device pointers, everything that does not change between steps worked out before it starts:
  * forward, per step: one cuBLASLt GEMM writing the hidden projection ``h_{t-1} @ W_hh^T`` into
    ``hidden_gates[t]``, and one generated cell kernel reading ``input_gates[t]``, ``hidden_gates[t]`` and
    ``c_{t-1}``, writing ``h_t`` into ``output[t]`` and ``c_t`` into ``cs[t]``;
  * backward, per step (last to first): one cell-backward kernel reading the gates again, the output's gradient
    ``grad_output[t]`` and the recurrent gradients ``dh`` (bf16/fp32 as the layer) and ``dc`` (in the compute
    dtype, updated in place), writing the gate gradients into ``grad_input_gates[t]``; and one GEMM for the next
    ``dh = grad_gates_t @ W_hh``. After the loop, W_hh's gradient is one GEMM over all steps.
The cell kernels are kernel IR (``codegen.kernel_ir``) with literal sizes, scheduled and rendered as the
compiler's are, built once per (dtype, batch, hidden, 16-byte alignment) and kept in ``_plans`` with their
launch shape; the GEMM plans come from ``matmul.pointer_gemm``. Their arithmetic is ``_lstm_cell``'s and
``_lstm_cell_backward``'s, in float32 for half-precision layers; the one difference from the decomposition is
that ``dc`` is carried between steps in float32 rather than rounded to the layer's dtype each step.
Anything the loop does not take (dtypes cuBLASLt lacks, an empty batch, gradients reaching ``cs`` or
``hidden_gates``, which only a second derivative sends) runs the declared decomposition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilewise import dtypes
from tilewise._cuda_api import check, driver_api
from tilewise.backends.cuda.device_memory import data_ptr, empty, stream_handle
from tilewise.backends.cuda.kernels import kernel, launch, load
from tilewise.backends.cuda.kernels.creation import fill
from tilewise.backends.cuda.matmul import SUPPORTED, gemm, pointer_gemm
from tilewise.backends.cuda.runtime.device import ensure_context
from tilewise.codegen.kernel_ir import Index, Kernel, Load, Nest, Param, Store, cast
from tilewise.codegen.render.cstyle import compute_of
from tilewise.codegen.render.kernel_cuda import render_source
from tilewise.codegen.schedule import KernelSchedule, Knobs, schedule_cuda
from tilewise.device import Device
from tilewise.dtypes import DType
from tilewise.ops.expr import Expr, substitute
from tilewise.ops.registry import OPS
from tilewise.tensor import Tensor

VECTOR_BYTES = 16


# ---------------------------------------------------------------------------------------------- the cell kernels

def _applied(op_name: str, x: Expr) -> Expr:
    """The declared meaning of the pointwise operator ``op_name`` applied to ``x``."""
    return substitute(OPS[op_name].expr, {id(Expr("input", (), 0)): x})


class _Builder:
    """The loads and parameters of a cell kernel over the domain [batch, hidden]."""

    def __init__(self, dtype: DType, batch: int, hidden: int):
        self.dtype, self.compute, self.hidden = dtype, compute_of(dtype), hidden
        self.params: list[Param] = []
        self.loads: list[Load] = []
        self.stores: list[Store] = []

    def param(self, name: str, dtype: DType, read: bool, written: bool) -> int:
        self.params.append(Param(name, dtype, read, written))
        return len(self.params) - 1

    def index(self, chunk: int, chunks: int) -> Index:
        """Chunk ``chunk`` of rows of ``chunks * hidden`` elements."""
        return Index(chunk * self.hidden, ((0, chunks * self.hidden), (1, 1)))

    def load(self, param: int, chunk: int = 0, chunks: int = 1) -> Expr:
        dtype = self.params[param].dtype
        self.loads.append(Load(param, self.index(chunk, chunks), dtype))
        value = Expr("input", (), len(self.loads) - 1)
        return value if compute_of(dtype) is self.compute else cast(value, self.compute)

    def store(self, param: int, value: Expr, chunk: int = 0, chunks: int = 1) -> None:
        self.stores.append(Store(param, self.index(chunk, chunks), value, self.params[param].dtype, None))

    def gates(self, input_gates: int, hidden_gates: int) -> list[Expr]:
        """i, f, g, o: sigmoid, sigmoid, tanh, sigmoid of the sums of the two projections, as ``_lstm_gates``."""
        sums = [self.load(input_gates, k, 4) + self.load(hidden_gates, k, 4) for k in range(4)]
        return [_applied("tanh" if k == 2 else "sigmoid", s) for k, s in enumerate(sums)]

    def kernel(self, name: str, batch: int) -> Kernel:
        return Kernel(name, self.params, [Nest((batch, self.hidden), (), self.loads, [], self.stores)])


def forward_cell_kernel(dtype: DType, batch: int, hidden: int) -> Kernel:
    """One forward step: ``(ig, hg, c_prev) -> (h -> h_out, c -> c_out)``, ``_lstm_cell``'s arithmetic."""
    b = _Builder(dtype, batch, hidden)
    ig, hg, c_prev = (b.param(n, dtype, True, False) for n in ("input_gates", "hidden_gates", "c_prev"))
    h_out, c_out = (b.param(n, dtype, False, True) for n in ("h_out", "c_out"))
    i, f, g, o = b.gates(ig, hg)
    cy = f * b.load(c_prev) + i * g
    b.store(h_out, o * _applied("tanh", cy))
    b.store(c_out, cy)
    return b.kernel(f"tw_lstm_step_{dtype.name}_{batch}x{hidden}", batch)


def backward_cell_kernel(dtype: DType, batch: int, hidden: int, grad_output: bool) -> Kernel:
    """One backward step, ``_lstm_cell_backward``'s arithmetic: the gate gradients into ``grad_gates`` and the
    cell state's into ``dc`` (compute dtype, read and written in place) from ``dh`` (+ ``grad_output``)."""
    b = _Builder(dtype, batch, hidden)
    ig, hg, c_prev = (b.param(n, dtype, True, False) for n in ("input_gates", "hidden_gates", "c_prev"))
    g_out = b.param("grad_output", dtype, True, False) if grad_output else None
    dh_in = b.param("dh", dtype, True, False)
    dc_io = b.param("dc", b.compute, True, True)
    grad_gates = b.param("grad_gates", dtype, False, True)
    i, f, g, o = b.gates(ig, hg)
    c = b.load(c_prev)
    dh = b.load(dh_in) if g_out is None else b.load(g_out) + b.load(dh_in)
    tanh_cy = _applied("tanh", f * c + i * g)
    dc = b.load(dc_io) + dh * o * (1 - tanh_cy * tanh_cy)
    for k, value in enumerate((dc * g * i * (1 - i), dc * c * f * (1 - f), dc * i * (1 - g * g),
                               dh * tanh_cy * o * (1 - o))):
        b.store(grad_gates, value, k, 4)
    b.store(dc_io, dc * f)
    suffix = "_go" if grad_output else ""
    return b.kernel(f"tw_lstm_step_backward{suffix}_{dtype.name}_{batch}x{hidden}", batch)


BLOCK = 128
MIN_BLOCKS = 132  # an H100/H200's SMs: a step's cell is too small to fill them with 16-byte accesses


def cell_schedule(kernel_ir: Kernel, vector: bool) -> KernelSchedule:
    """The kernel's CUDA schedule: wide accesses only where every pointer a launch passes is aligned for them,
    and no wider than leaves a block for every SM (a step's [64, 1024] cell in 16-byte accesses of bfloat16 is
    32 blocks of 256 threads: a quarter of the GPU, each thread a long chain of exp and tanh)."""
    width = schedule_cuda(kernel_ir, Knobs(block=BLOCK)).nests[0].cuda.vector if vector else 1
    numel = kernel_ir.nests[0].shape[0] * kernel_ir.nests[0].shape[1]
    while width > 1 and numel // (width * BLOCK) < MIN_BLOCKS:
        width //= 2
    sched = schedule_cuda(kernel_ir, Knobs(block=BLOCK, vector=width))
    if sched.nests[0].cuda.vector > 1:
        sched.kernel = Kernel(f"{kernel_ir.name}_v{sched.nests[0].cuda.vector}", kernel_ir.params, kernel_ir.nests)
    return sched


@dataclass
class _Cell:
    fn: object
    grid: int
    block: int


_plans: dict[tuple, _Cell] = {}


def _cell(kind: str, dtype: DType, batch: int, hidden: int, aligned: bool, device: int) -> _Cell:
    key = (kind, dtype, batch, hidden, aligned, device)
    cell = _plans.get(key)
    if cell is None:
        if kind == "forward":
            kernel_ir = forward_cell_kernel(dtype, batch, hidden)
        else:
            kernel_ir = backward_cell_kernel(dtype, batch, hidden, kind == "backward_go")
        sched = cell_schedule(kernel_ir, aligned)
        cell = _plans[key] = _Cell(load(render_source(sched), sched.kernel.name, device), sched.grid, sched.block)
    return cell


# ---------------------------------------------------------------------------------------------- launches per step

def pack_steps(offsets: tuple[int, ...], argvs: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray] | None:
    """Every step's kernel arguments (all pointers) packed before the loop: (the parameter values, one row per
    step, and one row per step of the addresses of its values, the ``void**`` a launch takes). None where the
    kernel's parameters are not 8-byte slots side by side."""
    count = len(offsets)
    if offsets != tuple(range(0, 8 * count, 8)) or any(len(a) != count for a in argvs):
        return None
    values = np.array(argvs, dtype=np.uint64).reshape(len(argvs), count)
    rows = np.arange(len(argvs), dtype=np.uint64)[:, None] * np.uint64(8 * count)
    addresses = np.uint64(values.ctypes.data) + rows + np.array(offsets, dtype=np.uint64)[None, :]
    return values, np.ascontiguousarray(addresses)


class StepLaunches:
    """One cell kernel's launch at each step of a loop, its arguments packed before the loop starts: a step
    costs one ``cuLaunchKernel`` call (the per-launch work of ``kernels.launch``, packing included, done once)."""

    def __init__(self, cell: _Cell, argvs: list[tuple[int, ...]], stream: int, device: int):
        self.cell, self.argvs, self.stream = cell, argvs, stream
        packed = pack_steps(cell.fn.parameter_layout[0], argvs)
        self.packed = packed  # keeps the parameter memory alive while launches read it
        if packed is not None:
            ensure_context(device)
            base, stride = int(packed[1].ctypes.data), packed[1].shape[1] * 8
            self.params = [base + t * stride for t in range(len(argvs))]
            self.launch_kernel = driver_api().cuLaunchKernel

    def __call__(self, t: int) -> None:
        cell = self.cell
        if self.packed is None:
            launch(cell.fn, cell.grid, cell.block, self.argvs[t], self.stream)
            return
        result = self.launch_kernel(cell.fn._driver_handle, cell.grid, 1, 1, cell.block, 1, 1, 0, self.stream,
                                    self.params[t], 0)
        if int(result[0]):
            check(result, f"cuLaunchKernel({cell.fn.name})")


# ---------------------------------------------------------------------------------------------- the loops

def _step_pointers(t: Tensor, steps: int) -> list[int]:
    """The address of ``t[s]`` for every step ``s`` of a contiguous [steps, ...] tensor."""
    base, stride = data_ptr(t), t._strides[0] * t._dtype.itemsize
    return [base + s * stride for s in range(steps)]


def _aligned(*pointers: int, strides: tuple[int, ...] = ()) -> bool:
    return all(p % VECTOR_BYTES == 0 for p in (*pointers, *strides))


def _alignment(*values: int) -> int:
    """The largest power of two (at most 256) dividing every one of ``values`` (addresses, byte strides)."""
    align = 256
    for v in values:
        if v:
            align = min(align, v & -v)
    return align


LAYER_OPS = ("_lstm_layer", "_lstm_layer_backward")


def keeps(op_name: str, args: tuple) -> bool:
    """Whether the compiler should keep a layer's operator whole on CUDA, as this module's time loop (a cell kernel
    and a cuBLASLt GEMM per step), rather than decompose it into per-step operators (the CUDA target's passes,
    ``compiler.targets``): its dtype is one the loop takes and it has steps to run. ``args`` are its bound
    arguments, tensors standing for anything with ``shape`` and ``dtype``."""
    if op_name not in LAYER_OPS:
        return False
    gates = args[0] if op_name == "_lstm_layer" else args[5]
    return gates.dtype.name in SUPPORTED and len(gates.shape) == 3 and all(n > 0 for n in gates.shape)


def _takes(dtype: DType, *tensors) -> bool:
    return dtype.name in SUPPORTED and all(t is None or t._dtype is dtype for t in tensors)


def _dense(t: Tensor) -> Tensor:
    return t if t.is_contiguous() else t.contiguous()


@kernel("_lstm_layer")
def lstm_layer(device: Device, input_gates: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor):
    op = OPS["_lstm_layer"]
    dtype = input_gates._dtype
    if input_gates.ndim != 3 or not _takes(dtype, h0, c0, w_hh) or any(t._device != device for t in (h0, c0, w_hh)):
        return op.decomposition(input_gates, h0, c0, w_hh)
    steps, batch, gates = input_gates._shape
    hidden = gates // 4
    if batch == 0 or hidden == 0 or steps == 0 or (h0._shape, c0._shape, w_hh._shape) != (
            (batch, hidden), (batch, hidden), (gates, hidden)) or gates != 4 * hidden:
        return op.decomposition(input_gates, h0, c0, w_hh)  # its checks raise the errors
    input_gates, h0, c0, w_hh = _dense(input_gates), _dense(h0), _dense(c0), _dense(w_hh)
    output = empty((steps, batch, hidden), dtype, device)
    cs = empty((steps, batch, hidden), dtype, device)
    hidden_gates = empty((steps, batch, gates), dtype, device)
    run_forward(input_gates, h0, c0, w_hh, output, cs, hidden_gates)
    return output, output[steps - 1].clone(), cs[steps - 1].clone(), cs, hidden_gates


def run_forward(input_gates: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, output: Tensor, cs: Tensor,
                hidden_gates: Tensor) -> None:
    """The forward loop (see the note) on contiguous tensors of the checked shapes."""
    device = input_gates._device
    steps, batch, gates = input_gates._shape
    hidden, itemsize = gates // 4, input_gates._dtype.itemsize
    ig, hg, out, c = (_step_pointers(t, steps) for t in (input_gates, hidden_gates, output, cs))
    h_prev = [data_ptr(h0), *out[:-1]]
    c_prev = [data_ptr(c0), *c[:-1]]
    cell = _cell("forward", input_gates._dtype, batch, hidden, _aligned(
        ig[0], hg[0], out[0], c[0], c_prev[0], strides=(hidden * itemsize,)), device.index)
    project = pointer_gemm(h0, w_hh.t(), hidden_gates[0],
                           _alignment(*h_prev[:2], *hg[:2], data_ptr(w_hh), batch * hidden * itemsize))
    stream = stream_handle(device.index)
    w_ptr = data_ptr(w_hh)
    step = StepLaunches(cell, [(ig[t], hg[t], c_prev[t], out[t], c[t]) for t in range(steps)], stream,
                        device.index)
    for t in range(steps):
        project(h_prev[t], w_ptr, hg[t], stream)
        step(t)


@kernel("_lstm_layer_backward")
def lstm_layer_backward(device: Device, grad_output, grad_hy, grad_cy, grad_cs, grad_hidden_gates, input_gates,
                        h0, c0, w_hh, output, cs, hidden_gates):
    args = (grad_output, grad_hy, grad_cy, grad_cs, grad_hidden_gates, input_gates, h0, c0, w_hh, output, cs,
            hidden_gates)
    dtype = input_gates._dtype
    steps, batch, gates = input_gates._shape
    if (grad_cs is not None or grad_hidden_gates is not None or batch == 0 or gates == 0
            or not _takes(dtype, grad_output, grad_hy, grad_cy, h0, c0, w_hh, output, cs, hidden_gates)):
        return OPS["_lstm_layer_backward"].decomposition(*args)
    hidden = gates // 4
    compute = dtypes.compute_dtype(dtype)
    dh = empty((batch, hidden), dtype, device)
    dc = empty((batch, hidden), compute, device)
    for state, given in ((dh, grad_hy), (dc, grad_cy)):
        if given is None:
            fill(state, 0)
        else:
            state.copy_(given)
    grad_input_gates = empty((steps, batch, gates), dtype, device)
    input_gates, hidden_gates, c0, cs, w_hh = (_dense(t) for t in (input_gates, hidden_gates, c0, cs, w_hh))
    grad_output = _dense(grad_output) if grad_output is not None else None
    run_backward(grad_output, input_gates, c0, w_hh, cs, hidden_gates, dh, dc, grad_input_gates)
    states_in = OPS["cat"]([h0.unsqueeze(0), output[:-1]], 0).reshape(steps * batch, hidden)
    grad_w_hh = gemm(grad_input_gates.view(steps * batch, gates).t(), _dense(states_in))
    return grad_input_gates, dh, dc.to(c0._dtype), grad_w_hh


def run_backward(grad_output: Tensor | None, input_gates: Tensor, c0: Tensor, w_hh: Tensor, cs: Tensor,
                 hidden_gates: Tensor, dh: Tensor, dc: Tensor, grad_input_gates: Tensor) -> None:
    """The backward loop (see the note): ``dh`` and ``dc`` hold the gradients of the last step's h and c, and
    end as those of h0 and c0; ``grad_input_gates`` receives every step's gate gradients."""
    device = input_gates._device
    steps, batch, gates = input_gates._shape
    hidden, itemsize = gates // 4, input_gates._dtype.itemsize
    ig, hg, c, dg = (_step_pointers(t, steps) for t in (input_gates, hidden_gates, cs, grad_input_gates))
    c_prev = [data_ptr(c0), *c[:-1]]
    go = _step_pointers(grad_output, steps) if grad_output is not None else None
    dh_ptr, dc_ptr = data_ptr(dh), data_ptr(dc)
    pointers = (ig[0], hg[0], c_prev[0], dh_ptr, dc_ptr, dg[0], *((go[0],) if go else ()))
    kind = "backward_go" if go else "backward"
    cell = _cell(kind, input_gates._dtype, batch, hidden, _aligned(*pointers, strides=(hidden * itemsize,)),
                 device.index)
    # choosing the plan's algorithm runs the product: into memory of its own, as dh holds the last step's gradient
    grad_h = pointer_gemm(grad_input_gates[0], w_hh, empty(dh._shape, dh._dtype, device),
                          _alignment(*dg[:2], data_ptr(w_hh), dh_ptr, batch * gates * itemsize))
    stream = stream_handle(device.index)
    w_ptr = data_ptr(w_hh)
    gradient = (lambda t: (go[t],)) if go is not None else (lambda t: ())
    step = StepLaunches(cell, [(ig[t], hg[t], c_prev[t], *gradient(t), dh_ptr, dc_ptr, dg[t]) for t in range(steps)],
                        stream, device.index)
    for t in reversed(range(steps)):
        step(t)
        grad_h(dg[t], w_ptr, dh_ptr, stream)
