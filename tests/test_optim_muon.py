"""optim.Muon against torch: the Newton-Schulz orthogonalisation bit for bit, the trajectory over several steps,
the state dict, the arguments and the refusals."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz as torch_newton_schulz

import tilewise as tw
from tilewise.optim.muon import _zeropower_via_newtonschulz


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 5), (16, 3)])
def test_newton_schulz_matches_torch_bit_for_bit(shape):
    g = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ours = _zeropower_via_newtonschulz(tw.tensor(g), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    theirs = torch_newton_schulz(torch.tensor(g), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    assert ours.dtype is tw.bfloat16 and ours.shape == tuple(theirs.shape)
    np.testing.assert_array_equal(ours.float().numpy(), theirs.float().numpy())


@pytest.mark.parametrize("kwargs", [dict(), dict(lr=0.02, nesterov=False, weight_decay=0.0),
                                    dict(lr=0.01, momentum=0.8, adjust_lr_fn="match_rms_adamw")],
                         ids=["default", "no-nesterov", "match-rms"])
def test_trajectory_follows_torch(kwargs):
    """The orthogonalised update is rounded to bfloat16, so a last-bit difference in the momentum buffer (tilewise's
    lerp is not fused) can move an update by a bfloat16 ulp: the parameters agree to well within one step."""
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (3, 7))]
    target = [rng.standard_normal(s).astype(np.float32) for s in ((6, 4), (3, 7))]
    results, states = [], []
    for lib in (tw, torch):
        params = [lib.nn.Parameter(lib.tensor(a.copy())) for a in init]
        opt = lib.optim.Muon(params, **kwargs)
        for _ in range(8):
            for p, t in zip(params, target):
                p.grad = (p.detach() - lib.tensor(t)) * 2
            opt.step()
        results.append([p.detach().numpy().copy() for p in params])
        states.append(opt.state_dict())
    for ours, theirs, start in zip(*results, init):
        moved = np.abs(theirs - start).max()
        np.testing.assert_allclose(ours, theirs, atol=0.02 * moved, rtol=0)
    assert states[0]["param_groups"] == states[1]["param_groups"]
    assert [list(s) for s in states[0]["state"].values()] == [["momentum_buffer"]] * 2


def test_arguments_printed_form_and_refusals_are_torchs():
    def described(lib):
        return [(p.name, p.kind, p.default) for p in inspect.signature(lib.optim.Muon).parameters.values()]

    assert described(tw) == described(torch)
    assert repr(tw.optim.Muon([tw.nn.Parameter(tw.zeros(2, 2))])) == \
        repr(torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]))
    for shape, kwargs in (((3,), {}), ((2, 2), dict(lr=-1.0)), ((2, 2), dict(momentum=-1.0)),
                          ((2, 2), dict(weight_decay=-1.0)), ((2, 2), dict(adjust_lr_fn="other"))):
        messages = []
        for lib in (tw, torch):
            with pytest.raises(ValueError) as info:
                lib.optim.Muon([lib.nn.Parameter(lib.zeros(shape))], **kwargs)
            messages.append(str(info.value).replace("tilewise.Size", "torch.Size"))
        assert messages[0] == messages[1]


def _muon_problem(device: str):
    rng = np.random.default_rng(2)
    values = [rng.standard_normal(s).astype(np.float32) for s in ((8, 5), (4, 9))]
    params = [tw.nn.Parameter(tw.tensor(v).to(device)) for v in values]
    targets = [tw.tensor(rng.standard_normal(tuple(p.shape)).astype(np.float32)).to(device) for p in params]
    return params, targets


def _run_muon(params, targets, opt, steps: int = 4):
    for _ in range(steps):
        for p, t in zip(params, targets):
            p.grad = (p.detach() - t) * 2
        opt.step()


def test_the_compiled_group_update_matches_the_loop():
    """On CUDA a group's update runs compiled by default; the compiled program (C here) gives the loop's values."""
    runs = []
    for compiled in (False, True):
        params, targets = _muon_problem("cpu")
        opt = tw.optim.Muon(params, lr=0.02)
        opt.param_groups[0]["foreach"] = compiled
        _run_muon(params, targets, opt)
        runs.append(params)
        assert len(opt.__dict__.get("_programs", {})) == int(compiled)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


def test_the_group_update_lowers_to_cuda_kernels_that_nvrtc_compiles():
    from tilewise.codegen.toolchain import compile_cached
    from tilewise.compiler.capture import trace
    from tilewise.compiler.passes import run_pipeline
    from tilewise.compiler.program import lower_program
    from tilewise.compiler.targets import CUDA_TARGET

    params, targets = _muon_problem("cpu")
    for p, t in zip(params, targets):
        p.grad = p.detach() - t
    opt = tw.optim.Muon(params)
    opt.init_state()
    low = lower_program(run_pipeline(trace(lambda: opt.step(), (), {}).graph), CUDA_TARGET)
    assert low.kernels
    for kernel, source in low.sources.items():
        compile_cached(source, kernel, "sm_90")


@pytest.mark.cuda
def test_the_default_compiled_update_on_cuda_matches_the_cpu_loop():
    runs = []
    for device in ("cpu", "cuda"):
        params, targets = _muon_problem(device)
        opt = tw.optim.Muon(params, lr=0.02)
        _run_muon(params, targets, opt)
        runs.append(params)
    for a, b in zip(*runs):
        np.testing.assert_allclose(b.detach().cpu().numpy(), a.detach().numpy(), rtol=1e-3, atol=1e-3)
