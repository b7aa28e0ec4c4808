"""Sequence and continuous-depth programs in styles people publish, run under torch and under tilewise
(``import tilewise as torch``) from the same initial weights and batches, as in ``test_trust_programs.py``, whose
helpers these use: a Mamba-style selective state-space language model (its scan as a loop over time and in
parallel), an RWKV-style model with its numerically stable WKV recurrence, and a neural ODE classifier integrated by
a hand-written RK4, eager and compiled. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806, E741 — the programs keep the scripts' names (A_log, B, C, D, T, l)

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


def token_batches(rng, steps=3, batch=2, length=6, vocab=13):
    return [rng.integers(0, vocab, (batch, length + 1)).astype(np.int64) for _ in range(steps)]


# ----------------------------------------------------------------------------------------------------------------------
# A Mamba-style selective state-space language model, as the minimal re-implementations write it: the input projection
# split into x and a gate, a depthwise causal Conv1d (padded by kernel - 1, then sliced), SiLU, a data-dependent step
# delta through softplus, A = -exp(A_log), the selective scan either as a Python loop over time with einsum or in
# parallel through a cumulative sum of log decays (a masked segment sum, exponentiated); RMSNorm, an embedding tied to
# the head, AdamW decaying matrices only, clip_grad_norm_.

def mamba_lm(torch, init, batches, scan="loop", vocab=13, d_model=8, n_layers=2, compiled=False):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class MambaBlock(nn.Module):
        def __init__(self, d_model, d_state=4, d_conv=3, expand=2):
            super().__init__()
            self.d_inner = expand * d_model
            self.dt_rank = math.ceil(d_model / 16)
            self.in_proj = nn.Linear(d_model, self.d_inner * 2, bias=False)
            self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, kernel_size=d_conv, groups=self.d_inner,
                                    padding=d_conv - 1, bias=True)
            self.x_proj = nn.Linear(self.d_inner, self.dt_rank + d_state * 2, bias=False)
            self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
            A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(self.d_inner, 1)
            self.A_log = nn.Parameter(torch.log(A))
            self.D = nn.Parameter(torch.ones(self.d_inner))
            self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

        def forward(self, x):
            b, l, d = x.shape
            x_and_res = self.in_proj(x)
            x, res = x_and_res.split(split_size=[self.d_inner, self.d_inner], dim=-1)
            x = x.transpose(1, 2)
            x = self.conv1d(x)[:, :, :l]
            x = x.transpose(1, 2)
            x = F.silu(x)
            y = self.ssm(x)
            y = y * F.silu(res)
            return self.out_proj(y)

        def ssm(self, x):
            d_in, n = self.A_log.shape
            A = -torch.exp(self.A_log.float())
            D = self.D.float()
            x_dbl = self.x_proj(x)
            delta, B, C = x_dbl.split(split_size=[self.dt_rank, n, n], dim=-1)
            delta = F.softplus(self.dt_proj(delta))
            if scan == "loop":
                return self.selective_scan(x, delta, A, B, C, D)
            return self.selective_scan_parallel(x, delta, A, B, C, D)

        @staticmethod
        def selective_scan(u, delta, A, B, C, D):
            b, l, d_in = u.shape
            n = A.shape[1]
            deltaA = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
            deltaB_u = torch.einsum("bld,bln,bld->bldn", delta, B, u)
            x = torch.zeros((b, d_in, n), device=deltaA.device)
            ys = []
            for i in range(l):
                x = deltaA[:, i] * x + deltaB_u[:, i]
                y = torch.einsum("bdn,bn->bd", x, C[:, i, :])
                ys.append(y)
            y = torch.stack(ys, dim=1)
            return y + u * D

        @staticmethod
        def segsum(x):
            T = x.size(-1)
            x_cumsum = torch.cumsum(x, dim=-1)
            x_segsum = x_cumsum[..., :, None] - x_cumsum[..., None, :]
            mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=0)
            return x_segsum.masked_fill(~mask, -torch.inf)

        @classmethod
        def selective_scan_parallel(cls, u, delta, A, B, C, D):
            dA = torch.einsum("bld,dn->bdnl", delta, A)
            L = torch.exp(cls.segsum(dA))  # (b, d, n, t, s): the decay from s to t
            deltaB_u = torch.einsum("bld,bln,bld->bdnl", delta, B, u)
            h = torch.einsum("bdnts,bdns->btdn", L, deltaB_u)
            y = torch.einsum("btdn,btn->btd", h, C)
            return y + u * D

    class ResidualBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = MambaBlock(d_model)
            self.norm = RMSNorm(d_model)

        def forward(self, x):
            return self.mixer(self.norm(x)) + x

    class Mamba(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, d_model)
            self.layers = nn.ModuleList([ResidualBlock() for _ in range(n_layers)])
            self.norm_f = RMSNorm(d_model)
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
            self.lm_head.weight = self.embedding.weight  # tied

        def forward(self, input_ids):
            x = self.embedding(input_ids)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm_f(x))

    model = Mamba()
    record = {"init": initial_state(torch, model, init), "loss": [], "norm": [], "grads": []}
    run = torch.compile(model) if compiled else model
    record["tied"] = model.lm_head.weight is model.embedding.weight
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    for tokens in batches:
        tokens = torch.from_numpy(tokens)
        x, y = tokens[:, :-1], tokens[:, 1:]
        logits = run(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record["loss"].append(loss.item())
        record["norm"].append(norm.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        record["eval"] = numpy_of(model(torch.from_numpy(batches[0][:, :-1])).log_softmax(-1))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


@pytest.mark.parametrize("scan", ["loop", "parallel"])
def test_mamba_language_model_with_a_selective_scan_trains_like_torch(scan):
    ours, theirs = run_both(mamba_lm, token_batches(np.random.default_rng(0)), scan=scan)
    assert theirs["tied"] and ours["tied"]
    assert_same(ours, theirs)


def test_mamba_scan_in_parallel_agrees_with_the_loop():
    batches = token_batches(np.random.default_rng(1), steps=2)
    loop = run_both(mamba_lm, batches, scan="loop")
    real_torch.manual_seed(0)
    parallel_theirs = mamba_lm(real_torch, None, batches, scan="parallel")
    parallel_ours = mamba_lm(tilewise, parallel_theirs["init"], batches, scan="parallel")
    assert_same(parallel_ours["loss"], loop[0]["loss"], rtol=1e-4, atol=1e-5)
    assert_same(parallel_theirs["loss"], loop[1]["loss"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("program", ["mamba loop", "mamba parallel", "rwkv"])
def test_sequence_models_compiled_by_tilewise_train_as_they_do_eagerly(program):
    # tilewise.compile over the Python loops over time: one graph per step's shapes, the same numbers as eagerly
    prog, kwargs = {"mamba loop": (mamba_lm, {"scan": "loop"}), "mamba parallel": (mamba_lm, {"scan": "parallel"}),
                    "rwkv": (rwkv_lm, {})}[program]
    batches = token_batches(np.random.default_rng(3), steps=2)
    eager, theirs = run_both(prog, batches, **kwargs)
    compiled = prog(tilewise, theirs["init"], batches, compiled=True, **kwargs)
    assert_same(compiled, eager, rtol=1e-4, atol=1e-5)
    assert_same(compiled, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# An RWKV-style language model (the v4 formulation): token shift through nn.ZeroPad2d((0, 0, 1, -1)) or F.pad with a
# negative pad, time-mix interpolations, a learned per-channel decay in the WKV recurrence kept stable with
# torch.maximum and exp of differences, channel-mix with squared ReLU, LayerNorm, Adam under a cosine schedule with
# linear warmup through LambdaLR.

def rwkv_lm(torch, init, batches, shift="zeropad", vocab=13, n_embd=8, n_layer=2, warmup=2, total=6,
            compiled=False):
    nn, F = torch.nn, torch.nn.functional

    class TokenShift(nn.Module):
        def __init__(self):
            super().__init__()
            self.pad = nn.ZeroPad2d((0, 0, 1, -1))

        def forward(self, x):
            return self.pad(x) if shift == "zeropad" else F.pad(x, (0, 0, 1, -1))

    class TimeMix(nn.Module):
        def __init__(self, layer_id):
            super().__init__()
            ratio_0_to_1 = layer_id / max(n_layer - 1, 1)
            ratio_1_to_almost0 = 1.0 - layer_id / n_layer
            decay_speed = torch.ones(n_embd)
            for h in range(n_embd):
                decay_speed[h] = -5 + 8 * (h / (n_embd - 1)) ** (0.7 + 1.3 * ratio_0_to_1)
            self.time_decay = nn.Parameter(decay_speed)
            zigzag = torch.tensor([(i + 1) % 3 - 1 for i in range(n_embd)]) * 0.5
            self.time_first = nn.Parameter(torch.ones(n_embd) * math.log(0.3) + zigzag)
            x = torch.ones(1, 1, n_embd)
            for i in range(n_embd):
                x[0, 0, i] = i / n_embd
            self.time_mix_k = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
            self.time_mix_v = nn.Parameter(torch.pow(x, ratio_1_to_almost0) + 0.3 * ratio_0_to_1)
            self.time_mix_r = nn.Parameter(torch.pow(x, 0.5 * ratio_1_to_almost0))
            self.time_shift = TokenShift()
            self.key = nn.Linear(n_embd, n_embd, bias=False)
            self.value = nn.Linear(n_embd, n_embd, bias=False)
            self.receptance = nn.Linear(n_embd, n_embd, bias=False)
            self.output = nn.Linear(n_embd, n_embd, bias=False)

        def wkv(self, k, v):
            B, T, C = k.size()
            w = -torch.exp(self.time_decay)
            u = self.time_first
            aa = torch.zeros(B, C, dtype=k.dtype)
            bb = torch.zeros(B, C, dtype=k.dtype)
            pp = torch.full((B, C), -1e38, dtype=k.dtype)
            out = []
            for t in range(T):
                kk, vv = k[:, t], v[:, t]
                ww = u + kk
                p = torch.maximum(pp, ww)
                e1 = torch.exp(pp - p)
                e2 = torch.exp(ww - p)
                out.append((e1 * aa + e2 * vv) / (e1 * bb + e2))
                ww = w + pp
                p = torch.maximum(ww, kk)
                e1 = torch.exp(ww - p)
                e2 = torch.exp(kk - p)
                aa = e1 * aa + e2 * vv
                bb = e1 * bb + e2
                pp = p
            return torch.stack(out, dim=1)

        def forward(self, x):
            xx = self.time_shift(x)
            xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
            xv = x * self.time_mix_v + xx * (1 - self.time_mix_v)
            xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
            k, v = self.key(xk), self.value(xv)
            sr = torch.sigmoid(self.receptance(xr))
            return self.output(sr * self.wkv(k, v))

    class ChannelMix(nn.Module):
        def __init__(self, layer_id):
            super().__init__()
            self.time_shift = TokenShift()
            ratio_1_to_almost0 = 1.0 - layer_id / n_layer
            x = torch.arange(n_embd, dtype=torch.float32).view(1, 1, n_embd) / n_embd
            self.time_mix_k = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
            self.time_mix_r = nn.Parameter(torch.pow(x, ratio_1_to_almost0))
            self.key = nn.Linear(n_embd, 4 * n_embd, bias=False)
            self.receptance = nn.Linear(n_embd, n_embd, bias=False)
            self.value = nn.Linear(4 * n_embd, n_embd, bias=False)

        def forward(self, x):
            xx = self.time_shift(x)
            xk = x * self.time_mix_k + xx * (1 - self.time_mix_k)
            xr = x * self.time_mix_r + xx * (1 - self.time_mix_r)
            k = torch.square(torch.relu(self.key(xk)))
            kv = self.value(k)
            return torch.sigmoid(self.receptance(xr)) * kv

    class Block(nn.Module):
        def __init__(self, layer_id):
            super().__init__()
            self.ln0 = nn.LayerNorm(n_embd) if layer_id == 0 else None
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.att, self.ffn = TimeMix(layer_id), ChannelMix(layer_id)

        def forward(self, x):
            if self.ln0 is not None:
                x = self.ln0(x)
            x = x + self.att(self.ln1(x))
            return x + self.ffn(self.ln2(x))

    class RWKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, n_embd)
            self.blocks = nn.Sequential(*[Block(i) for i in range(n_layer)])
            self.ln_out = nn.LayerNorm(n_embd)
            self.head = nn.Linear(n_embd, vocab, bias=False)

        def forward(self, idx):
            return self.head(self.ln_out(self.blocks(self.emb(idx))))

    model = RWKV()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    run = torch.compile(model) if compiled else model
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3, betas=(0.9, 0.99), eps=1e-8)

    def lr_lambda(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    for tokens in batches:
        tokens = torch.from_numpy(tokens)
        logits = run(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["lr"].append(scheduler.get_last_lr()[0])
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    with torch.no_grad():
        record["eval"] = numpy_of(model(torch.from_numpy(batches[0][:, :-1])))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


@pytest.mark.parametrize("shift", ["zeropad", "negative_pad"])
def test_rwkv_language_model_with_a_stable_wkv_recurrence_trains_like_torch(shift):
    ours, theirs = run_both(rwkv_lm, token_batches(np.random.default_rng(2), steps=4), shift=shift)
    assert theirs["lr"][0] < theirs["lr"][1]  # warmup
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A neural ODE classifier: an encoder, a tanh MLP vector field taking time as an extra input (a 0-d time expanded over
# the batch and concatenated), integrated from 0 to 1 by a fixed-step RK4 written in Python, a linear head; SGD with
# Nesterov momentum and weight decay. The same program runs with the model compiled (torch.compile on torch's side,
# tilewise.compile on tilewise's).

def neural_ode(torch, init, batches, compiled=False, steps=4, dim=4, hidden=16):
    nn, F = torch.nn, torch.nn.functional

    class ODEFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(dim + 1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                     nn.Linear(hidden, dim))
            self.nfe = 0

        def forward(self, t, y):
            self.nfe += 1
            tt = t.expand(y.shape[0], 1)
            return self.net(torch.cat([y, tt], dim=1))

    def rk4(func, y0, t0=0.0, t1=1.0, n=steps):
        h = (t1 - t0) / n
        y = y0
        for i in range(n):
            t = torch.tensor([[t0 + i * h]], dtype=y.dtype)
            k1 = func(t, y)
            k2 = func(t + h / 2, y + h / 2 * k1)
            k3 = func(t + h / 2, y + h / 2 * k2)
            k4 = func(t + h, y + h * k3)
            y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return y

    class ODEBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.odefunc = ODEFunc()

        def forward(self, x):
            return rk4(self.odefunc, x)

    class ODENet(nn.Module):
        def __init__(self, in_features=2, num_classes=3):
            super().__init__()
            self.encoder = nn.Linear(in_features, dim)
            self.ode = ODEBlock()
            self.fc = nn.Linear(dim, num_classes)

        def forward(self, x):
            return self.fc(self.ode(torch.tanh(self.encoder(x))))

    model = ODENet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    run = torch.compile(model) if compiled is True else model
    if compiled == "method":  # nn.Module.compile(): the module itself runs compiled
        model.compile()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        optimizer.zero_grad()
        loss = F.cross_entropy(run(x), y)
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        logits = run(torch.from_numpy(batches[0][0]))
        record["accuracy"] = (logits.argmax(1) == torch.from_numpy(batches[0][1])).float().mean().item()
        record["eval"] = numpy_of(logits)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def spirals(rng, steps=4, batch=12):
    batches = []
    for _ in range(steps):
        y = rng.integers(0, 3, batch)
        r = rng.uniform(0.2, 1.0, batch)
        theta = 2.5 * r + y * 2 * np.pi / 3 + rng.normal(0, 0.1, batch)
        x = np.stack([r * np.cos(theta), r * np.sin(theta)], 1).astype(np.float32)
        batches.append((x, y.astype(np.int64)))
    return batches


def test_neural_ode_classifier_with_rk4_and_nesterov_sgd_trains_like_torch():
    ours, theirs = run_both(neural_ode, spirals(np.random.default_rng(4)))
    assert_same(ours, theirs)


@pytest.mark.slow  # torch.compile's side compiles for about 20 s on two cores
def test_neural_ode_classifier_compiled_trains_as_it_does_eagerly():
    batches = spirals(np.random.default_rng(5), steps=3)
    eager_ours, eager_theirs = run_both(neural_ode, batches)
    compiled_ours = neural_ode(tilewise, eager_theirs["init"], batches, compiled=True)
    real_torch.manual_seed(0)
    compiled_theirs = neural_ode(real_torch, None, batches, compiled=True)
    assert_same(compiled_ours["loss"], eager_ours["loss"])
    assert_same(compiled_ours, compiled_theirs)
    assert_same(eager_ours, eager_theirs)
    method_ours = neural_ode(tilewise, eager_theirs["init"], batches, compiled="method")
    assert_same(method_ours, eager_theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Mamba's reference initialisation and its recurrent inference: dt_proj's bias set to softplus^-1 of a log-uniform
# step (expm1, clamp, copy_ under no_grad, a _no_reinit flag on the Parameter), A_log and D flagged _no_weight_decay and
# grouped by that flag; then step-by-step decoding with a rolling conv state written in place and an SSM state,
# against the full sequence's logits, and a greedy generation loop.

def mamba_inference(torch, init, batches, rolls, d_model=8, d_state=4, d_conv=4, vocab=11, dt_min=1e-3, dt_max=0.1):
    nn, F = torch.nn, torch.nn.functional
    d_inner, dt_rank = 2 * d_model, math.ceil(d_model / 16)

    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = nn.Linear(d_model, d_inner * 2, bias=False)
            self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
            self.x_proj = nn.Linear(d_inner, dt_rank + 2 * d_state, bias=False)
            self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
            dt_init_std = dt_rank ** -0.5
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
            dt = torch.exp(torch.from_numpy(rolls) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            dt = dt.clamp(min=1e-4)
            inv_dt = dt + torch.log(-torch.expm1(-dt))
            with torch.no_grad():
                self.dt_proj.bias.copy_(inv_dt)
            self.dt_proj.bias._no_reinit = True
            A = torch.arange(1, d_state + 1, dtype=torch.float32)[None, :].expand(d_inner, -1).contiguous()
            self.A_log = nn.Parameter(torch.log(A))
            self.A_log._no_weight_decay = True
            self.D = nn.Parameter(torch.ones(d_inner))
            self.D._no_weight_decay = True
            self.out_proj = nn.Linear(d_inner, d_model, bias=False)

        def forward(self, hidden):
            L = hidden.shape[1]
            xz = self.in_proj(hidden).transpose(1, 2)  # (b, 2 * d_inner, l)
            x, z = xz.chunk(2, dim=1)
            x = F.silu(self.conv1d(x)[..., :L])
            x_dbl = self.x_proj(x.transpose(1, 2))
            dt, B, C = torch.split(x_dbl, [dt_rank, d_state, d_state], dim=-1)
            dt = F.softplus(self.dt_proj(dt))  # (b, l, d_inner)
            A = -torch.exp(self.A_log.float())
            state = x.new_zeros(x.shape[0], d_inner, d_state)
            ys = []
            for t in range(L):
                dA = torch.exp(dt[:, t, :, None] * A)
                dBx = dt[:, t, :, None] * B[:, t, None, :] * x[:, :, t, None]
                state = state * dA + dBx
                ys.append((state @ C[:, t, :, None]).squeeze(-1))
            y = torch.stack(ys, dim=-1) + x * self.D[:, None]
            y = y * F.silu(z)
            return self.out_proj(y.transpose(1, 2))

        def step(self, hidden, conv_state, ssm_state):
            xz = self.in_proj(hidden.squeeze(1))
            x, z = xz.chunk(2, dim=-1)
            conv_state.copy_(torch.roll(conv_state, shifts=-1, dims=-1))
            conv_state[:, :, -1] = x
            x = torch.sum(conv_state * self.conv1d.weight.squeeze(1), dim=-1)
            x = F.silu(x + self.conv1d.bias)
            dt, B, C = torch.split(self.x_proj(x), [dt_rank, d_state, d_state], dim=-1)
            dt = F.softplus(F.linear(dt, self.dt_proj.weight, self.dt_proj.bias))
            A = -torch.exp(self.A_log.float())
            dA = torch.exp(torch.einsum("bd,dn->bdn", dt, A))
            dB = torch.einsum("bd,bn->bdn", dt, B)
            ssm_state.copy_(ssm_state * dA + x.unsqueeze(-1) * dB)
            y = torch.einsum("bdn,bn->bd", ssm_state.to(x.dtype), C)
            y = y + self.D.to(x.dtype) * x
            y = y * F.silu(z)
            return self.out_proj(y).unsqueeze(1)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, d_model)
            self.mixer = Mixer()
            self.norm = nn.LayerNorm(d_model)
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
            self.lm_head.weight = self.embedding.weight

        def forward(self, ids):
            h = self.embedding(ids)
            return self.lm_head(self.norm(h + self.mixer(h)))

        def step(self, ids, conv_state, ssm_state):
            h = self.embedding(ids)
            return self.lm_head(self.norm(h + self.mixer.step(h, conv_state, ssm_state)))

    model = LM()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    record["flags"] = {n: float(getattr(p, "_no_weight_decay", False)) for n, p in model.named_parameters()}
    no_wd = [p for p in model.parameters() if getattr(p, "_no_weight_decay", False)]
    wd = [p for p in model.parameters() if not getattr(p, "_no_weight_decay", False)]
    optimizer = torch.optim.AdamW([{"params": wd}, {"params": no_wd, "weight_decay": 0.0}], lr=1e-2,
                                  weight_decay=0.1)
    for tokens in batches:
        tokens = torch.from_numpy(tokens)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.inference_mode():
        ids = torch.from_numpy(batches[0][:, :-1])
        full = model(ids)
        b = ids.shape[0]
        conv_state = torch.zeros(b, d_inner, d_conv)
        ssm_state = torch.zeros(b, d_inner, d_state)
        steps = [model.step(ids[:, t:t + 1], conv_state, ssm_state) for t in range(ids.shape[1])]
        record["full"], record["stepped"] = numpy_of(full), numpy_of(torch.cat(steps, dim=1))
        generated = ids[:, -1:]
        out = []
        for _ in range(4):
            nxt = model.step(generated, conv_state, ssm_state)[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            generated = nxt
        record["generated"] = numpy_of(torch.cat(out, dim=1))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_mamba_initialisation_and_recurrent_decoding_match_torch():
    rng = np.random.default_rng(6)
    ours, theirs = run_both(mamba_inference, token_batches(rng, steps=2, vocab=11), rng.random(16).astype(np.float32))
    assert [n for n, flag in theirs["flags"].items() if flag] == ["mixer.A_log", "mixer.D"]
    np.testing.assert_allclose(theirs["stepped"], theirs["full"], rtol=1e-4, atol=1e-5)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# RWKV run as an RNN: the same time-mix and channel-mix weights applied one token at a time with a state of five
# vectors per layer (the previous inputs, and the WKV numerator, denominator and running maximum), F.layer_norm with
# explicit weights, against the parallel formulation over the whole sequence.

def rwkv_rnn(torch, init, tokens, n_embd=8, vocab=11):
    nn, F = torch.nn, torch.nn.functional

    class RWKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, n_embd)
            self.ln1, self.ln2, self.ln_out = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.time_decay = nn.Parameter(torch.linspace(-2, 1, n_embd))
            self.time_first = nn.Parameter(torch.full((n_embd,), math.log(0.3)))
            self.att_mix = nn.Parameter(torch.rand(3, n_embd))
            self.ffn_mix = nn.Parameter(torch.rand(2, n_embd))
            self.att = nn.ModuleDict({k: nn.Linear(n_embd, n_embd, bias=False) for k in ("key", "value", "recept",
                                                                                          "output")})
            self.ffn_key = nn.Linear(n_embd, 4 * n_embd, bias=False)
            self.ffn_value = nn.Linear(4 * n_embd, n_embd, bias=False)
            self.ffn_recept = nn.Linear(n_embd, n_embd, bias=False)
            self.head = nn.Linear(n_embd, vocab, bias=False)

        def layer_norm(self, x, ln):
            return F.layer_norm(x, (n_embd,), weight=ln.weight, bias=ln.bias)

        def channel_mixing(self, x, last_x):
            k = self.ffn_key(x * self.ffn_mix[0] + last_x * (1 - self.ffn_mix[0]))
            r = self.ffn_recept(x * self.ffn_mix[1] + last_x * (1 - self.ffn_mix[1]))
            return torch.sigmoid(r) * self.ffn_value(torch.square(torch.relu(k)))

        def time_mixing(self, x, last_x, num, den, pmax):
            mk, mv, mr = self.att_mix.unbind(0)
            k = self.att["key"](x * mk + last_x * (1 - mk))
            v = self.att["value"](x * mv + last_x * (1 - mv))
            r = self.att["recept"](x * mr + last_x * (1 - mr))
            ww = self.time_first + k
            q = torch.maximum(pmax, ww)
            e1, e2 = torch.exp(pmax - q), torch.exp(ww - q)
            wkv = (e1 * num + e2 * v) / (e1 * den + e2)
            ww = pmax - torch.exp(self.time_decay)
            q = torch.maximum(ww, k)
            e1, e2 = torch.exp(ww - q), torch.exp(k - q)
            return self.att["output"](torch.sigmoid(r) * wkv), (e1 * num + e2 * v, e1 * den + e2, q)

        def forward(self, token, state):
            x = self.emb(token)
            xa = self.layer_norm(x, self.ln1)
            dx, (num, den, pmax) = self.time_mixing(xa, state[0], state[1], state[2], state[3])
            x = x + dx
            xf = self.layer_norm(x, self.ln2)
            x = x + self.channel_mixing(xf, state[4])
            state = torch.stack([xa, num, den, pmax, xf])
            return self.head(self.layer_norm(x, self.ln_out)), state

    model = RWKV()
    record = {"init": initial_state(torch, model, init), "loss": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for seq in tokens:
        seq = torch.from_numpy(seq)
        state = torch.zeros(5, seq.shape[0], n_embd)
        state[3] = -1e30
        losses = []
        for t in range(seq.shape[1] - 1):
            logits, state = model(seq[:, t], state)
            losses.append(F.cross_entropy(logits, seq[:, t + 1], reduction="none"))
        loss = torch.stack(losses, dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
    record["grads"] = gradients(model)
    with torch.no_grad():
        state = torch.zeros(5, 1, n_embd)
        state[3].fill_(-1e30)
        probs = []
        for token in tokens[0][0]:
            logits, state = model(torch.tensor([int(token)]), state)
            probs.append(F.softmax(logits, dim=-1))
        record["probs"] = numpy_of(torch.cat(probs))
        record["state"] = numpy_of(state)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_rwkv_as_an_rnn_with_a_stacked_state_trains_like_torch():
    ours, theirs = run_both(rwkv_rnn, token_batches(np.random.default_rng(7), steps=3, vocab=11))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A continuous normalizing flow (FFJORD-style) on 2-d points: the dynamics and the log-density change integrated
# together by an odeint over a torch.linspace grid (RK4, the 3/8 rule), the divergence by Hutchinson's estimator
# (a vector-Jacobian product of the dynamics with autograd.grad(create_graph=True), with numpy-drawn Rademacher
# noise) and exactly (one autograd.grad per coordinate); Adam, with clipping by value.

def cnf(torch, init, batches, exact=False, hidden=16, dim=2):
    nn = torch.nn

    class ConcatSquash(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.layer = nn.Linear(d_in, d_out)
            self.hyper_gate = nn.Linear(1, d_out)
            self.hyper_bias = nn.Linear(1, d_out, bias=False)

        def forward(self, t, x):
            t = t.view(1, 1)
            return self.layer(x) * torch.sigmoid(self.hyper_gate(t)) + self.hyper_bias(t)

    class ODEnet(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([ConcatSquash(dim, hidden), ConcatSquash(hidden, hidden),
                                         ConcatSquash(hidden, dim)])

        def forward(self, t, x):
            for i, layer in enumerate(self.layers):
                x = layer(t, x)
                if i < len(self.layers) - 1:
                    x = nn.functional.softplus(x)
            return x

    class CNFFunc(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = ODEnet()
            self.noise = None

        def forward(self, t, states):
            z = states[0]
            with torch.set_grad_enabled(True):
                if not z.requires_grad:
                    z.requires_grad_(True)
                dz = self.net(t, z)
                if exact:
                    div = 0.0
                    for i in range(z.shape[1]):
                        div += torch.autograd.grad(dz[:, i].sum(), z, create_graph=True)[0][:, i]
                    div = div.view(-1, 1)
                else:
                    e_dzdx = torch.autograd.grad(dz, z, self.noise, create_graph=True)[0]
                    div = (e_dzdx * self.noise).view(z.shape[0], -1).sum(dim=1, keepdim=True)
            return dz, -div

    def odeint(func, y0, t):
        ys = y0
        for t0, t1 in zip(t[:-1], t[1:]):
            dt = t1 - t0
            k1 = func(t0, ys)
            k2 = func(t0 + dt / 3, tuple(y + dt * a / 3 for y, a in zip(ys, k1)))
            k3 = func(t0 + dt * 2 / 3, tuple(y + dt * (b - a / 3) for y, a, b in zip(ys, k1, k2)))
            k4 = func(t1, tuple(y + dt * (a - b + c) for y, a, b, c in zip(ys, k1, k2, k3)))
            ys = tuple(y + (a + 3 * (b + c) + d) * dt * 0.125 for y, a, b, c, d in zip(ys, k1, k2, k3, k4))
        return ys

    func = CNFFunc()
    record = {"init": initial_state(torch, func, init), "loss": [], "grads": []}
    optimizer = torch.optim.Adam(func.parameters(), lr=5e-3, weight_decay=1e-5)
    times = torch.linspace(0.0, 1.0, 3)
    for x, noise in batches:
        x, func.noise = torch.from_numpy(x), torch.from_numpy(noise)
        logp_diff_t0 = torch.zeros(x.shape[0], 1, dtype=torch.float32)
        z_t1, logp_diff_t1 = odeint(func, (x, logp_diff_t0), times)
        logp_x = (-0.5 * z_t1.pow(2).sum(1, keepdim=True) - math.log(2 * math.pi)) - logp_diff_t1
        loss = -logp_x.mean(0)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(func.parameters(), 1.0)
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(func))
    record["final"] = {k: numpy_of(v) for k, v in func.state_dict().items()}
    return record


def two_moons(rng, steps=3, batch=8):
    batches = []
    for _ in range(steps):
        theta = rng.uniform(0, np.pi, batch)
        side = rng.integers(0, 2, batch)
        x = np.stack([np.cos(theta) + side, np.sin(theta) * (1 - 2 * side) + 0.5 * side], 1)
        noise = rng.choice([-1.0, 1.0], (batch, 2))
        batches.append(((x + 0.05 * rng.standard_normal(x.shape)).astype(np.float32), noise.astype(np.float32)))
    return batches


@pytest.mark.parametrize("exact", [False, True], ids=["hutchinson", "exact"])
def test_continuous_normalizing_flow_with_a_trace_estimator_trains_like_torch(exact):
    ours, theirs = run_both(cnf, two_moons(np.random.default_rng(8)), exact=exact)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# What the programs met, reduced.


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_tensor_split_names_its_sizes_split_size_as_torch(torch):
    # x.split(split_size=[...]) as Mamba's reference code calls it; torch.split's keyword is split_size_or_sections
    x = torch.arange(6.0)
    assert [t.tolist() for t in x.split(split_size=[2, 4], dim=-1)] == [[0.0, 1.0], [2.0, 3.0, 4.0, 5.0]]
    assert [t.tolist() for t in x.split(split_size=4)] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert [t.tolist() for t in torch.split(x, split_size_or_sections=[5, 1])] == [[0.0, 1.0, 2.0, 3.0, 4.0], [5.0]]
    exc = raised(lambda t: x.split(split_size_or_sections=2), torch)
    assert type(exc) is TypeError and "got an unexpected keyword argument 'split_size_or_sections'" in str(exc)
    exc = raised(lambda t: t.split(x, split_size=2), torch)
    assert type(exc) is TypeError and "got an unexpected keyword argument 'split_size'" in str(exc)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_the_module_exports_torchs_constants(torch):
    # x.masked_fill(~mask, -torch.inf), as Mamba-2's segment sum writes it
    assert torch.inf == math.inf and math.isnan(torch.nan) and torch.pi == math.pi and torch.e == math.e
    assert torch.newaxis is None
    x = torch.zeros(2, 2).masked_fill(~torch.tril(torch.ones(2, 2, dtype=torch.bool)), -torch.inf)
    assert x.tolist() == [[0.0, -math.inf], [0.0, 0.0]]


# Heinsen's parallel scan, as log-space linear recurrences (minGRU, Mamba-like) publish it: log of negative or complex
# values, logcumsumexp over complex numbers, its gradient; and the complex gradients it leads to (a complex number
# operand's conjugate, pow's, prod's and cumprod's)

def heinsen_scan(torch, log_coeffs, log_values):
    a_star = torch.cumsum(log_coeffs, dim=1)
    log_h0_plus_b_star = torch.logcumsumexp(log_values - a_star, dim=1)
    return torch.exp(a_star + log_h0_plus_b_star)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_logcumsumexp_of_complex_numbers_and_its_gradient_match_torch(dtype):
    rng = np.random.default_rng(9)
    coeffs = rng.uniform(0.5, 0.99, (2, 5, 3))
    values = rng.standard_normal((2, 5, 3))  # negative values: their logs are complex
    seen = []
    for torch in LIBRARIES:
        dt = getattr(torch, dtype)
        c = torch.tensor(coeffs, dtype=dt, requires_grad=True)
        v = torch.tensor(values, dtype=dt, requires_grad=True)
        h = heinsen_scan(torch, torch.log(c), torch.log(v))
        (h.real * torch.linspace(-1, 1, 3)).sum().backward()
        seen.append([numpy_of(h), numpy_of(c.grad), numpy_of(v.grad)])
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)
    recurrence, h = [], np.zeros((2, 3))
    for t in range(5):
        h = coeffs[:, t] * h + values[:, t]
        recurrence.append(h)
    np.testing.assert_allclose(seen[1][0].real, np.stack(recurrence, 1), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_logcumsumexp_at_infinities_and_of_integers_as_torch(torch):
    inf, nan = math.inf, math.nan
    x = torch.tensor([[complex(-inf, 0), 1 + 1j, complex(inf, 0.5), 2], [complex(-inf, 0), complex(-inf, 1), 1j, nan]])
    out = torch.logcumsumexp(x, 1)
    assert out[0].tolist()[:2] == [complex(-inf, 0), 1 + 1j] and out[0, 2].real == inf and out[0, 3].real == inf
    assert out[1].tolist()[:3] == [complex(-inf, 0), complex(-inf, 0), 1j] and math.isnan(out[1, 3].real)
    for dtype, name in ((torch.int64, "Long"), (torch.bool, "Bool"), (torch.int8, "Char")):
        exc = raised(lambda t, dtype=dtype: t.logcumsumexp(t.tensor([1, 0], dtype=dtype), 0), torch)
        assert type(exc) is NotImplementedError and f'"logcumsumexp_out_cpu" not implemented for \'{name}\'' in str(exc)


COMPLEX_GRADIENTS = {
    "x * complex": lambda t, x: x * (1 + 1j),
    "complex * x": lambda t, x: (1 - 2j) * x,
    "x / complex": lambda t, x: x / (1 + 1j),
    "x.mul(complex)": lambda t, x: x.mul(0.5j),
    "x ** complex": lambda t, x: x ** (1 + 1j),
    "complex ** x": lambda t, x: (1 + 1j) ** x,
    "x ** complex tensor": lambda t, x: x ** t.tensor([2 + 1j, 0.5j, 1.0]),
    "complex tensor ** x": lambda t, x: t.tensor([2 + 1j, 0.5j, 1.0]) ** x,
    "x ** x": lambda t, x: t.pow(x, x),
    "prod": lambda t, x: x.prod() * (1 + 1j),
    "prod(dim)": lambda t, x: x.reshape(1, 3).prod(1),
    "cumsum": lambda t, x: x.cumsum(0) * t.tensor([1j, 2.0, -1.0]),
    "cumprod": lambda t, x: x.cumprod(0) * t.tensor([1 + 1j, 2.0, -1j]),
    "cumprod with a zero": lambda t, x: (x * t.tensor([1.0, 0.0, 1.0])).cumprod(0) * (1 - 1j),
    **{f"x.{name}()": (lambda t, x, name=name: getattr(x * 0.3, name)()) for name in (
        "exp2", "expm1", "log2", "log10", "log1p", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "tanh", "sigmoid", "sgn", "sinc")},
    "addcmul": lambda t, x, y=(0.5 - 1j): t.addcmul(x, x, x.flip(0), value=y),
    "addcdiv": lambda t, x: t.addcdiv(x, x.flip(0), x, value=0.5),
    "lerp": lambda t, x: t.lerp(x, x.flip(0) * 1j, x),
    "lerp by a number": lambda t, x: t.lerp(x, x.flip(0) * 1j, 0.3),
}


@pytest.mark.parametrize("case", COMPLEX_GRADIENTS)
def test_gradients_of_complex_arithmetic_match_torch(case):
    seen = []
    for torch in LIBRARIES:
        x = torch.tensor([1 + 2j, -3 + 0.5j, 0.1 - 1j], requires_grad=True)
        y = COMPLEX_GRADIENTS[case](torch, x)
        (g,) = torch.autograd.grad((y.real + 0.5 * y.imag).sum(), x, create_graph=True)
        record = [numpy_of(y), numpy_of(g), float(g.requires_grad)]
        if g.requires_grad:  # not where y is linear in x
            record.append(numpy_of(torch.autograd.grad(g.abs().sum(), x)[0]))
        seen.append(record)
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)


# S4D-style kernels (a complex diagonal state matrix, its Vandermonde product by einsum, an FFT convolution) and
# complex parameters trained by torch's optimizers

def s4d_kernel(torch, params, u, L):
    dt = torch.exp(params["log_dt"])
    C = torch.view_as_complex(params["C"])
    A = -torch.exp(params["log_A_real"]) + 1j * params["A_imag"]
    dtA = A * dt.unsqueeze(-1)
    K = dtA.unsqueeze(-1) * torch.arange(L)
    C = C * (torch.exp(dtA) - 1.0) / A
    K = 2 * torch.einsum("hn, hnl -> hl", C, torch.exp(K)).real
    y = torch.fft.irfft(torch.fft.rfft(u, n=2 * L) * torch.fft.rfft(K, n=2 * L), n=2 * L)[..., :L]
    return y + u * params["D"].unsqueeze(-1)


def test_s4d_convolution_kernel_and_its_gradients_match_torch():
    rng = np.random.default_rng(10)
    H, N, L = 3, 4, 8
    values = {"log_dt": rng.uniform(-3, -1, H), "C": rng.standard_normal((H, N, 2)),
              "log_A_real": np.log(0.5 * np.ones((H, N))), "A_imag": math.pi * np.tile(np.arange(N), (H, 1)),
              "D": rng.standard_normal(H)}
    u = rng.standard_normal((2, H, L)).astype(np.float32)
    seen = []
    for torch in LIBRARIES:
        params = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in values.items()}
        y = s4d_kernel(torch, params, torch.from_numpy(u), L)
        torch.nn.functional.gelu(y).pow(2).mean().backward()
        seen.append([numpy_of(y), {k: numpy_of(p.grad) for k, p in params.items()}])
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)


MATRIX_GRADIENTS = {
    "mm": lambda t, a, b: a @ b,
    "bmm": lambda t, a, b: a.expand(2, 3, 4).bmm(b.expand(2, 4, 5)),
    "einsum": lambda t, a, b: t.einsum("ij,jk->ik", a, b),
    "linear": lambda t, a, b: t.nn.functional.linear(a, b.T, b[0]),
    "addmm": lambda t, a, b: t.addmm(b[0, :5], a, b, beta=0.5, alpha=2.0),
    "mv": lambda t, a, b: t.mv(a, b[:, 0]),
}


@pytest.mark.parametrize("case", MATRIX_GRADIENTS)
def test_gradients_of_complex_matrix_products_match_torch(case):
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    b = (rng.standard_normal((4, 5)) + 1j * rng.standard_normal((4, 5))).astype(np.complex64)
    seen = []
    for torch in LIBRARIES:
        x, w = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        y = MATRIX_GRADIENTS[case](torch, x, w)
        gx, gw = torch.autograd.grad((y.real - 0.5 * y.imag).sum(), (x, w), create_graph=True)
        seen.append([numpy_of(y), numpy_of(gx.resolve_conj()), numpy_of(gw.resolve_conj()),
                     [numpy_of(g.resolve_conj()) for g in torch.autograd.grad(gx.abs().sum() + gw.abs().sum(),
                                                                               (x, w))]])
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)


OPTIMIZERS = {
    "SGD nesterov": ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    "Adam": ("Adam", {"lr": 0.1}), "AdamW amsgrad": ("AdamW", {"lr": 0.1, "amsgrad": True}),
    "Adam foreach": ("Adam", {"lr": 0.1, "foreach": True}), "RMSprop centered": ("RMSprop", {"lr": 0.01,
                                                                                          "centered": True}),
    "Adagrad": ("Adagrad", {"lr": 0.1}), "Adamax": ("Adamax", {"lr": 0.1}), "NAdam": ("NAdam", {"lr": 0.1}),
    "RAdam": ("RAdam", {"lr": 0.1}), "Adadelta": ("Adadelta", {"lr": 0.5}), "ASGD": ("ASGD", {"lr": 0.1}),
    "Rprop": ("Rprop", {"lr": 0.1}),
}


@pytest.mark.parametrize("case", OPTIMIZERS)
def test_complex_parameters_are_updated_as_torch_updates_them(case):
    # torch updates a complex parameter as its real view: Adam's second moment of each part, not a complex square
    name, kwargs = OPTIMIZERS[case]
    start = np.random.default_rng(12).standard_normal((4, 2)).astype(np.float32)
    seen = []
    for torch in LIBRARIES:
        w = torch.nn.Parameter(torch.view_as_complex(torch.tensor(start)).clone())
        optimizer = getattr(torch.optim, name)([w], **kwargs)
        for _ in range(3):
            optimizer.zero_grad()
            ((w * w).real.sum() + w.abs().sum()).backward()
            optimizer.step()
        state = {k: numpy_of(v) for k, v in optimizer.state[w].items() if isinstance(v, (real_torch.Tensor,
                                                                                          tilewise.Tensor))}
        seen.append([numpy_of(w), state])
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_complex_tensors_take_a_float_alpha_and_adafactor_refuses_them_as_torch(torch):
    z = torch.tensor([1 + 1j, 2 - 1j])
    assert z.add(torch.ones(2, dtype=torch.complex64), alpha=-0.5).tolist() == [0.5 + 1j, 1.5 - 1j]
    assert z.sub(z, alpha=0.25).tolist() == [0.75 + 0.75j, 1.5 - 0.75j]
    w = torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    w.grad = torch.ones(2, dtype=torch.complex64)
    exc = raised(lambda t: t.optim.Adafactor([w]).step(), torch)
    assert type(exc) is RuntimeError and str(exc) == "Adafactor does not support complex parameters"


TANGENTS = {
    "tanh": lambda t, x: t.tanh(x), "sigmoid": lambda t, x: t.sigmoid(x), "sin": lambda t, x: t.sin(x),
    "x * complex": lambda t, x: x * (1 + 1j), "x ** 2.5": lambda t, x: x ** 2.5, "sgn": lambda t, x: x.sgn(),
    "prod": lambda t, x: x.prod(), "cumprod": lambda t, x: x.cumprod(0), "cumprod with a zero": lambda t, x:
    (x * t.tensor([1.0, 0.0, 1.0, 1.0])).cumprod(0), "logcumsumexp": lambda t, x: x.logcumsumexp(0),
    "mm": lambda t, x: x.view(2, 2) @ x.view(2, 2).flip(0),
}


@pytest.mark.parametrize("case", TANGENTS)
def test_forward_mode_tangents_of_complex_functions_match_torch(case):
    seen = []
    for torch in LIBRARIES:
        fa = torch.autograd.forward_ad
        with fa.dual_level():
            x = fa.make_dual(torch.tensor([1 + 2j, -0.3 + 0.5j, 0.7, 2j]), torch.tensor([1 + 0j, 0.5j, 1, -1j]))
            seen.append(numpy_of(fa.unpack_dual(TANGENTS[case](torch, x)).tangent))
    assert_same(seen[1], seen[0], rtol=1e-4, atol=1e-5)


LERP_REFUSALS = {
    "end of another dtype": (lambda t: t.lerp(t.ones(2), t.zeros(2, dtype=t.float64), 0.3), RuntimeError,
                             "expected dtype float for `end` but got dtype double"),
    "0-dim end of another dtype": (lambda t: t.lerp(t.ones(2), t.tensor(0.0, dtype=t.float64), 0.3), RuntimeError,
                                   "expected dtype float for `end` but got dtype double"),
    "lerp_ with end of another dtype": (lambda t: t.ones(2, dtype=t.float64).lerp_(t.zeros(2), 0.5), RuntimeError,
                                        "expected dtype double for `end` but got dtype float"),
    "weight of another dtype": (lambda t: t.lerp(t.ones(2), t.zeros(2), t.tensor([0.3], dtype=t.float64)),
                                RuntimeError, "expected dtype float for `weight` but got dtype double"),
    "real weight of a complex lerp": (
        lambda t: t.lerp(t.ones(2, dtype=t.complex64), t.zeros(2, dtype=t.complex64), t.full((2,), 0.3)),
        RuntimeError, "expected dtype c10::complex<float> for `weight` but got dtype float"),
    "integer weight": (lambda t: t.lerp(t.ones(2), t.zeros(2), t.zeros(2, dtype=t.int64)), RuntimeError,
                       "expected dtype float for `weight` but got dtype long int"),
    "integers, a number weight": (lambda t: t.lerp(t.ones(2, dtype=t.int64), t.zeros(2, dtype=t.int64), 0.5),
                                  NotImplementedError, "\"lerp_kernel_scalar\" not implemented for 'Long'"),
    "integers, a tensor weight": (lambda t: t.ones(2, dtype=t.int32).lerp(t.zeros(2, dtype=t.int32),
                                                                        t.zeros(2, dtype=t.int32)),
                                  NotImplementedError, "\"lerp_kernel_tensor\" not implemented for 'Int'"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", LERP_REFUSALS)
def test_lerp_refuses_mixed_dtypes_and_integers_as_torch(torch, case):
    # met writing lerp(x, end, weight) with a complex state and a real weight, as S4-style EMAs do
    call, error, message = LERP_REFUSALS[case]
    exc = raised(call, torch)
    assert type(exc) is error, repr(exc)
    assert message in str(exc)


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_lerp_takes_a_0_dim_weight_of_another_dtype_as_torch(torch):
    out = torch.lerp(torch.ones(2, dtype=torch.float16), torch.zeros(2, dtype=torch.float16), torch.tensor(0.25))
    assert out.dtype == torch.float16 and out.tolist() == [0.75, 0.75]


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
def test_compile_takes_torchs_arguments(torch):
    # torch.compile(model, backend=..., disable=...), Module.compile() and torch.compiler.is_compiling(), as
    # published training scripts call them
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    x = torch.from_numpy(np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3))
    expected = numpy_of(model(x))
    assert torch.compile(model, disable=True) is model
    np.testing.assert_allclose(numpy_of(torch.compile(model, backend="eager")(x)), expected, rtol=1e-6)
    np.testing.assert_allclose(numpy_of(torch.compile(backend="inductor", mode=None, dynamic=None)(model)(x)),
                               expected, rtol=1e-5, atol=1e-6)
    exc = raised(lambda t: t.compile(model, backend="no such backend")(x), torch)
    assert "Invalid backend: 'no such backend'" in str(exc)
    assert torch.compiler.is_compiling() is False
    model.compile()
    assert type(model) is torch.nn.Sequential and list(model.state_dict()) == ["0.weight", "0.bias", "2.weight",
                                                                               "2.bias"]
    out = model(x)
    np.testing.assert_allclose(numpy_of(out), expected, rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    assert model[0].weight.grad.shape == (4, 3)
    ema = copy.deepcopy(model)  # an EMA copy of a compiled model runs its own weights
    with torch.no_grad():
        ema[2].bias.add_(1.0)
    np.testing.assert_allclose(numpy_of(ema(x)), expected + 1.0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(numpy_of(model(x)), expected, rtol=1e-5, atol=1e-6)


def test_pow_of_a_number_by_a_tensor_differentiates_as_torch():
    # pow's exponent gradient with the base a Python number (torch.pow(2.0, x), torch.pow(1j, z)), met while its
    # formula learned complex exponents
    seen = []
    for torch in LIBRARIES:
        x = torch.tensor([0.0, 1.5, 2.0], requires_grad=True)
        z = torch.tensor([0.5 + 1j, 2.0], requires_grad=True)
        y = torch.pow(2.0, x) + torch.pow(0.0, x) + torch.pow(torch.tensor([0.0, 2.0, 0.0]), x)
        (y.sum() + (torch.pow(2.0, z) + torch.pow(1j, z)).real.sum()).backward()
        seen.append([numpy_of(y), numpy_of(x.grad), numpy_of(z.grad)])
    assert_same(seen[1], seen[0])


def test_random_factories_draw_complex_tensors_as_torch_does():
    """``randn``/``rand`` with a complex dtype (an S4D kernel's random initialisation): real and imaginary parts each
    normal of variance 1/2, or uniform in [0, 1), in a tensor of its own; ``randn_like`` of a complex tensor too."""
    x = tilewise.randn(200_000, dtype=tilewise.complex64)
    assert x.dtype == tilewise.complex64 and x._base is None and x.is_leaf
    for part in (x.real, x.imag):
        assert abs(float(part.var()) - 0.5) < 0.01 and abs(float(part.mean())) < 0.01
    y = tilewise.rand(50, 3, dtype=tilewise.complex128, requires_grad=True)
    assert y.dtype == tilewise.complex128 and y.requires_grad and y.is_leaf
    assert float(y.real.min()) >= 0 and float(y.imag.max()) < 1
    assert tilewise.randn_like(y).dtype == tilewise.complex128
    g = tilewise.Generator().manual_seed(3)
    first = tilewise.randn(8, dtype=tilewise.complex64, generator=g)
    g.manual_seed(3)
    assert bool((tilewise.randn(8, dtype=tilewise.complex64, generator=g) == first).all())
