"""tilewise.nn against torch.nn: module machinery, every layer's forward and backward, and whole training runs
(MLP, conv net, small Transformer) from the same initial weights (copied through DLPack) on the same data."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import tilewise as tw


def _copy_weights(model, ref) -> None:
    """Give the tilewise model the torch model's parameters and buffers (through DLPack)."""
    model.load_state_dict({k: v.detach() for k, v in ref.state_dict().items()})


def _close(ours, theirs, rtol=1e-5, atol=1e-5, what=""):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy(), dtype=np.float64),
                               theirs.detach().numpy().astype(np.float64), rtol=rtol, atol=atol, err_msg=what)


# ---------------------------------------------------------------------------- one layer at a time

def _float_input(shape, seed=0, low=-2.0, high=2.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def _int_input(shape, high, seed=0):
    return np.random.default_rng(seed).integers(0, high, size=shape)


LAYERS = {
    "Linear": (lambda nn: nn.Linear(5, 3), [(4, 5)]),
    "Linear-nobias-3d": (lambda nn: nn.Linear(5, 3, bias=False), [(2, 4, 5)]),
    "Bilinear": (lambda nn: nn.Bilinear(3, 4, 2), [(5, 3), (5, 4)]),
    "Identity": (lambda nn: nn.Identity(), [(2, 3)]),
    "Flatten": (lambda nn: nn.Flatten(), [(2, 3, 4)]),
    "Unflatten": (lambda nn: nn.Unflatten(1, (2, 3)), [(4, 6)]),
    "ReLU": (lambda nn: nn.ReLU(), [(3, 4)]),
    "ReLU6": (lambda nn: nn.ReLU6(), [(3, 4)]),
    "LeakyReLU": (lambda nn: nn.LeakyReLU(0.2), [(3, 4)]),
    "PReLU": (lambda nn: nn.PReLU(3, init=0.1), [(2, 3, 4)]),
    "GELU": (lambda nn: nn.GELU(), [(3, 4)]),
    "GELU-tanh": (lambda nn: nn.GELU("tanh"), [(3, 4)]),
    "SiLU": (lambda nn: nn.SiLU(), [(3, 4)]),
    "Mish": (lambda nn: nn.Mish(), [(3, 4)]),
    "Softplus": (lambda nn: nn.Softplus(2.0, 3.0), [(3, 4)]),
    "Hardswish": (lambda nn: nn.Hardswish(), [(3, 4)]),
    "Hardsigmoid": (lambda nn: nn.Hardsigmoid(), [(3, 4)]),
    "Hardtanh": (lambda nn: nn.Hardtanh(-0.5, 1.5), [(3, 4)]),
    "ELU": (lambda nn: nn.ELU(0.7), [(3, 4)]),
    "SELU": (lambda nn: nn.SELU(), [(3, 4)]),
    "CELU": (lambda nn: nn.CELU(1.3), [(3, 4)]),
    "Softsign": (lambda nn: nn.Softsign(), [(3, 4)]),
    "LogSigmoid": (lambda nn: nn.LogSigmoid(), [(3, 4)]),
    "Sigmoid": (lambda nn: nn.Sigmoid(), [(3, 4)]),
    "Tanh": (lambda nn: nn.Tanh(), [(3, 4)]),
    "Threshold": (lambda nn: nn.Threshold(0.1, 20.0), [(3, 4)]),
    "Softmax": (lambda nn: nn.Softmax(dim=1), [(3, 4)]),
    "LogSoftmax": (lambda nn: nn.LogSoftmax(dim=-1), [(3, 4)]),
    "Softmin": (lambda nn: nn.Softmin(dim=1), [(3, 4)]),
    "Softmax2d": (lambda nn: nn.Softmax2d(), [(2, 3, 4, 5)]),
    "Tanhshrink": (lambda nn: nn.Tanhshrink(), [(3, 4)]),
    "Hardshrink": (lambda nn: nn.Hardshrink(0.7), [(3, 4)]),
    "Softshrink": (lambda nn: nn.Softshrink(0.7), [(3, 4)]),
    "GLU": (lambda nn: nn.GLU(dim=1), [(3, 6)]),
    "CosineSimilarity": (lambda nn: nn.CosineSimilarity(dim=-1), [(3, 5), (3, 5)]),
    "ZeroPad2d": (lambda nn: nn.ZeroPad2d((1, 2, 0, 3)), [(2, 3, 4, 4)]),
    "Dropout2d-eval": (lambda nn: nn.Dropout2d(0.5).eval(), [(2, 3, 4, 4)]),
    "LayerNorm": (lambda nn: nn.LayerNorm(4), [(3, 4)]),
    "LayerNorm-2d-nobias": (lambda nn: nn.LayerNorm((3, 4), bias=False), [(2, 3, 4)]),
    "RMSNorm": (lambda nn: nn.RMSNorm(4, eps=1e-6), [(3, 4)]),
    "GroupNorm": (lambda nn: nn.GroupNorm(2, 4), [(3, 4, 5)]),
    "BatchNorm1d": (lambda nn: nn.BatchNorm1d(4), [(6, 4)]),
    "BatchNorm1d-3d": (lambda nn: nn.BatchNorm1d(4, momentum=None), [(6, 4, 3)]),
    "BatchNorm2d": (lambda nn: nn.BatchNorm2d(3), [(4, 3, 5, 5)]),
    "BatchNorm2d-eval": (lambda nn: nn.BatchNorm2d(3).eval(), [(4, 3, 5, 5)]),
    "BatchNorm2d-no-stats-no-affine": (lambda nn: nn.BatchNorm2d(3, affine=False, track_running_stats=False),
                                       [(4, 3, 5, 5)]),
    "Embedding": (lambda nn: nn.Embedding(10, 3), ["ids"]),
    "Embedding-padding": (lambda nn: nn.Embedding(10, 3, padding_idx=0), ["ids"]),
    "Conv1d": (lambda nn: nn.Conv1d(3, 4, 3, stride=2, padding=1), [(2, 3, 9)]),
    "Conv1d-reflect": (lambda nn: nn.Conv1d(2, 4, 3, padding=1, padding_mode="reflect"), [(2, 2, 7)]),
    "Conv2d": (lambda nn: nn.Conv2d(3, 4, 3, padding=1), [(2, 3, 6, 6)]),
    "Conv2d-strided-dilated-groups": (lambda nn: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 2), groups=2),
                                      [(2, 4, 7, 7)]),
    "Conv2d-same": (lambda nn: nn.Conv2d(2, 3, 4, padding="same"), [(1, 2, 6, 6)]),
    "MaxPool2d": (lambda nn: nn.MaxPool2d(2), [(2, 3, 6, 6)]),
    "MaxPool2d-padded": (lambda nn: nn.MaxPool2d(3, stride=2, padding=1), [(2, 3, 7, 7)]),
    "AvgPool2d": (lambda nn: nn.AvgPool2d(2), [(2, 3, 6, 6)]),
    "AdaptiveAvgPool2d": (lambda nn: nn.AdaptiveAvgPool2d((2, 3)), [(2, 3, 7, 8)]),
    "Dropout-eval": (lambda nn: nn.Dropout(0.5).eval(), [(3, 4)]),
    "MultiheadAttention": (lambda nn: nn.MultiheadAttention(8, 2, batch_first=True), [(2, 5, 8)] * 3),
    "TransformerEncoderLayer": (lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                [(2, 5, 8)]),
    "TransformerEncoderLayer-norm-first-gelu": (
        lambda nn: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", norm_first=True), [(5, 2, 8)]),
}


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_torch(name):
    make, shapes = LAYERS[name]
    torch.manual_seed(0)
    ref = make(torch.nn)
    layer = make(tw.nn)
    if not ref.training:
        layer.eval()
    _copy_weights(layer, ref)
    arrays = [_int_input((3, 4), 10, seed=k) if s == "ids" else _float_input(s, seed=k) for k, s in enumerate(shapes)]
    ours_in = [tw.tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]
    out, ref_out = layer(*ours_in), ref(*theirs_in)
    if isinstance(ref_out, tuple):
        _close(out[1], ref_out[1], what="attention weights")
        out, ref_out = out[0], ref_out[0]
    _close(out, ref_out, what="output")
    grad = _float_input(tuple(ref_out.shape), seed=99)
    out.backward(tw.tensor(grad))
    ref_out.backward(torch.tensor(grad))
    for k, (a, b) in enumerate(zip(ours_in, theirs_in)):
        if b.grad is not None:
            _close(a.grad, b.grad, rtol=1e-4, atol=1e-5, what=f"grad of input {k}")
    ours = dict(layer.named_parameters())
    for pname, p in ref.named_parameters():
        _close(ours[pname].grad, p.grad, rtol=1e-4, atol=1e-5, what=f"grad of {pname}")
    for bname, b in ref.named_buffers():
        _close(dict(layer.named_buffers())[bname], b, what=f"buffer {bname}")


LOSSES = {
    "MSELoss": (lambda nn: nn.MSELoss(), "float"),
    "L1Loss-sum": (lambda nn: nn.L1Loss(reduction="sum"), "float"),
    "SmoothL1Loss": (lambda nn: nn.SmoothL1Loss(beta=0.5), "float"),
    "HuberLoss": (lambda nn: nn.HuberLoss(delta=0.7), "float"),
    "KLDivLoss-batchmean": (lambda nn: nn.KLDivLoss(reduction="batchmean"), "log_prob"),
    "CrossEntropyLoss": (lambda nn: nn.CrossEntropyLoss(), "class"),
    "CrossEntropyLoss-smoothing-ignore": (lambda nn: nn.CrossEntropyLoss(ignore_index=1, label_smoothing=0.1),
                                          "class"),
    "NLLLoss-none": (lambda nn: nn.NLLLoss(reduction="none"), "class"),
    "BCELoss": (lambda nn: nn.BCELoss(), "prob"),
    "BCEWithLogitsLoss": (lambda nn: nn.BCEWithLogitsLoss(), "binary"),
}


@pytest.mark.parametrize("name", LOSSES)
def test_loss_module_matches_torch(name):
    make, kind = LOSSES[name]
    x = _float_input((6, 4))
    if kind == "prob":
        x = 1 / (1 + np.exp(-x))
    if kind == "log_prob":
        x = x - np.log(np.exp(x).sum(1, keepdims=True))
    target = {"float": _float_input((6, 4), seed=1), "class": _int_input((6,), 4, seed=1),
              "prob": _float_input((6, 4), seed=1, low=0, high=1),
              "binary": _int_input((6, 4), 2, seed=1).astype(np.float32),
              "log_prob": _float_input((6, 4), seed=1, low=0.05, high=1)}[kind]
    ours_x, theirs_x = tw.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = make(tw.nn)(ours_x, tw.tensor(target))
    ref = make(torch.nn)(theirs_x, torch.tensor(target))
    _close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    _close(ours_x.grad, theirs_x.grad)


def test_dropout_in_training_zeroes_and_rescales():
    tw.manual_seed(0)
    out = tw.nn.Dropout(0.25)(tw.ones(4000))
    values = set(np.unique(out.numpy()).tolist())
    assert values <= {0.0, float(np.float32(1 / 0.75))}
    assert abs((out.numpy() == 0).mean() - 0.25) < 0.03
    channels = tw.nn.Dropout2d(0.5)(tw.ones(8, 50, 3, 3)).numpy()
    assert (channels.min(axis=(2, 3)) == channels.max(axis=(2, 3))).all()


# ---------------------------------------------------------------------------- whole training runs

def _train(lib, model, optimizer, batches, loss_fn) -> list[float]:
    losses = []
    for x, y in batches:
        loss = loss_fn(lib, model(lib.tensor(x)), lib.tensor(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _cross_entropy(lib, logits, target):
    return lib.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _compare_training(make, batches, make_opt, steps_loss_tol=2e-5, param_tol=1e-4):
    torch.manual_seed(0)
    ref = make(torch.nn)
    model = make(tw.nn)
    _copy_weights(model, ref)
    ours = _train(tw, model, make_opt(tw.optim, model.parameters()), batches, _cross_entropy)
    theirs = _train(torch, ref, make_opt(torch.optim, ref.parameters()), batches, _cross_entropy)
    np.testing.assert_allclose(ours, theirs, rtol=steps_loss_tol, atol=steps_loss_tol)
    assert theirs[-1] < theirs[0]
    ours_state = model.state_dict()
    for name, value in ref.state_dict().items():
        _close(ours_state[name], value, rtol=param_tol, atol=param_tol, what=name)


def test_mlp_training_matches_torch():
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((32, 10)).astype(np.float32), rng.integers(0, 3, 32)) for _ in range(30)]
    _compare_training(lambda nn: nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(),
                                               nn.Linear(32, 3)),
                      batches, lambda optim, params: optim.SGD(params, lr=0.1, momentum=0.9))


def test_conv_net_training_matches_torch():
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((8, 3, 12, 12)).astype(np.float32), rng.integers(0, 4, 8)) for _ in range(2)]
    batches = data * 6

    def make(nn):
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))

    _compare_training(make, batches, lambda optim, params: optim.Adam(params, lr=1e-2))


class _TinyTransformer:
    """Token embedding, two encoder layers with a causal mask, and a vocabulary head — in either framework."""

    def __new__(cls, nn):
        lib = torch if nn is torch.nn else tw

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(12, 16)
                layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True)
                self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                self.head = nn.Linear(16, 12)

            def forward(self, idx):
                length = idx.shape[1]
                mask = lib.ones(length, length).triu(1).bool()
                return self.head(self.encoder(self.emb(idx), mask=mask))

        return Model()


def test_small_transformer_training_matches_torch():
    rng = np.random.default_rng(2)
    batches = []
    for _ in range(15):
        seq = (rng.integers(0, 12, (4, 1)) + 3 * np.arange(9)) % 12
        batches.append((seq[:, :-1], seq[:, 1:]))
    # SGD rather than Adam: the key projection's bias has an exactly-zero gradient in exact arithmetic (softmax
    # ignores a shift shared by all keys), and Adam would amplify its rounding noise into full-size steps
    _compare_training(_TinyTransformer, batches, lambda optim, params: optim.SGD(params, lr=0.1, momentum=0.9))


def test_gpt_model_trains_and_generates():
    from tilewise.models import GPT, GPTConfig

    tw.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, n_embd=16))
    assert model.head.weight is model.tok_emb.weight
    assert {n for n, _ in model.named_parameters()} >= {"tok_emb.weight", "pos_emb.weight", "ln_f.weight"}
    opt = tw.optim.AdamW(model.parameters(), lr=1e-2)
    seq = tw.tensor([[k % 8 for k in range(9)]] * 4)
    losses = []
    for _ in range(30):
        _, loss = model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    out = model.generate(tw.zeros(1, 1, dtype=tw.int64), 10, generator=tw.Generator().manual_seed(0))
    assert out.shape == (1, 11)


# ---------------------------------------------------------------------------- module machinery

def _torch_and_tw(make):
    torch.manual_seed(0)
    return make(tw.nn), make(torch.nn)


def test_names_of_parameters_buffers_and_state_dict_match_torch():
    def make(nn):
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                             nn.ModuleDict({"attn": nn.MultiheadAttention(4, 2), "ln": nn.LayerNorm(4)}),
                             nn.ModuleList([nn.Linear(4, 4), nn.Embedding(5, 4, padding_idx=1)]),
                             nn.TransformerEncoderLayer(4, 2, 8))

    model, ref = _torch_and_tw(make)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in ref.named_buffers()]
    assert list(model.state_dict()) == list(ref.state_dict())
    assert [n for n, _ in model.named_modules()][:6] == [n for n, _ in ref.named_modules()][:6]
    assert [tuple(p.shape) for p in model.parameters()] == [tuple(p.shape) for p in ref.parameters()]


def test_reassigning_a_parameter_keeps_its_place_in_the_order():
    """Tying a decoder to its embedding (``decoder.weight = encoder.weight``) or putting a new Parameter in place of
    a layer's weight keeps the parameter where it was, so parameters(), the state dict and an optimizer's parameter
    indices are torch's."""
    def make(nn, lib):
        encoder, decoder, head = nn.Embedding(6, 4), nn.Linear(4, 6), nn.Linear(4, 3)
        decoder.weight = encoder.weight
        head.weight = nn.Parameter(lib.zeros(3, 4))
        return nn.ModuleDict({"encoder": encoder, "decoder": decoder, "head": head})

    ours, theirs = make(tw.nn, tw), make(torch.nn, torch)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters(remove_duplicate=False)] == \
        [n for n, _ in theirs.named_parameters(remove_duplicate=False)]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours_shapes = [tuple(p.shape) for p in ours.parameters()]
    assert ours_shapes == [tuple(p.shape) for p in theirs.parameters()] == [(6, 4), (6,), (3, 4), (3,)]


def test_repr_matches_torch():
    def make(nn):
        return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(8, 4, bias=False), nn.Dropout(0.1), nn.LayerNorm(4),
                             nn.GELU(approximate="tanh"), nn.Embedding(10, 3, padding_idx=2), nn.Softmax(dim=-1),
                             nn.LeakyReLU(0.2), nn.ModuleList([nn.Tanh(), nn.Identity()]))

    model, ref = _torch_and_tw(make)
    assert repr(model) == repr(ref)


def test_parameter_and_load_result_reprs_match_torch():
    def texts(lib):
        lib.manual_seed(0)
        p = lib.nn.Parameter(lib.tensor([[1.5, -2.0], [0.25, 3.0]]))
        frozen = lib.nn.Parameter(lib.tensor([1.0, 2.0]), requires_grad=False)
        layer = lib.nn.Linear(2, 2)
        full = layer.load_state_dict(layer.state_dict())
        partial = layer.load_state_dict({"weight": lib.zeros(2, 2), "extra": lib.zeros(1)}, strict=False)
        return [repr(p), str(p), f"{frozen}", repr(p.data), repr(p.detach()), repr(p * 1), repr(p[0]), repr(full),
                repr(partial), type(partial).__name__, partial.missing_keys, partial.unexpected_keys]

    assert texts(tw) == texts(torch)


def test_load_state_dict_names_every_missing_unexpected_and_mismatched_key():
    model = tw.nn.Sequential(tw.nn.Linear(3, 4), tw.nn.BatchNorm1d(4), tw.nn.Linear(4, 2))
    state = dict(model.state_dict())
    del state["0.bias"]
    del state["1.running_var"]
    state["2.weight"] = tw.zeros(3, 3)
    state["3.weight"] = tw.zeros(1)
    state["0.extra"] = tw.zeros(1)
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(state)
    message = str(info.value)
    assert message.startswith("Error(s) in loading state_dict for Sequential:")
    for text in ('Missing key(s) in state_dict: "0.bias", "1.running_var".',
                 'Unexpected key(s) in state_dict: "3.weight", "0.extra".',
                 "size mismatch for 2.weight: copying a param with shape tilewise.Size([3, 3]) from checkpoint, the "
                 "shape in current model is tilewise.Size([2, 4])."):
        assert text in message
    with pytest.raises(RuntimeError, match="size mismatch for 2.weight"):
        model.load_state_dict(state, strict=False)
    del state["2.weight"]
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["0.bias", "1.running_var", "2.weight"]
    assert result.unexpected_keys == ["3.weight", "0.extra"]


def test_load_state_dict_copies_in_place_or_assigns():
    model = tw.nn.Linear(2, 2)
    weight = model.weight
    new = {"weight": tw.ones(2, 2), "bias": tw.zeros(2)}
    assert repr(model.load_state_dict(new)) == "<All keys matched successfully>"
    assert model.weight is weight and weight.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    model.load_state_dict(new, assign=True)
    assert model.weight is not weight and isinstance(model.weight, tw.nn.Parameter) and model.weight.requires_grad


def test_non_persistent_buffers_stay_out_of_the_state_dict():
    module = tw.nn.Module()
    module.register_buffer("kept", tw.zeros(1))
    module.register_buffer("scratch", tw.zeros(1), persistent=False)
    assert list(module.state_dict()) == ["kept"]
    assert [n for n, _ in module.named_buffers()] == ["kept", "scratch"]


def test_buffers_assigned_as_nn_buffer_are_registered_as_torchs():
    results = {}
    for lib in (torch, tw):
        module = lib.nn.Linear(2, 2)
        module.steps = lib.nn.Buffer(lib.zeros(()), persistent=False)
        module.mask = lib.nn.Buffer(lib.ones(2))
        module.grads = lib.nn.Buffer(lib.ones(2, requires_grad=True))
        module.mask = lib.zeros(2)  # a plain tensor into a registered buffer stays a buffer, persistence kept
        module.plain = lib.ones(1)
        errors = []
        for name, value in (("plain", lib.nn.Buffer(lib.ones(1))), ("mask", 3)):
            with pytest.raises((KeyError, TypeError)) as info:
                setattr(module, name, value)
            errors.append(type(info.value).__name__)
        results[lib.__name__] = (list(module.state_dict()), [n for n, _ in module.named_buffers()],
                                 isinstance(module.steps, lib.nn.Buffer), isinstance(lib.ones(1), lib.nn.Buffer),
                                 module.grads.requires_grad, module.grads.is_leaf, module.steps.persistent, errors,
                                 module.mask.tolist())
    assert results["tilewise"] == results["torch"]


def test_attribute_registration_rules():
    module = tw.nn.Module()
    module.w = tw.nn.Parameter(tw.zeros(2))
    module.child = tw.nn.Linear(1, 1)
    module.plain = tw.zeros(1)
    assert [n for n, _ in module.named_parameters()] == ["w", "child.weight", "child.bias"]
    assert "plain" not in module.state_dict()
    with pytest.raises(TypeError, match="cannot assign 'tilewise.FloatTensor' as parameter 'w'"):
        module.w = tw.zeros(2)
    module.w = None
    assert module.w is None and [n for n, _ in module.named_parameters()] == ["child.weight", "child.bias"]
    del module.child
    assert not hasattr(module, "child")
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'missing'"):
        module.missing  # noqa: B018
    with pytest.raises(KeyError, match="contain"):
        module.register_buffer("a.b", tw.zeros(1))


def test_parameter_is_a_plain_tensor_sharing_storage():
    data = tw.zeros(3)
    p = tw.nn.Parameter(data)
    assert type(p) is tw.Tensor and isinstance(p, tw.nn.Parameter) and not isinstance(data, tw.nn.Parameter)
    assert p.requires_grad and p.is_leaf and p.data_ptr() == data.data_ptr()
    assert not tw.nn.Parameter(tw.zeros(1), requires_grad=False).requires_grad


def test_forward_hooks():
    model = tw.nn.Linear(2, 2)
    calls = []
    pre = model.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
    post = model.register_forward_hook(lambda m, args, out: calls.append(out.shape) or out + 1)
    out = model(tw.ones(3, 2))
    np.testing.assert_allclose(out.detach().numpy(), (model.bias.detach().numpy() + 1)[None].repeat(3, 0), rtol=1e-6)
    assert calls == [(3, 2)]
    pre.remove()
    post.remove()
    np.testing.assert_allclose(model(tw.ones(1, 2)).detach().numpy(),
                               (model.weight.sum(1) + model.bias).detach().numpy()[None], rtol=1e-6)
    kw = model.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] * 2,), kwargs), with_kwargs=True)
    assert model(tw.zeros(1, 2)).shape == (1, 2)
    kw.remove()


def test_always_call_forward_hooks_run_when_forward_raises_as_in_torch():
    def outcome(lib):
        log = []

        class Boom(lib.nn.Module):
            def forward(self, x):
                if x.sum() > 10:
                    raise ValueError("too big")
                return x * 2

        def failing(module, args, out):
            raise KeyError("hook")

        model = Boom()
        first = model.register_forward_hook(lambda m, a, out: log.append(("always", out is None)), always_call=True)
        model.register_forward_hook(lambda m, a, out: log.append(("plain", out is None)))
        model.register_forward_hook(lambda m, a, kw, out: log.append(("kwargs", out is None)), always_call=True,
                                    with_kwargs=True)
        model(lib.ones(2))
        for remove_first in (False, True):
            if remove_first:
                first.remove()
            with pytest.raises(ValueError, match="too big"):
                model(lib.full((2,), 10.0))
        model.register_forward_hook(failing, always_call=True)
        with pytest.warns(UserWarning, match="always_call=True.*silenced.*'hook'"), pytest.raises(ValueError):
            model(lib.full((2,), 10.0))
        return log

    assert outcome(tw) == outcome(torch)


def test_train_eval_apply_and_zero_grad():
    model = tw.nn.Sequential(tw.nn.Linear(2, 2), tw.nn.Dropout(0.5))
    assert model.training and model[1].training
    model.eval()
    assert not model[1].training
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "Dropout", "Sequential"]
    model(tw.ones(1, 2)).sum().backward()
    model.zero_grad(set_to_none=False)
    assert model[0].weight.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]]
    model.zero_grad()
    assert model[0].weight.grad is None
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


def test_to_dtype_keeps_parameter_identity():
    model = tw.nn.Sequential(tw.nn.Linear(2, 2), tw.nn.BatchNorm1d(2))
    weight = model[0].weight
    optimizer = tw.optim.SGD(model.parameters(), lr=0.1)
    model.to(tw.float64)
    assert model[0].weight is weight and weight.dtype is tw.float64 and isinstance(weight, tw.nn.Parameter)
    assert model[1].num_batches_tracked.dtype is tw.int64
    assert optimizer.param_groups[0]["params"][0] is weight
    model.float()
    assert weight.dtype is tw.float32


@pytest.mark.parametrize("dtype", ["bfloat16", "float64", "complex64", "complex128"])
def test_module_to_casts_complex_buffers_and_accepts_complex_dtypes_as_torch(dtype):
    # a rotary table kept as a complex buffer (Llama's freqs_cis) is cast by model.to(dtype) like a float one
    def run(lib):
        model = lib.nn.Linear(2, 2)
        angles = lib.outer(lib.arange(3.0), lib.tensor([1.0, 0.5]))
        model.register_buffer("freqs_cis", lib.polar(lib.ones_like(angles), angles), persistent=False)
        model.register_buffer("steps", lib.arange(3))
        with pytest.warns(UserWarning) as caught:
            model.to(getattr(lib, dtype))
            warnings.warn("a marker, so that pytest.warns holds one warning at least", UserWarning, stacklevel=1)
        # torch says "Casting complex values to real discards the imaginary part" once a process; tilewise each time
        messages = [str(w.message).split(" Please file")[0] for w in caught if "Casting complex" not in str(w.message)]
        if lib is tw:
            assert any("Casting complex" in str(w.message) for w in caught) == (not dtype.startswith("complex"))
        state = {name: (str(t.dtype).split(".")[-1], t.tolist()) for name, t in model.named_buffers()}
        return state, str(model.weight.dtype).split(".")[-1], messages

    ours, theirs = run(tw), run(torch)
    assert ours[1:] == theirs[1:]
    assert ours[0].keys() == theirs[0].keys()
    for name, (got_dtype, got) in ours[0].items():
        assert got_dtype == theirs[0][name][0], name
        np.testing.assert_allclose(np.array(got), np.array(theirs[0][name][1]), rtol=1e-6, atol=1e-7, err_msg=name)


def test_module_to_refuses_an_integer_dtype_naming_the_valid_kinds():
    with pytest.raises(TypeError, match=r"nn.Module.to only accepts floating point or complex dtypes, but got "
                                        r"desired dtype=tilewise.int64"):
        tw.nn.Linear(2, 2).to(tw.int64)


def test_deepcopy_gives_independent_parameters():
    model = tw.nn.Linear(2, 2)
    clone = copy.deepcopy(model)
    assert clone.weight is not model.weight
    np.testing.assert_array_equal(clone.weight.detach().numpy(), model.weight.detach().numpy())
    assert [n for n, _ in clone.named_parameters()] == ["weight", "bias"]
    assert isinstance(clone.weight, tw.nn.Parameter)


def test_containers():
    seq = tw.nn.Sequential(tw.nn.ReLU(), tw.nn.Tanh())
    seq.append(tw.nn.Sigmoid())
    assert len(seq) == 3 and isinstance(seq[-1], tw.nn.Sigmoid) and len(seq[1:]) == 2
    del seq[0]
    assert [type(m).__name__ for m in seq] == ["Tanh", "Sigmoid"] and list(seq._modules) == ["0", "1"]
    layers = tw.nn.ModuleList([tw.nn.Linear(1, 1) for _ in range(3)])
    assert len(list(layers.parameters())) == 6
    with pytest.raises(IndexError, match="out of range"):
        layers[3]
    params = tw.nn.ParameterList([tw.zeros(1), tw.nn.Parameter(tw.ones(2))])
    assert [n for n, _ in params.named_parameters()] == ["0", "1"] and isinstance(params[0], tw.nn.Parameter)
    table = tw.nn.ModuleDict({"a": tw.nn.ReLU()})
    table["b"] = tw.nn.Tanh()
    assert list(table.keys()) == ["a", "b"] and "b" in table


# ---------------------------------------------------------------------------- init and utils

def test_init_distributions():
    tw.manual_seed(0)
    w = tw.empty(200, 300)
    bound = 1 / np.sqrt(300)
    tw.nn.init.kaiming_uniform_(w, a=np.sqrt(5))
    assert np.abs(w.numpy()).max() <= bound and np.abs(w.numpy()).max() > 0.98 * bound
    tw.nn.init.xavier_normal_(w)
    assert abs(w.numpy().std() - np.sqrt(2 / 500)) < 0.002
    tw.nn.init.trunc_normal_(w, std=1.0, a=-0.5, b=0.5)
    assert w.numpy().min() >= -0.5 and w.numpy().max() <= 0.5
    tw.nn.init.constant_(w, 0.25)
    assert set(np.unique(w.numpy()).tolist()) == {0.25}
    for nonlinearity in ("linear", "relu", "tanh", "selu", "sigmoid"):
        ours, theirs = tw.nn.init.calculate_gain(nonlinearity), torch.nn.init.calculate_gain(nonlinearity)
        assert ours == theirs and type(ours) is type(theirs)  # torch's linear gains are the int 1
    assert tw.nn.init.calculate_gain("leaky_relu", 0.2) == torch.nn.init.calculate_gain("leaky_relu", 0.2)


def test_init_on_a_parameter_records_no_history():
    p = tw.nn.Parameter(tw.empty(3))
    tw.nn.init.normal_(p)
    assert p.grad_fn is None and p.requires_grad


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_torch(norm_type):
    grads = [_float_input((3, 4), seed=1) * 3, _float_input((5,), seed=2)]
    ours = [tw.nn.Parameter(tw.zeros(g.shape)) for g in grads]
    theirs = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    for p, q, g in zip(ours, theirs, grads):
        p.grad, q.grad = tw.tensor(g), torch.tensor(g)
    total = tw.nn.utils.clip_grad_norm_(ours, 1.0, norm_type)
    ref = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    _close(total, ref)
    for p, q in zip(ours, theirs):
        _close(p.grad, q.grad)
    tw.nn.utils.clip_grad_value_(ours, 0.01)
    assert all(np.abs(p.grad.numpy()).max() <= 0.01 for p in ours)


def test_parameters_to_vector_and_back():
    model = tw.nn.Linear(3, 2)
    vec = tw.nn.utils.parameters_to_vector(model.parameters())
    assert vec.shape == (8,)
    tw.nn.utils.vector_to_parameters(tw.arange(8.0), model.parameters())
    assert model.weight.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and model.bias.tolist() == [6.0, 7.0]


DOCUMENTED = ["tilewise.nn", "tilewise.nn.parameter", "tilewise.nn.init", "tilewise.nn.utils.clip_grad",
              "tilewise.nn.modules.module", "tilewise.nn.modules.linear", "tilewise.nn.modules.container",
              "tilewise.nn.modules.conv", "tilewise.nn.modules.sparse", "tilewise.nn.modules.loss",
              "tilewise.optim.sgd", "tilewise.optim.adam", "tilewise.utils.data", "tilewise.serialization",
              "tilewise._dlpack", "tilewise.models.gpt", "tilewise.data"]


@pytest.mark.parametrize("module", DOCUMENTED)
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


MHA_BAD_MASKS = {  # (query shape, call keywords, exception type, message fragment) for MultiheadAttention(8, 2)
    "2d-mask": ((5, 3, 8), lambda m: {"attn_mask": m.zeros(4, 4)}, RuntimeError,
                r"The shape of the 2D attn_mask is .*Size\(\[4, 4\]\), but should be \(5, 5\)"),
    "3d-mask": ((5, 3, 8), lambda m: {"attn_mask": m.zeros(2, 5, 5)}, RuntimeError,
                r"The shape of the 3D attn_mask is .*Size\(\[2, 5, 5\]\), but should be \(6, 5, 5\)"),
    "4d-mask": ((5, 3, 8), lambda m: {"attn_mask": m.zeros(1, 1, 5, 5)}, AssertionError,
                r"For batched \(3-D\) `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found 4-D"),
    "padding": ((5, 3, 8), lambda m: {"key_padding_mask": m.zeros(3, 4, dtype=m.bool)}, AssertionError, ""),
    "unbatched-padding": ((5, 8), lambda m: {"key_padding_mask": m.zeros(4, dtype=m.bool)}, AssertionError, ""),
}


@pytest.mark.parametrize("case", MHA_BAD_MASKS)
def test_multihead_attention_refuses_masks_of_the_wrong_shape_like_torch(case):
    shape, call, kind, message = MHA_BAD_MASKS[case]
    for m in (torch, tw):
        x = m.zeros(*shape)
        with pytest.raises(kind, match=message):
            m.nn.MultiheadAttention(8, 2)(x, x, x, **call(m))
    x = tw.zeros(*shape)
    with pytest.raises(kind, match=r"MultiheadAttention.*key length 5"):
        tw.nn.MultiheadAttention(8, 2)(x, x, x, **call(tw))


@pytest.mark.parametrize("case", ["self", "cross", "float-mask", "odd-heads", "training", "fastpath-off"])
def test_multihead_attention_output_layout_follows_torchs_path(case):
    """torch's fused inference path returns a batch-major contiguous output, its general path a transposed view
    of a sequence-major one: code that views the output works in one and fails in the other."""
    def layout(lib):
        torch.manual_seed(0)
        heads = 3 if case == "odd-heads" else 2
        module = lib.nn.MultiheadAttention(6, heads, batch_first=True).train(case == "training")
        x = lib.tensor(_float_input((2, 5, 6)))
        mask = lib.zeros(5, 5) if case == "float-mask" else lib.zeros(5, 5, dtype=lib.bool)
        lib.backends.mha.set_fastpath_enabled(case != "fastpath-off")
        try:
            with lib.no_grad():
                return module(x, x.clone() if case == "cross" else x, x, attn_mask=mask)[0].stride()
        finally:
            lib.backends.mha.set_fastpath_enabled(True)

    assert layout(tw) == layout(torch)


def test_multihead_attention_refuses_an_integer_padding_mask_like_torch():
    for m in (torch, tw):
        x = m.zeros(2, 5, 8)
        with pytest.raises(AssertionError, match="only bool and floating types of key_padding_mask are supported"):
            m.nn.MultiheadAttention(8, 2, batch_first=True)(x, x, x, key_padding_mask=m.zeros(2, 5, dtype=m.int64))


@pytest.mark.parametrize("case", ["bool-mask", "float-mask", "not-left-aligned", "no-mask-check", "training",
                                  "grad", "sequence-first", "odd-heads", "norm-first", "nested-off"])
def test_transformer_encoder_inference_zeroes_padding_as_torchs_nested_path(case):
    """In inference with a padding mask torch's encoder runs on nested tensors and pads the output back with
    zeros; the warning at construction says when it will not."""
    padding = np.array([[False] * 5, [False, False, False, True, True], [False, True, True, True, True]])
    if case == "not-left-aligned":
        padding[1] = [True, False, False, False, True]

    def run(lib):
        torch.manual_seed(0)
        layer = lib.nn.TransformerEncoderLayer(8, 1 if case == "odd-heads" else 2, 16, 0.0,
                                               batch_first=case != "sequence-first", norm_first=case == "norm-first")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            encoder = lib.nn.TransformerEncoder(layer, 2, enable_nested_tensor=case != "nested-off",
                                                mask_check=case != "no-mask-check")
        encoder.train(case == "training")
        with lib.no_grad():
            for p in encoder.parameters():
                p.copy_(lib.tensor(_float_input(tuple(p.shape), seed=p.numel(), low=-0.3, high=0.3)))
        x = lib.tensor(_float_input((3, 5, 8)))
        x = x if case != "sequence-first" else x.transpose(0, 1)
        mask = lib.tensor(padding)
        if case == "float-mask":
            mask = lib.zeros(3, 5).masked_fill(mask, float("-inf"))
        with lib.set_grad_enabled(case == "grad"):
            out = encoder(x, src_key_padding_mask=mask)
        return out, [str(w.message) for w in caught], encoder.use_nested_tensor

    (out, warned, nested), (ref, ref_warned, ref_nested) = run(tw), run(torch)
    _close(out, ref, what="output")
    assert (warned, nested) == (ref_warned, ref_nested)


def test_multihead_attention_embed_dim_not_divisible_by_heads_is_torch_assertion():
    for m in (torch, tw):
        with pytest.raises(AssertionError, match="embed_dim must be divisible by num_heads"):
            m.nn.MultiheadAttention(6, 4)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("variant", ["masks-weights", "masks-no-weights", "per-head-weights", "kdim-vdim",
                                     "unbatched", "causal-encoder", "bias-kv-zero-attn", "sequence-first"])
def test_multihead_attention_variants_match_torch(variant):
    torch.manual_seed(0)
    kwargs = {"kdim": 6, "vdim": 3} if variant == "kdim-vdim" else {}
    if variant == "bias-kv-zero-attn":
        kwargs = {"add_bias_kv": True, "add_zero_attn": True}
    batch_first = variant != "sequence-first"
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first, **kwargs)
    attn = tw.nn.MultiheadAttention(8, 2, batch_first=batch_first, **kwargs)
    assert [n for n, _ in attn.named_parameters()] == [n for n, _ in ref.named_parameters()]
    _copy_weights(attn, ref)
    q = _float_input((2, 4, 8) if variant != "unbatched" else (4, 8))
    k = _float_input((2, 5, kwargs.get("kdim", 8)) if variant != "unbatched" else (5, 8), seed=1)
    v = _float_input((2, 5, kwargs.get("vdim", 8)) if variant != "unbatched" else (5, 8), seed=2)
    if not batch_first:
        q, k, v = (a.transpose(1, 0, 2).copy() for a in (q, k, v))
    padding = np.array([[False, False, False, True, True], [False, False, False, False, True]])
    additive = _float_input((4, 5), seed=3, low=-1, high=0)
    call = {
        "masks-weights": dict(key_padding_mask=padding, attn_mask=additive),
        "masks-no-weights": dict(key_padding_mask=padding, attn_mask=additive, need_weights=False),
        "per-head-weights": dict(attn_mask=additive > -0.2, average_attn_weights=False),
        "kdim-vdim": dict(key_padding_mask=padding),
        "unbatched": dict(attn_mask=additive),
        "causal-encoder": dict(attn_mask=np.triu(np.ones((4, 5), dtype=bool), 1), need_weights=False),
        "bias-kv-zero-attn": dict(key_padding_mask=padding, attn_mask=additive > -0.2),
        "sequence-first": dict(key_padding_mask=padding),
    }[variant]

    def run(lib, module):
        args = [lib.tensor(a, requires_grad=True) for a in (q, k, v)]
        extra = {name: lib.tensor(value) if isinstance(value, np.ndarray) else value for name, value in call.items()}
        out, weights = module(*args, **extra)
        (out * lib.tensor(_float_input(tuple(out.shape), seed=9))).sum().backward()
        return out, weights, args

    out, weights, args = run(tw, attn)
    ref_out, ref_weights, ref_args = run(torch, ref)
    _close(out, ref_out, what="output")
    assert out.stride() == ref_out.stride()  # torch's general path: a sequence-major output (.view works as there)
    assert (weights is None) == (ref_weights is None)
    if weights is not None:
        _close(weights, ref_weights, what="weights")
    for a, b in zip(args, ref_args):
        _close(a.grad, b.grad, rtol=1e-4, what="input grad")
    ours = dict(attn.named_parameters())
    for name, p in ref.named_parameters():
        _close(ours[name].grad, p.grad, rtol=1e-4, what=name)


@pytest.mark.parametrize("form", ["self", "shared-key-value", "separate"])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_packed_projections_match_torch(form, need_weights, batch_first):
    """Query, key and value that are one tensor take one in-projection (torch's ``_in_projection_packed``), a
    shared key and value one for both; results and every gradient as torch's, whichever the form."""
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    attn = tw.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    _copy_weights(attn, ref)
    shape = (2, 4, 8) if batch_first else (4, 2, 8)
    arrays = [_float_input(shape, seed=s) for s in range(3)]

    def run(lib, module):
        inputs = [lib.tensor(a, requires_grad=True) for a in arrays]
        q, k, v = {"self": (inputs[0],) * 3, "shared-key-value": (inputs[0], inputs[1], inputs[1]),
                   "separate": tuple(inputs)}[form]
        out, _ = module(q, k, v, need_weights=need_weights)
        (out * lib.tensor(_float_input(tuple(out.shape), seed=9))).sum().backward()
        return out, inputs

    out, inputs = run(tw, attn)
    ref_out, ref_inputs = run(torch, ref)
    _close(out, ref_out, what="output")
    assert out.stride() == ref_out.stride()
    for a, b in zip(inputs, ref_inputs):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            _close(a.grad, b.grad, rtol=1e-4, what="input grad")
    ours = dict(attn.named_parameters())
    for name, p in ref.named_parameters():
        _close(ours[name].grad, p.grad, rtol=1e-4, what=name)
