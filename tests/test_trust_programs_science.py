"""Scientific-computing and control programs in the styles their papers' code is published in, run under torch and
under tilewise (``import tilewise as torch``) from the same initial weights and data, as in ``test_trust_programs.py``,
whose helpers these use: a Fourier neural operator in 1-D and 2-D (spectral convolutions with complex weights), neural
style transfer optimising the input image with L-BFGS, and a DQN agent on a small deterministic environment written
in tensors. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (G, Q)

from __future__ import annotations

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


# ----------------------------------------------------------------------------------------------------------------------
# A Fourier neural operator, as the reference scripts write it: a lifting Linear over (u, grid), spectral convolutions
# (rfft / rfft2, the lowest modes multiplied by complex weights through einsum, written into a zero complex spectrum,
# irfft / irfft2 back with n= / s=) beside pointwise 1x1 convolutions, GELU, a projection MLP; the 2-D model pads the
# domain with F.pad and crops it after. A unit Gaussian normaliser on the targets, the relative L2 loss (LpLoss), Adam
# with weight decay under StepLR.

def fno(torch, init, batches, dims=1, modes=4, width=8, layers=2, padding=2):
    nn, F = torch.nn, torch.nn.functional
    library = dims == "nd"  # the library's form: real weights viewed as complex, rfftn / irfftn over named dims
    dims = 2 if library else dims

    class SpectralConv1d(nn.Module):
        def __init__(self, in_channels, out_channels, modes1):
            super().__init__()
            self.out_channels, self.modes1 = out_channels, modes1
            self.scale = 1 / (in_channels * out_channels)
            self.weights1 = nn.Parameter(self.scale * torch.rand(in_channels, out_channels, modes1, dtype=torch.cfloat))

        def compl_mul1d(self, input, weights):
            return torch.einsum("bix,iox->box", input, weights)

        def forward(self, x):
            batchsize = x.shape[0]
            x_ft = torch.fft.rfft(x)
            out_ft = torch.zeros(batchsize, self.out_channels, x.size(-1) // 2 + 1, device=x.device, dtype=torch.cfloat)
            out_ft[:, :, :self.modes1] = self.compl_mul1d(x_ft[:, :, :self.modes1], self.weights1)
            return torch.fft.irfft(out_ft, n=x.size(-1))

    class SpectralConv2d(nn.Module):
        def __init__(self, in_channels, out_channels, modes1, modes2):
            super().__init__()
            self.out_channels, self.modes1, self.modes2 = out_channels, modes1, modes2
            self.scale = 1 / (in_channels * out_channels)
            self.weights1 = nn.Parameter(
                self.scale * torch.rand(in_channels, out_channels, modes1, modes2, dtype=torch.cfloat))
            self.weights2 = nn.Parameter(
                self.scale * torch.rand(in_channels, out_channels, modes1, modes2, dtype=torch.cfloat))

        def compl_mul2d(self, input, weights):
            return torch.einsum("bixy,ioxy->boxy", input, weights)

        def forward(self, x):
            batchsize = x.shape[0]
            x_ft = torch.fft.rfft2(x)
            out_ft = torch.zeros(batchsize, self.out_channels, x.size(-2), x.size(-1) // 2 + 1, dtype=torch.cfloat,
                                 device=x.device)
            out_ft[:, :, :self.modes1, :self.modes2] = self.compl_mul2d(x_ft[:, :, :self.modes1, :self.modes2],
                                                                        self.weights1)
            out_ft[:, :, -self.modes1:, :self.modes2] = self.compl_mul2d(x_ft[:, :, -self.modes1:, :self.modes2],
                                                                         self.weights2)
            return torch.fft.irfft2(out_ft, s=(x.size(-2), x.size(-1)))

    class SpectralConvNd(nn.Module):
        def __init__(self, in_channels, out_channels, n_modes, norm="ortho"):
            super().__init__()
            self.out_channels, self.n_modes, self.norm = out_channels, n_modes, norm
            scale = (2 / (in_channels + out_channels)) ** 0.5
            self.weight = nn.Parameter(scale * torch.randn(2, in_channels, out_channels, *n_modes, 2))
            self.bias = nn.Parameter(torch.zeros(out_channels, 1, 1))

        def forward(self, x):
            batchsize, channels, *mode_sizes = x.shape
            fft_dims = list(range(-len(mode_sizes), 0))
            x_ft = torch.fft.rfftn(x.float(), norm=self.norm, dim=fft_dims)
            weight = torch.view_as_complex(self.weight)
            out_ft = torch.zeros([batchsize, self.out_channels, *x_ft.shape[2:]], dtype=x_ft.dtype, device=x.device)
            m1, m2 = self.n_modes
            slices = [(slice(None), slice(None), slice(None, m1), slice(None, m2)),
                      (slice(None), slice(None), slice(-m1, None), slice(None, m2))]
            for w, idx in zip(weight, slices):
                out_ft[idx] = torch.einsum("bixy,ioxy->boxy", x_ft[idx], w)
            x = torch.fft.irfftn(out_ft, s=mode_sizes, norm=self.norm, dim=fft_dims)
            return x + self.bias

    class FNO(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc0 = nn.Linear(1 + dims, width)
            if library:
                self.convs = nn.ModuleList([SpectralConvNd(width, width, (modes, modes)) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv2d(width, width, 1, bias=False) for _ in range(layers)])
            elif dims == 1:
                self.convs = nn.ModuleList([SpectralConv1d(width, width, modes) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv1d(width, width, 1) for _ in range(layers)])
            else:
                self.convs = nn.ModuleList([SpectralConv2d(width, width, modes, modes) for _ in range(layers)])
                self.ws = nn.ModuleList([nn.Conv2d(width, width, 1) for _ in range(layers)])
            self.fc1 = nn.Linear(width, 16)
            self.fc2 = nn.Linear(16, 1)

        def get_grid(self, shape, device):
            batchsize, size_x = shape[0], shape[1]
            gridx = torch.tensor(np.linspace(0, 1, size_x), dtype=torch.float)
            if dims == 1:
                return gridx.reshape(1, size_x, 1).repeat([batchsize, 1, 1]).to(device)
            size_y = shape[2]
            gridx = gridx.reshape(1, size_x, 1, 1).repeat([batchsize, 1, size_y, 1])
            gridy = torch.tensor(np.linspace(0, 1, size_y), dtype=torch.float)
            gridy = gridy.reshape(1, 1, size_y, 1).repeat([batchsize, size_x, 1, 1])
            return torch.cat((gridx, gridy), dim=-1).to(device)

        def forward(self, x):
            grid = self.get_grid(x.shape, x.device)
            x = torch.cat((x, grid), dim=-1)
            x = self.fc0(x)
            if dims == 1:
                x = x.permute(0, 2, 1)
            else:
                x = x.permute(0, 3, 1, 2)
                x = F.pad(x, [0, padding, 0, padding])
            for i, (conv, w) in enumerate(zip(self.convs, self.ws)):
                x = conv(x) + w(x)
                if i < layers - 1:
                    x = F.gelu(x)
            if dims == 1:
                x = x.permute(0, 2, 1)
            else:
                x = x[..., :-padding, :-padding]
                x = x.permute(0, 2, 3, 1)
            x = F.gelu(self.fc1(x))
            return self.fc2(x)

    class UnitGaussianNormalizer:
        def __init__(self, x, eps=0.00001):
            self.mean = torch.mean(x, 0)
            self.std = torch.std(x, 0)
            self.eps = eps

        def encode(self, x):
            return (x - self.mean) / (self.std + self.eps)

        def decode(self, x):
            return (x * (self.std + self.eps)) + self.mean

    class LpLoss:
        def __init__(self, d=2, p=2, size_average=True, reduction=True):
            self.d, self.p, self.reduction, self.size_average = d, p, reduction, size_average

        def rel(self, x, y):
            num_examples = x.size()[0]
            diff_norms = torch.norm(x.reshape(num_examples, -1) - y.reshape(num_examples, -1), self.p, 1)
            y_norms = torch.norm(y.reshape(num_examples, -1), self.p, 1)
            if self.reduction:
                if self.size_average:
                    return torch.mean(diff_norms / y_norms)
                return torch.sum(diff_norms / y_norms)
            return diff_norms / y_norms

        def __call__(self, x, y):
            return self.rel(x, y)

    model = FNO()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    y_normalizer = UnitGaussianNormalizer(torch.from_numpy(np.concatenate([y for _, y in batches])))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    myloss = LpLoss(size_average=False)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        optimizer.zero_grad()
        out = y_normalizer.decode(model(x).reshape(y.shape))
        loss = myloss(out.view(x.shape[0], -1), y.view(x.shape[0], -1))
        loss.backward()
        optimizer.step()
        record["lr"].append(scheduler.get_last_lr()[0])
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        x, y = (torch.from_numpy(a) for a in batches[0])
        out = y_normalizer.decode(model(x).reshape(y.shape))
        record["eval"] = numpy_of(out)
        record["per_sample"] = numpy_of(LpLoss(reduction=False)(out, y))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def burgers_like(rng, dims, steps=4, batch=3, size=16):
    """Smooth random fields u0 on a periodic grid and targets from a fixed nonlinear smoothing of them."""
    batches = []
    shape = (batch, size) if dims == 1 else (batch, size, size)
    for _ in range(steps):
        spectrum = rng.normal(size=shape) * np.exp(-0.3 * np.arange(size))
        u0 = np.real(np.fft.ifft(spectrum, axis=-1)) * size
        u = np.tanh(np.roll(u0, 1, axis=-1) + 0.5 * u0) + 0.1 * u0 ** 2
        batches.append((u0[..., None].astype(np.float32), u.astype(np.float32)))
    return batches


@pytest.mark.parametrize("dims", [1, 2, "nd"])
def test_fourier_neural_operator_trains_like_torch(dims):
    ours, theirs = run_both(fno, burgers_like(np.random.default_rng(0), 1 if dims == 1 else 2), dims=dims)
    assert any(np.iscomplexobj(v) for v in theirs["init"].values()) == (dims != "nd")
    assert theirs["lr"] == [1e-2, 1e-2, 5e-3, 5e-3]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Neural style transfer, as the tutorials write it: a small VGG-like feature extractor, frozen (requires_grad_(False),
# eval()), rebuilt as an nn.Sequential with a normalisation first and content/style loss modules inserted after chosen
# layers (the ReLUs replaced by out-of-place ones), then cut after the last loss; Gram matrices from mm of the flattened
# features (the PyTorch tutorial) or bmm of a batch (fast-neural-style's gram_matrix); the input image itself optimised
# by L-BFGS with a closure, clamped to [0, 1] between steps with img.data.clamp_ or clamp_ under no_grad.

def style_transfer(torch, init, images, gram="mm", clamp="no_grad", line_search=None, steps=3):
    nn, F = torch.nn, torch.nn.functional

    def gram_matrix(input):
        if gram == "bmm":
            b, ch, h, w = input.size()
            features = input.view(b, ch, w * h)
            features_t = features.transpose(1, 2)
            return features.bmm(features_t) / (ch * h * w)
        a, b, c, d = input.size()
        features = input.view(a * b, c * d)
        G = torch.mm(features, features.t())
        return G.div(a * b * c * d)

    class ContentLoss(nn.Module):
        def __init__(self, target):
            super().__init__()
            self.target = target.detach()

        def forward(self, input):
            self.loss = F.mse_loss(input, self.target)
            return input

    class StyleLoss(nn.Module):
        def __init__(self, target_feature):
            super().__init__()
            self.target = gram_matrix(target_feature).detach()

        def forward(self, input):
            G = gram_matrix(input)
            self.loss = F.mse_loss(G, self.target)
            return input

    class Normalization(nn.Module):
        def __init__(self, mean, std):
            super().__init__()
            self.mean = torch.tensor(mean).view(-1, 1, 1)
            self.std = torch.tensor(std).view(-1, 1, 1)

        def forward(self, img):
            return (img - self.mean) / self.std

    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1),
                        nn.ReLU(inplace=True), nn.MaxPool2d(2, 2), nn.Conv2d(8, 16, 3, padding=1),
                        nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(inplace=True),
                        nn.MaxPool2d(2, 2), nn.Conv2d(16, 16, 3, padding=1))
    record = {"init": initial_state(torch, cnn, init)}
    cnn.eval()
    cnn.requires_grad_(False)
    content_layers, style_layers = ["conv_3"], ["conv_1", "conv_2", "conv_3", "conv_4"]
    content_img, style_img = torch.from_numpy(images["content"]), torch.from_numpy(images["style"])

    normalization = Normalization([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    content_losses, style_losses = [], []
    model = nn.Sequential(normalization)
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name = f"relu_{i}"
            layer = nn.ReLU(inplace=False)
        elif isinstance(layer, nn.MaxPool2d):
            name = f"pool_{i}"
        else:
            raise RuntimeError(f"Unrecognized layer: {layer.__class__.__name__}")
        model.add_module(name, layer)
        if name in content_layers:
            target = model(content_img).detach()
            content_loss = ContentLoss(target)
            model.add_module(f"content_loss_{i}", content_loss)
            content_losses.append(content_loss)
        if name in style_layers:
            target_feature = model(style_img).detach()
            style_loss = StyleLoss(target_feature)
            model.add_module(f"style_loss_{i}", style_loss)
            style_losses.append(style_loss)
    for i in range(len(model) - 1, -1, -1):
        if isinstance(model[i], (ContentLoss, StyleLoss)):
            break
    model = model[:(i + 1)]
    record["layers"] = [name for name, _ in model.named_children()]

    input_img = content_img.clone()
    input_img.requires_grad_(True)
    model.eval()
    model.requires_grad_(False)
    # lr=0.5: at the tutorial's 1 a step overshoots to a loss of 1e7, where float32 rounding decides the rest
    optimizer = torch.optim.LBFGS([input_img], lr=0.5, max_iter=5, history_size=4, line_search_fn=line_search)
    style_weight, content_weight = 1e4, 1
    record["losses"], record["images"] = [], []
    run = [0]
    for _ in range(steps):
        def closure():
            if clamp == "no_grad":
                with torch.no_grad():
                    input_img.clamp_(0, 1)
            optimizer.zero_grad()
            model(input_img)
            style_score = 0
            content_score = 0
            for sl in style_losses:
                style_score += sl.loss
            for cl in content_losses:
                content_score += cl.loss
            style_score *= style_weight
            content_score *= content_weight
            loss = style_score + content_score
            loss.backward()
            run[0] += 1
            record["losses"].append([style_score.item(), content_score.item()])
            return style_score + content_score

        optimizer.step(closure)
        if clamp == "data":
            input_img.data.clamp_(0, 1)
        record["images"].append(numpy_of(input_img))
    with torch.no_grad():
        input_img.clamp_(0, 1)
    record["final"] = numpy_of(input_img)
    record["evaluations"] = run[0]
    record["frozen"] = [p.requires_grad for p in cnn.parameters()] + [cnn.training]
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    record["lbfgs"] = {"func_evals": state["func_evals"], "n_iter": state["n_iter"], "d": numpy_of(state["d"]),
                       "t": float(state["t"])}
    return record


def style_images(rng, size=12):
    content = rng.uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    stripes = 0.5 + 0.5 * np.sin(np.arange(size)[None, :] * 1.3 + np.arange(3)[:, None, None] * 2.0)
    style = np.clip(stripes + 0.1 * rng.normal(size=(3, size, size)), 0, 1)[None].astype(np.float32)
    return {"content": content, "style": style}


@pytest.mark.parametrize(("gram", "clamp", "line_search"), [("mm", "no_grad", None), ("bmm", "data", None),
                                                             ("mm", "no_grad", "strong_wolfe")])
def test_neural_style_transfer_optimising_the_image_with_lbfgs_matches_torch(gram, clamp, line_search):
    ours, theirs = run_both(style_transfer, style_images(np.random.default_rng(5)), gram=gram, clamp=clamp,
                            line_search=line_search)
    layers = theirs.pop("layers")
    assert ours.pop("layers") == layers and layers[-1] == "style_loss_4" and not any(theirs["frozen"])
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

EINSUM_PROMOTIONS = {
    # torch's einsum multiplies a pair where nothing is summed (element-wise, outer, an index summed within one
    # operand first), promoting the dtypes as mul does; a contraction runs bmm, which takes one dtype
    "hadamard": ("ij,ij->ij", [(2, 3), (2, 3)], ["float32", "complex64"]),
    "outer": ("i,j->ij", [(2,), (3,)], ["float32", "float64"]),
    "summed within one operand": ("ij,j->j", [(2, 3), (3,)], ["float32", "float64"]),
    "three operands": ("i,i,i->i", [(2,), (2,), (2,)], ["float32", "float64", "complex64"]),
    "spectral weights, modes broadcast": ("bix,ix->bix", [(2, 3, 4), (3, 4)], ["complex64", "float32"]),
}


@pytest.mark.parametrize("case", EINSUM_PROMOTIONS)
def test_einsum_without_a_contraction_promotes_mixed_dtypes_as_torch(case):
    equation, shapes, names = EINSUM_PROMOTIONS[case]
    rng = np.random.default_rng(0)
    data = [rng.normal(size=s).astype(np.float32) for s in shapes]
    seen = []
    for torch in LIBRARIES:
        operands = [torch.tensor(d).to(getattr(torch, n)).requires_grad_() for d, n in zip(data, names)]
        out = torch.einsum(equation, *operands)
        out.abs().sum().backward()
        seen.append([str(out.dtype).split(".")[-1], numpy_of(out), [numpy_of(t.grad) for t in operands]])
    assert_same(seen[1][1:], seen[0][1:])
    assert seen[1][0] == seen[0][0]


PRODUCT_DTYPE_REFUSALS = {
    "mm": (lambda t: t.mm(t.ones(2, 2), t.ones(2, 2, dtype=t.float64)),
           "expected m1 and m2 to have the same dtype, but got: float != double"),
    "mm, complex weights": (lambda t: t.ones(2, 2, dtype=t.cfloat) @ t.ones(2, 2),
                            "expected m1 and m2 to have the same dtype, but got: c10::complex<float> != float"),
    "linear": (lambda t: t.nn.functional.linear(t.ones(2, 2), t.ones(2, 2, dtype=t.float64)),
               "expected m1 and m2 to have the same dtype, but got: float != double"),
    "bmm": (lambda t: t.bmm(t.ones(1, 2, 2), t.ones(1, 2, 2, dtype=t.float64)),
            "expected scalar type Float but found Double"),
    "batched matmul": (lambda t: t.ones(3, 2, 2) @ t.ones(3, 2, 2, dtype=t.float64),
                       "expected scalar type Float but found Double"),
    "einsum contraction of complex by real": (
        lambda t: t.einsum("bix,iox->box", t.ones(2, 3, 4, dtype=t.cfloat), t.ones(3, 5, 4)),
        "expected scalar type ComplexFloat but found Float"),
    "einsum, the promoted pair then contracted": (
        lambda t: t.einsum("i,i,i->", t.ones(2), t.ones(2, dtype=t.float64), t.ones(2)),
        "expected scalar type Double but found Float"),
    "matrix @ vector": (lambda t: t.ones(3, 2, 2) @ t.ones(2, dtype=t.float64),
                        "addmv input tensors must have the same dtype, but got Double, Float, and Double"),
    "mv": (lambda t: t.mv(t.ones(2, 2, dtype=t.float64), t.ones(2)),
           "addmv input tensors must have the same dtype, but got Float, Double, and Float"),
    "vector @ vector": (lambda t: t.ones(2) @ t.ones(2, dtype=t.float64),
                        "dot : expected both vectors to have same dtype, but found Float and Double"),
    "vdot": (lambda t: t.vdot(t.ones(2), t.ones(2, dtype=t.float64)),
             "dot : expected both vectors to have same dtype, but found Float and Double"),
    "rfft of a complex signal": (lambda t: t.fft.rfft(t.ones(4, dtype=t.cfloat)),
                                 "rfft expects a real input tensor, but got ComplexFloat"),
    "rfft2 of a complex signal": (lambda t: t.fft.rfft2(t.ones(4, 4, dtype=t.cdouble)),
                                  "rfftn expects a real-valued input tensor, but got ComplexDouble"),
    "fft of half": (lambda t: t.fft.fft(t.ones(4, dtype=t.half)), "Unsupported dtype Half"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", PRODUCT_DTYPE_REFUSALS)
def test_products_and_transforms_of_mixed_dtypes_refuse_in_torchs_words(torch, case):
    # met forgetting dtype=torch.cfloat on a spectral layer's weights, or its spectrum's zeros
    call, message = PRODUCT_DTYPE_REFUSALS[case]
    exc = raised(call, torch)
    assert type(exc) is RuntimeError, repr(exc)
    assert str(exc).startswith(message), str(exc)
