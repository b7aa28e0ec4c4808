"""Every plug-in point of the core: where a lower layer calls a higher one without importing it.

[Note: plug-in points] The layers (``tests/import_graph.py``) import only downward. Where a lower layer must
still reach a higher one at run time, it owns a *slot* and the higher layer fills it when it is imported: a
registration function, an attribute of a hooks object, or a method the higher layer installs on ``Tensor``.
This table names each slot, the module that fills it and why it exists; ``tests/test_plugins.py`` checks,
after ``import tilewise``, that each slot holds what the named module put there, and the import-graph test
prints the table beside the arrows it replaces. A new upward call gets a row here, not an import.
"""

from __future__ import annotations

from typing import NamedTuple


class PlugIn(NamedTuple):
    slot: str  # "module:attribute.path" in the lower layer
    filled_by: str  # the module that fills it when it loads
    why: str


PLUG_INS: tuple[PlugIn, ...] = (
    # device backends (see [Note: the Backend protocol] in device.py)
    PlugIn("tilewise.device:BACKENDS.cpu", "tilewise.backends.cpu",
           "the CPU Backend, registered by backends.load(); the CUDA one joins it where a GPU is found"),
    # the dispatcher's keys (see [Note: dispatcher plug-ins] in dispatch.py)
    PlugIn("tilewise.dispatch:record", "tilewise.autograd.graph",
           "the Autograd key: run an op below autograd and record its node"),
    PlugIn("tilewise.dispatch:forward_ad", "tilewise.autograd.forward_ad",
           "the ForwardAD key: a call whose inputs carry tangents, with its tangent rule"),
    PlugIn("tilewise.dispatch:forward_ad_write", "tilewise.autograd.forward_ad",
           "an in-place write hands the written tensor (and a view's base) the tangents of what was written"),
    PlugIn("tilewise.dispatch:apply_view", "tilewise.ops.views", "a view op's stride arithmetic"),
    PlugIn("tilewise.dispatch:trace", "tilewise.compiler.capture",
           "the Trace key: record ops while tilewise.compile captures a function"),
    PlugIn("tilewise.dispatch:resolve_numbers", "tilewise.compiler.numbers",
           "a compiled function's dynamic numbers become operands an operator reads at run time, or their values"),
    PlugIn("tilewise.dispatch:profile_op", "tilewise.profiler.recorder",
           "the Profiler key: an operator call inside a profiler event while tilewise.profiler.profile records"),
    PlugIn("tilewise.dispatch:batch", "tilewise.ops.batching",
           "the Vmap key: an operator's batching rule on the tensors tilewise.func.vmap batches"),
    PlugIn("tilewise.autograd.engine:profile_node", "tilewise.profiler.recorder",
           "an autograd node's work inside torch's engine ranges while a profile records"),
    PlugIn("tilewise.autograd.profiler:nvtx_ranges", "tilewise.profiler.nvtx_ranges",
           "emit_nvtx: NVTX ranges from the profiler's hooks while it is entered"),
    # the tensor model (see [Note: methods from above] in tensor.py)
    PlugIn("tilewise.tensor:FACTORIES.empty", "tilewise.ops.creation",
           "Tensor(2, 3) and the legacy types' constructors make tensors with the empty factory"),
    PlugIn("tilewise.tensor:Tensor.to", "tilewise.ops.conversions", "device and dtype moves dispatch _to_copy"),
    PlugIn("tilewise.tensor:Tensor._to_dtype", "tilewise.ops.conversions", "the dtype-only move autocast uses"),
    PlugIn("tilewise.tensor:Tensor.backward", "tilewise.autograd", "runs the autograd engine"),
    PlugIn("tilewise.tensor:Tensor.retain_grad", "tilewise.autograd.graph", "marks a non-leaf in the graph"),
    PlugIn("tilewise.tensor:Tensor.register_hook", "tilewise.autograd.graph", "hooks a tensor's gradient"),
    PlugIn("tilewise.tensor:Tensor.register_post_accumulate_grad_hook", "tilewise.autograd.graph",
           "hooks a leaf after the engine accumulated its gradient"),
    PlugIn("tilewise.tensor:Tensor.__repr__", "tilewise._tensor_str", "printing, with torch's format"),
    PlugIn("tilewise.tensor:Tensor.type", "tilewise.tensortypes", "legacy type names and conversions"),
    PlugIn("tilewise.tensor:Tensor.record_stream", "tilewise.cuda",
           "a CUDA tensor's memory marked as used by another stream, for the caching allocator"),
    PlugIn("tilewise.tensor:grad_enabled", "tilewise._grad_mode",
           "whether grad mode is on, for numpy() of a tensor that requires grad (allowed under no_grad)"),
    PlugIn("tilewise.tensor:inference_mode_enabled", "tilewise._grad_mode",
           "whether inference mode is on, for the refusals of inference tensors and the factories that mark them"),
    PlugIn("tilewise.ops.nn_functional:ATTENTION_HOOKS.sdp_enabled", "tilewise.backends.flags",
           "scaled_dot_product_attention refuses as torch when the attention switches leave no kernel"),
    PlugIn("tilewise.tensor:AUTOGRAD_HOOKS.refuse_stale_view", "tilewise.autograd.graph",
           "reading grad_fn of a view autograd would refuse (made under no_grad, then its base written) raises"),
    PlugIn("tilewise.tensor:VMAP_HOOKS.detach", "tilewise.ops.batching",
           "detach() of a batched tensor of vmap detaches its physical tensor and keeps the batch"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.value_needed", "tilewise.compiler.capture",
           "Python reading a traced tensor's values: a graph break or an error naming the user's line"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.shares_memory", "tilewise.compiler.capture",
           "a new tensor object taking a traced tensor's memory (detach, .data =)"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.version", "tilewise.compiler.capture",
           "a traced tensor's version counter, kept on the memory it stands for"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.bump_version", "tilewise.compiler.capture", "an in-place write to it"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.untraced", "tilewise.compiler.meta",
           "operators run, not recorded, while a graph break reads values"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.grad_assigned", "tilewise.compiler.capture",
           "t.grad = ... inside a traced function (the trace learns what .grad held)"),
    PlugIn("tilewise.tensor:TRACE_HOOKS.lay_out", "tilewise.compiler.capture",
           "a traced factory result (zeros_like of a channels-last tensor) takes the strides eager gives it"),
    # the compiler
    PlugIn("tilewise.compiler.program:profile_program", "tilewise.profiler.recorder",
           "a compiled program's run and each of its steps inside profiler events while a profile records"),
    # the CUDA backend
    PlugIn("tilewise.backends.cuda:_fused", "tilewise.compiler.composites",
           "composite ops run as one compiled kernel on CUDA (register_composite_runner)"),
)
