"""Operator tags: facts about an operator that other layers act on, with torch's names (``torch.Tag``).

An operator's tags are part of its declaration (``attrs["tags"]``, a tuple of :class:`Tag`); custom operators
take them from ``tilewise.library.custom_op(..., tags=...)`` as torch.library's do. What acts on them today:
``cudagraph_unsafe`` keeps a compiled program that calls the operator out of CUDA graphs (see
[Note: custom operators in CUDA graphs] in ``compiler/program_cuda.py``). The other members are torch's, so that
code naming them runs unchanged; tilewise gives them no meaning of its own yet.
"""

from __future__ import annotations

from enum import Enum


class Tag(Enum):
    """torch.Tag's members, with its values.

    >>> Tag.cudagraph_unsafe
    <Tag.cudagraph_unsafe: 1>
    """

    core = 0
    cudagraph_unsafe = 1
    data_dependent_output = 2
    dynamic_output_shape = 3
    flexible_layout = 4
    generated = 5
    inplace = 6
    inplace_view = 7
    maybe_aliasing_or_mutating = 8
    needs_contiguous_strides = 9
    needs_exact_strides = 10
    needs_fixed_stride_order = 11
    nondeterministic_bitwise = 12
    nondeterministic_seeded = 13
    out = 14
    out_variant = 15
    pointwise = 16
    pt2_compliant_tag = 17
    reduction = 18
    view_copy = 19


def tags_of(op) -> tuple[Tag, ...]:
    """The tags an operator was declared with."""
    return op.attrs.get("tags", ())
