"""Small training programs written as users write them, run eagerly under torch and under tilewise (``import tilewise
as torch``) from the same initial weights and batches, and compared step by step: losses, gradients, learning rates
and final weights. Each program is a function of the framework module, so its body reads as the published script does.

torch is the reference: its model's initial state goes to tilewise's model through numpy, and the batches are numpy
arrays both runs read. Random draws are not compared (the libraries' generators differ); where a program samples
(``multinomial`` in a generation loop, a ``WeightedRandomSampler``), the result's shape, range and reproducibility
under a seeded ``Generator`` are. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (B, T, C, K, E)

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import torch as real_torch

import tilewise

RTOL, ATOL = 2e-4, 2e-5


def numpy_of(value):
    return value.detach().cpu().numpy().copy()


def initial_state(torch, model, init):
    """The torch run returns its model's initial state (``init`` is None); the tilewise run loads it."""
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    return {k: numpy_of(v) for k, v in model.state_dict().items()}


def assert_same(ours, theirs, path="", rtol=RTOL, atol=ATOL):
    """Every number of the torch run's record matches the tilewise run's, walking nested dicts and lists."""
    if isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), path
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}/{key}", rtol, atol)
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, f"{path}[{i}]", rtol, atol)
    else:
        wide = np.complex128 if np.iscomplexobj(theirs) else np.float64
        np.testing.assert_allclose(np.asarray(ours, wide), np.asarray(theirs, wide), rtol=rtol, atol=atol, err_msg=path)


def run_both(program, *args, **kwargs):
    real_torch.manual_seed(0)
    theirs = program(real_torch, None, *args, **kwargs)
    ours = program(tilewise, theirs["init"], *args, **kwargs)
    return ours, theirs


def gradients(model):
    return {n: numpy_of(p.grad) for n, p in model.named_parameters() if p.grad is not None}


# ----------------------------------------------------------------------------------------------------------------------
# A character-level GRU language model: packed sequences of varying lengths, truncated BPTT (the hidden state detached
# between chunks), gradient clipping, ReduceLROnPlateau.

def char_gru(torch, init, batches):
    nn = torch.nn
    rnn_utils = torch.nn.utils.rnn

    class CharRNN(nn.Module):
        def __init__(self, vocab=11, emb=8, hidden=16, layers=2):
            super().__init__()
            self.embed = nn.Embedding(vocab, emb, padding_idx=0)
            self.rnn = nn.GRU(emb, hidden, num_layers=layers, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x, lengths, h=None):
            packed = rnn_utils.pack_padded_sequence(self.embed(x), lengths, batch_first=True, enforce_sorted=False)
            out, h = self.rnn(packed, h)
            out, _ = rnn_utils.pad_packed_sequence(out, batch_first=True, total_length=x.size(1))
            return self.head(out), h

    model = CharRNN()
    record = {"init": initial_state(torch, model, init), "loss": [], "norm": [], "grads": [], "lr": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
    criterion = nn.CrossEntropyLoss(ignore_index=0)
    hidden = None
    for step, (x, y, lengths) in enumerate(batches):
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        if hidden is not None:
            hidden = hidden.detach()
        model.train()
        optimizer.zero_grad(set_to_none=True)
        logits, hidden = model(x, torch.tensor(lengths), hidden)
        loss = criterion(logits.reshape(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
        scheduler.step(loss.item() if step % 2 else 10.0)
        record["loss"].append(loss.item())
        record["norm"].append(float(norm))
        record["grads"].append(gradients(model))
        record["lr"].append(optimizer.param_groups[0]["lr"])
    model.eval()
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(batches[0][0]), torch.tensor(batches[0][2]))
    record["probabilities"] = numpy_of(torch.softmax(logits, dim=-1))
    record["hidden"] = numpy_of(hidden)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def padded_sequences(rng, steps=5, batch=4, width=8, vocab=11):
    batches = []
    for _ in range(steps):
        lengths = rng.integers(2, width + 1, size=batch)
        x, y = np.zeros((batch, width), np.int64), np.zeros((batch, width), np.int64)
        for i, n in enumerate(lengths):
            x[i, :n], y[i, :n] = rng.integers(1, vocab, n), rng.integers(1, vocab, n)
        batches.append((x, y, lengths.tolist()))
    return batches


def test_char_gru_with_packed_sequences_truncated_bptt_and_plateau_schedule_trains_like_torch():
    ours, theirs = run_both(char_gru, padded_sequences(np.random.default_rng(0)))
    assert theirs["lr"][-1] < theirs["lr"][0]  # the plateau schedule cut the rate
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A small CNN classifier: augmentation in tensor ops (flips through torch.where, roll, a reflect-padded crop), mixup
# (lerp of a batch with its permutation, one_hot targets), label smoothing, AdamW with no decay on norms and biases,
# OneCycleLR, gradient accumulation through a (disabled) GradScaler, clipping, and an EMA of the weights kept with
# torch._foreach_lerp_ and copy_ under no_grad.

def cnn_classifier(torch, init, batches, accumulate=2):
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self, num_classes=5):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                nn.Conv2d(8, 8, 3, padding=1, groups=2), nn.GroupNorm(2, 8), nn.SiLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.GELU(),
                nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten())
            self.norm = nn.LayerNorm(16)
            self.fc = nn.Linear(16, num_classes)

        def forward(self, x):
            return self.fc(self.norm(self.features(x)))

    model = Net()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    ema = Net()
    ema.load_state_dict(model.state_dict())
    for p in ema.parameters():
        p.requires_grad_(False)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=3e-3, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=5e-3, total_steps=len(batches) // accumulate)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer.zero_grad()
    for step, (x, y, flip, shift, crop, lam, perm) in enumerate(batches):
        x, y, flip, perm = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(flip), torch.from_numpy(perm)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        x = torch.roll(x, shifts=(int(shift[0]), int(shift[1])), dims=(2, 3))
        i, j = int(crop[0]), int(crop[1])
        x = F.pad(x, (2, 2, 2, 2), mode="reflect")[:, :, i:i + 8, j:j + 8]
        target = F.one_hot(y, num_classes=5).float()
        x = torch.lerp(x, x[perm], 1 - lam)
        target = target.lerp(target[perm], 1 - lam)
        loss = criterion(model(x), target) / accumulate
        scaler.scale(loss).backward()
        record["loss"].append(loss.item())
        if (step + 1) % accumulate == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            record["grads"].append(gradients(model))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            with torch.no_grad():
                torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 0.1)
                for ema_buffer, buffer in zip(ema.buffers(), model.buffers()):
                    ema_buffer.copy_(buffer)
    model.eval()
    ema.eval()
    with torch.no_grad():
        x = torch.from_numpy(batches[0][0])
        record["eval"], record["eval_ema"] = numpy_of(model(x)), numpy_of(ema(x))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    record["ema"] = {k: numpy_of(v) for k, v in ema.state_dict().items()}
    return record


def image_batches(rng, steps=6, batch=6):
    return [(rng.standard_normal((batch, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, batch),
             rng.random(batch) < 0.5, rng.integers(-2, 3, 2), rng.integers(0, 5, 2), float(rng.beta(0.4, 0.4)),
             rng.permutation(batch)) for _ in range(steps)]


def test_cnn_with_tensor_augmentation_mixup_param_groups_accumulation_and_ema_trains_like_torch():
    ours, theirs = run_both(cnn_classifier, image_batches(np.random.default_rng(1)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A nanoGPT-style trainer: apply(_init_weights) with a scaled init of the residual projections, the embedding tied to
# the output head, weight_norm through torch.nn.utils.parametrizations, AdamW with decay groups, warmup then cosine
# (SequentialLR), a checkpoint of model, optimizer, scheduler and RNG state saved mid-training, from which a fresh
# process resumes, and an eval-mode generation loop with top-k sampling from a seeded Generator.

def gpt(torch, vocab=13, d=16, heads=2, layers=2, block=8):
    nn, F = torch.nn, torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block),
                                 persistent=False)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(d, dim=2)
            q = q.view(B, T, heads, C // heads).transpose(1, 2)
            k = k.view(B, T, heads, C // heads).transpose(1, 2)
            v = v.view(B, T, heads, C // heads).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), CausalSelfAttention(), nn.LayerNorm(d)
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(d, 4 * d), c_proj=nn.Linear(4 * d, d),
                                          act=nn.GELU(approximate="tanh")))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            m = self.mlp
            return x + m.c_proj(m.act(m.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
                h=nn.ModuleList([Block() for _ in range(layers)]), ln_f=nn.LayerNorm(d)))
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / (2 * layers) ** 0.5)
            for b in self.transformer.h:
                torch.nn.utils.parametrizations.weight_norm(b.mlp.c_fc)

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None):
            t = idx.size(1)
            pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for blk in self.transformer.h:
                x = blk(x)
            x = self.transformer.ln_f(x)
            if targets is None:
                return self.lm_head(x[:, [-1], :]), None
            logits = self.lm_head(x)
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)

        @torch.no_grad()
        def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None):
            for _ in range(max_new_tokens):
                idx_cond = idx if idx.size(1) <= block else idx[:, -block:]
                logits, _ = self(idx_cond)
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                probs = F.softmax(logits, dim=-1)
                idx = torch.cat((idx, torch.multinomial(probs, num_samples=1, generator=generator)), dim=1)
            return idx

    return GPT()


def gpt_training(torch, init, batches, checkpoint=None, stop_at=None):
    """Train on ``batches``; with ``stop_at``, save a checkpoint there and stop; with an existing ``checkpoint``,
    resume from it."""
    model = gpt(torch)
    record = {"init": initial_state(torch, model, init), "loss": [], "lr": [], "grads": []}
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-2, betas=(0.9, 0.95))
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(batches), eta_min=1e-4)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[2])
    start = 0
    if stop_at is None and checkpoint is not None:
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
        record.update(loss=state["loss"], lr=state["lr"])
    for step in range(start, len(batches)):
        if step == stop_at:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "step": step,
                        "loss": record["loss"], "lr": record["lr"]}, checkpoint)
            return None
        x, y = (torch.from_numpy(a) for a in batches[step])
        model.train()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr()[0])
        record["grads"].append(gradients(model))
    model.eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    samples = model.generate(torch.zeros((2, 1), dtype=torch.long), 10, temperature=0.8, top_k=3,
                             generator=torch.Generator().manual_seed(1234))
    again = model.generate(torch.zeros((2, 1), dtype=torch.long), 10, temperature=0.8, top_k=3,
                           generator=torch.Generator().manual_seed(1234))
    assert samples.shape == (2, 11) and samples.dtype == torch.int64
    assert bool(((samples >= 0) & (samples < 13)).all()) and torch.equal(samples, again)
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(batches[0][0]))
    record["logits"] = numpy_of(logits)
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_gpt_with_tied_weights_weight_norm_and_warmup_cosine_trains_like_torch_and_resumes_from_a_checkpoint(tmp_path):
    rng = np.random.default_rng(2)
    batches = [(rng.integers(0, 13, (4, 8)), rng.integers(0, 13, (4, 8))) for _ in range(6)]
    ours, theirs = run_both(gpt_training, batches)
    assert_same(ours, theirs)
    path = tmp_path / "ckpt.pt"
    assert gpt_training(tilewise, theirs["init"], batches, checkpoint=path, stop_at=3) is None
    resumed = gpt_training(tilewise, theirs["init"], batches, checkpoint=path)
    assert_same(resumed, {**ours, "grads": ours["grads"][3:]}, rtol=0, atol=0)  # resuming equals not stopping


# ----------------------------------------------------------------------------------------------------------------------
# A sequence classifier over ragged sequences: pad_sequence and pack_padded_sequence into a bidirectional two-layer LSTM
# with proj_size, a ReLU RNN over its packed output, the last valid step picked by fancy indexing, penalties on the
# final states, clip_grad_value_, Nesterov SGD with weight decay and CosineAnnealingWarmRestarts stepped by epoch
# fractions.

def ragged_lstm(torch, init, batches):
    nn, rnn_utils = torch.nn, torch.nn.utils.rnn

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(9, 6)
            self.lstm = nn.LSTM(6, 8, num_layers=2, bidirectional=True, proj_size=4)
            self.rnn = nn.RNN(8, 5, nonlinearity="relu")
            self.out = nn.Linear(5, 3)

        def forward(self, seqs):
            lengths = torch.tensor([len(s) for s in seqs])
            padded = rnn_utils.pad_sequence([self.emb(s) for s in seqs])
            out, (h, c) = self.lstm(rnn_utils.pack_padded_sequence(padded, lengths, enforce_sorted=False))
            out, _ = self.rnn(out)
            out, lengths = rnn_utils.pad_packed_sequence(out)
            return self.out(out[lengths - 1, torch.arange(len(seqs))]), h, c

    model = Classifier()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "lr": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=2, T_mult=2)
    for i, (seqs, y) in enumerate(batches):
        logits, h, c = model([torch.from_numpy(s) for s in seqs])
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y)) + 0.01 * h.pow(2).mean() \
            + 0.01 * c.abs().mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.05)
        record["grads"].append(gradients(model))
        optimizer.step()
        scheduler.step(i + 0.5)
        record["loss"].append(loss.item())
        record["lr"].append(scheduler.get_last_lr())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    packed = rnn_utils.pack_sequence([torch.from_numpy(s) for s in sorted(batches[0][0], key=len, reverse=True)])
    record["packed"] = [numpy_of(packed.data), numpy_of(packed.batch_sizes)]
    return record


def test_ragged_sequences_through_packed_bidirectional_lstm_and_rnn_train_like_torch():
    rng = np.random.default_rng(4)
    batches = [([rng.integers(0, 9, rng.integers(1, 6)) for _ in range(4)], rng.integers(0, 3, 4)) for _ in range(4)]
    ours, theirs = run_both(ragged_lstm, batches)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A contrastive encoder with a critic: the NT-Xent loss (normalised embeddings, a similarity matrix with its diagonal
# masked to -inf, logsumexp), a WGAN-GP gradient penalty (autograd.grad with create_graph), MultiheadAttention with a
# key padding mask and per-head weights, cosine_similarity and cdist terms, forward and full backward hooks, AMSGrad
# with LambdaLR, and parameters_to_vector / vector_to_parameters at the end.

def contrastive_with_penalty(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 8))
            self.critic = nn.Sequential(nn.Linear(6, 16), nn.Softplus(), nn.Linear(16, 1))
            # no projection biases: the key's has a zero gradient in exact arithmetic (a shift of every score of a
            # query), so its rounding noise, which AMSGrad scales up to a full step, would be what the runs compare
            self.mha = nn.MultiheadAttention(8, 2, batch_first=True, bias=False)

        def forward(self, x):
            return self.net(x)

    model = Model()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "activations": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    activations, output_grads = {}, []
    forward_hook = model.net[1].register_forward_hook(lambda m, i, o: activations.__setitem__("h", o.detach()))
    backward_hook = model.net[2].register_full_backward_hook(lambda m, gi, go: output_grads.append(numpy_of(go[0])))
    for x1, x2, real, fake, padding in batches:
        x1, x2, real, fake, padding = (torch.from_numpy(a) for a in (x1, x2, real, fake, padding))
        z1, z2 = F.normalize(model(x1), dim=1), F.normalize(model(x2), dim=1)
        z = torch.cat([z1, z2], 0)
        n = z1.shape[0]
        sim = (z @ z.T / 0.5).masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
        nt_xent = F.cross_entropy(sim, torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]))
        alpha = torch.full((n, 1), 0.3)
        between = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
        score = model.critic(between)
        grad, = torch.autograd.grad(score, between, grad_outputs=torch.ones_like(score), create_graph=True,
                                    retain_graph=True)
        penalty = ((grad.norm(2, dim=1) - 1) ** 2).mean()
        wasserstein = model.critic(fake).mean() - model.critic(real).mean()
        pair = torch.stack([z1, z2], 1)
        attended, weights = model.mha(pair, pair, pair, key_padding_mask=padding, need_weights=True,
                                      average_attn_weights=False)
        loss = nt_xent + 10 * penalty + wasserstein + attended.pow(2).mean() \
            + 0.1 * F.cosine_similarity(z1, z2).mean() + 0.1 * torch.cdist(z1, z2).mean() \
            + 0.01 * torch.logsumexp(sim, dim=1).mean() + 0.1 * weights[:, 1].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["activations"].append(numpy_of(activations["h"]))
    forward_hook.remove()
    backward_hook.remove()
    record["output_grads"] = output_grads
    vector = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.nn.utils.vector_to_parameters(vector * 0.5, model.parameters())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_contrastive_loss_gradient_penalty_attention_and_hooks_train_like_torch():
    rng = np.random.default_rng(5)
    padding = np.array([[False, True]] * 2 + [[False, False]] * 2)
    batches = [tuple(rng.standard_normal((4, 6)).astype(np.float32) for _ in range(4)) + (padding,) for _ in range(3)]
    ours, theirs = run_both(contrastive_with_penalty, batches)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A data pipeline: a map-style Dataset returning dicts, random_split by fractions, a WeightedRandomSampler and a
# DataLoader with two persistent workers and a collate_fn returning dicts; shuffling reproducible from a seeded
# Generator; an IterableDataset sharded over workers with get_worker_info; TensorDataset, ConcatDataset and the default
# collate of dicts.

ROWS = np.random.default_rng(3).standard_normal((40, 3)).astype(np.float32)


def data_pipeline(torch):
    data = torch.utils.data

    class Rows(data.Dataset):
        def __init__(self):
            self.x = torch.from_numpy(ROWS)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return {"x": self.x[i], "y": int(i % 3), "id": i}

    def collate(batch):
        return {"x": torch.stack([b["x"] for b in batch]), "y": torch.tensor([b["y"] for b in batch]),
                "ids": [b["id"] for b in batch]}

    rows = Rows()
    train, val = data.random_split(rows, [0.75, 0.25], generator=torch.Generator().manual_seed(7))
    assert sorted(list(train.indices) + list(val.indices)) == list(range(40))
    weights = [3.0 if rows[i]["y"] == 0 else 1.0 for i in train.indices]

    def weighted_epochs(seed):
        sampler = data.WeightedRandomSampler(weights, num_samples=len(weights), replacement=True,
                                             generator=torch.Generator().manual_seed(seed))
        loader = data.DataLoader(train, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True,
                                 collate_fn=collate, pin_memory=False)
        return [[(b["ids"], numpy_of(b["x"]), numpy_of(b["y"])) for b in loader] for _ in range(2)]

    epochs = weighted_epochs(3)
    for epoch in epochs:
        for ids, x, y in epoch:
            assert set(ids) <= set(train.indices)
            np.testing.assert_array_equal(x, ROWS[ids])
            np.testing.assert_array_equal(y, np.array(ids) % 3)
    assert [[ids for ids, _, _ in epoch] for epoch in epochs] == \
        [[ids for ids, _, _ in epoch] for epoch in weighted_epochs(3)]

    def shuffled(seed):
        loader = data.DataLoader(train, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(seed),
                                 num_workers=2, drop_last=True)
        return [numpy_of(b["id"]).tolist() for b in loader]

    assert shuffled(11) == shuffled(11)
    assert sorted(sum(shuffled(11), [])) == sorted(train.indices)

    class Stream(data.IterableDataset):
        def __iter__(self):
            info = data.get_worker_info()
            first, step = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(first, 10, step):
                yield torch.tensor([float(i)]), i

    first = next(iter(data.DataLoader(rows, batch_size=7)))
    return {
        "shapes": [[(len(ids), x.shape) for ids, x, _ in epoch] for epoch in epochs],
        "stream": sorted(int(i) for _, ids in data.DataLoader(Stream(), batch_size=2, num_workers=2) for i in ids),
        "tensor_dataset": [numpy_of(a).tolist() for a, _ in data.DataLoader(
            data.TensorDataset(torch.arange(10.0), torch.arange(10)), batch_size=3)],
        "lengths": [len(train), len(val), len(data.ConcatDataset([train, val])), len(data.Subset(rows, [1, 2]))],
        "default_collate": [sorted(first), type(first["x"]).__name__, str(first["y"].dtype).split(".")[-1],
                            numpy_of(first["id"]).tolist(), numpy_of(first["x"]).tolist()],
    }


def test_data_pipeline_with_workers_samplers_splits_and_collate_behaves_as_torch():
    assert data_pipeline(tilewise) == data_pipeline(real_torch)


# ----------------------------------------------------------------------------------------------------------------------
# A VQ-VAE with a mixture-of-experts bottleneck: an EmbeddingBag encoder with per-sample weights and offsets, a codebook
# found by argmin over distances, one-hot codes by scatter_, an EMA codebook update under no_grad, the straight-through
# estimator z + (zq - z).detach(), a top-2 router dispatching rows with torch.where(mask) and index_add_, a load
# balancing term from bincount, custom autograd Functions (a quantiser whose backward is once_differentiable and whose
# second output is marked non-differentiable, a gradient reversal layer), Adagrad with lr_decay and CyclicLR.

def vq_moe(torch, init, batches):
    nn, F = torch.nn, torch.nn.functional

    class GradReverse(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, alpha):
            ctx.alpha = alpha
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad_output):
            return grad_output.neg() * ctx.alpha, None

    class STEQuant(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, levels):
            ctx.save_for_backward(x)
            ctx.mark_non_differentiable(levels)
            return torch.round(x * 4) / 4, levels

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, g, _):
            x, = ctx.saved_tensors
            return g * (x.abs() <= 1).to(g.dtype), None

    class VQ(nn.Module):
        def __init__(self, K=6, D=4, decay=0.8):
            super().__init__()
            self.embedding = nn.Embedding(K, D)
            self.embedding.weight.data.uniform_(-1 / K, 1 / K)
            self.register_buffer("cluster_size", torch.zeros(K))
            self.register_buffer("embed_avg", self.embedding.weight.data.clone())
            self.decay, self.K = decay, K

        def forward(self, z):
            flat = z.reshape(-1, z.shape[-1])
            distances = (flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.embedding.weight.t()
                         + self.embedding.weight.pow(2).sum(1))
            idx = torch.argmin(distances, dim=1)
            enc = torch.zeros(idx.shape[0], self.K, device=z.device)
            enc.scatter_(1, idx.unsqueeze(1), 1)
            zq = torch.matmul(enc, self.embedding.weight).view(z.shape)
            if self.training:
                with torch.no_grad():
                    self.cluster_size.mul_(self.decay).add_(enc.sum(0), alpha=1 - self.decay)
                    self.embed_avg.mul_(self.decay).add_(enc.t() @ flat, alpha=1 - self.decay)
                    n = self.cluster_size.sum()
                    cs = (self.cluster_size + 1e-5) / (n + self.K * 1e-5) * n
                    self.embedding.weight.data.copy_(self.embed_avg / cs.unsqueeze(1))
            commit = F.mse_loss(zq.detach(), z)
            zq = z + (zq - z).detach()
            avg = enc.mean(0)
            perplexity = torch.exp(-torch.sum(avg * torch.log(avg + 1e-10)))
            return zq, commit, perplexity, idx

    class MoE(nn.Module):
        def __init__(self, d=4, E=4, k=2):
            super().__init__()
            self.gate = nn.Linear(d, E, bias=False)
            self.experts = nn.ModuleList([nn.Sequential(nn.Linear(d, 8), nn.GELU(), nn.Linear(8, d))
                                          for _ in range(E)])
            self.k, self.E = k, E

        def forward(self, x):
            probs = self.gate(x).softmax(-1)
            topv, topi = probs.topk(self.k, dim=-1)
            topv = topv / topv.sum(-1, keepdim=True)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows, slot = torch.where(topi == e)
                if rows.numel() == 0:
                    continue
                out.index_add_(0, rows, expert(x[rows]) * topv[rows, slot].unsqueeze(-1))
            counts = torch.bincount(topi.flatten(), minlength=self.E).float()
            return out, self.E * (counts / counts.sum() * probs.mean(0)).sum(), counts

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(15, 6, mode="sum")
            self.enc = nn.Linear(6, 8)
            self.vq = VQ()
            self.moe = MoE()
            self.dec = nn.Linear(8, 6)
            self.domain = nn.Linear(8, 2)

        def forward(self, tokens, offsets, weights):
            e = self.bag(tokens, offsets, per_sample_weights=weights)
            zq, commit, perplexity, idx = self.vq(self.enc(e).view(-1, 2, 4))
            m, aux, counts = self.moe(zq.reshape(-1, 4))
            q, _ = STEQuant.apply(m, torch.arange(3))
            h = q.reshape(-1, 8)
            return self.dec(h), e, commit, perplexity, aux, self.domain(GradReverse.apply(h, 0.5)), idx, counts

    model = Model()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "stats": []}
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1)
    scheduler = torch.optim.lr_scheduler.CyclicLR(optimizer, base_lr=0.01, max_lr=0.05, step_size_up=2,
                                                  cycle_momentum=False)
    for tokens, offsets, weights, domain in batches:
        tokens, offsets, weights, domain = (torch.from_numpy(a) for a in (tokens, offsets, weights, domain))
        recon, target, commit, perplexity, aux, domain_logits, idx, counts = model(tokens, offsets, weights)
        loss = F.mse_loss(recon, target.detach()) + 0.25 * commit + 0.01 * aux \
            + F.cross_entropy(domain_logits, domain)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["stats"].append([perplexity.item(), numpy_of(idx), numpy_of(counts), scheduler.get_last_lr()])
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def bags(rng, steps=5, batch=4):
    out = []
    for _ in range(steps):
        lengths = rng.integers(1, 5, batch)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out.append((rng.integers(0, 15, lengths.sum()), offsets, rng.random(lengths.sum()).astype(np.float32),
                    rng.integers(0, 2, batch)))
    return out


def test_vq_vae_with_a_routed_mixture_of_experts_and_custom_functions_trains_like_torch():
    ours, theirs = run_both(vq_moe, bags(np.random.default_rng(6)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A graph attention network over a batch of small graphs, with a box head trained as detectors are: a segment softmax
# over incoming edges (scatter_reduce amax, index_add_), messages summed with scatter_add_, graph pooling by
# index_reduce_ "amax" into a fresh zeros tensor, box IoU by broadcasting, smooth L1, sigmoid focal loss, a weighted
# cross-entropy, triplet, cosine-embedding and margin-ranking losses, kl_div; greedy NMS; RAdam with decoupled weight
# decay under a ChainedScheduler; then pruning: l1_unstructured, ln_structured, remove, global_unstructured.

def graph_detector(torch, init, graphs):
    nn, F = torch.nn, torch.nn.functional
    prune = importlib.import_module(f"{torch.__name__}.nn.utils.prune")

    def segment_softmax(scores, index, n):
        smax = torch.full((n, scores.size(1)), float("-inf")).scatter_reduce(
            0, index[:, None].expand_as(scores), scores, reduce="amax", include_self=True)
        ex = (scores - smax[index]).exp()
        denom = torch.zeros(n, scores.size(1)).index_add_(0, index, ex)
        return ex / denom[index].clamp_min(1e-16)

    class GATLayer(nn.Module):
        def __init__(self, d_in, d_out, heads=2):
            super().__init__()
            self.lin = nn.Linear(d_in, heads * d_out, bias=False)
            self.att_src = nn.Parameter(torch.empty(1, heads, d_out))
            self.att_dst = nn.Parameter(torch.empty(1, heads, d_out))
            nn.init.xavier_uniform_(self.att_src)
            nn.init.xavier_uniform_(self.att_dst)
            self.heads, self.d_out = heads, d_out

        def forward(self, x, edge_index):
            n = x.size(0)
            h = self.lin(x).view(n, self.heads, self.d_out)
            src, dst = edge_index
            a = (h * self.att_src).sum(-1)[src] + (h * self.att_dst).sum(-1)[dst]
            msg = h[src] * segment_softmax(F.leaky_relu(a, 0.2), dst, n).unsqueeze(-1)
            return torch.zeros_like(h).scatter_add_(0, dst.view(-1, 1, 1).expand_as(msg), msg).mean(1)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.g1, self.g2 = GATLayer(4, 8), GATLayer(8, 8)
            self.box, self.cls, self.emb = nn.Linear(8, 4), nn.Linear(8, 3), nn.Linear(8, 4)

        def forward(self, x, edge_index, batch, num_graphs):
            h = F.elu(self.g1(x, edge_index))
            h = F.elu(self.g2(h, edge_index)) + h
            pooled = torch.zeros(num_graphs, 8).index_reduce_(0, batch, h, "amax", include_self=False)
            mean = torch.zeros(num_graphs, 8).index_add_(0, batch, h) / torch.bincount(batch).unsqueeze(1)
            return self.box(h).sigmoid(), self.cls(h), self.emb(pooled + mean)

    def box_iou(a, b):
        area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
        area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        wh = (torch.min(a[:, None, 2:], b[:, 2:]) - torch.max(a[:, None, :2], b[:, :2])).clamp(min=0)
        inter = wh[..., 0] * wh[..., 1]
        return inter / (area_a[:, None] + area_b - inter)

    def nms(boxes, scores, threshold):
        order, keep = scores.argsort(descending=True, stable=True), []
        while order.numel() > 0:
            keep.append(int(order[0]))
            if order.numel() == 1:
                break
            iou = box_iou(boxes[order[0]].unsqueeze(0), boxes[order[1:]]).squeeze(0)
            order = order[1:][iou <= threshold]
        return torch.tensor(keep, dtype=torch.long)

    def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2):
        p = torch.sigmoid(inputs)
        ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
        p_t = p * targets + (1 - p) * (1 - targets)
        alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
        return (alpha_t * ce * ((1 - p_t) ** gamma)).mean()

    model = Model()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "keep": []}
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-2, weight_decay=1e-3, decoupled_weight_decay=True)
    scheduler = torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.ConstantLR(optimizer, factor=0.5, total_iters=2),
        torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)])
    triplet = nn.TripletMarginLoss(margin=0.5, p=2)
    for x, edge_index, batch, boxes, labels in graphs:
        x, edge_index, batch, boxes, labels = (torch.from_numpy(a) for a in (x, edge_index, batch, boxes, labels))
        corners, logits, g = model(x, edge_index, batch, 3)
        corners = torch.cat([corners[:, :2] * 0.5, corners[:, :2] * 0.5 + 0.5 * corners[:, 2:]], 1)
        onehot = F.one_hot(labels, 3).float()
        gn = F.normalize(g, dim=-1)
        loss = (1 - box_iou(corners, boxes).diagonal()).mean() + F.smooth_l1_loss(corners, boxes, beta=0.1) \
            + sigmoid_focal_loss(logits, onehot) + F.cross_entropy(logits, labels, weight=torch.tensor([1, 2, 0.5])) \
            + triplet(gn[0:1], gn[1:2], gn[2:3]) \
            + F.cosine_embedding_loss(gn[:2], gn[1:], torch.tensor([1, -1]), margin=0.1) \
            + F.margin_ranking_loss(g[:, 0], g[:, 1], torch.tensor([1.0, -1.0, 1.0]), margin=0.2) \
            + F.kl_div(logits.log_softmax(-1), onehot * 0.9 + 0.1 / 3, reduction="batchmean")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        with torch.no_grad():
            record["keep"].append(numpy_of(nms(corners, logits.softmax(-1).amax(-1), 0.7)))
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    prune.l1_unstructured(model.box, name="weight", amount=0.3)
    prune.random_unstructured(model.cls, name="bias", amount=0.0)
    prune.ln_structured(model.emb, name="weight", amount=0.5, n=2, dim=0)
    record["masks"] = [numpy_of(model.box.weight_mask), numpy_of(model.emb.weight_mask)]
    prune.remove(model.box, "weight")
    prune.global_unstructured([(model.g1.lin, "weight"), (model.g2.lin, "weight")],
                              pruning_method=prune.L1Unstructured, amount=10)
    record["pruned"] = float((model.g1.lin.weight == 0).sum() + (model.g2.lin.weight == 0).sum())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def small_graphs(rng, steps=4):
    out = []
    for _ in range(steps):
        sizes = rng.integers(2, 5, 3)
        n, start, edges = sizes.sum(), 0, []
        for s in sizes:
            edges += [(i, i) for i in range(start, start + s)]
            for a, b in rng.integers(start, start + s, (s, 2)):
                edges += [(a, b), (b, a)]
            start += s
        low = rng.uniform(0, 0.5, (n, 2))
        boxes = np.concatenate([low, low + rng.uniform(0.1, 0.5, (n, 2))], 1).astype(np.float32)
        out.append((rng.standard_normal((n, 4)).astype(np.float32), np.array(edges).T.astype(np.int64),
                    np.repeat(np.arange(3), sizes), boxes, rng.integers(0, 3, n)))
    return out


def test_graph_attention_detector_with_segment_softmax_index_reduce_pooling_and_pruning_trains_like_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's index_reduce is in beta
        ours, theirs = run_both(graph_detector, small_graphs(np.random.default_rng(7)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# What the programs met, reduced.

def test_random_fork_rng_restores_the_generator_as_torch_does():
    for torch in (real_torch, tilewise):
        torch.manual_seed(0)
        with torch.random.fork_rng():
            torch.rand(5)
        after_fork = torch.rand(2)
        torch.manual_seed(0)
        assert torch.equal(after_fork, torch.rand(2))
        with torch.random.fork_rng(enabled=False):
            inside = torch.rand(2)
        torch.manual_seed(0)
        torch.rand(2)
        assert torch.equal(inside, torch.rand(2))
        torch.random.manual_seed(3)
        assert torch.random.initial_seed() == 3 and torch.initial_seed() == 3


def layer_then_tanh(torch, layer, x):
    return torch.tanh(layer(x)) * 2


def test_utils_checkpoint_is_reachable_without_its_own_import():
    results = []
    for torch in (real_torch, tilewise):
        layer = torch.nn.Linear(3, 3)
        layer.load_state_dict({"weight": torch.eye(3) * 0.5, "bias": torch.zeros(3)})
        x = torch.arange(6.0).reshape(2, 3).requires_grad_()
        torch.utils.checkpoint.checkpoint(layer_then_tanh, torch, layer, x, use_reentrant=False).sum().backward()
        results.append((numpy_of(x.grad), numpy_of(layer.weight.grad)))
    assert_same(results[1], results[0])


def test_norm_of_a_complex_tensor_is_the_norm_of_its_moduli():
    values = [1 + 1j, 2 - 0.5j, 0.5 + 2j]
    for p in (2, 1, 3, float("inf"), 0, "fro"):
        got, expected = [], []
        for torch, out in ((tilewise, got), (real_torch, expected)):
            x = torch.tensor(values).requires_grad_()
            norm = x.norm(p=p)
            assert norm.dtype == torch.float32
            if p != 0:
                norm.backward()
                out.append(numpy_of(x.grad))
            out += [numpy_of(norm), numpy_of(torch.linalg.vector_norm(x.detach(), dim=0)),
                    numpy_of(torch.nn.utils.get_total_norm([x.detach()]))]
        assert_same(got, expected, f"p={p}")


@pytest.mark.parametrize("call", [lambda t, x: x.norm(), lambda t, x: x.norm(p=1, dim=0),
                                  lambda t, x: t.norm(x, dtype=t.float32), lambda t, x: (x > 0).norm()])
def test_norm_of_an_integer_or_bool_tensor_raises_as_torch(call):
    messages = []
    for torch in (real_torch, tilewise):
        with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor as input") as error:
            call(torch, torch.tensor([1, 2]))
        messages.append(str(error.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("name", ["mean", "var", "std"])
def test_mean_and_variance_of_integers_raise_runtime_error_as_torch(name):
    for torch in (real_torch, tilewise):
        with pytest.raises(RuntimeError, match="floating point"):
            getattr(torch.tensor([1, 2]), name)()


def test_nonzero_as_tuple_gives_one_index_tensor_per_dimension():
    cases = ([[0, 1], [1, 1]], 5, 0, [[0.0, 2.5, 0.0]])
    for value in cases:
        for as_tuple in (True, False):
            got = tilewise.nonzero(tilewise.tensor(value), as_tuple=as_tuple)
            expected = real_torch.nonzero(real_torch.tensor(value), as_tuple=as_tuple)
            if as_tuple:
                assert isinstance(got, tuple) and len(got) == len(expected)
                assert [numpy_of(g).tolist() for g in got] == [numpy_of(e).tolist() for e in expected]
            else:
                assert numpy_of(got).tolist() == numpy_of(expected).tolist() and got.shape == expected.shape
    x = tilewise.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert x[x.nonzero(as_tuple=True)].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("strategy", ["reverse-mode", "forward-mode"])
def test_autograd_functional_hessian_has_torch_structure_and_values(strategy):
    """The Hessian of a function of one tensor is a tensor of shape input.shape * 2 (it came back as a 1-tuple), and
    the forward-over-reverse strategy differentiates through the inner gradient (it returned zeros)."""
    def f(v):
        return (v ** 3).sum() + v.prod()

    def g(a, b):
        return (a * b ** 2).sum()

    results = []
    for torch in (real_torch, tilewise):
        hessian = torch.autograd.functional.hessian
        x, y = torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        one, square = (hessian(f, t, vectorize=True, outer_jacobian_strategy=strategy) for t in (x, y))
        pair = hessian(g, (x, x), vectorize=True, outer_jacobian_strategy=strategy)
        assert isinstance(one, torch.Tensor) and tuple(one.shape) == (2, 2) and tuple(square.shape) == (2, 2, 2, 2)
        assert len(pair) == 2 and all(len(row) == 2 for row in pair)  # torch's forward mode gives lists, not tuples
        results.append([numpy_of(one), numpy_of(square), [[numpy_of(h) for h in row] for row in pair]])
    assert_same(results[1], results[0])


@pytest.mark.parametrize("condition", [[[True, False], [False, True]], [0, 2, 0, 5], 3.0, 0, [[[1, 0]], [[0, 1]]]])
def test_where_of_a_condition_alone_gives_the_indices_nonzero_gives_as_a_tuple(condition):
    got, expected = tilewise.where(tilewise.tensor(condition)), real_torch.where(real_torch.tensor(condition))
    assert isinstance(got, tuple) and len(got) == len(expected)
    assert [numpy_of(g).tolist() for g in got] == [numpy_of(e).tolist() for e in expected]
    assert [g.dtype for g in got] == [tilewise.int64] * len(got)
    keyword = tilewise.where(condition=tilewise.tensor(condition))
    assert [numpy_of(g).tolist() for g in keyword] == [numpy_of(e).tolist() for e in expected]


def once_differentiable_square(torch, grad_modes):
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            grad_modes.append(torch.is_grad_enabled())
            return 2 * x * grad

    return Square


def test_once_differentiable_backward_runs_without_a_graph_and_refuses_a_second_backward():
    for torch in (real_torch, tilewise):
        grad_modes = []
        square = once_differentiable_square(torch, grad_modes)
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = square.apply(x)
        g, = torch.autograd.grad(y.sum(), x, create_graph=True)  # the incoming gradient needs no grad: plain result
        assert g.tolist() == [2.0, 4.0] and not g.requires_grad
        assert square.backward.__name__ == "backward"
        v = torch.ones(2, requires_grad=True)
        g, = torch.autograd.grad(square.apply(x), x, v, create_graph=True)
        assert g.tolist() == [2.0, 4.0] and g.requires_grad and repr(g.grad_fn).startswith("<Error object")
        with pytest.raises(RuntimeError, match="^trying to differentiate twice a function that was marked with "
                                               "@once_differentiable$"):
            g.sum().backward()
        with pytest.raises(RuntimeError, match="The differentiated Tensor at index 0 appears to not have been used"):
            torch.autograd.grad(g.sum(), v)
        assert grad_modes == [False, False]


IN_PLACE_WITH_A_GRADIENT_THROUGH_ANOTHER_INPUT = {
    "mul_": lambda t, x, w: x.mul_(w), "div_": lambda t, x, w: x.div_(w), "pow_": lambda t, x, w: x.pow_(w),
    "imul": lambda t, x, w: x.__imul__(w), "xlogy_": lambda t, x, w: x.xlogy_(w),
    "atan2_": lambda t, x, w: x.atan2_(w), "clamp_": lambda t, x, w: x.clamp_(min=w),
    "clamp_min_": lambda t, x, w: x.clamp_min_(w), "clamp_max_": lambda t, x, w: x.clamp_max_(w),
    "index_reduce_amax": lambda t, x, w: x.index_reduce_(0, t.tensor([1, 0]), w, "amax", include_self=False),
    "index_reduce_prod": lambda t, x, w: x.index_reduce_(0, t.tensor([1, 1]), w, "prod"),
    "scatter_reduce_amax": lambda t, x, w: x.scatter_reduce_(0, t.tensor([[1, 0], [1, 1]]), w, "amax"),
    "scatter_reduce_mean": lambda t, x, w: x.scatter_reduce_(0, t.tensor([[1, 0], [1, 1]]), w, "mean",
                                                             include_self=False),
    "logit_": lambda t, x, w: x.mul_(w).mul_(0.1).logit_(eps=1e-3),
}


@pytest.mark.parametrize("self_requires_grad", [False, True])
@pytest.mark.parametrize("name", sorted(IN_PLACE_WITH_A_GRADIENT_THROUGH_ANOTHER_INPUT))
def test_in_place_operator_keeps_the_value_self_had_for_the_other_inputs_gradient(name, self_requires_grad):
    """``x.mul_(w)`` with ``w`` requiring grad and ``x`` not (a buffer scaled by a parameter, a pooled tensor
    filled by ``index_reduce_``): the node needs ``x``'s value before the write. It saved ``x`` itself, which the
    write then changed, so backward refused (composites such as ``index_reduce_`` and ``clamp_min_`` even when ``x``
    required grad)."""
    op = IN_PLACE_WITH_A_GRADIENT_THROUGH_ANOTHER_INPUT[name]
    results = []
    for torch in (real_torch, tilewise):
        w = torch.tensor([[2.0, 3.0], [0.5, 0.25]], requires_grad=True)
        a = torch.tensor([[1.5, 0.5], [0.75, 2.0]], requires_grad=self_requires_grad)
        x = a.clone() if self_requires_grad else a
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's index_reduce is in beta
            y = op(torch, x, w)
        (y * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
        results.append([numpy_of(y), numpy_of(w.grad)] + ([numpy_of(a.grad)] if self_requires_grad else []))
    assert_same(results[1], results[0])
