"""``tilewise.autograd.profiler``: torch.autograd.profiler's ``emit_nvtx``.

``emit_nvtx`` makes every operator call, autograd node, compiled program step, ``record_function`` block and
module forward a named NVTX range while it is entered, so Nsight Systems shows them over the CUDA work
(``nvidia-smi``-free: ``nsys profile python train.py``). The ranges come from the profiler's own hooks (the
dispatcher's Profiler key), which live a layer above autograd: ``tilewise.profiler.nvtx_ranges`` fills the
``nvtx_ranges`` slot here when it loads (see [Note: plug-in points]). Nothing of it costs anything while no
``emit_nvtx`` is entered.

>>> import tilewise as tw
>>> with tw.autograd.profiler.emit_nvtx():
...     y = tw.ones(2) + 1
"""

from __future__ import annotations

# (record_shapes) -> a context manager emitting the ranges while it is entered; filled by the profiler
nvtx_ranges = None


def register_nvtx_ranges(fn) -> None:
    global nvtx_ranges
    nvtx_ranges = fn


class emit_nvtx:  # noqa: N801 — torch's name
    """NVTX ranges around every operator, autograd node, program step and module forward while entered
    (``enabled=False``: nothing); ``record_shapes`` adds the inputs' sizes to the operators' range names."""

    def __init__(self, enabled: bool = True, record_shapes: bool = False):
        self.enabled = enabled
        self.record_shapes = record_shapes
        self.entered = False
        self._ranges = None

    def __enter__(self) -> emit_nvtx:
        if not self.enabled:
            return self
        if self.entered:
            raise RuntimeError("NVTX annotation context manager is not reentrant")
        if nvtx_ranges is None:
            raise RuntimeError("emit_nvtx: the profiler's NVTX ranges are not registered; they are when "
                               "tilewise.profiler is imported (import tilewise rather than its submodules alone)")
        self.entered = True
        self._ranges = nvtx_ranges(self.record_shapes)
        self._ranges.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        if not self.enabled or not self.entered:
            return False
        ranges, self._ranges, self.entered = self._ranges, None, False
        ranges.__exit__(*exc)
        return False
