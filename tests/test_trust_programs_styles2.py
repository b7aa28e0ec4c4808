"""More programs in styles people publish, run eagerly under torch and under tilewise (``import tilewise as torch``)
from the same initial weights and batches, as in ``test_trust_programs.py``, whose helpers these use: a WGAN with
weight clipping and an R1 penalty, a RealNVP flow with slogdet, a batch-hard triplet embedding with checkpointed
blocks, an EmbeddingBag text classifier over a Counter vocabulary, a time-series nn.Transformer forecaster and a message
passing GNN. Below the programs, the failures they met, each reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (netG, netD)

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]



# ----------------------------------------------------------------------------------------------------------------------
# A WGAN: a ConvTranspose2d generator with BatchNorm and LeakyReLU, a critic trained n_critic times per generator step
# on fake.detach() with RMSprop, its weights clipped by p.data.clamp_ after each step, requires_grad toggled off the
# critic for the generator's step; then a non-saturating BCE-with-logits critic loss with an R1 penalty from
# autograd.grad(create_graph=True) on the real batch.

def wgan(torch, init, batches, n_critic=2, clip=0.05):
    nn, F = torch.nn, torch.nn.functional

    class Generator(nn.Module):
        def __init__(self, nz=4, ngf=4):
            super().__init__()
            self.main = nn.Sequential(
                nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2),
                nn.LeakyReLU(0.2, inplace=True),
                nn.ConvTranspose2d(ngf * 2, 1, 4, 2, 1, bias=False), nn.Tanh())

        def forward(self, z):
            return self.main(z)

    class Critic(nn.Module):
        def __init__(self, ndf=4):
            super().__init__()
            self.main = nn.Sequential(
                nn.Conv2d(1, ndf, 4, 2, 1), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf, ndf * 2, 3, 1, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(ndf * 2, 1, 4, 1, 0))

        def forward(self, x):
            return self.main(x).view(-1)

    netG, netD = Generator(), Critic()
    models = nn.ModuleDict({"G": netG, "D": netD})
    record = {"init": initial_state(torch, models, init), "d": [], "g": [], "grads": [], "r1": []}
    optD = torch.optim.RMSprop(netD.parameters(), lr=5e-3)
    optG = torch.optim.RMSprop(netG.parameters(), lr=5e-3)
    for real, noise in batches:
        real, noise = torch.from_numpy(real), torch.from_numpy(noise)
        for p in netD.parameters():
            p.requires_grad = True
        for _ in range(n_critic):
            optD.zero_grad()
            fake = netG(noise).detach()
            errD = -(netD(real).mean() - netD(fake).mean())
            errD.backward()
            optD.step()
            for p in netD.parameters():
                p.data.clamp_(-clip, clip)
        record["d"].append(errD.item())
        for p in netD.parameters():
            p.requires_grad = False
        optG.zero_grad()
        fake = netG(noise)
        errG = -netD(fake).mean()
        errG.backward()
        optG.step()
        record["g"].append(errG.item())
        record["grads"].append(gradients(netG))
        # a non-saturating loss with an R1 penalty on the real batch, as StyleGAN2-style critics do
        for p in netD.parameters():
            p.requires_grad_(True)
        real_req = real.detach().requires_grad_(True)
        logits = netD(real_req)
        ones = torch.ones_like(logits)
        loss = F.binary_cross_entropy_with_logits(logits, ones) + F.softplus(netD(fake.detach())).mean()
        grad_real, = torch.autograd.grad(outputs=logits.sum(), inputs=real_req, create_graph=True)
        r1 = grad_real.pow(2).reshape(grad_real.shape[0], -1).sum(1).mean()
        optD.zero_grad(set_to_none=True)
        (loss + 0.5 * r1).backward()
        record["r1"].append([r1.item(), loss.item()])
        record["grads"].append(gradients(netD))
        optD.step()
    netG.eval()
    with torch.no_grad():
        record["sample"] = numpy_of(netG(torch.from_numpy(batches[0][1])))
    record["final"] = {k: numpy_of(v) for k, v in models.state_dict().items()}
    return record

def wgan_batches(rng, steps=3, batch=4):
    return [(rng.uniform(-1, 1, (batch, 1, 8, 8)).astype(np.float32),
             rng.standard_normal((batch, 4, 1, 1)).astype(np.float32)) for _ in range(steps)]


def test_wgan_with_weight_clipping_and_an_r1_penalty_trains_like_torch():
    ours, theirs = run_both(wgan, wgan_batches(np.random.default_rng(0)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A RealNVP flow: affine coupling layers over alternating masks (registered buffers), tanh-bounded scales, Glow's
# invertible linear map with log|det W| by torch.slogdet, a Normal base on a non-persistent buffer, Adam with
# clipping; the inverse pass, logdet/slogdet/linalg.slogdet/det agreeing, and the flow's log-det against slogdet of
# its autograd.functional.jacobian.

def realnvp(torch, init, batches, dim=4):
    nn = torch.nn

    class Coupling(nn.Module):
        def __init__(self, mask, hidden=8):
            super().__init__()
            self.register_buffer("mask", mask)
            self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 2 * dim))
            self.scale = nn.Parameter(torch.zeros(dim))

        def forward(self, x):
            xm = x * self.mask
            s, t = self.net(xm).chunk(2, dim=-1)
            s = self.scale * torch.tanh(s) * (1 - self.mask)
            t = t * (1 - self.mask)
            y = xm + (1 - self.mask) * (x * torch.exp(s) + t)
            return y, s.sum(-1)

        def inverse(self, y):
            ym = y * self.mask
            s, t = self.net(ym).chunk(2, dim=-1)
            s = self.scale * torch.tanh(s) * (1 - self.mask)
            t = t * (1 - self.mask)
            return ym + (1 - self.mask) * (y - t) * torch.exp(-s)

    class InvLinear(nn.Module):
        """Glow's invertible 1x1 convolution on vectors: log|det W| by slogdet, and by logdet for a check."""
        def __init__(self):
            super().__init__()
            w = torch.linalg.qr(torch.randn(dim, dim))[0]
            self.weight = nn.Parameter(w)

        def forward(self, x):
            sign, logabsdet = torch.slogdet(self.weight)
            return x @ self.weight.T, logabsdet.expand(x.shape[0])

        def inverse(self, y):
            return y @ torch.inverse(self.weight).T

    class Flow(nn.Module):
        def __init__(self):
            super().__init__()
            masks = [torch.arange(dim) % 2, 1 - torch.arange(dim) % 2] * 2
            layers = []
            for m in masks:
                layers += [Coupling(m.float()), InvLinear()]
            self.layers = nn.ModuleList(layers)
            self.register_buffer("loc", torch.zeros(dim), persistent=False)

        def forward(self, x):
            log_det = x.new_zeros(x.shape[0])
            for layer in self.layers:
                x, ld = layer(x)
                log_det = log_det + ld
            return x, log_det

        def inverse(self, z):
            for layer in reversed(self.layers):
                z = layer.inverse(z)
            return z

        def log_prob(self, x):
            z, log_det = self(x)
            base = torch.distributions.Normal(self.loc, torch.ones_like(self.loc))
            return base.log_prob(z).sum(-1) + log_det

    flow = Flow()
    record = {"init": initial_state(torch, flow, init), "nll": [], "grads": []}
    record["keys"] = sorted(flow.state_dict())
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-2, weight_decay=1e-5)
    for x in batches:
        x = torch.from_numpy(x)
        loss = -flow.log_prob(x).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(flow.parameters(), 5.0)
        optimizer.step()
        record["nll"].append(loss.item())
        record["grads"].append(gradients(flow))
    with torch.no_grad():
        x = torch.from_numpy(batches[0])
        z, log_det = flow(x)
        record["roundtrip"] = numpy_of(flow.inverse(z))
        w = flow.layers[1].weight
        record["logdet"] = [torch.logdet(w).item(), torch.slogdet(w)[1].item(),
                            torch.linalg.slogdet(w).logabsdet.item(),
                            torch.det(w).abs().log().item()]
        record["log_det"] = numpy_of(log_det)
        # a change of variables through autograd: log|det J| of the flow at one point by jacobian
    jac = torch.autograd.functional.jacobian(lambda v: flow(v.unsqueeze(0))[0].squeeze(0),
                                             torch.from_numpy(batches[0][0]))
    record["jac_logdet"] = torch.linalg.slogdet(jac)[1].item()
    record["final"] = {k: numpy_of(v) for k, v in flow.state_dict().items()}
    return record

def flow_batches(rng, steps=4, batch=16):
    out = []
    for _ in range(steps):
        a = rng.standard_normal((batch, 4)).astype(np.float32)
        a[:, 1] = a[:, 0] ** 2 * 0.5 + 0.3 * a[:, 1]
        out.append(a)
    return out


def test_realnvp_flow_with_slogdet_trains_and_inverts_like_torch():
    batches = flow_batches(np.random.default_rng(1))
    ours, theirs = run_both(realnvp, batches)
    assert ours.pop("keys") == theirs.pop("keys")
    assert_same(ours, theirs)
    np.testing.assert_allclose(theirs["roundtrip"], batches[0], atol=1e-4)
    np.testing.assert_allclose(theirs["jac_logdet"], theirs["log_det"][0], rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------------------
# A batch-hard triplet embedding: residual blocks run through torch.utils.checkpoint.checkpoint(use_reentrant=False)
# while training (their BatchNorm1d, cumulative momentum=None, updated again by the recomputation as in torch),
# distances by torch.cdist, hardest positives and negatives by masks, the nearest negatives by topk(largest=False),
# TripletMarginLoss(swap=True) and TripletMarginWithDistanceLoss, SGD with dampening; eval against train outputs.

def triplet(torch, init, batches, margin=0.3):
    nn, F = torch.nn, torch.nn.functional
    checkpoint = torch.utils.checkpoint.checkpoint

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.fc = nn.Linear(d, d)
            self.bn = nn.BatchNorm1d(d, momentum=None)
            self.drop = nn.Dropout(0.0)

        def forward(self, x):
            return x + self.drop(F.gelu(self.bn(self.fc(x))))

    class Embedder(nn.Module):
        def __init__(self, d_in=6, d=8, out=4):
            super().__init__()
            self.stem = nn.Linear(d_in, d)
            self.blocks = nn.ModuleList([Block(d), Block(d)])
            self.head = nn.Linear(d, out)
            self.use_checkpoint = True

        def forward(self, x):
            x = self.stem(x)
            for blk in self.blocks:
                if self.use_checkpoint and self.training:
                    x = checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
            return F.normalize(self.head(x), p=2, dim=1)

    def batch_hard_triplet_loss(labels, embeddings, margin, squared=False):
        dist = torch.cdist(embeddings, embeddings, p=2)
        if squared:
            dist = dist.pow(2)
        same = labels.unsqueeze(0) == labels.unsqueeze(1)
        eye = torch.eye(labels.size(0), dtype=torch.bool, device=labels.device)
        pos_mask = same & ~eye
        neg_mask = ~same
        hardest_pos = (dist * pos_mask.float()).max(dim=1, keepdim=True)[0]
        max_dist = dist.max(dim=1, keepdim=True).values
        hardest_neg = (dist + max_dist * (~neg_mask).float()).min(dim=1, keepdim=True)[0]
        loss = F.relu(hardest_pos - hardest_neg + margin)
        # semi-hard: the k nearest negatives by topk of the negated distances
        neg_d = dist.masked_fill(~neg_mask, float("inf"))
        k_near, k_idx = torch.topk(neg_d, k=2, dim=1, largest=False, sorted=True)
        frac = (loss > 1e-16).float().sum() / pos_mask.any(1).sum().clamp(min=1)
        return loss.mean(), frac, k_idx, k_near

    model = Embedder()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "frac": [], "knn": [], "builtin": []}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.1)
    criterion = nn.TripletMarginLoss(margin=margin, p=2, swap=True)
    dist_criterion = nn.TripletMarginWithDistanceLoss(distance_function=lambda a, b: 1 - F.cosine_similarity(a, b),
                                                      margin=0.5)
    for x, y in batches:
        x, y = torch.from_numpy(x), torch.from_numpy(y)
        model.train()
        emb = model(x)
        loss, frac, k_idx, k_near = batch_hard_triplet_loss(y, emb, margin)
        a, p, n = emb[0::3], emb[1::3], emb[2::3]
        extra = criterion(a, p, n) + dist_criterion(a, p, n)
        optimizer.zero_grad()
        (loss + 0.5 * extra).backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["builtin"].append(extra.item())
        record["frac"].append(frac.item())
        record["knn"].append([numpy_of(k_idx), numpy_of(k_near)])
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(batches[0][0])
        record["eval"] = numpy_of(model(x))
        record["bn"] = [(numpy_of(b.bn.running_mean), numpy_of(b.bn.running_var), b.bn.num_batches_tracked.item())
                        for b in model.blocks]
        model.train()
        record["train"] = numpy_of(model(x))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record

def triplet_batches(rng, steps=4, batch=9):
    out = []
    for _ in range(steps):
        y = rng.integers(0, 3, batch)
        out.append(((rng.standard_normal((batch, 6)) + y[:, None]).astype(np.float32), y))
    return out


def test_batch_hard_triplet_embedding_with_checkpointed_blocks_trains_like_torch():
    ours, theirs = run_both(triplet, triplet_batches(np.random.default_rng(2)))
    assert [b[2] for b in theirs["bn"]] == [8, 8]  # each training forward counted twice: once more when recomputed
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The text classification tutorial: a vocabulary from collections.Counter, a collate_fn building EmbeddingBag offsets by
# cumsum and a pad_sequence batch for a Conv1d branch max-pooled under a length mask, uniform_ init through .data,
# SGD with StepLR and clipping; then embedding_bag's other modes (sum with include_last_offset, max, per-sample
# weights, an empty bag, padding_idx).

CORPUS = [(0, "the cat sat on the mat"), (1, "stocks fell sharply on monday"), (0, "a dog chased the cat"),
          (1, "markets rallied as stocks rose"), (2, "the team won the match"), (2, "a late goal won the game"),
          (1, "bond yields rose on monday"), (0, "the bird sang on the mat"), (2, "the match ended in a draw")]

def text_classifier(torch, init, corpus, epochs=3):
    nn, F = torch.nn, torch.nn.functional
    pad_sequence = torch.nn.utils.rnn.pad_sequence
    DataLoader = torch.utils.data.DataLoader

    tokenizer = str.split
    counter = Counter()
    for _, line in corpus:
        counter.update(tokenizer(line))
    specials = ["<pad>", "<unk>"]
    itos = specials + [w for w, c in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])) if c >= 1]
    stoi = {w: i for i, w in enumerate(itos)}
    text_pipeline = lambda x: [stoi.get(tok, stoi["<unk>"]) for tok in tokenizer(x)]

    def collate_batch(batch):
        label_list, text_list, offsets, padded = [], [], [0], []
        for _label, _text in batch:
            label_list.append(_label)
            processed = torch.tensor(text_pipeline(_text), dtype=torch.int64)
            text_list.append(processed)
            padded.append(processed)
            offsets.append(processed.size(0))
        label_list = torch.tensor(label_list, dtype=torch.int64)
        offsets = torch.tensor(offsets[:-1]).cumsum(dim=0)
        text_list = torch.cat(text_list)
        lengths = torch.tensor([len(p) for p in padded])
        return label_list, text_list, offsets, pad_sequence(padded, batch_first=True, padding_value=0), lengths

    class TextClassificationModel(nn.Module):
        def __init__(self, vocab_size, embed_dim, num_class):
            super().__init__()
            self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, mode="mean", sparse=False)
            self.tokens = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
            self.conv = nn.Conv1d(embed_dim, embed_dim, 3, padding=1)
            self.fc = nn.Linear(2 * embed_dim, num_class)
            self.init_weights()

        def init_weights(self):
            initrange = 0.5
            self.embedding.weight.data.uniform_(-initrange, initrange)
            self.fc.weight.data.uniform_(-initrange, initrange)
            self.fc.bias.data.zero_()

        def forward(self, text, offsets, padded, lengths):
            bag = self.embedding(text, offsets)
            h = self.conv(self.tokens(padded).transpose(1, 2))
            mask = torch.arange(padded.size(1))[None, :] < lengths[:, None]
            h = h.masked_fill(~mask[:, None, :], float("-inf")).amax(dim=2)
            return self.fc(torch.cat([bag, h], dim=1))

    model = TextClassificationModel(len(itos), 6, 3)
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "acc": [], "lr": []}
    record["vocab"] = itos
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=2.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    loader = DataLoader(corpus, batch_size=4, shuffle=False, collate_fn=collate_batch)
    for _ in range(epochs):
        model.train()
        total_acc, total_count = 0, 0
        for label, text, offsets, padded, lengths in loader:
            optimizer.zero_grad()
            predicted_label = model(text, offsets, padded, lengths)
            loss = criterion(predicted_label, label)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
            total_acc += (predicted_label.argmax(1) == label).sum().item()
            total_count += label.size(0)
            record["loss"].append(loss.item())
            record["grads"].append(gradients(model))
        scheduler.step()
        record["acc"].append(total_acc / total_count)
        record["lr"].append(scheduler.get_last_lr()[0])
    model.eval()
    with torch.no_grad():
        text = torch.tensor(text_pipeline("the unknown cat won"))
        bag = model.embedding(text.unsqueeze(0))
        offsets_bag = model.embedding(text, torch.tensor([0, 2]))
        sum_bag = F.embedding_bag(text, model.embedding.weight, torch.tensor([0, 2, 4]), mode="sum",
                                  include_last_offset=True)
        max_bag = F.embedding_bag(text, model.embedding.weight, torch.tensor([0, 1]), mode="max")
        weighted = F.embedding_bag(text, model.embedding.weight, torch.tensor([0, 1]), mode="sum",
                                   per_sample_weights=torch.tensor([0.5, 1.0, 2.0, -1.0]))
        empty = F.embedding_bag(text, model.embedding.weight, torch.tensor([0, 4]), mode="mean")
        pad_bag = nn.EmbeddingBag(len(itos), 3, mode="mean", padding_idx=0)
        record["bags"] = [numpy_of(b) for b in (bag, offsets_bag, sum_bag, max_bag, weighted, empty)]
        record["pad_bag"] = [numpy_of(pad_bag.weight[0]), list(pad_bag(torch.tensor([[0, 0], [0, 2]])).shape)]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_embedding_bag_text_classifier_over_a_counter_vocabulary_trains_like_torch():
    ours, theirs = run_both(text_classifier, CORPUS)
    assert ours.pop("vocab") == theirs.pop("vocab")
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A time-series forecaster on nn.Transformer (batch_first, norm_first): a sinusoidal encoding as a non-persistent
# buffer, windows by Tensor.unfold, teacher forcing with generate_square_subsequent_mask and tgt_is_causal, the names
# of named_modules, parameters_to_vector, autoregressive decoding through .encoder/.decoder under no_grad, and
# vector_to_parameters loading halved weights back.

def ts_transformer(torch, init, series, enc_len=6, dec_len=3, d_model=8):
    nn, F = torch.nn, torch.nn.functional

    class PositionalEncoding(nn.Module):
        def __init__(self, d_model, max_len=32):
            super().__init__()
            position = torch.arange(max_len).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            pe = torch.zeros(1, max_len, d_model)
            pe[0, :, 0::2] = torch.sin(position * div_term)
            pe[0, :, 1::2] = torch.cos(position * div_term)
            self.register_buffer("pe", pe, persistent=False)

        def forward(self, x):
            return x + self.pe[:, : x.size(1)]

    class TimeSeriesTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc_in = nn.Linear(1, d_model)
            self.dec_in = nn.Linear(1, d_model)
            self.pos = PositionalEncoding(d_model)
            self.transformer = nn.Transformer(d_model=d_model, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                              dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=True)
            self.out = nn.Linear(d_model, 1)

        def forward(self, src, tgt):
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
            memory_mask = None
            h = self.transformer(self.pos(self.enc_in(src)), self.pos(self.dec_in(tgt)), tgt_mask=tgt_mask,
                                 memory_mask=memory_mask, tgt_is_causal=True)
            return self.out(h)

    model = TimeSeriesTransformer()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    record["names"] = [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.LayerNorm))]
    record["buffers"] = sorted(name for name, _ in model.named_buffers())
    # not Adam: it would blow the attention's key bias gradient, zero but for rounding, up to steps of the full rate
    optimizer = torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9)
    series = torch.from_numpy(series)
    windows = series.unfold(0, enc_len + dec_len, 2).unsqueeze(-1)
    for step in range(3):
        batch = windows[step::2][:4]
        src, target = batch[:, :enc_len], batch[:, enc_len:]
        tgt = torch.cat([src[:, -1:], target[:, :-1]], dim=1)  # teacher forcing: shifted right
        pred = model(src, tgt)
        loss = F.mse_loss(pred, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    vec = torch.nn.utils.parameters_to_vector(model.parameters())
    record["vec"] = numpy_of(vec)
    model.eval()
    with torch.no_grad():
        src = windows[:2, :enc_len]
        memory = model.transformer.encoder(model.pos(model.enc_in(src)))
        dec = src[:, -1:]
        for _ in range(dec_len):
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(dec.size(1))
            h = model.transformer.decoder(model.pos(model.dec_in(dec)), memory, tgt_mask=tgt_mask)
            dec = torch.cat([dec, model.out(h[:, -1:])], dim=1)
        record["forecast"] = numpy_of(dec[:, 1:])
        record["mask"] = numpy_of(nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64))
        torch.nn.utils.vector_to_parameters(vec * 0.5, model.parameters())
        record["halved"] = numpy_of(model(src, dec[:, :-1]))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def test_time_series_transformer_with_teacher_forcing_and_autoregressive_decoding_matches_torch():
    t = np.arange(40, dtype=np.float32)
    series = (np.sin(t / 3) + 0.1 * np.cos(t)).astype(np.float32)
    ours, theirs = run_both(ts_transformer, series)
    for key in ("names", "buffers"):
        assert ours.pop(key) == theirs.pop(key), key
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A message passing GNN without torch.sparse: GCN normalisation from bincount degrees and scatter_add_, GraphSAGE
# aggregations by index_add_ (mean) and scatter_reduce_(include_self=False) with amax and prod, graph pooling by
# scatter_reduce mean and amin; every reduction with and without include_self, and amax's gradient.

def gnn(torch, init, graphs):
    nn, F = torch.nn, torch.nn.functional

    class SAGEConv(nn.Module):
        """GraphSAGE with a choice of aggregation: mean by index_add_ and degree, max/min by scatter_reduce_."""
        def __init__(self, d_in, d_out, aggr):
            super().__init__()
            self.aggr = aggr
            self.lin_l = nn.Linear(d_in, d_out)
            self.lin_r = nn.Linear(d_in, d_out, bias=False)

        def forward(self, x, edge_index):
            src, dst = edge_index
            msg = x.index_select(0, src)
            if self.aggr == "mean":
                out = torch.zeros_like(x).index_add_(0, dst, msg)
                deg = torch.zeros(x.size(0), dtype=x.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=x.dtype))
                out = out / deg.clamp(min=1).unsqueeze(-1)
            else:
                index = dst.unsqueeze(-1).expand_as(msg)
                out = torch.zeros_like(x).scatter_reduce_(0, index, msg, reduce=self.aggr, include_self=False)
            return self.lin_l(out) + self.lin_r(x)

    class GCNConv(nn.Module):
        def __init__(self, d_in, d_out):
            super().__init__()
            self.lin = nn.Linear(d_in, d_out, bias=False)
            self.bias = nn.Parameter(torch.zeros(d_out))

        def forward(self, x, edge_index):
            n = x.size(0)
            loops = torch.arange(n).repeat(2, 1)
            edge_index = torch.cat([edge_index, loops], dim=1)
            src, dst = edge_index
            deg = torch.bincount(dst, minlength=n).to(x.dtype)
            norm = deg.pow(-0.5)
            norm = norm.masked_fill(torch.isinf(norm), 0)
            w = norm[src] * norm[dst]
            h = self.lin(x)
            out = torch.zeros_like(h).scatter_add_(0, dst.view(-1, 1).expand(-1, h.size(1)), h[src] * w.view(-1, 1))
            return out + self.bias

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = GCNConv(3, 8)
            self.conv2 = SAGEConv(8, 8, "amax")
            self.conv3 = SAGEConv(8, 8, "mean")
            self.conv4 = SAGEConv(8, 8, "prod")
            self.head = nn.Linear(16, 2)

        def forward(self, x, edge_index, batch, num_graphs):
            x = F.elu(self.conv1(x, edge_index))
            x = F.relu(self.conv2(x, edge_index))
            x = torch.tanh(self.conv3(x, edge_index))
            x = self.conv4(x, edge_index)
            index = batch.unsqueeze(-1).expand_as(x)
            mean = torch.zeros(num_graphs, x.size(1)).scatter_reduce(0, index, x, reduce="mean", include_self=False)
            amin = torch.zeros(num_graphs, x.size(1)).scatter_reduce(0, index, x, reduce="amin", include_self=False)
            return self.head(torch.cat([mean, amin], dim=1))

    model = Net()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=5e-4)
    for x, edge_index, batch, y in graphs:
        x, edge_index, batch, y = (torch.from_numpy(a) for a in (x, edge_index, batch, y))
        model.train()
        optimizer.zero_grad()
        out = model(x, edge_index, batch, int(batch.max()) + 1)
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    # include_self=True against False, and a node no edge reaches (kept at its self value / zero)
    x = torch.from_numpy(graphs[0][0])
    src = torch.tensor([0, 1, 2, 2])
    dst = torch.tensor([1, 1, 0, 0])
    base = torch.full((4, 3), 2.0)
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            idx = dst.unsqueeze(-1).expand(-1, 3)
            out = base.clone().scatter_reduce_(0, idx, x[src], reduce, include_self=include_self)
            record[f"{reduce}_{include_self}"] = numpy_of(out)
    xs = x[:4].clone().requires_grad_(True)
    b = torch.ones(4, 3, requires_grad=True)
    out = b.scatter_reduce(0, dst.unsqueeze(-1).expand(-1, 3), xs[src] * 2, "amax", include_self=False)
    out.pow(2).sum().backward()
    record["amax_grads"] = [numpy_of(xs.grad), numpy_of(b.grad)]
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def small_graphs(rng, steps=3):
    out = []
    for _ in range(steps):
        sizes = [4, 5]
        x = rng.standard_normal((sum(sizes), 3)).astype(np.float32)
        edges, batch, start = [], [], 0
        for g, n in enumerate(sizes):
            for i in range(n - 1):
                edges += [(start + i, start + i + 1), (start + i + 1, start + i)]
            edges.append((start, start + n - 1))
            batch += [g] * n
            start += n
        out.append((x, np.array(edges).T.copy(), np.array(batch), rng.integers(0, 2, len(sizes))))
    return out


def test_message_passing_gnn_with_scatter_reduce_trains_like_torch():
    ours, theirs = run_both(gnn, small_graphs(np.random.default_rng(3)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# What the programs, and the bad inputs tried on them, met, reduced.

def raised(call, torch):
    try:
        call(torch)
    except Exception as exc:  # noqa: BLE001 — the exception itself is what is compared
        return exc
    return None


REFUSALS = {
    # embedding_bag: an index outside the table is a RuntimeError (embedding's IndexError is not what torch raises)
    "embedding_bag index past the end": (
        lambda t: t.nn.functional.embedding_bag(t.tensor([1, 7]), t.ones(5, 3), t.tensor([0]), mode="max"),
        RuntimeError, "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be 7"),
    "embedding_bag negative index": (
        lambda t: t.nn.functional.embedding_bag(t.tensor([1, -1]), t.ones(5, 3, dtype=t.float64), t.tensor([0])),
        RuntimeError, "embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be -1"),
    "embedding_bag float offsets": (
        lambda t: t.nn.functional.embedding_bag(t.tensor([1, 2]), t.ones(5, 3), t.tensor([0.0])),
        RuntimeError, "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int"),
    "embedding_bag int16 indices": (
        lambda t: t.nn.functional.embedding_bag(t.tensor([1, 2], dtype=t.int16), t.ones(5, 3),
                                                t.tensor([0], dtype=t.int16)),
        RuntimeError, "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int"),
    # index_add: an index out of range in a tensor of 2 dims or more is torch's RuntimeError (of 1 dim, an IndexError)
    "index_add index past the end": (
        lambda t: t.zeros(3, 2).index_add_(0, t.tensor([0, 3]), t.ones(2, 2)),
        RuntimeError, "index 3 is out of bounds for dimension 0 with size 3"),
    "index_add negative index": (
        lambda t: t.zeros(3, 2).index_add(1, t.tensor([-1]), t.ones(3, 1)),
        RuntimeError, "index -1 is out of bounds for dimension 1 with size 2"),
    "index_add into 1 dim": (lambda t: t.zeros(3).index_add(0, t.tensor([3]), t.ones(1)), IndexError, "out of range"),
    # activations torch has floating kernels only for
    "leaky_relu of integers": (lambda t: t.nn.functional.leaky_relu(t.tensor([-1, 2])),
                               NotImplementedError, "\"leaky_relu_cpu\" not implemented for 'Long'"),
    "leaky_relu_ of int8": (lambda t: t.nn.functional.leaky_relu_(t.tensor([-1, 2], dtype=t.int8)),
                            NotImplementedError, "\"leaky_relu_cpu\" not implemented for 'Char'"),
    "LeakyReLU of bools": (lambda t: t.nn.LeakyReLU(0.2)(t.tensor([True, False])),
                           NotImplementedError, "\"leaky_relu_cpu\" not implemented for 'Bool'"),
    "rrelu of integers": (lambda t: t.nn.functional.rrelu(t.tensor([-1, 2])),
                          NotImplementedError, "\"leaky_relu_cpu\" not implemented for 'Long'"),
    "prelu of integers": (lambda t: t.nn.functional.prelu(t.tensor([-1, 2]), t.tensor([1])),
                          NotImplementedError, "\"prelu_cpu\" not implemented for 'Long'"),
    "glu of integers": (lambda t: t.nn.functional.glu(t.tensor([-1, 2])),
                        NotImplementedError, "\"glu_cpu\" not implemented for 'Long'"),
    # cdist takes two tensors of one dtype
    "cdist of float64 and float32": (lambda t: t.cdist(t.ones(3, 4, dtype=t.float64), t.ones(2, 4)),
                                     RuntimeError, "expected scalar type Double but found Float"),
    "cdist of float32 and float64": (lambda t: t.cdist(t.ones(3, 4), t.ones(2, 4, dtype=t.float64)),
                                     RuntimeError, "expected scalar type Float but found Double"),
    # a size or dims list spelled as varargs must have at least one entry
    "repeat()": (lambda t: t.arange(3).repeat(), TypeError,
                 'repeat() missing 1 required positional arguments: "repeats"'),
    "0-d repeat()": (lambda t: t.tensor(3).repeat(), TypeError, "repeat() missing 1 required positional argument"),
    "0-d permute()": (lambda t: t.tensor(3).permute(), TypeError, "permute() missing 1 required positional argument"),
    "0-d reshape()": (lambda t: t.tensor(3).reshape(), TypeError, "reshape() missing 1 required positional argument"),
    "0-d expand()": (lambda t: t.tensor(3).expand(), TypeError, "expand() missing 1 required positional argument"),
    "0-d flip()": (lambda t: t.tensor(3).flip(), TypeError, "flip() missing 1 required positional argument"),
    "0-d tile()": (lambda t: t.tensor(3).tile(), TypeError, "tile() missing 1 required positional argument"),
    "0-d view()": (lambda t: t.tensor(3).view(), TypeError, "view()"),
}


@pytest.mark.parametrize("torch", LIBRARIES, ids=["torch", "tilewise"])
@pytest.mark.parametrize("case", REFUSALS)
def test_bad_inputs_met_by_the_programs_are_refused_as_torch(torch, case):
    call, error, message = REFUSALS[case]
    exc = raised(call, torch)
    assert type(exc) is error or (error is NotImplementedError and isinstance(exc, error)), repr(exc)
    assert message in str(exc)


ACCEPTED = {
    # indices promoted with their offsets: bool or uint8 indices next to int64 offsets are int64 indices
    "embedding_bag bool indices, long offsets": lambda t: t.nn.functional.embedding_bag(
        t.tensor([True, False]), t.arange(15.0).reshape(5, 3), t.tensor([0])),
    "embedding_bag uint8 indices, long offsets": lambda t: t.nn.functional.embedding_bag(
        t.tensor([1, 4], dtype=t.uint8), t.arange(15.0).reshape(5, 3), t.tensor([0, 1]), mode="sum"),
    # index_add into integers takes a float alpha as its integer part
    "index_add int64, alpha=1.5": lambda t: t.zeros(3, dtype=t.int64).index_add(
        0, t.arange(3), t.full((3,), 3, dtype=t.int64), alpha=1.5),
    "index_add int64, alpha=-2.7": lambda t: t.zeros(3, dtype=t.int64).index_add_(
        0, t.tensor([2, 0, 2]), t.tensor([1, 2, 3]), alpha=-2.7),
    "index_add int32, alpha=2.0": lambda t: t.ones(2, 2, dtype=t.int32).index_add(
        1, t.tensor([1]), t.ones(2, 1, dtype=t.int32), alpha=2.0),
    "repeat(()) of a 0-d tensor": lambda t: t.tensor(3).repeat(()),
    "view(()) of a 0-d tensor": lambda t: t.tensor(3).view(()),
}


@pytest.mark.parametrize("case", ACCEPTED)
def test_inputs_torch_accepts_give_its_values(case):
    call = ACCEPTED[case]
    expected, ours = call(real_torch), call(tilewise)
    assert str(ours.dtype).split(".")[-1] == str(expected.dtype).split(".")[-1]
    assert tuple(ours.shape) == tuple(expected.shape)
    np.testing.assert_array_equal(ours.numpy(), expected.numpy())
