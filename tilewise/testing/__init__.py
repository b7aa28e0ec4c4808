"""``tilewise.testing``: torch.testing's user-facing API, so test code ported by swapping the import runs.

>>> import tilewise as tw
>>> from tilewise.testing import assert_close, make_tensor
>>> x = make_tensor(2, 3, dtype=tw.float32, device="cpu", low=-1, high=1)
>>> assert_close(x + 1e-7, x)
>>> assert_close({"w": [x]}, {"w": [x.clone()]})

``assert_close`` compares tensors, numpy arrays, Python and numpy numbers, booleans and ``None``, and
sequences and mappings of them element by element, with torch's default tolerances per dtype and torch's
error messages. ``make_tensor`` draws a random tensor from torch's value range for the dtype.
``assert_allclose`` is torch's deprecated predecessor of ``assert_close``, kept because torch still has it.
"""

from tilewise.testing._comparison import assert_allclose, assert_close
from tilewise.testing._creation import make_tensor

__all__ = ["assert_allclose", "assert_close", "make_tensor"]
