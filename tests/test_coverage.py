"""The coverage report: its name list is the installed torch's, and docs/COVERAGE.md is what the command writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch  # noqa: F401  (the name list is recorded from it)

from tilewise import cli, coverage

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("torch_api_names", ROOT / "tests" / "torch_api_names.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recorded_names_are_the_installed_torchs():
    recorded = json.loads((ROOT / "tilewise" / "data" / "torch_api.json").read_text())
    assert recorded == json.loads(json.dumps(_generator().build())), \
        "tilewise/data/torch_api.json is stale: run python tests/torch_api_names.py"


def test_left_out_names_follow_the_rules():
    names = _generator()
    assert names.excluded_reason("sparse_coo_tensor") == "sparse tensors"
    assert names.excluded_reason("view_as_complex") == "complex numbers"
    assert names.excluded_reason("quantize_per_tensor") == "quantized tensors"
    assert names.excluded_reason("refine_names") == "named tensors"
    assert names.excluded_reason("matmul") is None and names.excluded_reason("LongTensor") is None


def test_present_missing_and_tested(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text("import torch\nimport tilewise as tw\ntw.matmul\nOpInfo('relu')\n")
    (tests / "test_b.py").write_text("import tilewise as tw\ntw.softmax\n")  # does not compare with torch
    _, spaces, counted = coverage.measure(tests)
    torch_ns = next(ns for ns in spaces if ns.name == "torch")
    assert counted
    assert "matmul" in torch_ns.present and "matmul" in torch_ns.tested and "relu" in torch_ns.tested
    assert "softmax" in torch_ns.present and "softmax" not in torch_ns.tested
    assert all(not coverage._exists(n) for n in torch_ns.missing)
    assert coverage.resolve("nn.functional.relu") is __import__("tilewise").nn.functional.relu
    with pytest.raises(LookupError):
        coverage.resolve("nn.no_such_layer")


def test_the_committed_report_is_what_the_command_writes(tmp_path):
    out = tmp_path / "COVERAGE.md"
    assert cli.main(["coverage", "--out", str(out)]) == 0
    assert out.read_text() == (ROOT / "docs" / "COVERAGE.md").read_text(), \
        "docs/COVERAGE.md is stale: run python -m tilewise coverage"
