"""``tilewise.backends.mha``: torch.backends.mha's switch of the Transformer fast path.

tilewise computes attention one way, but torch's fast path is visible in results: a ``TransformerEncoder`` that
takes it returns zeros at the padded positions, and ``MultiheadAttention`` returns a batch-major contiguous output
(see ``nn/modules/transformer.py``). With the switch off both follow torch's slow path.

>>> import tilewise as tw
>>> tw.backends.mha.get_fastpath_enabled()
True
"""

from __future__ import annotations

_enabled = [True]


def get_fastpath_enabled() -> bool:
    return _enabled[0]


def set_fastpath_enabled(value: bool) -> None:
    _enabled[0] = value
