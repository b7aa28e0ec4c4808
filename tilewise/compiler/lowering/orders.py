"""Which values the lowering laid out in an order other than their readers' (channels-last), for fusion.

[Note: value orders] The channels-last lowering (``channels_last.py``) makes values whose logical shape is the
channels-last permutation (N, *S, C) of the (N, C, *S) quantities their readers see through a permute view.
Fusion maps a value onto a nest's domain by position where nothing else says how (a value of the domain's shape
whose operands are all outside the nest), and two values of one shape in different orders must not share a
domain that way: an (N, H, W, C) value and an (N, C, H, W) nest of the same sizes (C == H) would take H for C.
So each nest has the order of the values it was built from, and a value joins one by position only in its order.
"""

from __future__ import annotations

import weakref

_CHANNELS_LAST: weakref.WeakSet = weakref.WeakSet()


def mark_channels_last(node) -> None:
    _CHANNELS_LAST.add(node)


def order_of(node) -> str:
    """"channels_last" for a value the lowering laid out in channels-last order, else "logical"."""
    return "channels_last" if node in _CHANNELS_LAST else "logical"
