import os
import subprocess
import sys

import numpy as np
import pytest
from childenv import python_path

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
def _exact_float32_convolutions(request):
    """GPU tests compare float32 convolutions with torch's and between eager and compiled programs, which may pick
    different cuDNN plans: with TF32 (both libraries' default) each rounds its inputs to 10 bits differently, so
    these tests run with it off on both sides (a test about TF32 turns it on itself)."""
    if "cuda" not in request.keywords:
        yield
        return
    import tilewise as tw

    torch = sys.modules.get("torch")
    tw.backends.cudnn.allow_tf32 = False
    if torch is not None:
        torch.backends.cudnn.allow_tf32 = False
    yield
    tw.backends.cudnn.allow_tf32 = True
    if torch is not None:
        torch.backends.cudnn.allow_tf32 = True


@pytest.fixture
def torch_on_one_thread():
    """torch (the reference) on one intra-op thread: its threads spin on tiny operators when the machine is busy,
    and the rounding of some of its kernels followed the thread state earlier tests had left."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seeded():
    np.random.seed(int(os.environ.get("TILEWISE_TEST_SEED", "0")))
    yield


@pytest.fixture
def outputs_of_two_processes(tmp_path):
    """Run a Python script in two fresh processes sharing one ``TILEWISE_CACHE_DIR``; the words each printed."""
    def run(script: str) -> tuple[list[str], list[str]]:
        env = {**os.environ, "TILEWISE_CACHE_DIR": str(tmp_path), "PYTHONPATH": python_path()}
        first, second = (subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                        check=True).stdout.split() for _ in range(2))
        return first, second

    return run
