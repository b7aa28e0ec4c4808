import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("TILEWISE_VERIFY", "1")  # every compiler pass's output is checked against the IR invariants
sys.path.insert(0, os.path.dirname(__file__))  # the op table (opinfo, opinfos/) imports as top-level


def _gpu_available() -> bool:
    try:
        from tilewise._cuda_api import is_available
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


@pytest.fixture
def outputs_of_two_processes(tmp_path):
    """Run a Python script in two fresh processes sharing one ``TILEWISE_CACHE_DIR``; the words each printed."""
    def run(script: str) -> tuple[list[str], list[str]]:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {**os.environ, "TILEWISE_CACHE_DIR": str(tmp_path), "PYTHONPATH": root}
        first, second = (subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                        check=True).stdout.split() for _ in range(2))
        return first, second

    return run
