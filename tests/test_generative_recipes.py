"""Generative and self-supervised training programs in the styles their tutorials publish — a DDPM denoiser, a
SimCLR contrastive step, a VQ-VAE with a straight-through codebook — run with ``torch`` and with ``tilewise`` as
the module named ``torch`` inside them, from torch's initial weights and numpy data: losses and parameters agree
step by step (see ``test_training_recipes.py`` for the method), eagerly and with each training step compiled by
``tilewise.compile``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from compiled_steps import compiled_if
from test_training_recipes import ADAM_ATOL, _assert_runs_agree, _named_parameters, _run_both

# --- 1. DDPM: a noise-prediction step over a linear beta schedule -------------------------------------------


def ddpm_model(torch):
    nn, F = torch.nn, torch.nn.functional  # noqa: N806 — the tutorials' names

    class TimeEmbedding(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim

        def forward(self, t):
            half = self.dim // 2
            freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / (half - 1))
            args = t.float()[:, None] * freqs[None, :]
            return torch.cat([args.sin(), args.cos()], dim=-1)

    class Block(nn.Module):
        def __init__(self, cin, cout, tdim):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
            self.norm1, self.norm2 = nn.GroupNorm(4, cout), nn.GroupNorm(4, cout)
            self.time = nn.Linear(tdim, cout)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, temb):
            h = F.silu(self.norm1(self.conv1(x)))
            h = h + self.time(temb)[:, :, None, None]
            h = F.silu(self.norm2(self.conv2(h)))
            return h + self.skip(x)

    class UNetTiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.temb = nn.Sequential(TimeEmbedding(16), nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 32))
            self.down, self.mid, self.up = Block(1, 8, 32), Block(8, 16, 32), Block(24, 8, 32)
            self.out = nn.Conv2d(8, 1, 1)

        def forward(self, x, t):
            temb = self.temb(t)
            d = self.down(x, temb)
            m = self.mid(F.avg_pool2d(d, 2), temb)
            u = F.interpolate(m, scale_factor=2, mode="nearest")
            return self.out(self.up(torch.cat([u, d], dim=1), temb))

    return UNetTiny()



def ddpm_recipe(torch, model, images, timesteps, noises, compiled=False):
    F = torch.nn.functional  # noqa: N806 — the tutorials' name
    betas = torch.linspace(1e-4, 0.02, 100)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    sqrt_ab, sqrt_1m_ab = alphas_cumprod.sqrt(), (1.0 - alphas_cumprod).sqrt()
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    losses = []

    @compiled_if(torch, compiled)
    def train_step(x0, t, noise):
        a = sqrt_ab.gather(0, t).view(-1, 1, 1, 1)
        b = sqrt_1m_ab[t].reshape(-1, 1, 1, 1)
        loss = F.mse_loss(model(a * x0 + b * noise, t), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].lerp_(v, 0.1) if v.dtype.is_floating_point else ema[k].copy_(v)
        return loss.detach()

    for x0, t, noise in zip(images, timesteps, noises):
        losses.append(train_step(torch.from_numpy(x0), torch.from_numpy(t), torch.from_numpy(noise)).item())
    return {"losses": losses, "params": {**_named_parameters(model), **{f"ema.{k}": v for k, v in ema.items()}}}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_ddpm_denoiser_trains_as_torchs(compiled):
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((4, 1, 8, 8), dtype=np.float32) for _ in range(5)]
    timesteps = [rng.integers(0, 100, size=4) for _ in range(5)]
    noises = [rng.standard_normal((4, 1, 8, 8), dtype=np.float32) for _ in range(5)]
    theirs, ours = _run_both(ddpm_recipe, ddpm_model, images, timesteps, noises, compiled=compiled)
    # AdamW at lr 2e-3 turns a last-bit difference in a near-zero gradient into up to a step's worth of lr in its
    # parameter (see ADAM_ATOL, set for lr 1e-3); the sums' order depends on how many BLAS threads a GEMM gets
    _assert_runs_agree(theirs, ours, rtol=1e-4, atol=5 * ADAM_ATOL)


# --- 2. SimCLR: the NT-Xent loss over two views ---------------------------------------------------------------


def simclr_model(torch):
    nn = torch.nn
    return nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))


def nt_xent(torch, z1, z2, temperature=0.5):
    F = torch.nn.functional  # noqa: N806 — the tutorials' name
    z = F.normalize(torch.cat([z1, z2], dim=0), dim=1)
    sim = z @ z.T / temperature
    n = z1.shape[0]
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    targets = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, targets)


def simclr_recipe(torch, model, batches, compiled=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=len(batches))
    losses, accuracy = [], []

    @compiled_if(torch, compiled)
    def train_step(view1, view2):
        z1, z2 = model(view1), model(view2)
        loss = nt_xent(torch, z1, z2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # top-1: does each view find its partner?
            sim = torch.nn.functional.cosine_similarity(z1[:, None, :], z2[None, :, :], dim=-1)
            hits = (sim.argmax(dim=1) == torch.arange(len(view1))).sum()
        return loss.detach(), hits

    for view1, view2 in batches:
        loss, hits = train_step(torch.from_numpy(view1), torch.from_numpy(view2))
        sched.step()
        losses.append(loss.item())
        accuracy.append(int(hits))
    return {"losses": losses, "params": _named_parameters(model), "accuracy": accuracy}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_simclr_contrastive_step_trains_as_torchs(compiled):
    rng = np.random.default_rng(1)
    base = [rng.standard_normal((8, 12), dtype=np.float32) for _ in range(6)]
    batches = [(b + 0.1 * rng.standard_normal(b.shape, dtype=np.float32),
                b + 0.1 * rng.standard_normal(b.shape, dtype=np.float32)) for b in base]
    theirs, ours = _run_both(simclr_recipe, simclr_model, batches, compiled=compiled)
    _assert_runs_agree(theirs, ours, rtol=1e-4, atol=1e-5)


# --- 3. VQ-VAE: nearest codes, a straight-through estimator, commitment loss ---------------------------------


def vqvae_model(torch):
    nn = torch.nn

    class VQVAE(nn.Module):
        def __init__(self, codes=16, dim=4, beta=0.25):
            super().__init__()
            self.encoder = nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.ReLU(), nn.Conv2d(8, dim, 1))
            self.decoder = nn.Sequential(nn.ConvTranspose2d(dim, 8, 4, 2, 1), nn.ReLU(), nn.Conv2d(8, 1, 3, padding=1))
            self.codebook = nn.Embedding(codes, dim)
            self.codebook.weight.data.uniform_(-1.0 / codes, 1.0 / codes)
            self.beta = beta

        def forward(self, x):
            z = self.encoder(x)
            flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
            distances = torch.cdist(flat, self.codebook.weight)
            indices = distances.argmin(dim=1)
            quantized = self.codebook(indices).view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)
            codebook_loss = torch.nn.functional.mse_loss(quantized, z.detach())
            commitment = torch.nn.functional.mse_loss(z, quantized.detach())
            quantized = z + (quantized - z).detach()  # straight through
            return self.decoder(quantized), codebook_loss + self.beta * commitment, indices

    return VQVAE()


def vqvae_recipe(torch, model, images, compiled=False):
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, used = [], []

    @compiled_if(torch, compiled)
    def train_step(x):
        recon, vq_loss, indices = model(x)
        loss = torch.nn.functional.mse_loss(recon, x) + vq_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.detach(), indices

    for x in images:
        loss, indices = train_step(torch.from_numpy(x))
        losses.append(loss.item())
        used.append(sorted(torch.unique(indices).tolist()))
    perplexity = torch.bincount(indices, minlength=16).float().div(indices.numel())
    return {"losses": losses, "params": _named_parameters(model), "used": used,
            "perplexity": round(float(torch.exp(-(perplexity * (perplexity + 1e-10).log()).sum())), 4)}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_vq_vae_with_a_straight_through_codebook_trains_as_torchs(compiled):
    rng = np.random.default_rng(2)
    images = [rng.standard_normal((3, 1, 8, 8), dtype=np.float32) for _ in range(5)]
    theirs, ours = _run_both(vqvae_recipe, vqvae_model, images, compiled=compiled)
    _assert_runs_agree(theirs, ours, rtol=1e-4, atol=ADAM_ATOL)
