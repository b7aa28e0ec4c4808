"""nn.DataParallel: with no GPU it calls the module (torch's behaviour), keeps torch's ``module.`` state-dict
prefix, and its state dicts load in both directions; on GPUs (marked ``cuda``) the scattered, replicated and
gathered step equals the module on the whole batch, outputs and gradients."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

import tilewise as tw


def _model(lib):
    lib.manual_seed(0)
    return lib.nn.Sequential(lib.nn.Linear(6, 8), lib.nn.BatchNorm1d(8), lib.nn.ReLU(), lib.nn.Linear(8, 3))


def _weights_from_torch(ours, theirs):
    ours.load_state_dict({k: tw.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})


def test_without_a_gpu_it_calls_the_module_and_keeps_torchs_state_dict_prefix():
    theirs, ours = torch.nn.DataParallel(_model(torch)), tw.nn.DataParallel(_model(tw))
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(k.startswith("module.") for k in ours.state_dict())
    ours.load_state_dict({k: tw.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    y_ours, y_theirs = ours(tw.tensor(x)), theirs(torch.tensor(x))
    np.testing.assert_allclose(y_ours.detach().numpy(), y_theirs.detach().numpy(), rtol=1e-5, atol=1e-6)
    y_ours.sum().backward()
    y_theirs.sum().backward()
    np.testing.assert_allclose(ours.module[0].weight.grad.numpy(), theirs.module[0].weight.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    assert ours.device_ids == theirs.device_ids == []
    plain = _model(tw)
    plain.load_state_dict({k.removeprefix("module."): v for k, v in ours.state_dict().items()})


def test_the_functional_form_without_a_gpu():
    model = _model(tw).eval()
    x = tw.randn(4, 6)
    np.testing.assert_array_equal(tw.nn.parallel.data_parallel(model, x).detach().numpy(),
                                  model(x).detach().numpy())
    np.testing.assert_array_equal(tw.nn.parallel.data_parallel(model, (x,), module_kwargs={}).detach().numpy(),
                                  model(x).detach().numpy())


@pytest.fixture
def two_stand_in_devices(monkeypatch):
    """Two 'GPUs' that are the CPU: the scatter, replicas on threads, gather and backward all run."""
    import importlib

    dp = importlib.import_module("tilewise.nn.parallel.data_parallel")  # the module; the package's name is the function
    current = []
    monkeypatch.setattr(dp, "_available_devices", lambda: [0, 1])
    monkeypatch.setattr(dp, "_to_device", lambda index: tw.device("cpu"))
    monkeypatch.setattr(dp, "_make_current", current.append)
    monkeypatch.setattr(dp, "_check_balance", lambda ids: None)
    return current


def test_scattered_replicas_on_threads_give_each_slices_output_and_the_summed_gradients(two_stand_in_devices):
    tw.manual_seed(0)
    model, reference = _model(tw), _model(tw)
    reference.load_state_dict(model.state_dict())
    wrapped = tw.nn.DataParallel(model)
    assert wrapped.device_ids == [0, 1] and wrapped.output_device == 0
    x = tw.randn(7, 6)
    out = wrapped(x)
    assert sorted(two_stand_in_devices) == [0, 1], "each replica's thread made its device current"
    out.pow(2).sum().backward()
    start, grads = 0, {}
    for part in x.chunk(2):  # batch norm normalises each replica's slice by itself, as in torch
        one = _model(tw)
        one.load_state_dict(reference.state_dict())
        y = one(part)
        np.testing.assert_allclose(out[start:start + part.shape[0]].detach().numpy(), y.detach().numpy(),
                                   rtol=1e-6, atol=1e-6)
        y.pow(2).sum().backward()
        for name, p in one.named_parameters():
            grads[name] = p.grad if name not in grads else grads[name] + p.grad
        start += part.shape[0]
    for name, p in model.named_parameters():
        assert p.is_leaf and p.grad is not None, name
        np.testing.assert_allclose(p.grad.numpy(), grads[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]


def test_keyword_arguments_containers_and_scalars_are_scattered_and_gathered(two_stand_in_devices):
    Out = collections.namedtuple("Out", "double total")

    class Model(tw.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = tw.nn.Parameter(tw.tensor(3.0))

        def forward(self, x, extra=None, factor=1):
            return {"out": Out(x * self.scale * factor, (x * self.scale).sum()), "extra": extra, "none": None}

    x = tw.arange(10.0).reshape(5, 2)
    with pytest.warns(UserWarning, match="all input tensors were scalars; will instead unsqueeze"):
        got = tw.nn.DataParallel(Model())(x, extra=[x + 1, {"k": x * 0}], factor=2)
    assert isinstance(got["out"], Out) and got["none"] is None
    np.testing.assert_array_equal(got["out"].double.detach().numpy(), (x * 6).numpy())
    np.testing.assert_array_equal(got["out"].total.detach().numpy(), [3 * x[:3].sum().item(), 3 * x[3:].sum().item()])
    np.testing.assert_array_equal(got["extra"][0].numpy(), (x + 1).numpy())
    np.testing.assert_array_equal(got["extra"][1]["k"].numpy(), np.zeros((5, 2)))


def test_a_batch_smaller_than_the_devices_runs_fewer_replicas_and_no_grad_detaches(two_stand_in_devices):
    model = tw.nn.Linear(3, 2)
    with tw.no_grad():
        out = tw.nn.DataParallel(model)(tw.ones(1, 3))
    assert out.shape == (1, 2) and not out.requires_grad
    assert two_stand_in_devices == [0]


def test_an_exception_in_a_replica_reaches_the_caller(two_stand_in_devices):
    class Failing(tw.nn.Module):
        def forward(self, x):
            if x.shape[0] < 3:
                raise ValueError("a replica failed")
            return x

    with pytest.raises(ValueError, match="a replica failed"):
        tw.nn.DataParallel(Failing())(tw.ones(5, 2))


# ---------------------------------------------------------------------------- on GPUs

Pair = collections.namedtuple("Pair", "logits hidden")


class TwoOutputs(tw.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = tw.nn.Sequential(tw.nn.Linear(6, 8), tw.nn.BatchNorm1d(8), tw.nn.ReLU())
        self.head = tw.nn.Linear(8, 3)

    def forward(self, x, scale=1.0, extra=None):
        hidden = self.body(x) * scale
        out = {"pair": Pair(self.head(hidden), hidden), "loss": self.head(hidden).pow(2).mean()}
        if extra is not None:
            out["extra"] = extra * 2
        return out


def _gpus(n):
    found = tw.cuda.device_count() if tw.cuda.is_available() else 0
    if found < n:
        pytest.skip(f"needs {n} GPUs; {found} found")


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [8, 7, 5])
def test_on_two_gpus_outputs_and_gradients_equal_each_slice_on_the_module(batch):
    """Each replica runs one slice (batch norm normalises each slice with its own statistics, as in torch), so
    the gathered outputs are the slices' outputs and the gradients their sum."""
    _gpus(2)
    tw.manual_seed(0)
    reference = TwoOutputs().cuda()
    model = _copy_of(reference)
    wrapped = tw.nn.DataParallel(model, device_ids=[0, 1])
    x = tw.randn(batch, 6, device="cuda")
    extra = tw.randn(batch, 2, device="cuda")
    with pytest.warns(UserWarning, match="all input tensors were scalars"):
        got = wrapped(x, scale=0.5, extra=extra)
    assert isinstance(got["pair"], Pair) and got["pair"].logits.device == tw.device("cuda", 0)
    assert tuple(got["loss"].shape) == (2,)  # one 0-d loss per replica, stacked
    np.testing.assert_allclose(got["extra"].cpu().numpy(), (extra * 2).cpu().numpy())
    got["pair"].logits.sum().backward()
    start, expected = 0, None
    for part in x.chunk(2):
        one = _copy_of(reference)
        logits = one(part, scale=0.5)["pair"].logits
        np.testing.assert_allclose(got["pair"].logits[start:start + part.shape[0]].detach().cpu().numpy(),
                                   logits.detach().cpu().numpy(), rtol=1e-5, atol=1e-5)
        logits.sum().backward()
        expected = one.head.weight.grad if expected is None else expected + one.head.weight.grad
        start += part.shape[0]
    assert model.head.weight.grad.device == tw.device("cuda", 0)
    np.testing.assert_allclose(model.head.weight.grad.cpu().numpy(), expected.cpu().numpy(), rtol=1e-5, atol=1e-5)


def _copy_of(module):
    copy = TwoOutputs().cuda()
    copy.load_state_dict(module.state_dict())
    return copy


@pytest.mark.cuda
def test_on_two_gpus_a_training_step_equals_summing_each_slices_step():
    _gpus(2)
    tw.manual_seed(0)
    net = tw.nn.Sequential(tw.nn.Linear(6, 8), tw.nn.ReLU(), tw.nn.Linear(8, 3)).cuda()
    twin = tw.nn.Sequential(tw.nn.Linear(6, 8), tw.nn.ReLU(), tw.nn.Linear(8, 3)).cuda()
    twin.load_state_dict(net.state_dict())
    x, y = tw.randn(10, 6, device="cuda"), tw.randint(0, 3, (10,), device="cuda")
    loss = tw.nn.functional.cross_entropy(tw.nn.DataParallel(net)(x), y)
    loss.backward()
    tw.nn.functional.cross_entropy(twin(x), y).backward()
    for a, b in zip(net.parameters(), twin.parameters()):
        np.testing.assert_allclose(a.grad.cpu().numpy(), b.grad.cpu().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_on_one_gpu_it_moves_the_module_there_and_calls_it():
    _gpus(1)
    model = _model(tw)
    wrapped = tw.nn.DataParallel(model, device_ids=[0])
    assert model[0].weight.device == tw.device("cuda", 0)
    x = tw.randn(4, 6, device="cuda")
    np.testing.assert_allclose(wrapped(x).detach().cpu().numpy(), model(x).detach().cpu().numpy())


@pytest.mark.cuda
def test_parameters_off_the_first_device_are_refused_with_torchs_message():
    _gpus(1)
    wrapped = tw.nn.DataParallel(tw.nn.Linear(3, 2).cuda(), device_ids=[0])
    wrapped.module.cpu()
    with pytest.raises(RuntimeError, match=r"module must have its parameters and buffers on device cuda:0 "
                                           r"\(device_ids\[0\]\) but found one of them on device: cpu"):
        wrapped(tw.randn(2, 3, device="cuda"))
