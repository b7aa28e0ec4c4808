"""Anomaly detection: ``detect_anomaly``, ``set_detect_anomaly`` and torch's flag functions.

[Note: anomaly mode] torch's anomaly mode has two parts: it records the forward stack of every node (for the
error message of a failing backward) and, with ``check_nan``, makes backward raise where a node returns NaN
gradients. tilewise keeps the flags with torch's semantics and implements both: while the mode is on, autograd records
with a recorder that keeps each node's forward stack (``graph.record_forward_stacks``; nothing is paid while it is
off), the engine calls :func:`check_node_outputs` after each node, and a node that fails in backward gets torch's
"Error detected in ..." warning with its forward traceback before the error propagates. The flags are
process-wide, as torch's.
"""

from __future__ import annotations

import functools
import warnings

from tilewise.autograd.graph import record_forward_stacks


class _Anomaly:
    enabled = False
    check_nan = True


ANOMALY = _Anomaly()


def _check_bool(value, name: str, position: int, function: str) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{function}(): argument '{name}' (position {position}) must be bool, not "
                        f"{type(value).__name__}")
    return value


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Turn anomaly detection on or off for the process (``torch.set_anomaly_enabled``)."""
    ANOMALY.enabled = _check_bool(enabled, "enabled", 1, "set_anomaly_enabled")
    ANOMALY.check_nan = _check_bool(check_nan, "check_nan", 2, "set_anomaly_enabled")
    record_forward_stacks(enabled)


def is_anomaly_enabled() -> bool:
    return ANOMALY.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return ANOMALY.check_nan


class detect_anomaly:  # noqa: N801 — torch's name
    """Within the region, backward raises where a node returns NaN gradients (with ``check_nan``). A context
    manager or a decorator.

    >>> import tilewise as tw
    >>> with tw.autograd.detect_anomaly():
    ...     tw.is_anomaly_enabled()
    True
    """

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self._saved: list[tuple[bool, bool]] = []
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should only be "
                      "enabled for debugging.", UserWarning, stacklevel=2)

    def __enter__(self):
        self._saved.append((ANOMALY.enabled, ANOMALY.check_nan))
        set_anomaly_enabled(True, self.check_nan)
        return self

    def __exit__(self, *exc) -> bool:
        set_anomaly_enabled(*self._saved.pop())
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper


class set_detect_anomaly:  # noqa: N801 — torch's name
    """Sets anomaly detection on or off at construction, so it works as a plain call; as a context manager it
    restores the previous setting on exit."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self._prev = (ANOMALY.enabled, ANOMALY.check_nan)
        set_anomaly_enabled(mode, check_nan)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        set_anomaly_enabled(*self._prev)
        return False


def check_node_outputs(node, grads) -> None:
    """torch's NaN check: the gradients a backward node returned hold no NaN."""
    for k, g in enumerate(grads):
        if g is not None and g.dtype.is_floating_point and bool(g.isnan().any()):
            raise RuntimeError(f"Function '{node.name()}' returned nan values in its {k}th output.")
