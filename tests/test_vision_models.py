"""The benchmark's vision models (``benchmarks/vision_models.py``: ResNet-50's design at reduced widths, and the
UNet) against torch running the same source: from the same weights, the loss, every parameter's gradient and the
batch-norm running statistics, eager and with forward and backward compiled by ``tilewise.compile``; and under
bf16 autocast (on the CPU, and on a GPU), no further from torch's float32 results than torch's own bf16 ones."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import tilewise as tw

SOURCE = Path(__file__).resolve().parent.parent / "benchmarks" / "vision_models.py"


def models_for(library) -> types.ModuleType:
    """The model source as a module of ``library``: for torch, ``tilewise`` becomes ``torch`` in its import lines."""
    source = SOURCE.read_text()
    if library is torch:
        source = "".join(re.sub(r"\btilewise\b", "torch", line) if re.match(r"\s*(import|from)\s+tilewise\b", line)
                         else line for line in source.splitlines(keepends=True))
    module = types.ModuleType(f"test_vision_models_on_{library.__name__}")
    sys.modules[module.__name__] = module
    exec(compile(source, str(SOURCE), "exec"), module.__dict__)
    return module


MODELS = {library: models_for(library) for library in (torch, tw)}


def narrow_resnet(models):
    # two blocks in the first stage: one block with a downsampling shortcut and one with the identity
    return models.ResNet(models.Bottleneck, [2, 1, 1, 1], num_classes=10, base_planes=8)


def small_unet(models):
    return models.UNet(3, num_classes=5, base=8, depth=3)


# name -> (builder, input shape, label shape, classes); 64x64 keeps ResNet's last stage at 2x2, so its batch norm
# sees 8 values a channel (2 values a channel make the normalised values +-1 and the gradients ill-conditioned)
CASES = {"resnet": (narrow_resnet, (2, 3, 64, 64), (2,), 10), "unet": (small_unet, (2, 3, 32, 32), (2, 32, 32), 5)}


def pair(name: str):
    """(torch model, tilewise model with torch's initial weights, input, labels) as numpy-built tensors."""
    build, x_shape, y_shape, classes = CASES[name]
    torch.manual_seed(0)
    theirs = build(MODELS[torch])
    ours = build(MODELS[tw])
    ours.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(0)
    return theirs, ours, rng.standard_normal(x_shape, dtype=np.float32), rng.integers(0, classes, y_shape)


def loss_and_backward(functional, model, x, y):
    loss = functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def loss_and_backward_in_bf16(model, x, y):
    with tw.autocast(x.device.type, dtype=tw.bfloat16):
        loss = tw.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def assert_like_torch(theirs, ours, loss_theirs, loss_ours, rtol: float, grad_tol: float) -> None:
    assert float(loss_ours.item()) == pytest.approx(float(loss_theirs.item()), rel=rtol)
    ours_params = dict(ours.named_parameters())
    assert list(ours_params) == [name for name, _ in theirs.named_parameters()]
    for name, p in theirs.named_parameters():
        grad = ours_params[name].grad
        assert grad is not None, f"{name} has no gradient"
        expected, got = p.grad.numpy(), grad.cpu().numpy().astype(np.float64)
        error = np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-6)
        assert error < grad_tol, f"{name}: gradient differs by {error:.2e} of its largest element"
    ours_buffers = dict(ours.named_buffers())
    for name, b in theirs.named_buffers():
        np.testing.assert_allclose(ours_buffers[name].cpu().numpy(), b.numpy(), rtol=rtol, atol=rtol,
                                   err_msg=f"buffer {name}")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(CASES))
def test_vision_model_loss_and_gradients_match_torch(name, compiled):
    theirs, ours, x, y = pair(name)
    loss_theirs = loss_and_backward(torch.nn.functional, theirs, torch.from_numpy(x), torch.from_numpy(y))
    step = tw.compile(loss_and_backward) if compiled else loss_and_backward
    loss_ours = step(tw.nn.functional, ours, tw.from_numpy(x), tw.from_numpy(y))
    if compiled:
        assert not step.eager_reason, step.eager_reason
    assert_like_torch(theirs, ours, loss_theirs, loss_ours, rtol=1e-4, grad_tol=1e-4)


@pytest.mark.slow  # 12-26 s on 2 shared cores
def test_resnet50_in_float64_matches_torch():
    """The full ResNet-50 on a tiny batch: in float32 its gradients are too ill-conditioned to compare (torch's own
    float32 gradients differ from its float64 ones by a third of their largest element in the last stage, where
    batch norm sees 8 values a channel), in float64 they agree to rounding."""
    torch.manual_seed(0)
    theirs = MODELS[torch].resnet50().double()
    ours = MODELS[tw].resnet50().double()
    ours.load_state_dict({k: tw.from_numpy(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3, 64, 64)), rng.integers(0, 1000, (2,))
    loss_theirs = loss_and_backward(torch.nn.functional, theirs, torch.from_numpy(x), torch.from_numpy(y))
    loss_ours = loss_and_backward(tw.nn.functional, ours, tw.from_numpy(x), tw.from_numpy(y))
    assert ours.fc.weight.dtype == tw.float64
    assert_like_torch(theirs, ours, loss_theirs, loss_ours, rtol=1e-9, grad_tol=1e-9)


@pytest.mark.parametrize("name", list(CASES))
def test_vision_model_in_eval_mode_matches_torch(name):
    theirs, ours, x, _ = pair(name)
    theirs.eval(), ours.eval()
    with torch.no_grad(), tw.no_grad():
        expected, got = theirs(torch.from_numpy(x)).numpy(), ours(tw.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def relative_errors(model, reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Each parameter's gradient's distance from ``reference``'s, relative to the latter's norm."""
    return {name: float(np.linalg.norm(p.grad.cpu().float().numpy() - expected) / np.linalg.norm(expected))
            for (name, p), expected in zip(model.named_parameters(), reference.values())}


def torch_bf16_device(device: str) -> str:
    """Where torch runs its bf16 side: beside ours, or on the CPU where this torch has no CUDA."""
    return device if device == "cpu" or torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(CASES))
def test_vision_model_under_bf16_autocast_errs_no_more_than_torch(name, compiled, device):
    """Under bf16 autocast, tilewise's loss and gradients are as far from torch's float32 ones as torch's own under
    bf16 autocast are (within 2x, plus 1%): these small batch-normed networks are ill-conditioned enough that bf16
    moves torch's own gradients by up to their whole norm, so an element-wise tolerance would test nothing."""
    theirs, ours, x, y = pair(name)
    torch_device = torch_bf16_device(device)
    theirs_bf16 = pair(name)[0].to(torch_device)
    loss_fp32 = float(loss_and_backward(torch.nn.functional, theirs, torch.from_numpy(x), torch.from_numpy(y)).item())
    reference = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    with torch.autocast(torch_device, dtype=torch.bfloat16):
        loss_torch = torch.nn.functional.cross_entropy(theirs_bf16(torch.from_numpy(x).to(torch_device)),
                                                       torch.from_numpy(y).to(torch_device))
    loss_torch.backward()
    ours.to(device)
    step = tw.compile(loss_and_backward_in_bf16) if compiled else loss_and_backward_in_bf16
    loss_ours = float(step(ours, tw.from_numpy(x).to(device), tw.from_numpy(y).to(device)).item())
    if compiled:
        assert not step.eager_reason, step.eager_reason
    assert abs(loss_ours - loss_fp32) <= 2 * abs(float(loss_torch.item()) - loss_fp32) + 1e-2 * abs(loss_fp32)
    theirs_errors, ours_errors = relative_errors(theirs_bf16, reference), relative_errors(ours, reference)
    worse = {k: (ours_errors[k], theirs_errors[k]) for k in reference if ours_errors[k] > 2 * theirs_errors[k] + 1e-2}
    assert not worse, f"gradients further from float32 than torch's bf16 ones (ours, torch's): {worse}"
