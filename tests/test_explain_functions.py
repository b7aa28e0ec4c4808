"""tilewise.explain for whole functions and training steps, and ``tilewise explain script.py:function``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from childenv import python_path
from torch.utils.flop_counter import FlopCounterMode

import tilewise as tw
from tilewise import nn
from tilewise.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = 1 << 20  # bytes per roofline measurement

MLP_SCRIPT = """
import tilewise as tw
from tilewise import nn

tw.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
opt = tw.optim.SGD(model.parameters(), lr=0.1)


def train_step(x, y):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss

"""


def _mlp_step():
    tw.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, train_step, (tw.randn(8, 16), tw.randint(0, 4, (8,)))


def _titles(text: str) -> list[str]:
    return re.findall(r"^== (.+?) =+$", text, flags=re.M)


# ---------------------------------------------------------------------------- the function form

def test_a_training_step_lists_what_the_compiled_program_runs_each_step_timed():
    model, step, args = _mlp_step()
    explained = tw.explain(step, *args, repeats=3, roofline_size=SMALL)
    programs = explained.compiled.programs()
    assert programs, "the training step compiled nothing"
    steps = [s for p in programs for s in p.steps]
    assert [r.text for r in explained.kernels] == [s.describe() for s in steps]
    ran = [r.name for r in explained.kernels if r.kind == "kernel"]
    assert ran == [k.name for p in programs for k in p.kernels]
    steady = explained.kernels[-1].program  # the program later calls run (a first call leaves gradients behind)
    gemms = [r.name for r in explained.kernels if r.kind == "library call" and r.program == steady]
    assert gemms.count("mm") == 5  # 2 forward, 3 backward (no gradient for the input)
    timed = [r for r in explained.kernels if r.times]
    assert {r.program for r in timed} == {steady}
    assert all(r.times for r in explained.kernels if r.program == steady)
    assert all(r.seconds > 0 and len(r.times) == 3 and r.placement is not None for r in timed)
    assert all(r.times or "ran only in the calls that compiled" in r.untimed for r in explained.kernels)
    assert any(r.kind == "kernel" for r in timed)
    text = str(explained)
    titles = _titles(text)
    assert titles[:3] == ["the call", "operators", "eager"] and titles[-2:] == ["roofline", "run"]
    assert any(t.endswith("generated C") for t in titles) and any(t.endswith("graph passes") for t in titles)
    assert "train_step at " in text and "float32[8, 16] on cpu, int64[8] on cpu" in text
    roofline = explained.section("roofline")
    assert roofline.count(" ms; ") == len(timed) and "bound; achieved" in roofline
    assert "not compared with eager (the call updates state" in explained.section("run")


def test_the_steps_gemm_flops_are_what_torch_counts_for_the_same_step():
    model, step, args = _mlp_step()
    explained = tw.explain(step, *args, repeats=1, roofline_size=SMALL)
    last = explained.kernels[-1].program
    ours = sum(r.flops for r in explained.kernels if r.kind == "library call" and r.program == last)

    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(reference(x), y).backward()
    assert ours == counter.get_total_flops()


def test_the_graph_after_each_pass_is_what_compile_kept():
    explained = tw.explain(lambda x: (x * 2).relu().sum(), tw.randn(32), repeats=1, roofline_size=SMALL)
    (program,) = explained.compiled.programs()
    names = [name for name, _ in program.passes]
    assert names[0] == "captured" and "decompose" in names and "functionalize" in names
    passes = explained.section("graph passes")
    assert passes.startswith("graph captured") or "captured" in passes.splitlines()[0]
    assert all(f"after {name}" in passes for name in names[1:])
    assert "largest difference from eager 0" in explained.section("run") or \
        re.search(r"largest difference from eager \d", explained.section("run"))


def test_a_pure_function_is_compared_with_eager():
    x = tw.randn(64, 64)
    explained = tw.explain(lambda x: x.softmax(-1), x, repeats=2, roofline_size=SMALL)
    diff = float(re.search(r"largest difference from eager (\S+)", explained.section("run")).group(1))
    assert diff < 1e-6
    (record,) = [r for r in explained.kernels if r.kind == "kernel"]
    assert record.nbytes == 2 * 64 * 64 * 4 and record.flops > 3 * 64 * 64


def test_expression_and_function_forms_use_one_machinery(capsys):
    assert main(["explain", "x * y", "--shape", "16", "--shape", "16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    titles = _titles(out)
    assert titles[:5] == ["the call", "operators", "eager", "graph passes", "fusion"]
    assert "x * y\n  with float32[16] on cpu, float32[16] on cpu" in out
    assert re.search(r"step 0 kernel k0_mul: [\d.]+ ms; 192 B, 16 FLOP", out)


def test_arch_without_cuda_target_is_refused():
    with pytest.raises(ValueError, match="arch='sm_90' picks the machine code of the CUDA target"):
        tw.explain(lambda x: x + 1, tw.randn(4), target="c", arch="sm_90")
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        tw.explain(lambda x: x + 1, tw.randn(4), repeats=0)


def test_no_run_lowers_without_running():
    calls = []

    def fn(x):
        calls.append(1)
        return x.exp() + 1

    explained = tw.explain(fn, tw.randn(8), run=False)
    assert calls == [1]  # recorded once, never run
    assert explained.section("run").startswith("not run: run=False")
    (record,) = explained.kernels
    assert (record.kind, record.nbytes, record.flops, record.times) == ("kernel", 64, 16, [])


# ---------------------------------------------------------------------------- CUDA code without a GPU

@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_a_training_step_down_to_sass_for_an_arch_without_a_gpu(arch):
    pytest.importorskip("cuda.bindings.nvrtc")
    model, step, args = _mlp_step()
    before = [p.detach().clone() for p in model.parameters()]
    explained = tw.explain(step, *args, arch=arch)
    titles = [t for t, _ in explained]
    assert "generated CUDA C" in titles
    ptx = [text for title, text in explained if title.endswith(f"PTX ({arch})")]
    sass = [text for title, text in explained if title.endswith(f"SASS ({arch})")]
    kernels = [r for r in explained.kernels if r.kind == "kernel"]
    assert len(ptx) == len(sass) == len(kernels) > 0
    assert all(f".target {arch}" in text for text in ptx)
    assert all("registers/thread" in text or "nvdisasm not found" in text for text in sass)
    assert "_addmm_activation" in [r.name for r in explained.kernels]  # the CUDA target's GEMM epilogue
    assert explained.section("run").startswith("not run: the arguments are on cpu, the code is for the cuda")
    if "registers/thread" in sass[0]:
        assert all("theoretical occupancy" in r.resources for r in kernels)
    for old, new in zip(before, model.parameters()):  # nothing ran: the step did not train
        assert tw.equal(old, new)


def test_a_bf16_attention_step_lowers_for_cuda_without_a_gpu():
    """Whether cuDNN keeps an attention whole depends on the GPU's compute capability; lowering from CPU
    tensors there is no GPU to ask (it raised CUDA's unavailability), so the target's architecture decides."""
    pytest.importorskip("cuda.bindings.nvrtc")
    tw.manual_seed(0)
    proj = nn.Linear(32, 96)
    x = tw.randn(2, 16, 32)

    def step(x):
        with tw.autocast("cpu", dtype=tw.bfloat16):
            q, k, v = proj(x).view(2, 16, 3, 4, 8).permute(2, 0, 3, 1, 4)
            y = tw.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.float().square().mean().backward()

    explained = tw.explain(step, x, arch="sm_90")
    assert explained.section("run").startswith("not run: the arguments are on cpu, the code is for the cuda")
    assert any(r.kind == "kernel" for r in explained.kernels)


# ---------------------------------------------------------------------------- the command line

def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "step.py"
    path.write_text(textwrap.dedent(body))
    return path


def _explain_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: tilewise explain" in err and "Accepted forms: tilewise explain \"EXPR\"" in err
    assert "path/to/script.py:function" in err
    return err


def test_the_script_form_runs_the_scripts_function_with_its_args(tmp_path):
    path = _script(tmp_path, MLP_SCRIPT + "ARGS = (tw.randn(8, 16), tw.randint(0, 4, (8,)))\n")
    run = subprocess.run([sys.executable, "-m", "tilewise", "explain", f"{path}:train_step", "--repeats", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": python_path()})
    assert run.returncode == 0, run.stderr
    titles = _titles(run.stdout)
    assert titles[:3] == ["the call", "operators", "eager"] and titles[-2:] == ["roofline", "run"]
    line = MLP_SCRIPT.splitlines().index("def train_step(x, y):") + 1
    assert f"train_step at {path}:{line}" in run.stdout
    assert re.search(r"step \d+ kernel \w+: [\d.]+ ms; ", run.stdout)


def test_the_readmes_example_step_explains(capsys):
    assert main(["explain", str(ROOT / "examples" / "explain_step.py") + ":train_step", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "== roofline" in out and re.search(r"step \d+ library call mm: [\d.]+ ms; ", out), out[-2000:]


def test_args_may_be_a_function(tmp_path, capsys):
    path = _script(tmp_path, "import tilewise as tw\n\ndef f(x):\n    return x + 1\n\n"
                   "def ARGS():\n    return (tw.ones(4),)\n")
    assert main(["explain", f"{path}:f", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "float32[4] on cpu" in out and "kernel k0_add" in out


def test_script_errors_point_at_the_problem(tmp_path, capsys):
    missing = tmp_path / "nowhere.py"
    assert f"no script '{missing}'" in _explain_error(capsys, f"{missing}:f")
    path = _script(tmp_path, "import tilewise as tw\n\ndef f(x):\n    return x + 1\n\nvalue = 3\n")
    assert f"{path} has no function 'g'; its functions: f" in _explain_error(capsys, f"{path}:g")
    assert f"{path} is not a function 'value'" in _explain_error(capsys, f"{path}:value")
    assert f"{path} defines no ARGS: add ARGS = (...)" in _explain_error(capsys, f"{path}:f")
    assert f"name the function after the script, as in {path}:train_step" in _explain_error(capsys, str(path))
    listed = _script(tmp_path, "import tilewise as tw\n\ndef f(x):\n    return x\n\nARGS = [tw.ones(2)]\n")
    assert "ARGS is a list; it must be a tuple of f's arguments" in _explain_error(capsys, f"{listed}:f")


def test_expression_errors_point_at_the_problem(capsys):
    err = _explain_error(capsys, "x.relu( +")
    assert "the expression does not parse" in err and "  x.relu( +\n" in err
    err = _explain_error(capsys, "x + y", "--shape", "4")
    assert "unknown name(s) y (y: give one --shape per input); it may use x, tw and F" in err
    assert "unknown name(s) nope" in _explain_error(capsys, "tw.relu(nope)")
    assert "unknown dtype 'float33'" in _explain_error(capsys, "x + 1", "--dtype", "float33")
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", "x + 1", "--arch", "sm90"])
    assert exit_info.value.code == 2
    assert "argument --arch: unknown CUDA target 'sm90': expected e.g. 'sm_90'" in capsys.readouterr().err


# ---------------------------------------------------------------------------- on a GPU

@pytest.mark.cuda
def test_cuda_steps_are_timed_with_events():
    x, y = tw.randn(1 << 20, device="cuda"), tw.randn(1 << 20, device="cuda")
    explained = tw.explain(lambda x, y: (x + y).relu() * 2, x, y, repeats=5, roofline_size=64 << 20)
    (kernel,) = [r for r in explained.kernels if r.kind == "kernel"]
    assert len(kernel.times) == 5 and kernel.seconds > 0
    assert kernel.nbytes == 12 << 20 and kernel.placement.bound == "memory"
    assert "theoretical occupancy" in kernel.resources
    assert explained.roofline.device == "cuda:0"
    roofline = explained.section("roofline")
    assert "CUPTI's kernel records per step" in roofline or "CUDA events per step" in roofline
    if kernel.placement.fraction > 1:  # 12 MB stay in an H100/H200's L2 between the timed calls
        assert "above the memory roofline: the step read operands the cache still held" in roofline


def test_a_library_call_whose_tuple_result_leaves_outputs_out_is_recorded():
    """cuDNN attention's optional outputs are None where nothing asked for them: its bytes are the rest's."""
    from tilewise.compiler.ir import Node, TensorType
    from tilewise.profiler.explain import _library_record

    t = TensorType((4, 8), tw.float32, tw.device("cpu"))
    a = Node("input", (), (0,), t)
    call = Node("_scaled_dot_product_cudnn_attention", (a, a, a), (), (t, None, None))
    record = _library_record("", 3, call, "text")
    assert (record.kind, record.nbytes, record.dtype) == ("library call", 4 * t.nbytes, "float32")


def test_explaining_a_compiled_function_reuses_its_programs():
    def f(x):
        return (x * 2 + 1).relu().sum()

    compiled = tw.compile(f)
    x = tw.randn(64)
    compiled(x)
    programs = compiled.programs()
    explained = tw.explain(compiled, x, repeats=2)
    assert explained.compiled is compiled
    assert compiled.programs() == programs  # nothing compiled again
    assert explained.call.startswith("test_explaining_a_compiled_function_reuses_its_programs.<locals>.f")
    assert all(r.seconds is not None for r in explained.kernels)
