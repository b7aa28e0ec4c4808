"""Every operator in the table, forward and backward, against torch on CPU (float32 and float64)."""

from __future__ import annotations

import importlib
import pkgutil

import opinfos
import pytest
from opinfo import check_op


def all_opinfos():
    infos = []
    for mod in pkgutil.iter_modules(opinfos.__path__):
        infos += importlib.import_module(f"opinfos.{mod.name}").OPINFOS
    return infos


OPINFOS = all_opinfos()
CASES = [(info, dtype) for info in OPINFOS for dtype in info.dtypes]


@pytest.mark.parametrize("info,dtype", CASES, ids=[f"{i.name}-{d}" for i, d in CASES])
def test_op_matches_torch(info, dtype):
    for sample in info.samples():
        for seed in (0, 1):
            check_op(info, sample, dtype, seed, noncontiguous=False)
        if info.noncontiguous:
            check_op(info, sample, dtype, 2, noncontiguous=True)
