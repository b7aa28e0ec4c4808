"""Generative training programs written as users publish them (a VAE, a DCGAN, a DDPM) and parametrized layers.

Each program runs eagerly under torch and under tilewise (``import tilewise as torch``) from the same initial weights
and batches, as in ``test_trust_programs.py``, whose helpers these use
noise a program draws comes from numpy.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, T, H, W, C, D, K)

from __future__ import annotations

import copy
import math

import numpy as np
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

# ----------------------------------------------------------------------------------------------------------------------
# A VAE: the reparameterisation by hand and through torch.distributions (Normal, Independent, Bernoulli with
# logits, kl_divergence, entropy, cdf, icdf, MultivariateNormal), BCE-with-logits, centred RMSprop with momentum,
# ExponentialLR, and sampling from the decoder.

def vae(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional
    D = torch.distributions
    class VAE(nn.Module):
        def __init__(self, x_dim=12, h=16, z=3):
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(x_dim, h), nn.ELU(), nn.Linear(h, 2 * z))
            self.dec = nn.Sequential(nn.Linear(z, h), nn.Tanh(), nn.Linear(h, x_dim))
            self.prior_loc = nn.Parameter(torch.zeros(z))
        def encode(self, x):
            mu, logvar = self.enc(x).chunk(2, dim=-1)
            return mu, logvar
        def forward(self, x, eps):
            mu, logvar = self.encode(x)
            std = torch.exp(0.5 * logvar)
            z = mu + eps * std
            return self.dec(z), mu, logvar, z
    model = VAE()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "parts": []}
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-2, alpha=0.9, centered=True, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    for step, (x, eps, eps2) in enumerate(batches):
        x, eps, eps2 = torch.from_numpy(x), torch.from_numpy(eps), torch.from_numpy(eps2)
        logits, mu, logvar, z = model(x, eps)
        recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / x.size(0)
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.size(0)
        q = D.Normal(mu, torch.exp(0.5 * logvar))
        p = D.Normal(model.prior_loc.expand_as(mu), torch.ones_like(mu))
        kl2 = D.kl_divergence(q, p).sum(-1).mean()
        qi = D.Independent(D.Normal(mu, (0.5 * logvar).exp()), 1)
        z2 = q.loc + q.scale * eps2
        log_q = qi.log_prob(z2)
        log_p = D.Independent(p, 1).log_prob(z2)
        bern = D.Bernoulli(logits=model.dec(z2))
        log_px = bern.log_prob(x).sum(-1)
        elbo_mc = (log_px + log_p - log_q).mean()
        ent = q.entropy().sum(-1).mean()
        loss = recon + kld + 0.5 * kl2 - 0.1 * elbo_mc + 0.01 * ent + F.mse_loss(torch.sigmoid(logits), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2:
            scheduler.step()
        record["loss"].append(loss.item())
        record["parts"].append([recon.item(), kld.item(), kl2.item(), elbo_mc.item(), ent.item(),
                                 numpy_of(q.cdf(z2)), numpy_of(q.icdf(torch.full_like(mu, 0.3))),
                                 numpy_of(bern.probs), numpy_of(bern.entropy()), numpy_of(q.stddev),
                                 numpy_of(q.variance)])
        record["grads"].append(gradients(model))
    with torch.no_grad():
        model.eval()
        z = torch.from_numpy(batches[0][1])
        samples = torch.sigmoid(model.dec(z))
        record["samples"] = numpy_of(samples)
        record["rsample_shape"] = list(D.Normal(torch.zeros(3), torch.ones(3)).rsample((5,)).shape)
        record["mvn"] = numpy_of(D.MultivariateNormal(torch.zeros(3), scale_tril=torch.eye(3) * 2).log_prob(z))
        record["kl_mvn"] = numpy_of(D.kl_divergence(D.MultivariateNormal(z[0], covariance_matrix=torch.eye(3) * 0.5),
                                                    D.MultivariateNormal(torch.zeros(3), torch.eye(3))))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def vae_batches(rng, steps=5, batch=6):
    return [((rng.random((batch, 12)) < 0.4).astype(np.float32), rng.standard_normal((batch, 3)).astype(np.float32),
             rng.standard_normal((batch, 3)).astype(np.float32)) for _ in range(steps)]


def test_vae_with_distributions_and_kl_divergence_trains_like_torch():
    ours, theirs = run_both(vae, vae_batches(np.random.default_rng(10)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A DCGAN: weights_init by class name, ConvTranspose2d generator and strided-conv discriminator with BatchNorm,
# two Adam optimizers with betas=(0.5, 0.999), the discriminator's fake pass on fake.detach(), label.fill_, BCELoss,
# and an eval-mode generator on fixed noise.

def dcgan(torch, init, batches, nz=4, ngf=4, ndf=4):
    nn = torch.nn
    def weights_init(m):
        classname = m.__class__.__name__
        if classname.find("Conv") != -1:
            nn.init.normal_(m.weight.data, 0.0, 0.02)
        elif classname.find("BatchNorm") != -1:
            nn.init.normal_(m.weight.data, 1.0, 0.02)
            nn.init.constant_(m.bias.data, 0)
    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
                nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
                nn.ConvTranspose2d(ngf, 1, 4, 2, 1, bias=False), nn.Tanh())
        def forward(self, input):
            return self.main(input)
    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(1, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())
        def forward(self, input):
            return self.main(input).view(-1, 1).squeeze(1)
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.G, self.D = netG, netD
    both = Both()
    record = {"init": initial_state(torch, both, init), "errD": [], "errG": [], "gradsD": [], "gradsG": [], "D_x": []}
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    real_label, fake_label = 1., 0.
    fixed_noise = torch.from_numpy(batches[0][1])
    for real, noise in batches:
        real_cpu = torch.from_numpy(real)
        b_size = real_cpu.size(0)
        netD.zero_grad()
        label = torch.full((b_size,), real_label, dtype=torch.float)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean().item()
        fake = netG(torch.from_numpy(noise))
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        record["gradsD"].append(gradients(netD))
        netG.zero_grad()
        label.fill_(real_label)
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        record["gradsG"].append(gradients(netG))
        record["errD"].append(errD.item())
        record["errG"].append(errG.item())
        record["D_x"].append(D_x)
    netG.eval()
    with torch.no_grad():
        fake = netG(fixed_noise).detach().cpu()
    record["fake"] = numpy_of(fake)
    record["grid"] = numpy_of(torch.cat([f for f in fake], dim=-1))
    record["final"] = {k: numpy_of(v) for k, v in both.state_dict().items()}
    return record

def dcgan_batches(rng, steps=4, batch=5, nz=4):
    return [(np.tanh(rng.standard_normal((batch, 1, 16, 16))).astype(np.float32),
             rng.standard_normal((batch, nz, 1, 1)).astype(np.float32)) for _ in range(steps)]


def test_dcgan_with_two_optimizers_and_detached_fakes_trains_like_torch():
    ours, theirs = run_both(dcgan, dcgan_batches(np.random.default_rng(11)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A DDPM trainer: a small UNet with GroupNorm, SiLU, scale-shift timestep conditioning and nearest upsampling,
# sinusoidal timestep embeddings, a float64 noise schedule (linspace, cumprod, F.pad) read with gather, per-sample
# MSE, OneCycleLR, an EMA copy kept with lerp_ under no_grad, and ancestral sampling under inference_mode.

def ddpm(torch, init, batches, T=20):
    nn, F = torch.nn, torch.nn.functional
    def timestep_embedding(timesteps, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
        freqs = freqs.to(device=timesteps.device)
        args = timesteps[:, None].float() * freqs[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return embedding
    class ResBlock(nn.Module):
        def __init__(self, c, tdim):
            super().__init__()
            self.norm1 = nn.GroupNorm(2, c)
            self.conv1 = nn.Conv2d(c, c, 3, padding=1)
            self.emb = nn.Sequential(nn.SiLU(), nn.Linear(tdim, 2 * c))
            self.norm2 = nn.GroupNorm(2, c, eps=1e-6)
            self.conv2 = nn.Conv2d(c, c, 3, padding=1)
            nn.init.zeros_(self.conv2.weight)
        def forward(self, x, emb):
            h = self.conv1(F.silu(self.norm1(x)))
            scale, shift = self.emb(emb)[..., None, None].chunk(2, dim=1)
            h = self.norm2(h) * (1 + scale) + shift
            return x + self.conv2(F.silu(h))
    class UNet(nn.Module):
        def __init__(self, c=8, tdim=8):
            super().__init__()
            self.tdim = tdim
            self.time = nn.Sequential(nn.Linear(tdim, 16), nn.SiLU(), nn.Linear(16, tdim))
            self.inc = nn.Conv2d(1, c, 3, padding=1)
            self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
            self.mid = ResBlock(c, tdim)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.res = ResBlock(2 * c, tdim)
            self.out = nn.Sequential(nn.GroupNorm(4, 2 * c), nn.SiLU(), nn.Conv2d(2 * c, 1, 3, padding=1))
        def forward(self, x, t):
            emb = self.time(timestep_embedding(t, self.tdim))
            h0 = self.inc(x)
            h = self.up(self.mid(self.down(h0), emb))
            h = self.res(torch.cat([h, h0], dim=1), emb)
            return self.out(h)
    model = UNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
    alphas = 1.0 - betas
    alphas_cumprod = torch.cumprod(alphas, dim=0)
    alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)
    sqrt_ac = torch.sqrt(alphas_cumprod).float()
    sqrt_1mac = torch.sqrt(1.0 - alphas_cumprod).float()
    posterior_variance = (betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod)).float()
    def extract(a, t, x_shape):
        b, *_ = t.shape
        out = a.gather(-1, t)
        return out.reshape(b, *((1,) * (len(x_shape) - 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=4e-3, total_steps=len(batches),
                                                    pct_start=0.3, anneal_strategy="cos")
    for x0, t, noise in batches:
        x0, t, noise = torch.from_numpy(x0), torch.from_numpy(t), torch.from_numpy(noise)
        x_t = extract(sqrt_ac, t, x0.shape) * x0 + extract(sqrt_1mac, t, x0.shape) * noise
        pred = model(x_t, t)
        loss = F.mse_loss(pred, noise, reduction="none").mean(dim=list(range(1, len(pred.shape)))).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            for p_ema, p in zip(ema.parameters(), model.parameters()):
                p_ema.lerp_(p, 0.2)
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["lr"].append(scheduler.get_last_lr()[0])
    # ancestral sampling with numpy-provided noise
    rng_noise = batches[0][2]
    with torch.inference_mode():
        x = torch.from_numpy(rng_noise[:2])
        for i in reversed(range(0, T, 5)):
            t = torch.full((2,), i, dtype=torch.long)
            eps = ema(x, t)
            coef = extract(betas.float(), t, x.shape) / extract(sqrt_1mac, t, x.shape)
            mean = (x - coef * eps) / extract(alphas.float().sqrt(), t, x.shape)
            nonzero = (t != 0).float().view(-1, 1, 1, 1)
            log_variance = extract(posterior_variance, t, x.shape).clamp(min=1e-20).log()
            x = mean + nonzero * (0.5 * log_variance).exp() * torch.from_numpy(rng_noise[2:4])
        x = x.clamp(-1, 1)
    record["samples"] = numpy_of(x)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["ema"] = {k: numpy_of(v) for k, v in ema.state_dict().items()}
    return record

def ddpm_batches(rng, steps=5, batch=4, T=20):
    return [(rng.uniform(-1, 1, (batch, 1, 8, 8)).astype(np.float32), rng.integers(0, T, batch),
             rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)) for _ in range(steps)]


def test_ddpm_with_gathered_noise_schedule_and_ema_trains_like_torch():
    ours, theirs = run_both(ddpm, ddpm_batches(np.random.default_rng(12)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Parametrizations: weight_norm (dim=0 and dim=None), spectral_norm, orthogonal and a user's Symmetric through
# register_parametrization, the forward under parametrize.cached(), state_dict keys, is_parametrized and
# remove_parametrizations with and without leave_parametrized.

def param_prog(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional
    P = torch.nn.utils.parametrize
    class Symmetric(nn.Module):
        def forward(self, X):
            return X.triu() + X.triu(1).transpose(-1, -2)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.utils.parametrizations.weight_norm(nn.Linear(6, 8), dim=0)
            self.b = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8), n_power_iterations=1)
            self.c = nn.Linear(8, 8)
            P.register_parametrization(self.c, "weight", Symmetric())
            self.d = nn.utils.parametrizations.orthogonal(nn.Linear(8, 8, bias=False))
            self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 3, 3), name="weight", dim=None)
            self.head = nn.Linear(8 + 3 * 4, 2)
        def forward(self, x):
            h = torch.tanh(self.a(x))
            h = torch.relu(self.b(h))
            h = self.c(h)
            h = self.d(h)
            c = self.conv(x.view(-1, 2, 3)[:, :, :].repeat(1, 1, 2)).flatten(1)
            return self.head(torch.cat([h, c], 1))
    model = Net()
    record = {"init": None, "loss": [], "grads": [], "sigma": []}
    if init is None:
        record["init"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    else:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
        record["init"] = init
    names = {"keys": list(model.state_dict().keys())}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        model.train()
        with P.cached():
            loss = F.cross_entropy(model(x), y) + 0.01 * model.c.weight.pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["sigma"].append(float(torch.linalg.matrix_norm(model.b.weight.detach(), ord=2)))
    model.eval()
    with torch.no_grad():
        record["eval"] = numpy_of(model(torch.from_numpy(batches[0][0])))
        W = model.d.weight
        record["orth"] = numpy_of(W @ W.T)
        record["sym"] = numpy_of(model.c.weight - model.c.weight.T)
    names["is_parametrized"] = [P.is_parametrized(model.a), P.is_parametrized(model.a, "weight"),
                                P.is_parametrized(model.head)]
    names["parameters"] = [n for n, _ in model.named_parameters()]
    P.remove_parametrizations(model.c, "weight", leave_parametrized=True)
    P.remove_parametrizations(model.a, "weight")
    names["parameters_after"] = [n for n, _ in model.named_parameters()]
    record["names"] = names
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def param_prog_batches(rng, steps=4, batch=5):
    return [(rng.standard_normal((batch, 6)).astype(np.float32), rng.integers(0, 2, batch)) for _ in range(steps)]


def test_parametrized_layers_train_like_torch():
    ours, theirs = run_both(param_prog, param_prog_batches(np.random.default_rng(13)))
    assert ours.pop("names") == theirs.pop("names")
    assert_same(ours, theirs)
