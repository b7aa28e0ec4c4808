import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the op table (opinfo, opinfos/) imports as top-level


def _gpu_available() -> bool:
    try:
        from tilewise.backends.cuda.runtime.driver import is_available
    except ImportError:
        return False
    return is_available()


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none found")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seeded():
    np.random.seed(int(os.environ.get("TILEWISE_TEST_SEED", "0")))
    yield
