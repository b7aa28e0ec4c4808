"""GAN training programs in the styles people publish them, run under torch and under tilewise (``import tilewise as
torch``) from the same initial weights, batches and noise, as in ``test_trust_programs.py``, whose helpers these use:
a StyleGAN2-style generator and discriminator at toy size (an equalized-learning-rate mapping network, modulated and
demodulated convolutions through the grouped-convolution trick, noise injection, a minibatch standard-deviation
layer, the non-saturating logistic loss with lazy R1 and path-length regularisation, Adam with betas (0, 0.99) and a
generator EMA), an SN-GAN with the hinge loss (both spectral_norm APIs, their power-iteration vectors set from numpy)
and a WGAN-GP critic (a gradient penalty on interpolates, several critic steps per generator step). Below the
programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, C, H, W, G, F)

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both
from test_trust_programs_styles2 import raised

import tilewise

LIBRARIES = [real_torch, tilewise]


pytestmark = pytest.mark.usefixtures("torch_on_one_thread")  # (tests/conftest.py)


# ----------------------------------------------------------------------------------------------------------------------
# StyleGAN2, as the popular re-implementations write it at toy size: a mapping MLP of EqualLinear layers (weights
# drawn as randn / lr_mul and scaled at run time by lr_mul / sqrt(fan_in)) after PixelNorm; a learned constant input;
# ModulatedConv2d whose per-sample weights are modulated by the style, demodulated with rsqrt and applied as one
# grouped convolution over the batch folded into channels; bilinear upsampling; NoiseInjection of given noise; a fused
# bias + leaky_relu(0.2) * sqrt(2); ToRGB skips. The discriminator: residual blocks with avg-pool downsampling, the
# minibatch standard-deviation feature, EqualLinear heads. Training: softplus (non-saturating logistic) losses, R1 on
# reals every d_reg_every steps, path-length regularisation every g_reg_every steps, Adam with betas (0, 0.99) and the
# lazy-regularisation ratio applied to lr and betas, and an EMA generator updated by lerp_ under no_grad.

def stylegan2(torch, init, batches, style_dim=8, channels=4, path_reg=True, resample="bilinear"):
    # resample "bilinear": F.interpolate up, avg_pool2d down; "upfirdn": the official FIR filtering written natively
    # (a grouped conv_transpose2d to upsample, then a [1, 3, 3, 1] blur; blur then a strided conv to downsample)
    nn, F = torch.nn, torch.nn.functional
    official = resample == "upfirdn"

    def make_kernel(k):
        k = torch.tensor(k, dtype=torch.float32)
        if k.ndim == 1:
            k = k[None, :] * k[:, None]
        k /= k.sum()
        return k

    def upfirdn2d(input, kernel, up=1, down=1, pad=(0, 0)):
        up_x = up_y = up
        down_x = down_y = down
        pad_x0, pad_x1, pad_y0, pad_y1 = pad[0], pad[1], pad[0], pad[1]
        _, channel, in_h, in_w = input.shape
        input = input.reshape(-1, in_h, in_w, 1)
        _, in_h, in_w, minor = input.shape
        kernel_h, kernel_w = kernel.shape
        out = input.view(-1, in_h, 1, in_w, 1, minor)
        out = F.pad(out, [0, 0, 0, up_x - 1, 0, 0, 0, up_y - 1])
        out = out.view(-1, in_h * up_y, in_w * up_x, minor)
        out = F.pad(out, [0, 0, max(pad_x0, 0), max(pad_x1, 0), max(pad_y0, 0), max(pad_y1, 0)])
        out = out[:, max(-pad_y0, 0): out.shape[1] - max(-pad_y1, 0),
                  max(-pad_x0, 0): out.shape[2] - max(-pad_x1, 0), :]
        out = out.permute(0, 3, 1, 2)
        out = out.reshape([-1, 1, in_h * up_y + pad_y0 + pad_y1, in_w * up_x + pad_x0 + pad_x1])
        w = torch.flip(kernel, [0, 1]).view(1, 1, kernel_h, kernel_w)
        out = F.conv2d(out, w)
        out = out.reshape(-1, minor, in_h * up_y + pad_y0 + pad_y1 - kernel_h + 1,
                          in_w * up_x + pad_x0 + pad_x1 - kernel_w + 1)
        out = out.permute(0, 2, 3, 1)
        out = out[:, ::down_y, ::down_x, :]
        out_h = (in_h * up_y + pad_y0 + pad_y1 - kernel_h + down_y) // down_y
        out_w = (in_w * up_x + pad_x0 + pad_x1 - kernel_w + down_x) // down_x
        return out.view(-1, channel, out_h, out_w)

    class Blur(nn.Module):
        def __init__(self, kernel, pad, upsample_factor=1):
            super().__init__()
            kernel = make_kernel(kernel)
            if upsample_factor > 1:
                kernel = kernel * (upsample_factor**2)
            self.register_buffer("kernel", kernel)
            self.pad = pad

        def forward(self, input):
            return upfirdn2d(input, self.kernel, pad=self.pad)

    class Upsample(nn.Module):
        def __init__(self, kernel, factor=2):
            super().__init__()
            self.factor = factor
            self.register_buffer("kernel", make_kernel(kernel) * (factor**2))
            p = self.kernel.shape[0] - factor
            self.pad = ((p + 1) // 2 + factor - 1, p // 2)

        def forward(self, input):
            return upfirdn2d(input, self.kernel, up=self.factor, down=1, pad=self.pad)

    class PixelNorm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(torch.mean(x**2, dim=1, keepdim=True) + 1e-8)

    class EqualLinear(nn.Module):
        def __init__(self, in_dim, out_dim, bias_init=0.0, lr_mul=1.0, activation=False):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(out_dim, in_dim).div_(lr_mul))
            self.bias = nn.Parameter(torch.zeros(out_dim).fill_(bias_init))
            self.scale = (1 / math.sqrt(in_dim)) * lr_mul
            self.lr_mul = lr_mul
            self.activation = activation

        def forward(self, x):
            if self.activation:
                out = F.linear(x, self.weight * self.scale)
                return F.leaky_relu(out + self.bias * self.lr_mul, 0.2) * math.sqrt(2)
            return F.linear(x, self.weight * self.scale, bias=self.bias * self.lr_mul)

    class EqualConv2d(nn.Module):
        def __init__(self, in_channel, out_channel, kernel_size, stride=1, padding=0, bias=True):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(out_channel, in_channel, kernel_size, kernel_size))
            self.scale = 1 / math.sqrt(in_channel * kernel_size**2)
            self.stride, self.padding = stride, padding
            self.bias = nn.Parameter(torch.zeros(out_channel)) if bias else None

        def forward(self, x):
            return F.conv2d(x, self.weight * self.scale, bias=self.bias, stride=self.stride, padding=self.padding)

    class FusedLeakyReLU(nn.Module):
        def __init__(self, channel):
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(channel))

        def forward(self, x):
            return F.leaky_relu(x + self.bias.view(1, -1, 1, 1), negative_slope=0.2) * math.sqrt(2)

    class ModulatedConv2d(nn.Module):
        def __init__(self, in_channel, out_channel, kernel_size, style_dim, demodulate=True, upsample=False):
            super().__init__()
            self.eps = 1e-8
            self.kernel_size, self.in_channel, self.out_channel = kernel_size, in_channel, out_channel
            self.upsample, self.demodulate = upsample, demodulate
            self.scale = 1 / math.sqrt(in_channel * kernel_size**2)
            self.padding = kernel_size // 2
            self.weight = nn.Parameter(torch.randn(1, out_channel, in_channel, kernel_size, kernel_size))
            self.modulation = EqualLinear(style_dim, in_channel, bias_init=1)
            if upsample and official:
                p = (4 - 2) - (kernel_size - 1)
                self.blur = Blur([1, 3, 3, 1], pad=((p + 1) // 2 + 1, p // 2 + 1), upsample_factor=2)

        def forward(self, input, style):
            batch, in_channel, height, width = input.shape
            style = self.modulation(style).view(batch, 1, in_channel, 1, 1)
            weight = self.scale * self.weight * style
            if self.demodulate:
                demod = torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8)
                weight = weight * demod.view(batch, self.out_channel, 1, 1, 1)
            if self.upsample and official:
                input = input.view(1, batch * in_channel, height, width)
                weight = weight.view(batch, self.out_channel, in_channel, self.kernel_size, self.kernel_size)
                weight = weight.transpose(1, 2).reshape(batch * in_channel, self.out_channel, self.kernel_size,
                                                        self.kernel_size)
                out = F.conv_transpose2d(input, weight, padding=0, stride=2, groups=batch)
                _, _, height, width = out.shape
                return self.blur(out.view(batch, self.out_channel, height, width))
            weight = weight.view(batch * self.out_channel, in_channel, self.kernel_size, self.kernel_size)
            if self.upsample:
                input = F.interpolate(input, scale_factor=2, mode="bilinear", align_corners=False)
                height, width = height * 2, width * 2
            input = input.view(1, batch * in_channel, height, width)
            out = F.conv2d(input, weight, padding=self.padding, groups=batch)
            _, _, height, width = out.shape
            return out.view(batch, self.out_channel, height, width)

    class NoiseInjection(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(1))

        def forward(self, image, noise):
            return image + self.weight * noise

    class StyledConv(nn.Module):
        def __init__(self, in_channel, out_channel, kernel_size, style_dim, upsample=False):
            super().__init__()
            self.conv = ModulatedConv2d(in_channel, out_channel, kernel_size, style_dim, upsample=upsample)
            self.noise = NoiseInjection()
            self.activate = FusedLeakyReLU(out_channel)

        def forward(self, input, style, noise):
            return self.activate(self.noise(self.conv(input, style), noise))

    class ToRGB(nn.Module):
        def __init__(self, in_channel, style_dim, upsample=True):
            super().__init__()
            self.upsample = upsample
            self.conv = ModulatedConv2d(in_channel, 3, 1, style_dim, demodulate=False)
            self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))
            if upsample and official:
                self.upsample = Upsample([1, 3, 3, 1])

        def forward(self, input, style, skip=None):
            out = self.conv(input, style) + self.bias
            if skip is not None and official:
                out = out + self.upsample(skip)
            elif skip is not None:
                out = out + F.interpolate(skip, scale_factor=2, mode="bilinear", align_corners=False)
            return out

    class Generator(nn.Module):
        def __init__(self, n_mlp=2, lr_mlp=0.01):
            super().__init__()
            self.style = nn.Sequential(PixelNorm(), *[EqualLinear(style_dim, style_dim, lr_mul=lr_mlp, activation=True)
                                                      for _ in range(n_mlp)])
            self.input = nn.Parameter(torch.randn(1, channels, 4, 4))
            self.conv1 = StyledConv(channels, channels, 3, style_dim)
            self.to_rgb1 = ToRGB(channels, style_dim, upsample=False)
            self.convs = nn.ModuleList([StyledConv(channels, channels, 3, style_dim, upsample=True),
                                        StyledConv(channels, channels, 3, style_dim)])
            self.to_rgbs = nn.ModuleList([ToRGB(channels, style_dim)])
            self.n_latent = 4

        def forward(self, z, noise, return_latents=False):
            w = self.style(z)
            latent = w.unsqueeze(1).repeat(1, self.n_latent, 1)
            out = self.input.repeat(z.shape[0], 1, 1, 1)
            out = self.conv1(out, latent[:, 0], noise=noise[0])
            skip = self.to_rgb1(out, latent[:, 1])
            out = self.convs[0](out, latent[:, 1], noise=noise[1])
            out = self.convs[1](out, latent[:, 2], noise=noise[2])
            image = self.to_rgbs[0](out, latent[:, 3], skip)
            return (image, latent) if return_latents else (image, None)

    class ResBlock(nn.Module):
        def __init__(self, in_channel, out_channel):
            super().__init__()
            self.conv1 = EqualConv2d(in_channel, in_channel, 3, padding=1)
            self.act1 = FusedLeakyReLU(in_channel)
            if official:
                self.conv2 = nn.Sequential(Blur([1, 3, 3, 1], pad=(2, 2)),
                                           EqualConv2d(in_channel, out_channel, 3, stride=2))
                self.skip = nn.Sequential(Blur([1, 3, 3, 1], pad=(1, 1)),
                                          EqualConv2d(in_channel, out_channel, 1, stride=2, bias=False))
            else:
                self.conv2 = EqualConv2d(in_channel, out_channel, 3, padding=1)
                self.skip = EqualConv2d(in_channel, out_channel, 1, bias=False)
            self.act2 = FusedLeakyReLU(out_channel)

        def forward(self, input):
            out = self.act1(self.conv1(input))
            if official:
                return (self.act2(self.conv2(out)) + self.skip(input)) / math.sqrt(2)
            out = self.act2(F.avg_pool2d(self.conv2(out), 2))
            skip = self.skip(F.avg_pool2d(input, 2))
            return (out + skip) / math.sqrt(2)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.from_rgb = nn.Sequential(EqualConv2d(3, channels, 1), FusedLeakyReLU(channels))
            self.block = ResBlock(channels, channels)
            self.stddev_group, self.stddev_feat = 4, 1
            self.final_conv = nn.Sequential(EqualConv2d(channels + 1, channels, 3, padding=1), FusedLeakyReLU(channels))
            self.final_linear = nn.Sequential(EqualLinear(channels * 4 * 4, channels, activation=True),
                                              EqualLinear(channels, 1))

        def forward(self, input):
            out = self.block(self.from_rgb(input))
            batch, channel, height, width = out.shape
            group = min(batch, self.stddev_group)
            stddev = out.view(group, -1, self.stddev_feat, channel // self.stddev_feat, height, width)
            stddev = torch.sqrt(stddev.var(0, unbiased=False) + 1e-8)
            stddev = stddev.mean([2, 3, 4], keepdims=True).squeeze(2)
            stddev = stddev.repeat(group, 1, height, width)
            out = self.final_conv(torch.cat([out, stddev], 1))
            return self.final_linear(out.view(batch, -1))

    def requires_grad(model, flag=True):
        for p in model.parameters():
            p.requires_grad = flag

    def d_logistic_loss(real_pred, fake_pred):
        return F.softplus(-real_pred).mean() + F.softplus(fake_pred).mean()

    def d_r1_loss(real_pred, real_img):
        (grad_real,) = torch.autograd.grad(outputs=real_pred.sum(), inputs=real_img, create_graph=True)
        return grad_real.pow(2).sum([1, 2, 3]).mean()

    def g_path_regularize(fake_img, latents, mean_path_length, path_noise, decay=0.01):
        noise = path_noise / math.sqrt(fake_img.shape[2] * fake_img.shape[3])
        (grad,) = torch.autograd.grad(outputs=(fake_img * noise).sum(), inputs=latents, create_graph=True)
        path_lengths = torch.sqrt(grad.pow(2).sum(2).mean(1))
        path_mean = mean_path_length + decay * (path_lengths.mean() - mean_path_length)
        path_penalty = (path_lengths - path_mean).pow(2).mean()
        return path_penalty, path_mean.detach(), path_lengths

    generator, discriminator = Generator(), Discriminator()
    models = nn.ModuleDict({"G": generator, "D": discriminator})
    record = {"init": initial_state(torch, models, init), "d": [], "g": [], "r1": [], "path": [], "grads": []}
    g_ema = copy.deepcopy(generator).eval()
    g_reg_every, d_reg_every, lr = 2, 2, 2e-3
    g_reg_ratio, d_reg_ratio = g_reg_every / (g_reg_every + 1), d_reg_every / (d_reg_every + 1)
    g_optim = torch.optim.Adam(generator.parameters(), lr=lr * g_reg_ratio,
                               betas=(0 ** g_reg_ratio, 0.99 ** g_reg_ratio))
    d_optim = torch.optim.Adam(discriminator.parameters(), lr=lr * d_reg_ratio,
                               betas=(0 ** d_reg_ratio, 0.99 ** d_reg_ratio))
    mean_path_length = 0
    accum = 0.5 ** (32 / (10 * 1000))
    for i, batch in enumerate(batches):
        real_img = torch.from_numpy(batch["real"])
        noise = [torch.from_numpy(n) for n in batch["noise"]]
        z = torch.from_numpy(batch["z"])

        requires_grad(generator, False)
        requires_grad(discriminator, True)
        fake_img, _ = generator(z, noise)
        fake_pred = discriminator(fake_img)
        real_pred = discriminator(real_img)
        d_loss = d_logistic_loss(real_pred, fake_pred)
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()
        record["d"].append([d_loss.item(), real_pred.mean().item(), fake_pred.mean().item()])

        if i % d_reg_every == 0:
            real_img.requires_grad = True
            real_pred = discriminator(real_img)
            r1_loss = d_r1_loss(real_pred, real_img)
            discriminator.zero_grad()
            (10 / 2 * r1_loss * d_reg_every + 0 * real_pred[0]).backward()
            d_optim.step()
            record["r1"].append(r1_loss.item())
            record["grads"].append(gradients(discriminator))

        requires_grad(generator, True)
        requires_grad(discriminator, False)
        fake_img, _ = generator(z, noise)
        fake_pred = discriminator(fake_img)
        g_loss = F.softplus(-fake_pred).mean()
        generator.zero_grad()
        g_loss.backward()
        g_optim.step()
        record["g"].append(g_loss.item())
        record["grads"].append(gradients(generator))

        if path_reg and i % g_reg_every == 0:
            fake_img, latents = generator(z, noise, return_latents=True)
            path_loss, mean_path_length, path_lengths = g_path_regularize(
                fake_img, latents, mean_path_length, torch.from_numpy(batch["path_noise"]))
            generator.zero_grad()
            weighted_path_loss = 2 * g_reg_every * path_loss
            weighted_path_loss += 0 * fake_img[0, 0, 0, 0]
            weighted_path_loss.backward()
            g_optim.step()
            record["path"].append([path_loss.item(), mean_path_length.item(), *path_lengths.tolist()])
            record["grads"].append(gradients(generator))

        with torch.no_grad():
            for p_ema, p in zip(g_ema.parameters(), generator.parameters()):
                p_ema.lerp_(p, 1 - accum)

    with torch.no_grad():
        sample, _ = g_ema(torch.from_numpy(batches[0]["z"]), [torch.from_numpy(n) for n in batches[0]["noise"]])
    record["sample"] = numpy_of(sample)
    record["ema"] = {k: numpy_of(v) for k, v in g_ema.state_dict().items()}
    record["final"] = {k: numpy_of(v) for k, v in models.state_dict().items()}
    return record


def stylegan2_batches(rng, steps=4, batch=4, style_dim=8, size=8):
    return [{"real": rng.uniform(-1, 1, (batch, 3, size, size)).astype(np.float32),
             "z": rng.standard_normal((batch, style_dim)).astype(np.float32),
             "noise": [rng.standard_normal((batch, 1, s, s)).astype(np.float32) for s in (4, 8, 8)],
             "path_noise": rng.standard_normal((batch, 3, size, size)).astype(np.float32)} for _ in range(steps)]


@pytest.mark.parametrize(("path_reg", "resample"), [(True, "bilinear"), (False, "bilinear"), (True, "upfirdn")])
def test_stylegan2_with_modulated_convolutions_r1_path_length_and_ema_trains_like_torch(path_reg, resample):
    ours, theirs = run_both(stylegan2, stylegan2_batches(np.random.default_rng(0)), path_reg=path_reg,
                            resample=resample)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# An SN-GAN with the hinge loss, as the SN-GAN / BigGAN-style scripts write it: a generator of Linear to 4x4, then
# ConvTranspose2d + BatchNorm2d + ReLU, a 3x3 conv and tanh; a discriminator whose layers are wrapped in
# nn.utils.spectral_norm (the hook API) or nn.utils.parametrizations.spectral_norm (the parametrization API), each
# power-iteration vector set from numpy (so the two runs start from the same u), LeakyReLU(0.1), global sum pooling
# and a class projection through a spectrally normalised nn.Embedding (the cGAN projection discriminator).
# Training: hinge losses, Adam betas (0, 0.9), requires_grad_(False) on the discriminator for the generator's step and
# zero_grad(set_to_none=True); an eval-mode sample afterwards (no power iteration in eval), then the normalisation
# removed (remove_spectral_norm, remove_parametrizations) and the plain weights compared.

def sngan(torch, init, batches, nz=6, ngf=8, ndf=4, parametrizations=False, n_classes=3):
    nn, F = torch.nn, torch.nn.functional
    SN = nn.utils.parametrizations.spectral_norm if parametrizations else nn.utils.spectral_norm

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.ngf = ngf
            self.l1 = nn.Linear(nz, 4 * 4 * ngf)
            self.block = nn.Sequential(
                nn.BatchNorm2d(ngf), nn.ReLU(True),
                nn.ConvTranspose2d(ngf, ngf // 2, kernel_size=4, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(ngf // 2), nn.ReLU(True),
                nn.Conv2d(ngf // 2, 3, kernel_size=3, stride=1, padding=1), nn.Tanh())

        def forward(self, z):
            return self.block(self.l1(z).view(-1, self.ngf, 4, 4))

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                SN(nn.Conv2d(3, ndf, 3, 1, 1)), nn.LeakyReLU(0.1, inplace=True),
                SN(nn.Conv2d(ndf, ndf * 2, 4, 2, 1)), nn.LeakyReLU(0.1, inplace=True),
                SN(nn.Conv2d(ndf * 2, ndf * 2, 3, 1, 1)), nn.LeakyReLU(0.1, inplace=True))
            self.linear = SN(nn.Linear(ndf * 2, 1))
            self.embed = SN(nn.Embedding(n_classes, ndf * 2))

        def forward(self, x, y):
            h = torch.sum(self.main(x), dim=[2, 3])
            return self.linear(h) + torch.sum(self.embed(y) * h, dim=1, keepdim=True)

    def spectral_layers(model):
        return [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.Embedding))]

    net_G, net_D = Generator(), Discriminator()
    u_rng = np.random.default_rng(5)
    with torch.no_grad():
        for layer in spectral_layers(net_D):
            if parametrizations:
                sn = layer.parametrizations.weight[0]
                u, v = sn._u, sn._v
            else:
                u, v = layer.weight_u, layer.weight_v
            u.copy_(F.normalize(torch.from_numpy(u_rng.standard_normal(u.shape[0]).astype(np.float32)), dim=0))
            v.copy_(F.normalize(torch.from_numpy(u_rng.standard_normal(v.shape[0]).astype(np.float32)), dim=0))
    models = nn.ModuleDict({"G": net_G, "D": net_D})
    record = {"init": initial_state(torch, models, init), "d": [], "g": [], "grads": [], "sigma": [],
              "keys": list(models.state_dict().keys())}
    optim_G = torch.optim.Adam(net_G.parameters(), lr=2e-3, betas=(0.0, 0.9))
    optim_D = torch.optim.Adam(net_D.parameters(), lr=2e-3, betas=(0.0, 0.9))
    for real, z_d, z_g, label in batches:
        real, z_g, y = torch.from_numpy(real), torch.from_numpy(z_g), torch.from_numpy(label)
        net_D.requires_grad_(True)
        for z in z_d:
            with torch.no_grad():
                fake = net_G(torch.from_numpy(z)).detach()
            net_D_real, net_D_fake = net_D(real, y), net_D(fake, y)
            loss_D = F.relu(1 - net_D_real).mean() + F.relu(1 + net_D_fake).mean()
            optim_D.zero_grad(set_to_none=True)
            loss_D.backward()
            optim_D.step()
            record["d"].append([loss_D.item(), net_D_real.mean().item(), net_D_fake.mean().item()])
        record["grads"].append(gradients(net_D))
        net_D.requires_grad_(False)
        loss_G = -net_D(net_G(z_g), y).mean()
        optim_G.zero_grad(set_to_none=True)
        loss_G.backward()
        optim_G.step()
        record["g"].append(loss_G.item())
        record["grads"].append(gradients(net_G))
        record["d_grads_are_none"] = [p.grad is None for p in net_D.parameters()]
        record["sigma"].append([numpy_of(layer.weight) for layer in spectral_layers(net_D)])
    net_G.eval()
    net_D.eval()
    with torch.no_grad():
        sample = net_G(torch.from_numpy(batches[0][2]))
        record["sample"] = numpy_of(sample)
        y = torch.from_numpy(batches[0][3])
        record["eval"] = [numpy_of(net_D(sample, y)), numpy_of(net_D(sample, y))]
    record["final"] = {k: numpy_of(v) for k, v in models.state_dict().items()}
    for layer in spectral_layers(net_D):
        if parametrizations:
            nn.utils.parametrize.remove_parametrizations(layer, "weight")
        else:
            nn.utils.remove_spectral_norm(layer)
    record["keys_removed"] = list(net_D.state_dict().keys())
    record["removed"] = {k: numpy_of(v) for k, v in net_D.state_dict().items()}
    return record


def sngan_batches(rng, steps=3, batch=4, nz=6, n_dis=2, n_classes=3):
    return [(rng.uniform(-1, 1, (batch, 3, 8, 8)).astype(np.float32),
             [rng.standard_normal((batch, nz)).astype(np.float32) for _ in range(n_dis)],
             rng.standard_normal((batch, nz)).astype(np.float32),
             rng.integers(0, n_classes, batch)) for _ in range(steps)]


@pytest.mark.parametrize("parametrizations", [False, True], ids=["hooks", "parametrizations"])
def test_sngan_with_spectral_norm_hinge_loss_and_frozen_discriminator_trains_like_torch(parametrizations):
    ours, theirs = run_both(sngan, sngan_batches(np.random.default_rng(1)), parametrizations=parametrizations)
    assert ours.pop("keys") == theirs.pop("keys")
    assert ours.pop("keys_removed") == theirs.pop("keys_removed")
    assert ours.pop("d_grads_are_none") == theirs.pop("d_grads_are_none")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A WGAN-GP, as the improved-training scripts write it: an MLP generator, a conv critic without batch norm (LayerNorm
# in its place), n_critic critic steps per generator step, each on interpolates alpha * real + (1 - alpha) * fake with
# a given alpha; the penalty from autograd.grad(outputs, interpolates, grad_outputs=ones, create_graph=True,
# retain_graph=True) as ((gradients.norm(2, dim=1) - 1) ** 2).mean() * LAMBDA. The "pytorch-gan" style builds its
# grad_outputs as Variable(Tensor(n, 1).fill_(1.0)) and its interpolates with requires_grad_(True).

def wgan_gp(torch, init, batches, nz=5, n_critic=3, optimizer="adam", LAMBDA=10.0, style="improved"):
    nn = torch.nn

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(nn.Linear(nz, 32), nn.LeakyReLU(0.2, inplace=True),
                                       nn.Linear(32, 64), nn.Tanh())

        def forward(self, z):
            return self.model(z).view(z.size(0), 1, 8, 8)

    class Critic(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(1, 4, 3, 2, 1), nn.LayerNorm([4, 4, 4]), nn.LeakyReLU(0.2),
                nn.Conv2d(4, 8, 3, 2, 1), nn.LeakyReLU(0.2))
            self.out = nn.Linear(8 * 2 * 2, 1)

        def forward(self, x):
            return self.out(self.main(x).flatten(1))

    def calc_gradient_penalty(netD, real_data, fake_data, alpha):
        if style == "improved":
            alpha = alpha.expand(real_data.size())
            interpolates = alpha * real_data + ((1 - alpha) * fake_data)
            interpolates = torch.autograd.Variable(interpolates, requires_grad=True)
            disc_interpolates = netD(interpolates)
            grad_outputs = torch.ones(disc_interpolates.size())
        else:
            interpolates = (alpha * real_data + ((1 - alpha) * fake_data)).requires_grad_(True)
            disc_interpolates = netD(interpolates)
            grad_outputs = torch.autograd.Variable(torch.FloatTensor(real_data.shape[0], 1).fill_(1.0),
                                                   requires_grad=False)
        gradients = torch.autograd.grad(outputs=disc_interpolates, inputs=interpolates, grad_outputs=grad_outputs,
                                        create_graph=True, retain_graph=True, only_inputs=True)[0]
        gradients = gradients.view(gradients.size(0), -1)
        return ((gradients.norm(2, dim=1) - 1) ** 2).mean() * LAMBDA

    netG, netD = Generator(), Critic()
    models = nn.ModuleDict({"G": netG, "D": netD})
    record = {"init": initial_state(torch, models, init), "d": [], "g": [], "gp": [], "grads": []}
    if optimizer == "adam":
        optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.9))
        optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.9))
    else:
        optimizerD = torch.optim.RMSprop(netD.parameters(), lr=1e-3)
        optimizerG = torch.optim.RMSprop(netG.parameters(), lr=1e-3)
    one = torch.tensor(1, dtype=torch.float)
    mone = one * -1
    for real, critic_steps, z_g in batches:
        real_data = torch.from_numpy(real)
        for p in netD.parameters():
            p.requires_grad = True
        for noise, alpha in critic_steps:
            netD.zero_grad()
            D_real = netD(real_data).mean()
            D_real.backward(mone)
            with torch.no_grad():
                fake = netG(torch.from_numpy(noise))
            D_fake = netD(fake.detach()).mean()
            D_fake.backward(one)
            gradient_penalty = calc_gradient_penalty(netD, real_data, fake.detach(), torch.from_numpy(alpha))
            gradient_penalty.backward()
            D_cost = D_fake - D_real + gradient_penalty
            Wasserstein_D = D_real - D_fake
            optimizerD.step()
            record["d"].append([D_cost.item(), Wasserstein_D.item()])
            record["gp"].append(gradient_penalty.item())
        record["grads"].append(gradients(netD))
        for p in netD.parameters():
            p.requires_grad = False
        netG.zero_grad()
        G = netD(netG(torch.from_numpy(z_g))).mean()
        G.backward(mone)
        optimizerG.step()
        record["g"].append(-G.item())
        record["grads"].append(gradients(netG))
    with torch.no_grad():
        record["sample"] = numpy_of(netG(torch.from_numpy(batches[0][2])))
    record["final"] = {k: numpy_of(v) for k, v in models.state_dict().items()}
    return record


def wgan_gp_batches(rng, steps=3, batch=4, nz=5, n_critic=3):
    return [(rng.uniform(-1, 1, (batch, 1, 8, 8)).astype(np.float32),
             [(rng.standard_normal((batch, nz)).astype(np.float32),
               rng.uniform(0, 1, (batch, 1, 1, 1)).astype(np.float32)) for _ in range(n_critic)],
             rng.standard_normal((batch, nz)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize(("optimizer", "style"), [("adam", "improved"), ("rmsprop", "pytorch-gan")])
def test_wgan_gp_with_interpolates_penalty_and_several_critic_steps_trains_like_torch(optimizer, style):
    ours, theirs = run_both(wgan_gp, wgan_gp_batches(np.random.default_rng(2)), optimizer=optimizer, style=style)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

def test_autograd_grad_takes_only_inputs_in_torchs_position_and_warns_when_it_is_false():
    # met in the WGAN-GP scripts, which pass only_inputs=True; torch's sixth positional argument is only_inputs
    results = []
    for torch in LIBRARIES:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = (x**3).sum()
        (g,) = torch.autograd.grad(y, x, None, True, True, True, None)
        with pytest.warns(FutureWarning, match="only_inputs argument is deprecated and is ignored now"):
            (g2,) = torch.autograd.grad(y, x, retain_graph=True, only_inputs=False)
        results.append((numpy_of(g), numpy_of(g2), g.requires_grad))
    assert_same(results[1], results[0])


def test_autograd_grad_with_a_dict_of_inputs_returns_a_dict():
    results = []
    for torch in LIBRARIES:
        model = torch.nn.Linear(2, 1)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[0.5, -1.0]]))
            model.bias.fill_(0.25)
        grads = torch.autograd.grad(model(torch.tensor([[1.0, 3.0]])).sum(), dict(model.named_parameters()))
        results.append({k: numpy_of(v) for k, v in grads.items()})
    assert list(results[1]) == list(results[0])
    assert_same(results[1], results[0])


def test_autograd_grad_with_batched_grad_outputs_gives_one_vjp_per_vector():
    results = []
    x0 = np.array([1.0, 2.0, 3.0], np.float32)
    for torch in LIBRARIES:
        x = torch.tensor(x0, requires_grad=True)
        y = torch.stack([x[0] * x[1], x.sin().sum()])
        (jac,) = torch.autograd.grad(y, x, torch.eye(2), is_grads_batched=True, create_graph=True)
        (hess_row,) = torch.autograd.grad(jac[1].sum(), x)
        results.append((numpy_of(jac), numpy_of(hess_row)))
    assert_same(results[1], results[0])


@pytest.mark.parametrize("case", ["batched shape", "materialize without allow_unused"])
def test_autograd_grad_refuses_bad_arguments_as_torch(case):
    def call(torch):
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        if case == "batched shape":
            return torch.autograd.grad(x * 2, x, torch.ones(2, 2), is_grads_batched=True)
        return torch.autograd.grad((x * 2).sum(), x, allow_unused=False, materialize_grads=True)

    theirs, ours = raised(call, real_torch), raised(call, tilewise)
    assert type(ours) is type(theirs)
    assert str(ours).split(":")[0] == str(theirs).split(":")[0]


@pytest.mark.parametrize("betas", [(0, 0.99), (0.0, 1 - 1e-2), (np.float32(0.5), 0.9), (True, 0.9)])
def test_adam_takes_betas_only_as_two_floats_or_two_tensors_as_torch(betas):
    # met writing StyleGAN2's betas=(0, 0.99), which torch refuses (its scripts write 0 ** ratio, a float)
    def call(torch):
        return torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], betas=betas).defaults["betas"]

    theirs, ours = raised(call, real_torch), raised(call, tilewise)
    assert type(ours) is type(theirs)
    if theirs is not None:
        assert str(ours).startswith(str(theirs))


def test_legacy_variable_with_volatile_warns_and_is_ignored_as_torch():
    # met in the original WGAN-GP script, which samples through Variable(noise, volatile=True)
    for torch in LIBRARIES:
        with pytest.warns(UserWarning, match="volatile was removed and now has no effect"):
            v = torch.autograd.Variable(torch.ones(2), volatile=True)
        assert not v.requires_grad


def test_autograd_grad_with_no_inputs_raises_as_torch():
    def call(torch):
        return torch.autograd.grad((torch.ones(2, requires_grad=True) * 2).sum(), [])

    theirs, ours = raised(call, real_torch), raised(call, tilewise)
    assert type(ours) is type(theirs) and str(ours) == str(theirs)


def test_spectral_norm_hook_of_a_missing_parameter_raises_key_error_as_torch():
    def call(torch):
        return torch.nn.utils.spectral_norm(torch.nn.Linear(2, 2), name="kernel")

    theirs, ours = raised(call, real_torch), raised(call, tilewise)
    assert type(ours) is type(theirs) and str(ours) == str(theirs)
