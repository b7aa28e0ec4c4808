"""Audio and signal-processing programs in the styles their reference code publishes, run under torch and under
tilewise (``import tilewise as torch``) from the same initial weights and signals, as in ``test_trust_programs.py``,
whose helpers these use: a torchaudio-style front end written in plain torch (STFT round trips, a mel filterbank built
by hand, log-mel, MFCC by a DCT matrix, delta features, Griffin-Lim), a Conformer CTC recogniser (relative positional
attention with rel-shift, depthwise convolutions, SpecAugment masks, CTC loss and greedy decoding), HiFi-GAN vocoder
pieces (weight-normed transposed convolutions, period and scale discriminators, a multi-resolution STFT loss, feature
matching), an ECAPA-style speaker embedding (masked statistics pooling, squeeze-and-excitation, AAM-softmax, cosine
scoring), a Conv-TasNet separator trained by SI-SNR with permutation-invariant training, a mu-law WaveNet, a
speech enhancer with complex parameters, and torchaudio.functional's Python signal processing (emphasis filters, an
IIR filter loop, FFT convolution, the phase vocoder, sinc resampling).

Adam divides each gradient by its own running magnitude, so a parameter whose true gradient is zero (a bias before a
batch norm or before a softmax over time, a key bias under softmax attention) moves by its normalised rounding noise in
either library. Where a published model has such parameters, the final weights are compared at a looser tolerance;
losses and gradients step by step are compared at the usual one. Below the programs, the failures they met, each
reduced to a test.
"""
# ruff: noqa: N803, N806 — the programs keep the scripts' names (F, B, T, C, K, M, N, L, H)

from __future__ import annotations

import copy
import itertools
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch as real_torch
from test_trust_programs import assert_same, gradients, initial_state, numpy_of, run_both

import tilewise

LIBRARIES = [real_torch, tilewise]
NOISE_LIMITED = {"atol": 2e-4, "rtol": 2e-3}  # final weights of models with zero-gradient parameters (see above)


def run_both_loose_final(program, *args, **kwargs):
    ours, theirs = run_both(program, *args, **kwargs)
    assert_same(ours.pop("final"), theirs.pop("final"), **NOISE_LIMITED)
    return ours, theirs


# ----------------------------------------------------------------------------------------------------------------------
# A front end as torchaudio computes it, written in plain torch: torch.stft over every combination of center, pad_mode
# (reflect, constant), window (Hann, Hamming, none) and normalized, each inverted by torch.istft where the window allows
# (torch refuses center=False with a Hann window, whose first sample is zero: the same error both ways) and
# differentiated; a two-sided STFT through view_as_real / view_as_complex and back; a mel filterbank built by hand
# (linspace, the triangular slopes, max / min against zero, Slaney normalisation), log-mel in dB through
# clamp_min().log10() with an 80 dB floor, MFCC by an orthonormal DCT-II matrix, delta features by torchaudio's
# replicate-padded grouped conv1d and by a conv1d with padding="same"; Griffin-Lim with momentum, from torch.polar
# phases, its angle and magnitude at the end.

def front_end(torch, wave, n_fft=32, hop=8, sr=8000, n_mels=6, n_mfcc=4):
    F = torch.nn.functional
    record, errors = {}, {}
    x = torch.from_numpy(wave).requires_grad_(True)
    windows = {"hann": lambda: torch.hann_window(n_fft), "hamming": lambda: torch.hamming_window(n_fft, periodic=True),
               "none": lambda: None}
    for center, pad_mode, window_name, normalized in itertools.product((True, False), ("reflect", "constant"),
                                                                       windows, (False, True)):
        key = f"{center}-{pad_mode}-{window_name}-{normalized}"
        window = windows[window_name]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the rectangular window's warning
            spec = torch.stft(x, n_fft, hop_length=hop, win_length=n_fft, window=window, center=center,
                              pad_mode=pad_mode, normalized=normalized, onesided=True, return_complex=True)
        record["spec " + key] = numpy_of(spec.detach())
        loss = spec.abs().mean()
        if window is not None:
            try:
                y = torch.istft(spec, n_fft, hop_length=hop, window=window, center=center, normalized=normalized,
                                length=x.shape[-1] if center else None)
            except RuntimeError as exc:
                errors[key] = str(exc)
            else:
                record["round trip " + key] = numpy_of(y.detach())
                loss = (y**2).mean() + spec.abs().pow(2).sum() * 1e-3
        (grad,) = torch.autograd.grad(loss, x)
        record["grad " + key] = numpy_of(grad)

    two_sided = torch.stft(x, 16, hop_length=4, window=torch.hann_window(16), onesided=False, return_complex=True)
    pairs = torch.view_as_real(two_sided)
    record["two-sided"] = numpy_of(two_sided.detach())
    record["as pairs"] = numpy_of(pairs.detach())
    record["as complex"] = numpy_of(torch.view_as_complex(pairs.contiguous()).detach())
    back = torch.istft(two_sided, 16, hop_length=4, window=torch.hann_window(16), onesided=False,
                       return_complex=False, length=60)
    record["two-sided round trip"] = numpy_of(back.detach())

    # torchaudio.functional.melscale_fbanks (htk scale, Slaney norm), by hand
    n_freqs = n_fft // 2 + 1
    all_freqs = torch.linspace(0, sr // 2, n_freqs)
    m_min, m_max = 2595.0 * math.log10(1.0), 2595.0 * math.log10(1.0 + (sr / 2) / 700.0)
    m_pts = torch.linspace(m_min, m_max, n_mels + 2)
    f_pts = 700.0 * (10 ** (m_pts / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    zero = torch.zeros(1)
    down_slopes = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up_slopes = slopes[:, 2:] / f_diff[1:]
    fb = torch.max(zero, torch.min(down_slopes, up_slopes))
    enorm = 2.0 / (f_pts[2: n_mels + 2] - f_pts[:n_mels])
    fb = fb * enorm.unsqueeze(0)
    record["filterbank"] = numpy_of(fb)

    spec = torch.stft(x, n_fft, hop_length=hop, window=torch.hann_window(n_fft), return_complex=True)
    power = spec.abs().pow(2.0)
    mel = torch.matmul(power.transpose(-1, -2), fb).transpose(-1, -2)
    log_mel = 10.0 * mel.clamp_min(1e-10).log10()
    log_mel = torch.max(log_mel, log_mel.amax(dim=(-2, -1), keepdim=True) - 80.0)
    record["log-mel"] = numpy_of(log_mel.detach())

    n = torch.arange(float(n_mels))
    k = torch.arange(float(n_mfcc)).unsqueeze(1)
    dct = torch.cos(math.pi / float(n_mels) * (n + 0.5) * k)
    dct[0] *= 1.0 / math.sqrt(2.0)
    dct *= math.sqrt(2.0 / float(n_mels))
    mfcc = torch.matmul(log_mel.transpose(-1, -2), dct.t()).transpose(-1, -2)
    record["mfcc"] = numpy_of(mfcc.detach())

    # torchaudio.functional.compute_deltas, and the same kernel through padding="same"
    win_length = 5
    half = (win_length - 1) // 2
    denom = half * (half + 1) * (2 * half + 1) / 3
    shape = mfcc.size()
    specgram = F.pad(mfcc.reshape(1, -1, shape[-1]), (half, half), mode="replicate")
    kernel = torch.arange(-half, half + 1, 1, dtype=specgram.dtype).repeat(specgram.shape[1], 1, 1)
    deltas = (F.conv1d(specgram, kernel, groups=specgram.shape[1]) / denom).reshape(shape)
    same = F.conv1d(mfcc.reshape(-1, 1, shape[-1]), torch.tensor([[[-2.0, -1.0, 0.0, 1.0, 2.0]]]),
                    padding="same") / denom
    record["deltas"], record["deltas, same padding"] = numpy_of(deltas.detach()), numpy_of(same.detach())
    loss = deltas.pow(2).mean() + same.abs().mean() + mfcc.mean()
    (grad,) = torch.autograd.grad(loss, x)
    record["mfcc grad"] = numpy_of(grad)

    # torchaudio.functional.griffinlim, from constant phases made by torch.polar
    with torch.no_grad():
        window = torch.hann_window(n_fft)
        specgram = torch.stft(x, n_fft, hop, window=window, return_complex=True).abs()
        angles = torch.polar(torch.ones_like(specgram), torch.zeros_like(specgram) + 0.3)
        tprev = torch.tensor(0.0, dtype=angles.dtype)
        momentum = 0.99 / (1 + 0.99)
        for _ in range(4):
            inverse = torch.istft(specgram * angles, n_fft=n_fft, hop_length=hop, window=window, length=x.shape[-1])
            rebuilt = torch.stft(inverse, n_fft=n_fft, hop_length=hop, window=window, center=True,
                                 pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
            angles = rebuilt
            angles = angles - tprev.mul_(momentum)
            angles = angles.div(angles.abs().add(1e-16))
            tprev = rebuilt
        waveform = torch.istft(specgram * angles, n_fft=n_fft, hop_length=hop, window=window, length=x.shape[-1])
        record["griffin-lim"] = numpy_of(waveform)
        phase = torch.angle(rebuilt)  # near +-pi where the imaginary part is a rounding's sign: compared as cos, sin
        record["phase"] = [numpy_of(phase.cos()), numpy_of(phase.sin())]
        record["magnitude"] = numpy_of(rebuilt.abs())
    return record, errors


def test_spectral_front_end_stft_mel_mfcc_deltas_and_griffin_lim_match_torch():
    wave = np.random.default_rng(0).standard_normal((2, 60)).astype(np.float32)
    theirs, their_errors = front_end(real_torch, wave)
    ours, our_errors = front_end(tilewise, wave)
    assert our_errors == their_errors and len(their_errors) == 4  # center=False with a Hann window
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A Conformer CTC recogniser as ESPnet and torchaudio write it: a convolutional front end, blocks of half-step
# feed-forward modules with Swish, relative positional multi-head attention (ESPnet's RelPositionalEncoding of positive
# and flipped negative positions, the learned biases u and v, rel_shift by pad / view / slice, a padding mask applied by
# masked_fill before and after the softmax), a convolution module (pointwise conv, GLU, depthwise Conv1d with
# groups=channels and padding="same", BatchNorm1d, SiLU) and a final layer norm; SpecAugment time and frequency masks
# from arange comparisons against per-utterance starts and widths; F.ctc_loss with zero_infinity=True over every
# reduction (one batch holds a target too long for its frames), AdamW and clip_grad_norm_; greedy CTC decoding with
# unique_consecutive in eval mode. Mask positions come from the batches (numpy); torch.randint is checked for range.

def conformer(torch, init, batches, d=8, heads=2, n_mels=6, vocab=5, reduction="mean"):
    nn, F = torch.nn, torch.nn.functional

    class RelPositionalEncoding(nn.Module):
        def __init__(self, d_model, max_len=64):
            super().__init__()
            pe_positive = torch.zeros(max_len, d_model)
            pe_negative = torch.zeros(max_len, d_model)
            position = torch.arange(0, max_len, dtype=torch.float32).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
            pe_positive[:, 0::2] = torch.sin(position * div_term)
            pe_positive[:, 1::2] = torch.cos(position * div_term)
            pe_negative[:, 0::2] = torch.sin(-1 * position * div_term)
            pe_negative[:, 1::2] = torch.cos(-1 * position * div_term)
            pe_positive = torch.flip(pe_positive, [0]).unsqueeze(0)
            pe_negative = pe_negative[1:].unsqueeze(0)
            self.register_buffer("pe", torch.cat([pe_positive, pe_negative], dim=1), persistent=False)

        def forward(self, x):
            T = x.size(1)
            center = self.pe.size(1) // 2
            return self.pe[:, center - T + 1: center + T]

    class RelPositionMultiHeadedAttention(nn.Module):
        def __init__(self, n_feat, n_head):
            super().__init__()
            self.d_k, self.h = n_feat // n_head, n_head
            self.linear_q = nn.Linear(n_feat, n_feat)
            self.linear_k = nn.Linear(n_feat, n_feat, bias=False)  # its bias would cancel in the softmax (see above)
            self.linear_v = nn.Linear(n_feat, n_feat)
            self.linear_out = nn.Linear(n_feat, n_feat)
            self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
            self.pos_bias_u = nn.Parameter(torch.Tensor(self.h, self.d_k))
            self.pos_bias_v = nn.Parameter(torch.Tensor(self.h, self.d_k))
            torch.nn.init.xavier_uniform_(self.pos_bias_u)
            torch.nn.init.xavier_uniform_(self.pos_bias_v)

        def rel_shift(self, x):
            b, h, qlen, pos_len = x.size()
            x = torch.nn.functional.pad(x, pad=(1, 0))
            x = x.view(b, h, -1, qlen)
            x = x[:, :, 1:].view(b, h, qlen, pos_len)
            return x[:, :, :, : pos_len // 2 + 1]

        def forward(self, x, pos_emb, mask):
            n_batch = x.size(0)
            q = self.linear_q(x).view(n_batch, -1, self.h, self.d_k)
            k = self.linear_k(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
            v = self.linear_v(x).view(n_batch, -1, self.h, self.d_k).transpose(1, 2)
            p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
            q_with_bias_u = (q + self.pos_bias_u).transpose(1, 2)
            q_with_bias_v = (q + self.pos_bias_v).transpose(1, 2)
            matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))
            matrix_bd = self.rel_shift(torch.matmul(q_with_bias_v, p.transpose(-2, -1)))
            scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
            mask = mask.unsqueeze(1).eq(0)
            scores = scores.masked_fill(mask, -float("inf"))
            attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
            x = torch.matmul(attn, v)
            x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)
            return self.linear_out(x)

    class ConvolutionModule(nn.Module):
        def __init__(self, channels, kernel_size=5):
            super().__init__()
            self.pointwise_conv1 = nn.Conv1d(channels, 2 * channels, 1)
            self.depthwise_conv = nn.Conv1d(channels, channels, kernel_size, padding="same", groups=channels,
                                            bias=False)  # torchaudio's default; a bias here cancels in the norm
            self.norm = nn.BatchNorm1d(channels)
            self.pointwise_conv2 = nn.Conv1d(channels, channels, 1)
            self.activation = nn.SiLU()

        def forward(self, x, pad_mask):
            x = x.transpose(1, 2).masked_fill(pad_mask.unsqueeze(1), 0.0)
            x = nn.functional.glu(self.pointwise_conv1(x), dim=1)
            x = self.activation(self.norm(self.depthwise_conv(x)))
            return self.pointwise_conv2(x).transpose(1, 2)

    class FeedForward(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w_1, self.w_2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            h = self.w_1(x)
            return self.w_2(h * torch.sigmoid(h))  # Swish written out

    class ConformerBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ff1, self.ff2 = FeedForward(d), FeedForward(d)
            self.mha = RelPositionMultiHeadedAttention(d, heads)
            self.conv = ConvolutionModule(d)
            self.norm_ff1, self.norm_mha, self.norm_conv = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
            self.norm_ff2, self.norm_final = nn.LayerNorm(d), nn.LayerNorm(d)

        def forward(self, x, pos, att_mask, pad_mask):
            x = x + 0.5 * self.ff1(self.norm_ff1(x))
            x = x + self.mha(self.norm_mha(x), pos, att_mask)
            x = x + self.conv(self.norm_conv(x), pad_mask)
            x = x + 0.5 * self.ff2(self.norm_ff2(x))
            return self.norm_final(x)

    class Recogniser(nn.Module):
        def __init__(self):
            super().__init__()
            self.subsample = nn.Conv1d(n_mels, d, 3, stride=1, padding=1)
            self.pos = RelPositionalEncoding(d)
            self.blocks = nn.ModuleList([ConformerBlock(), ConformerBlock()])
            self.out = nn.Linear(d, vocab)

        def forward(self, feats, lengths):
            x = F.silu(self.subsample(feats)).transpose(1, 2)
            T = x.size(1)
            pad_mask = torch.arange(T, device=x.device).expand(x.size(0), T) >= lengths.unsqueeze(1)
            att_mask = (~pad_mask.unsqueeze(1) & ~pad_mask.unsqueeze(2)) | torch.eye(T, dtype=torch.bool).unsqueeze(0)
            pos = self.pos(x)
            for block in self.blocks:
                x = block(x, pos, att_mask, pad_mask)
            return self.out(x).log_softmax(dim=-1)

    def spec_augment(feats, f_start, f_width, t_start, t_width):
        B, n_freq, T = feats.shape
        freq = torch.arange(n_freq).view(1, n_freq, 1)
        time = torch.arange(T).view(1, 1, T)
        freq_mask = (freq >= f_start.view(B, 1, 1)) & (freq < (f_start + f_width).view(B, 1, 1))
        time_mask = (time >= t_start.view(B, 1, 1)) & (time < (t_start + t_width).view(B, 1, 1))
        return feats.masked_fill(freq_mask | time_mask, 0.0)

    model = Recogniser()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "per utterance": []}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=1e-3)
    generator = torch.Generator().manual_seed(3)
    for feats, lengths, targets, target_lengths, masks in batches:
        feats, lengths = torch.from_numpy(feats), torch.from_numpy(lengths)
        targets, target_lengths = torch.from_numpy(targets), torch.from_numpy(target_lengths)
        feats = spec_augment(feats, *(torch.from_numpy(m) for m in masks))
        drawn = torch.randint(0, 3, (feats.shape[0],), generator=generator)
        assert drawn.dtype == torch.int64 and bool(((drawn >= 0) & (drawn < 3)).all())
        model.train()
        optimizer.zero_grad()
        log_probs = model(feats, lengths)
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, lengths, target_lengths, blank=0, reduction=reduction,
                          zero_infinity=True)
        if reduction == "none":
            record["per utterance"].append(numpy_of(loss))
            loss = loss.sum() / target_lengths.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        feats, lengths = torch.from_numpy(batches[0][0]), torch.from_numpy(batches[0][1])
        log_probs = model(feats, lengths)
        record["eval"] = numpy_of(log_probs)
        record["decoded"] = decode_greedily(torch, log_probs, lengths)
        record["decoded, fixed"] = decode_greedily(torch, torch.from_numpy(FIXED_LOG_PROBS), torch.tensor([6, 5]))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


FIXED_LOG_PROBS = np.log(np.eye(4, dtype=np.float32)[[[1, 1, 0, 2, 2, 3], [0, 3, 3, 0, 3, 1]]] * 0.9 + 0.025)


def decode_greedily(torch, log_probs, lengths, blank=0):
    best = log_probs.argmax(dim=-1)
    decoded = []
    for b in range(best.shape[0]):
        tokens = torch.unique_consecutive(best[b, : int(lengths[b])])
        decoded.append(tokens[tokens != blank].tolist())
        unique, inverse, counts = torch.unique_consecutive(best[b], return_inverse=True, return_counts=True)
        decoded.append([unique.tolist(), inverse.tolist(), counts.tolist()])
    return decoded


def asr_batches(rng, steps=4, B=3, n_mels=6, T=12, vocab=5):
    out = []
    for step in range(steps):
        feats = rng.standard_normal((B, n_mels, T)).astype(np.float32)
        lengths = np.array([T, T - 3, T - 5], dtype=np.int64)
        target_lengths = np.array([4, 3, 7 if step == 1 else 2], dtype=np.int64)  # 7 labels in 7 frames: impossible
        targets = rng.integers(1, vocab, (B, 7)).astype(np.int64)
        masks = (rng.integers(0, n_mels - 2, B), rng.integers(0, 3, B), rng.integers(0, T - 4, B),
                 rng.integers(0, 4, B))
        out.append((feats, lengths, targets, target_lengths, masks))
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_conformer_with_relative_attention_spec_augment_and_ctc_trains_and_decodes_like_torch(reduction):
    ours, theirs = run_both_loose_final(conformer, asr_batches(np.random.default_rng(0)), reduction=reduction)
    assert theirs["decoded, fixed"][0] == [1, 2, 3] and theirs["decoded, fixed"][2] == [3, 3]
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# HiFi-GAN, as its repository writes it, at toy sizes: a generator of weight-normed ConvTranspose1d upsampling layers
# and dilated residual blocks with F.leaky_relu, init_weights by .weight.data.normal_; a multi-period discriminator
# (reflect padding of the (B, 1, T) waveform by F.pad, then a view into periods and Conv2d with (k, 1) kernels) and a
# multi-scale one with grouped convolutions; least-squares adversarial losses, feature matching against detached real
# features, a log-magnitude L1 loss on reflect-padded STFTs (mel_spectrogram's padding) and ParallelWaveGAN's
# multi-resolution STFT loss (spectral convergence by Frobenius norms, log magnitude by l1_loss); two AdamW optimizers
# and ExponentialLR. Weight norm both ways: nn.utils.weight_norm and nn.utils.parametrizations.weight_norm, removed
# after training. The magnitude floor is 1e-2 rather than the repository's 1e-5 on mel bins: on raw bins of an untrained
# generator's quiet output, 1e-5 makes the gradient of the log ill-conditioned in float32 in either library.

def hifigan(torch, init, batches, weight_norm_form="hooks", ch=8, n_mels=4):
    nn, F = torch.nn, torch.nn.functional
    LRELU_SLOPE = 0.1

    def weight_norm(module):
        if weight_norm_form == "parametrizations":
            return nn.utils.parametrizations.weight_norm(module)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # nn.utils.weight_norm is deprecated
            return nn.utils.weight_norm(module)

    def init_weights(m, mean=0.0, std=0.05):
        if m.__class__.__name__.find("Conv") != -1:
            m.weight.data.normal_(mean, std)

    def get_padding(kernel_size, dilation=1):
        return int((kernel_size * dilation - dilation) / 2)

    class ResBlock(nn.Module):
        def __init__(self, channels, kernel_size=3, dilation=(1, 3)):
            super().__init__()
            self.convs1 = nn.ModuleList([weight_norm(nn.Conv1d(channels, channels, kernel_size, 1, dilation=d,
                                                               padding=get_padding(kernel_size, d)))
                                         for d in dilation])
            self.convs2 = nn.ModuleList([weight_norm(nn.Conv1d(channels, channels, kernel_size, 1, dilation=1,
                                                               padding=get_padding(kernel_size, 1)))
                                         for _ in dilation])

        def forward(self, x):
            for c1, c2 in zip(self.convs1, self.convs2):
                xt = c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
                x = xt + x
            return x

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_pre = weight_norm(nn.Conv1d(n_mels, ch, 7, 1, padding=3))
            self.ups = nn.ModuleList()
            for i, (u, k) in enumerate(zip((4, 2), (8, 4))):
                self.ups.append(weight_norm(nn.ConvTranspose1d(ch // (2**i), ch // (2 ** (i + 1)), k, u,
                                                               padding=(k - u) // 2)))
            self.resblocks = nn.ModuleList([ResBlock(ch // 2), ResBlock(ch // 4)])
            self.conv_post = weight_norm(nn.Conv1d(ch // 4, 1, 7, 1, padding=3))
            self.ups.apply(init_weights)
            self.conv_post.apply(init_weights)

        def forward(self, x):
            x = self.conv_pre(x)
            for up, block in zip(self.ups, self.resblocks):
                x = block(up(F.leaky_relu(x, LRELU_SLOPE)))
            x = self.conv_post(F.leaky_relu(x))
            return torch.tanh(x)

    class DiscriminatorP(nn.Module):
        def __init__(self, period):
            super().__init__()
            self.period = period
            self.convs = nn.ModuleList([weight_norm(nn.Conv2d(1, 4, (5, 1), (3, 1), padding=(2, 0))),
                                        weight_norm(nn.Conv2d(4, 8, (3, 1), 1, padding=(1, 0)))])
            self.conv_post = weight_norm(nn.Conv2d(8, 1, (3, 1), 1, padding=(1, 0)))

        def forward(self, x):
            fmap = []
            b, c, t = x.shape
            if t % self.period != 0:
                n_pad = self.period - (t % self.period)
                x = F.pad(x, (0, n_pad), "reflect")
                t = t + n_pad
            x = x.view(b, c, t // self.period, self.period)
            for layer in self.convs:
                x = F.leaky_relu(layer(x), LRELU_SLOPE)
                fmap.append(x)
            x = self.conv_post(x)
            fmap.append(x)
            return torch.flatten(x, 1, -1), fmap

    class DiscriminatorS(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([weight_norm(nn.Conv1d(1, 4, 5, 1, padding=2)),
                                        weight_norm(nn.Conv1d(4, 8, 5, 2, groups=4, padding=2)),
                                        weight_norm(nn.Conv1d(8, 8, 3, 1, padding=1))])
            self.conv_post = weight_norm(nn.Conv1d(8, 1, 3, 1, padding=1))

        def forward(self, x):
            fmap = []
            for layer in self.convs:
                x = F.leaky_relu(layer(x), LRELU_SLOPE)
                fmap.append(x)
            x = self.conv_post(x)
            fmap.append(x)
            return torch.flatten(x, 1, -1), fmap

    def feature_loss(fmap_r, fmap_g):
        loss = 0
        for dr, dg in zip(fmap_r, fmap_g):
            for rl, gl in zip(dr, dg):
                loss += torch.mean(torch.abs(rl - gl))
        return loss * 2

    def discriminator_loss(real_outputs, generated_outputs):
        loss = 0
        for dr, dg in zip(real_outputs, generated_outputs):
            loss += torch.mean((1 - dr) ** 2) + torch.mean(dg**2)
        return loss

    def stft_magnitude(x, fft_size, hop_size, win_length):
        x_stft = torch.stft(x, fft_size, hop_size, win_length, torch.hann_window(win_length), return_complex=True)
        return torch.sqrt(torch.clamp(x_stft.real**2 + x_stft.imag**2, min=1e-7)).transpose(2, 1)

    def multi_resolution_stft_loss(x, y):
        sc_loss, mag_loss = 0.0, 0.0
        for fft_size, hop_size, win_length in ((16, 4, 12), (32, 8, 24), (8, 2, 8)):
            x_mag = stft_magnitude(x, fft_size, hop_size, win_length)
            y_mag = stft_magnitude(y, fft_size, hop_size, win_length)
            sc_loss = sc_loss + torch.norm(y_mag - x_mag, p="fro") / torch.norm(y_mag, p="fro")
            mag_loss = mag_loss + F.l1_loss(torch.log(y_mag), torch.log(x_mag))
        return sc_loss / 3, mag_loss / 3

    def spectrogram_l1(x, y, pad=4):
        def log_magnitude(signal):
            signal = F.pad(signal.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
            spec = torch.stft(signal, 16, hop_length=4, window=torch.hann_window(16), center=False,
                              return_complex=True)
            return torch.log(torch.clamp(spec.abs(), min=1e-2))

        return F.l1_loss(log_magnitude(x), log_magnitude(y))

    generator, mpd, msd = Generator(), nn.ModuleList([DiscriminatorP(2), DiscriminatorP(3)]), DiscriminatorS()
    discriminators = [*mpd, msd]
    everything = nn.ModuleDict({"generator": generator, "mpd": mpd, "msd": msd})
    record = {"init": initial_state(torch, everything, init), "generator loss": [], "discriminator loss": [],
              "stft losses": [], "generator grads": [], "discriminator grads": []}
    optim_g = torch.optim.AdamW(generator.parameters(), 2e-3, betas=(0.8, 0.99))
    optim_d = torch.optim.AdamW([*mpd.parameters(), *msd.parameters()], 2e-3, betas=(0.8, 0.99))
    scheduler_g = torch.optim.lr_scheduler.ExponentialLR(optim_g, gamma=0.9)
    for mel, wave in batches:
        x, y = torch.from_numpy(mel), torch.from_numpy(wave).unsqueeze(1)
        y_g_hat = generator(x)
        optim_d.zero_grad()
        loss_disc = 0
        for discriminator in discriminators:
            y_d_r, _ = discriminator(y)
            y_d_g, _ = discriminator(y_g_hat.detach())
            loss_disc = loss_disc + discriminator_loss([y_d_r], [y_d_g])
        loss_disc.backward()
        optim_d.step()

        optim_g.zero_grad()
        sc_loss, mag_loss = multi_resolution_stft_loss(y_g_hat.squeeze(1), y.squeeze(1))
        loss_spec = spectrogram_l1(y_g_hat.squeeze(1), y.squeeze(1))
        loss_fm, loss_adv = 0, 0
        for discriminator in discriminators:
            _, fmap_r = discriminator(y)
            y_d_g, fmap_g = discriminator(y_g_hat)
            loss_fm = loss_fm + feature_loss([[f.detach() for f in fmap_r]], [fmap_g])
            loss_adv = loss_adv + torch.mean((1 - y_d_g) ** 2)
        loss_gen = loss_adv + loss_fm + 45 * loss_spec + sc_loss + mag_loss
        loss_gen.backward()
        optim_g.step()
        scheduler_g.step()
        record["generator loss"].append(loss_gen.item())
        record["discriminator loss"].append(loss_disc.item())
        record["stft losses"].append([sc_loss.item(), mag_loss.item(), loss_spec.item()])
        record["generator grads"].append(gradients(generator))
        record["discriminator grads"].append(gradients(everything))
    record["final"] = {k: numpy_of(v) for k, v in everything.state_dict().items()}
    if weight_norm_form == "parametrizations":
        nn.utils.parametrize.remove_parametrizations(generator.conv_pre, "weight")
    else:
        nn.utils.remove_weight_norm(generator.conv_pre)
    assert sorted(generator.conv_pre.state_dict()) == ["bias", "weight"]
    with torch.no_grad():
        record["inference"] = numpy_of(generator(torch.from_numpy(batches[0][0])))
    return record


def vocoder_batches(rng, steps=3, B=2, n_mels=4, T=5):
    return [(rng.standard_normal((B, n_mels, T)).astype(np.float32),
             (0.5 * np.sin(np.arange(T * 8) * 0.3 + rng.random((B, 1)) * 3)).astype(np.float32))
            for _ in range(steps)]


@pytest.mark.parametrize("weight_norm_form", ["hooks", "parametrizations"])
def test_hifigan_with_weight_norm_discriminators_and_stft_losses_trains_like_torch(weight_norm_form):
    ours, theirs = run_both(hifigan, vocoder_batches(np.random.default_rng(0)), weight_norm_form=weight_norm_form)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# A speaker embedding as ECAPA-TDNN's reference code writes it: a Res2Net block (torch.split, per-scale dilated
# convolutions, BatchNorm1d, torch.cat) with squeeze-and-excitation (AdaptiveAvgPool1d, two 1x1 convolutions, sigmoid),
# x-vector statistics pooling over the valid frames of variable-length utterances (a mask from arange < lengths, no
# packing), attentive statistics pooling on a global context of the masked mean and standard deviation (a softmax over
# time, masked_fill and renormalised), then AAM-softmax (F.normalize, F.linear, sqrt of 1 - cos^2 with clamp, the
# margin's threshold by torch.where, scatter_ one-hot, scale) plus the acos / cos form with F.one_hot and label
# smoothing; Adam and StepLR; cosine scoring of enrolment against test embeddings in eval mode (matmul of normalised
# embeddings, F.cosine_similarity, cdist).

def ecapa(torch, init, batches, feat=6, C=8, emb=4, n_spk=3, margin=0.2, scale=10.0, easy_margin=False):
    nn, F = torch.nn, torch.nn.functional

    class SEModule(nn.Module):
        def __init__(self, channels, bottleneck=4):
            super().__init__()
            self.se = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Conv1d(channels, bottleneck, 1), nn.ReLU(),
                                    nn.Conv1d(bottleneck, channels, 1), nn.Sigmoid())

        def forward(self, x):
            return x * self.se(x)

    class Bottle2neck(nn.Module):
        def __init__(self, C, scale=2, dilation=2):
            super().__init__()
            self.width = C // scale
            self.convs = nn.ModuleList([nn.Conv1d(self.width, self.width, 3, dilation=dilation, padding=dilation)
                                        for _ in range(scale - 1)])
            self.bns = nn.ModuleList([nn.BatchNorm1d(self.width) for _ in range(scale - 1)])
            self.nums = scale - 1
            self.se = SEModule(C)

        def forward(self, x):
            spx = torch.split(x, self.width, 1)
            for i in range(self.nums):
                if i == 0:
                    sp = spx[i]
                else:
                    sp = sp + spx[i]
                sp = self.bns[i](F.relu(self.convs[i](sp)))
                if i == 0:
                    out = sp
                else:
                    out = torch.cat((out, sp), 1)
            out = torch.cat((out, spx[self.nums]), 1)
            return self.se(out) + x

    class SpeakerEncoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(feat, C, 5, stride=1, padding=2)
            self.bn1 = nn.BatchNorm1d(C)
            self.layer1 = Bottle2neck(C)
            self.attention = nn.Sequential(nn.Conv1d(3 * C, 4, 1), nn.ReLU(), nn.BatchNorm1d(4), nn.Tanh(),
                                           nn.Conv1d(4, C, 1), nn.Softmax(dim=2))
            self.bn5 = nn.BatchNorm1d(4 * C)
            self.fc6 = nn.Linear(4 * C, emb)

        def forward(self, x, lengths):
            x = self.layer1(self.bn1(F.relu(self.conv1(x))))
            t = x.size()[-1]
            mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).to(x.dtype)
            n = mask.sum(dim=2)
            mean = (x * mask).sum(dim=2) / n
            std = torch.sqrt(((((x - mean.unsqueeze(2)) ** 2) * mask).sum(dim=2) / (n - 1)).clamp(min=1e-4))
            global_x = torch.cat((x, mean.unsqueeze(2).repeat(1, 1, t), std.unsqueeze(2).repeat(1, 1, t)), dim=1)
            w = self.attention(global_x).masked_fill(mask == 0, 0.0)
            w = w / w.sum(dim=2, keepdim=True)
            mu = torch.sum(x * w, dim=2)
            sg = torch.sqrt((torch.sum((x**2) * w, dim=2) - mu**2).clamp(min=1e-4))
            return self.fc6(self.bn5(torch.cat((mu, sg, mean, std), 1)))

    class AAMsoftmax(nn.Module):
        def __init__(self, n_class, m, s):
            super().__init__()
            self.m, self.s = m, s
            self.weight = torch.nn.Parameter(torch.FloatTensor(n_class, emb), requires_grad=True)
            self.ce = nn.CrossEntropyLoss()
            nn.init.xavier_normal_(self.weight, gain=1)
            self.cos_m, self.sin_m = math.cos(self.m), math.sin(self.m)
            self.th = math.cos(math.pi - self.m)
            self.mm = math.sin(math.pi - self.m) * self.m

        def forward(self, x, label):
            cosine = F.linear(F.normalize(x), F.normalize(self.weight))
            sine = torch.sqrt((1.0 - torch.mul(cosine, cosine)).clamp(0, 1))
            phi = cosine * self.cos_m - sine * self.sin_m
            if easy_margin:
                phi = torch.where(cosine > 0, phi, cosine)
            else:
                phi = torch.where((cosine - self.th) > 0, phi, cosine - self.mm)
            one_hot = torch.zeros_like(cosine)
            one_hot.scatter_(1, label.view(-1, 1), 1)
            output = ((one_hot * phi) + ((1.0 - one_hot) * cosine)) * self.s
            loss = self.ce(output, label)
            theta = torch.acos(cosine.clamp(-1 + 1e-7, 1 - 1e-7))
            target = torch.cos(theta + self.m)
            hot = F.one_hot(label, n_spk).float()
            logits = self.s * (hot * target + (1 - hot) * cosine)
            loss = loss + 0.5 * F.cross_entropy(logits, label, label_smoothing=0.1)
            precision = (output.detach().argmax(dim=1) == label).float().mean() * 100
            return loss, precision

    encoder, head = SpeakerEncoder(), AAMsoftmax(n_spk, margin, scale)
    both = nn.ModuleDict({"encoder": encoder, "head": head})
    record = {"init": initial_state(torch, both, init), "loss": [], "precision": [], "grads": []}
    optimizer = torch.optim.Adam(both.parameters(), lr=1e-2, weight_decay=2e-5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.97)
    for x, lengths, labels in batches:
        x, lengths, labels = torch.from_numpy(x), torch.from_numpy(lengths), torch.from_numpy(labels)
        both.train()
        optimizer.zero_grad()
        loss, precision = head(encoder(x, lengths), labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        record["loss"].append(loss.item())
        record["precision"].append(precision.item())
        record["grads"].append(gradients(both))
    both.eval()
    with torch.no_grad():
        x, lengths, _ = batches[0]
        embeddings = encoder(torch.from_numpy(x), torch.from_numpy(lengths))
        enrolment, test = F.normalize(embeddings[:3], p=2, dim=1), F.normalize(embeddings[3:6], p=2, dim=1)
        record["scores"] = numpy_of(torch.matmul(enrolment, test.T))
        record["cosine"] = numpy_of(F.cosine_similarity(embeddings[:3], embeddings[3:6]))
        record["all pairs"] = numpy_of(F.cosine_similarity(embeddings.unsqueeze(1), embeddings.unsqueeze(0), dim=-1))
        record["distances"] = numpy_of(torch.cdist(enrolment, test))
    record["final"] = {k: numpy_of(v) for k, v in both.state_dict().items()}
    return record


def speaker_batches(rng, steps=4, B=6, feat=6, T=10):
    return [(rng.standard_normal((B, feat, T)).astype(np.float32), rng.integers(5, T + 1, B).astype(np.int64),
             rng.integers(0, 3, B).astype(np.int64)) for _ in range(steps)]


@pytest.mark.parametrize("easy_margin", [False, True])
def test_ecapa_speaker_embedding_with_masked_statistics_pooling_and_aam_softmax_trains_like_torch(easy_margin):
    ours, theirs = run_both_loose_final(ecapa, speaker_batches(np.random.default_rng(0)), easy_margin=easy_margin)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Conv-TasNet, as its reference implementations write it: a learned 1-D encoder (Conv1d with stride L/2, ReLU),
# channel-wise and global layer norms written out, a temporal convolutional network of dilated depthwise blocks with
# PReLU, masks by a softmax over sources; the decoder two ways summed, F.conv_transpose1d of the masked weights and a
# learned basis overlap-added by F.fold over a height of one; SI-SNR with the DC removed; permutation-invariant training
# by a loop over itertools.permutations with torch.stack, min over permutations and gather of the best order, or by
# asteroid's pairwise loss matrix, one-hot permutation matrices by scatter_ and einsum, and index_select.

def conv_tasnet(torch, init, batches, N=8, L=4, B=6, H=8, n_src=2, pit="loop"):
    nn, F = torch.nn, torch.nn.functional
    EPS = 1e-8

    class ChannelwiseLayerNorm(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.gamma = nn.Parameter(torch.Tensor(1, channels, 1))
            self.beta = nn.Parameter(torch.Tensor(1, channels, 1))
            self.gamma.data.fill_(1)
            self.beta.data.zero_()

        def forward(self, y):
            mean = torch.mean(y, dim=1, keepdim=True)
            var = torch.var(y, dim=1, keepdim=True, unbiased=False)
            return self.gamma * (y - mean) / torch.pow(var + EPS, 0.5) + self.beta

    class GlobalLayerNorm(ChannelwiseLayerNorm):
        def forward(self, y):
            mean = y.mean(dim=1, keepdim=True).mean(dim=2, keepdim=True)
            var = (torch.pow(y - mean, 2)).mean(dim=1, keepdim=True).mean(dim=2, keepdim=True)
            return self.gamma * (y - mean) / torch.pow(var + EPS, 0.5) + self.beta

    class TemporalBlock(nn.Module):
        def __init__(self, dilation):
            super().__init__()
            self.conv1x1 = nn.Conv1d(B, H, 1, bias=False)
            self.prelu1, self.norm1 = nn.PReLU(), GlobalLayerNorm(H)
            self.dconv = nn.Conv1d(H, H, 3, stride=1, padding=dilation, dilation=dilation, groups=H, bias=False)
            self.prelu2, self.norm2 = nn.PReLU(), GlobalLayerNorm(H)
            self.pconv = nn.Conv1d(H, B, 1, bias=False)

        def forward(self, x):
            y = self.norm1(self.prelu1(self.conv1x1(x)))
            y = self.norm2(self.prelu2(self.dconv(y)))
            return x + self.pconv(y)

    class ConvTasNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Conv1d(1, N, kernel_size=L, stride=L // 2, bias=False)
            self.layer_norm = ChannelwiseLayerNorm(N)
            self.bottleneck = nn.Conv1d(N, B, 1)
            self.tcn = nn.Sequential(*[TemporalBlock(2**i) for i in range(2)])
            self.mask_conv = nn.Conv1d(B, n_src * N, 1, bias=False)
            self.basis = nn.Linear(N, L, bias=False)
            self.decoder = nn.ConvTranspose1d(N, 1, kernel_size=L, stride=L // 2, bias=False)

        def forward(self, mixture):
            M, T = mixture.size()
            mixture_w = F.relu(self.encoder(mixture.unsqueeze(1)))  # [M, N, K]
            K = mixture_w.size(-1)
            score = self.mask_conv(self.tcn(self.bottleneck(self.layer_norm(mixture_w)))).view(M, n_src, N, K)
            source_w = torch.unsqueeze(mixture_w, 1) * F.softmax(score, dim=1)  # [M, C, N, K]
            by_transpose = F.conv_transpose1d(source_w.reshape(M * n_src, N, K), self.decoder.weight, stride=L // 2)
            frames = self.basis(source_w.transpose(2, 3)).reshape(M * n_src, K, L).transpose(1, 2)  # [M*C, L, K]
            by_fold = F.fold(frames, output_size=(1, (K - 1) * (L // 2) + L), kernel_size=(1, L), stride=(1, L // 2))
            estimate = by_transpose.view(M, n_src, -1) + by_fold.view(M, n_src, -1)
            return F.pad(estimate, (0, T - estimate.size(-1)))

    def si_snr(estimate, source):
        estimate = estimate - torch.mean(estimate, dim=-1, keepdim=True)
        source = source - torch.mean(source, dim=-1, keepdim=True)
        dot = torch.sum(estimate * source, dim=-1, keepdim=True)
        projection = dot * source / (torch.sum(source**2, dim=-1, keepdim=True) + EPS)
        noise = estimate - projection
        ratio = torch.sum(projection**2, dim=-1) / (torch.sum(noise**2, dim=-1) + EPS)
        return 10 * torch.log10(ratio + EPS)

    def pit_loss(estimate, sources):
        if pit == "loop":
            perms = list(itertools.permutations(range(n_src)))
            losses = torch.stack([-si_snr(estimate[:, list(p)], sources).mean(dim=-1) for p in perms], dim=1)
            min_loss, best = torch.min(losses, dim=1)
            order = torch.tensor(perms)[best].unsqueeze(-1).expand(-1, -1, estimate.size(-1))
            return min_loss.mean(), torch.gather(estimate, 1, order), best
        pairwise = -si_snr(estimate.unsqueeze(1), sources.unsqueeze(2))  # [batch, source, estimate]
        perms = pairwise.new_tensor(list(itertools.permutations(range(n_src))), dtype=torch.long)
        perms_one_hot = pairwise.new_zeros((*perms.size(), n_src)).scatter_(2, torch.unsqueeze(perms, 2), 1)
        loss_set = torch.einsum("bij,pij->bp", [pairwise, perms_one_hot])
        loss_set /= n_src
        min_loss, best = torch.min(loss_set, dim=1)
        batch_indices = torch.stack([perms[m] for m in best], dim=0)
        reordered = torch.stack([torch.index_select(s, 0, b) for s, b in zip(estimate, batch_indices)])
        return min_loss.mean(), reordered, best

    model = ConvTasNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "best": [], "reordered": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for mixture, sources in batches:
        mixture, sources = torch.from_numpy(mixture), torch.from_numpy(sources)
        optimizer.zero_grad()
        loss, reordered, best = pit_loss(model(mixture), sources)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5)
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
        record["best"].append(best.tolist())
        record["reordered"].append(numpy_of(reordered.detach()))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def separation_batches(rng, steps=3, batch=3, T=34):
    out = []
    for _ in range(steps):
        t = np.arange(T)
        sources = np.stack([np.stack([np.sin(t * rng.uniform(0.1, 0.5) + rng.uniform(0, 3)),
                                      np.sign(np.sin(t * rng.uniform(0.05, 0.2)))]) for _ in range(batch)])
        sources = sources[:, ::-1] if rng.random() < 0.5 else sources
        out.append((sources.sum(1).astype(np.float32), np.ascontiguousarray(sources, dtype=np.float32)))
    return out


@pytest.mark.parametrize("pit", ["loop", "einsum"])
def test_conv_tasnet_with_si_snr_and_permutation_invariant_training_trains_like_torch(pit):
    ours, theirs = run_both(conv_tasnet, separation_batches(np.random.default_rng(0)), pit=pit)
    assert {tuple(b) for b in theirs["best"]} != {(0, 0, 0)}  # both orders are chosen
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# WaveNet, as its popular PyTorch ports write it: mu-law companding by sign / log1p / abs and back by exp, an embedding
# of the 16 quantised levels, causal dilated convolutions (a Conv1d subclass padding on the left by F.pad), gated
# activations of chunk()'s halves, residual and skip 1x1 convolutions, a 16-way F.cross_entropy over (N, C, T) logits
# and its nll_loss / log_softmax twin; greedy sample-by-sample generation with torch.cat, the generated codes decoded,
# and a Categorical's entropy of the last logits.

def wavenet(torch, init, batches, Q=16, R=8, S=8, dilations=(1, 2, 4, 1, 2)):
    nn, F = torch.nn, torch.nn.functional

    def mu_law_encoding(x, quantization_channels=Q):
        mu = torch.tensor(quantization_channels - 1, dtype=x.dtype)
        x_mu = torch.sign(x) * torch.log1p(mu * torch.abs(x)) / torch.log1p(mu)
        return ((x_mu + 1) / 2 * mu + 0.5).to(torch.int64)

    def mu_law_decoding(x_mu, quantization_channels=Q):
        mu = torch.tensor(quantization_channels - 1, dtype=torch.float32)
        x = (x_mu.float() / mu) * 2 - 1.0
        return torch.sign(x) * (torch.exp(torch.abs(x) * torch.log1p(mu)) - 1.0) / mu

    class CausalConv1d(nn.Conv1d):
        def __init__(self, in_channels, out_channels, kernel_size, dilation=1):
            super().__init__(in_channels, out_channels, kernel_size, dilation=dilation, padding=0)
            self.left_padding = (kernel_size - 1) * dilation

        def forward(self, x):
            return super().forward(F.pad(x, (self.left_padding, 0)))

    class ResidualBlock(nn.Module):
        def __init__(self, dilation):
            super().__init__()
            self.dilated = CausalConv1d(R, 2 * R, 2, dilation=dilation)
            self.residual = nn.Conv1d(R, R, 1)
            self.skip = nn.Conv1d(R, S, 1)

        def forward(self, x):
            filter_, gate = self.dilated(x).chunk(2, dim=1)
            z = torch.tanh(filter_) * torch.sigmoid(gate)
            return (x + self.residual(z)) * math.sqrt(0.5), self.skip(z)

    class WaveNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(Q, R)
            self.causal = CausalConv1d(R, R, 2)
            self.blocks = nn.ModuleList([ResidualBlock(d) for d in dilations])
            self.post = nn.Sequential(nn.ReLU(), nn.Conv1d(S, S, 1), nn.ReLU(), nn.Conv1d(S, Q, 1))

        def forward(self, codes):
            x = self.causal(self.embed(codes).transpose(1, 2))
            skips = 0
            for block in self.blocks:
                x, skip = block(x)
                skips = skips + skip
            return self.post(skips)

    model = WaveNet()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": [], "codes": []}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for wave in batches:
        codes = mu_law_encoding(torch.from_numpy(wave))
        record["codes"].append(codes.tolist())
        logits = model(codes[:, :-1])
        loss = F.cross_entropy(logits, codes[:, 1:])
        twin = F.nll_loss(F.log_softmax(logits, dim=1), codes[:, 1:], reduction="sum") / codes[:, 1:].numel()
        optimizer.zero_grad()
        (0.5 * loss + 0.5 * twin).backward()
        optimizer.step()
        record["loss"].append([loss.item(), twin.item()])
        record["grads"].append(gradients(model))
    model.eval()
    with torch.no_grad():
        generated = torch.full((1, 1), Q // 2, dtype=torch.long)
        for _ in range(12):
            logits = model(generated)[:, :, -1]
            generated = torch.cat([generated, logits.argmax(dim=1, keepdim=True)], dim=1)
        record["generated"] = generated.tolist()
        record["decoded"] = numpy_of(mu_law_decoding(generated))
        record["entropy"] = numpy_of(torch.distributions.Categorical(logits=logits).entropy())
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def sine_batches(rng, steps=4, batch=2, T=24):
    t = np.arange(T)
    return [(0.8 * np.sin(t * rng.uniform(0.2, 0.6, (batch, 1)) + rng.uniform(0, 3, (batch, 1)))).astype(np.float32)
            for _ in range(steps)]


def test_wavenet_with_mu_law_causal_dilated_convolutions_trains_and_generates_like_torch():
    ours, theirs = run_both(wavenet, sine_batches(np.random.default_rng(0)))
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Speech enhancement with complex parameters, as complex-mask models write it: a complex64 weight and bias applied to
# the noisy STFT by einsum, real and imaginary parts concatenated into a GRU, a complex ratio mask by torch.complex of
# tanh'd halves and its polar twin (abs, atan2, torch.polar), the masked STFT inverted by istft; a loss of the complex
# error's squared magnitude, an l1_loss on waveforms and an mse_loss on view_as_real; each optimizer on the complex
# parameters (torch steps them as their real views).

def complex_mask_enhancer(torch, init, batches, n_fft=16, hop=4, optimizer_name="Adam"):
    nn, F = torch.nn, torch.nn.functional

    class ComplexMask(nn.Module):
        def __init__(self, bins=n_fft // 2 + 1):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(bins, bins, dtype=torch.cfloat) * 0.1)
            self.bias = nn.Parameter(torch.zeros(bins, dtype=torch.cfloat))
            self.gru = nn.GRU(2 * bins, 8, batch_first=True)
            self.out = nn.Linear(8, 2 * bins)

        def forward(self, spec):  # (B, F, T), complex
            z = torch.einsum("gf,bft->bgt", self.weight, spec) + self.bias[None, :, None]
            hidden, _ = self.gru(torch.cat([z.real, z.imag], dim=1).transpose(1, 2))
            mask_real, mask_imag = self.out(hidden).transpose(1, 2).chunk(2, dim=1)
            mask = torch.complex(torch.tanh(mask_real), torch.tanh(mask_imag))
            polar_mask = torch.polar(torch.tanh(torch.abs(mask)), torch.atan2(mask_imag, mask_real))
            return spec * mask, spec * polar_mask

    model = ComplexMask()
    record = {"init": initial_state(torch, model, init), "loss": [], "grads": []}
    options = {"Adam": {"lr": 1e-2}, "AdamW": {"lr": 1e-2}, "SGD": {"lr": 1e-2, "momentum": 0.9},
               "RMSprop": {"lr": 1e-3}}
    optimizer = getattr(torch.optim, optimizer_name)(model.parameters(), **options[optimizer_name])
    window = torch.hann_window(n_fft)
    for noisy, clean in batches:
        noisy, clean = torch.from_numpy(noisy), torch.from_numpy(clean)
        spec = torch.stft(noisy, n_fft, hop, window=window, return_complex=True)
        target = torch.stft(clean, n_fft, hop, window=window, return_complex=True)
        masked, polar_masked = model(spec)
        wave = torch.istft(masked, n_fft, hop, window=window, length=noisy.shape[-1])
        loss = ((masked - target).abs().pow(2).mean() + F.l1_loss(wave, clean)
                + F.mse_loss(torch.view_as_real(polar_masked), torch.view_as_real(target)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(model))
    record["final"] = {k: numpy_of(v) for k, v in model.state_dict().items()}
    return record


def noisy_batches(rng, steps=3, batch=2, T=40):
    out = []
    for _ in range(steps):
        clean = np.sin(np.arange(T) * rng.uniform(0.2, 0.5, (batch, 1))).astype(np.float32)
        out.append(((clean + 0.3 * rng.standard_normal((batch, T))).astype(np.float32), clean))
    return out


@pytest.mark.parametrize("optimizer_name", ["Adam", "AdamW", "SGD", "RMSprop"])
def test_complex_mask_enhancer_with_complex_parameters_trains_like_torch(optimizer_name):
    ours, theirs = run_both(complex_mask_enhancer, noisy_batches(np.random.default_rng(0)),
                            optimizer_name=optimizer_name)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# Signal processing as torchaudio.functional writes it in Python: pre-emphasis by in-place slice arithmetic,
# de-emphasis by lfilter's sample loop over unfold()'s windows, FFT convolution by rfft / irfft against the direct
# conv1d, roll, the phase vocoder (arange with a fractional step, index_select of a padded complex STFT, angle, round,
# cumsum, polar), the resampler's windowed-sinc kernels in float64 and its strided conv1d; a learnable STFT window's
# gradient through stft and istft; an STFT of a non-contiguous float64 signal.

def signal_processing(torch, wave):
    F = torch.nn.functional
    record = {}
    x = torch.from_numpy(wave).requires_grad_()
    emphasised = x.clone()
    emphasised[..., 1:] -= 0.97 * x[..., :-1]
    record["pre-emphasis"] = numpy_of(emphasised.detach())

    a_coeffs, b_coeffs = torch.tensor([1.0, -0.97]), torch.tensor([1.0, 0.0])
    n_order = a_coeffs.size(0)
    windows = F.pad(emphasised, [n_order - 1, 0]).unfold(-1, n_order, 1)
    fir = (windows * torch.flip(b_coeffs, [0])).sum(-1)
    a_flipped = torch.flip(a_coeffs, [0])
    previous, samples = [torch.zeros(x.shape[0]) for _ in range(n_order - 1)], []
    for i in range(x.shape[-1]):
        sample = fir[:, i] - sum(a_flipped[j] * previous[j] for j in range(n_order - 1))
        samples.append(sample)
        previous = [*previous[1:], sample]
    de_emphasised = torch.stack(samples, dim=-1)
    record["de-emphasis"] = numpy_of(de_emphasised.detach())

    kernel = torch.hann_window(7, periodic=False)
    n = x.shape[-1] + kernel.shape[-1] - 1
    by_fft = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(kernel, n=n), n=n)
    direct = F.conv1d(F.pad(x.unsqueeze(1), (6, 6)), kernel.flip(0).view(1, 1, -1)).squeeze(1)
    record["fft convolution"], record["direct"] = numpy_of(by_fft.detach()), numpy_of(direct.detach())
    record["rolled"] = [numpy_of(torch.roll(x, shifts=3, dims=-1).detach()),
                        numpy_of(torch.roll(x, shifts=(1, -2), dims=(0, 1)).detach())]

    spec = torch.stft(x, 16, 4, window=torch.hann_window(16), return_complex=True)
    rate = 1.3
    phase_advance = torch.linspace(0, math.pi * 4, spec.size(-2))[..., None]
    time_steps = torch.arange(0, spec.size(-1), rate, device=spec.device, dtype=phase_advance.dtype)
    alphas = time_steps % 1.0
    phase_0 = spec[..., :1].angle()
    spec = F.pad(spec, [0, 2])
    spec_0 = spec.index_select(-1, time_steps.long())
    spec_1 = spec.index_select(-1, (time_steps + 1).long())
    phase = spec_1.angle() - spec_0.angle() - phase_advance
    phase = phase - 2 * math.pi * torch.round(phase / (2 * math.pi))
    phase = torch.cat([phase_0, (phase + phase_advance)[..., :-1]], dim=-1)
    phase_acc = torch.cumsum(phase, -1)
    mag = alphas * spec_1.abs() + (1 - alphas) * spec_0.abs()
    stretched = torch.polar(mag, phase_acc)
    record["time steps"], record["stretched"] = numpy_of(time_steps), numpy_of(stretched.abs().detach())
    record["stretched, real"] = numpy_of(stretched.real.detach())
    loss = de_emphasised.pow(2).mean() + by_fft.abs().mean() + mag.mean() + stretched.real.pow(2).mean()
    (grad,) = torch.autograd.grad(loss, x)
    record["grad"] = numpy_of(grad)

    # torchaudio's _get_sinc_resample_kernel and _apply_sinc_resample_kernel, 5 -> 3
    orig, new, lowpass_filter_width, rolloff = 5, 3, 6, 0.99
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx
    t *= base_freq
    t = t.clamp_(-lowpass_filter_width, lowpass_filter_width)
    window = torch.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernels *= window * (base_freq / orig)
    kernels = kernels.to(dtype=torch.float32)
    resampled = F.conv1d(F.pad(x, (width, width + orig))[:, None], kernels, stride=orig)
    resampled = resampled.transpose(1, 2).reshape(x.shape[0], -1)
    resampled = resampled[..., : torch.ceil(torch.as_tensor(new * x.shape[-1] / orig)).long()]
    (grad,) = torch.autograd.grad(resampled.pow(2).sum(), x)
    record["kernels"], record["resampled"] = numpy_of(kernels), numpy_of(resampled.detach())
    record["resampled grad"] = numpy_of(grad)

    window = torch.hann_window(16).requires_grad_()
    spec = torch.stft(x.detach(), 16, 4, window=window, return_complex=True)
    back = torch.istft(spec, 16, 4, window=window, length=x.shape[-1])
    (grad,) = torch.autograd.grad(spec.abs().sum() + back.pow(3).sum(), window)
    record["window grad"] = numpy_of(grad)

    strided = torch.from_numpy(np.ascontiguousarray(wave.T)).double().t().requires_grad_()
    spec = torch.stft(strided, 16, 4, window=torch.hann_window(16, dtype=torch.float64), return_complex=True)
    assert spec.dtype == torch.complex128
    (grad,) = torch.autograd.grad(spec.abs().sum(), strided)
    record["non-contiguous"], record["non-contiguous grad"] = numpy_of(spec.detach()), numpy_of(grad)
    return record


def test_emphasis_iir_filter_fft_convolution_phase_vocoder_and_resampling_match_torch():
    wave = np.random.default_rng(0).standard_normal((2, 40)).astype(np.float32)
    assert_same(signal_processing(tilewise, wave), signal_processing(real_torch, wave))


# ----------------------------------------------------------------------------------------------------------------------
# A MelGAN discriminator block, as its repository writes it: spectral-normed Conv1d layers (nn.utils.spectral_norm's
# hooks, or nn.utils.parametrizations.spectral_norm), ReflectionPad1d, in-place LeakyReLU, grouped strided
# convolutions, a hinge loss, Adam with betas (0.5, 0.9), AvgPool1d without the padding counted; the power iteration's
# vectors are in the state both runs start from, so its steps are compared too; eval mode and a deepcopy at the end.

def melgan_discriminator(torch, init, batches, form="hooks"):
    nn, F = torch.nn, torch.nn.functional
    spectral_norm = nn.utils.spectral_norm if form == "hooks" else nn.utils.parametrizations.spectral_norm

    class NLayerDiscriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.ModuleList([
                nn.Sequential(nn.ReflectionPad1d(3), spectral_norm(nn.Conv1d(1, 4, 7)), nn.LeakyReLU(0.2, True)),
                nn.Sequential(spectral_norm(nn.Conv1d(4, 8, 5, stride=2, padding=2, groups=2)),
                              nn.LeakyReLU(0.2, True)),
                spectral_norm(nn.Conv1d(8, 1, 3, padding=1)),
            ])

        def forward(self, x):
            results = []
            for layer in self.model:
                x = layer(x)
                results.append(x)
            return results

    discriminator = NLayerDiscriminator()
    downsample = nn.AvgPool1d(4, stride=2, padding=1, count_include_pad=False)
    record = {"init": initial_state(torch, discriminator, init), "loss": [], "grads": [], "downsampled": []}
    optimizer = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.9))
    for real, fake in batches:
        real, fake = torch.from_numpy(real), torch.from_numpy(fake)
        loss = F.relu(1 - discriminator(real)[-1]).mean() + F.relu(1 + discriminator(fake)[-1]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        record["loss"].append(loss.item())
        record["grads"].append(gradients(discriminator))
        record["downsampled"].append(numpy_of(downsample(real)))
    discriminator.eval()
    with torch.no_grad():
        record["eval"] = numpy_of(discriminator(torch.from_numpy(batches[0][0]))[-1])
        record["copy"] = numpy_of(copy.deepcopy(discriminator)(torch.from_numpy(batches[0][0]))[-1])
    record["final"] = {k: numpy_of(v) for k, v in discriminator.state_dict().items()}
    return record


def waveform_pairs(rng, steps=3, batch=2, T=32):
    return [(rng.standard_normal((batch, 1, T)).astype(np.float32),
             rng.standard_normal((batch, 1, T)).astype(np.float32)) for _ in range(steps)]


@pytest.mark.parametrize("form", ["hooks", "parametrizations"])
def test_melgan_discriminator_with_spectral_norm_trains_like_torch(form):
    ours, theirs = run_both(melgan_discriminator, waveform_pairs(np.random.default_rng(0)), form=form)
    assert_same(ours, theirs)


# ----------------------------------------------------------------------------------------------------------------------
# The failures the programs met, each reduced.

def grad_through_a_freed_graph(torch):
    # HiFi-GAN-style: the generator's graph is freed by backward, then a loss's gradient is asked of its output alone
    F = torch.nn.functional
    w = torch.ones(3, requires_grad=True)
    y_g_hat = (w * 2).exp()
    y_g_hat.sum().backward()
    losses = {
        "a product": (y_g_hat * 3).sum(),
        "a view": y_g_hat.unsqueeze(0).squeeze(0).sum(),
        "reflect padding": F.pad(y_g_hat.view(1, 1, 3), (1, 1), mode="reflect").sum(),
        "an stft": torch.stft(torch.cat([y_g_hat] * 4), 4, 1, window=torch.hann_window(4),
                              return_complex=True).abs().sum(),
    }
    return {name: numpy_of(torch.autograd.grad(loss, y_g_hat)[0]) for name, loss in losses.items()}


def test_grad_of_a_non_leaf_does_not_run_the_freed_graph_behind_it():
    assert_same(*(grad_through_a_freed_graph(torch) for torch in (tilewise, real_torch)))


def hooks_seen_by_grad_of_a_non_leaf(torch):
    w = torch.ones(3, requires_grad=True)
    h = (w * 2).exp()
    out = (h * 3).sum()
    calls = []
    h.grad_fn.register_prehook(lambda grad_outputs: calls.append("node pre-hook"))
    h.grad_fn.register_hook(lambda grad_inputs, grad_outputs: calls.append("node hook"))
    h.register_hook(lambda grad: calls.append("tensor hook"))
    (grad,) = torch.autograd.grad(out, h, retain_graph=True)
    seen = [list(calls)]
    grads = torch.autograd.grad(out, [h, w])  # w lies behind h: now h's node runs
    seen.append(calls[len(seen[0]):])
    return seen, [numpy_of(grad), [numpy_of(g) for g in grads]]


def test_grad_of_a_non_leaf_runs_its_tensor_hooks_but_not_its_nodes_hooks_as_torch():
    (our_calls, ours), (their_calls, theirs) = (hooks_seen_by_grad_of_a_non_leaf(t) for t in (tilewise, real_torch))
    assert our_calls == their_calls == [["tensor hook"], ["tensor hook", "node pre-hook", "node hook"]]
    assert_same(ours, theirs)


def aligned_stft(torch, signal, n_fft=16, hop=4, win_length=9):
    x = torch.from_numpy(signal).requires_grad_()
    spec = torch.stft(x, n_fft, hop, win_length=win_length, window=torch.hann_window(win_length), center=False,
                      align_to_window=True, return_complex=True)
    (grad,) = torch.autograd.grad(spec.abs().sum(), x)
    full = x.stft(n_fft, hop, window=torch.hann_window(n_fft), center=False, align_to_window=False,
                  return_complex=True)
    return [numpy_of(spec.detach()), numpy_of(grad), numpy_of(full.detach())]


def test_stft_takes_align_to_window_as_torch():
    signal = np.random.default_rng(0).standard_normal((2, 40)).astype(np.float32)
    ours, theirs = (aligned_stft(t, signal) for t in (tilewise, real_torch))
    assert theirs[0].shape == (2, 9, 8)  # one frame more than without alignment
    assert_same(ours, theirs)
    for torch in LIBRARIES:
        with pytest.raises(RuntimeError, match="stft align_to_window should only be set when center = false"):
            torch.stft(torch.ones(40), 16, 4, window=torch.hann_window(16), align_to_window=False,
                       return_complex=True)


WINDOW_ARGUMENTS = {
    "bartlett": {}, "blackman": {}, "cosine": {}, "exponential": {"tau": 3.0}, "gaussian": {"std": 2.5},
    "general_cosine": {"a": [0.5, 0.3, 0.2]}, "general_hamming": {"alpha": 0.6}, "hamming": {}, "hann": {},
    "kaiser": {"beta": 5.0}, "nuttall": {},
}


@pytest.mark.parametrize("name", WINDOW_ARGUMENTS)
def test_signal_windows_match_torch(name):
    for M, sym, dtype in itertools.product((0, 1, 2, 5, 8), (True, False), ("float32", "float64")):
        made = [getattr(t.signal.windows, name)(M, sym=sym, dtype=getattr(t, dtype), **WINDOW_ARGUMENTS[name])
                for t in LIBRARIES]
        assert str(made[0].dtype)[len("torch."):] == str(made[1].dtype)[len("tilewise."):] == dtype
        np.testing.assert_allclose(numpy_of(made[1]), numpy_of(made[0]), rtol=1e-6, atol=1e-7, err_msg=f"{M} {sym}")
    made = [getattr(t.signal.windows, name)(6, requires_grad=True, **WINDOW_ARGUMENTS[name]) for t in LIBRARIES]
    assert [w.requires_grad for w in made] == [True, True] and made[1].dtype is tilewise.float32


WINDOW_REFUSALS = {
    "a non-positive std": (lambda t: t.signal.windows.gaussian(5, std=0), ValueError,
                           "Standard deviation must be positive, got: 0 instead."),
    "a symmetric window's center": (lambda t: t.signal.windows.exponential(5, center=1.0), ValueError,
                                    "Center must be None for symmetric windows"),
    "a negative length": (lambda t: t.signal.windows.kaiser(-1), ValueError,
                          "kaiser requires non-negative window length, got M=-1"),
    "a negative beta": (lambda t: t.signal.windows.kaiser(4, beta=-1.0), ValueError,
                        "beta must be non-negative, got: -1.0 instead."),
    "no coefficients": (lambda t: t.signal.windows.general_cosine(5, a=[]), ValueError,
                        "Coefficients cannot be empty"),
    "a number of coefficients": (lambda t: t.signal.windows.general_cosine(5, a=3), TypeError,
                                 "Coefficients must be a list/tuple"),
    "an integer dtype": (lambda t: t.signal.windows.hann(5, dtype=t.int64), ValueError,
                         "general_cosine expects float32 or float64 dtypes, got: "),  # torch names the helper
}


@pytest.mark.parametrize("case", WINDOW_REFUSALS)
def test_signal_windows_refuse_what_torch_refuses_in_its_words(case):
    call, error, message = WINDOW_REFUSALS[case]
    for torch in LIBRARIES:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            call(torch)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int64"])
def test_ctc_loss_refuses_the_dtypes_torchs_kernels_lack(dtype):
    name = {"float16": "Half", "bfloat16": "BFloat16", "int64": "Long"}[dtype]
    for torch in LIBRARIES:
        log_probs = torch.zeros(5, 2, 3, dtype=getattr(torch, dtype))
        with pytest.raises(NotImplementedError, match=f"\"ctc_loss_cpu\" not implemented for '{name}'"):
            torch.nn.functional.ctc_loss(log_probs, torch.tensor([[1, 2], [1, 1]]), torch.tensor([5, 5]),
                                         torch.tensor([2, 2]))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast computes it in float32
            loss = torch.nn.functional.ctc_loss(torch.zeros(5, 2, 3, dtype=torch.bfloat16),
                                                torch.tensor([[1, 2], [1, 1]]), torch.tensor([5, 5]),
                                                torch.tensor([2, 2]))
        assert loss.dtype == torch.float32


KAISER_CALLS = {
    "the defaults": lambda t: t.kaiser_window(8),
    "periodic": lambda t: t.kaiser_window(8, False),
    "periodic and beta": lambda t: t.kaiser_window(8, False, 5.0),
    "both by keyword": lambda t: t.kaiser_window(8, periodic=False, beta=5.0),
    "beta by keyword": lambda t: t.kaiser_window(8, True, beta=5.0),
}


@pytest.mark.parametrize("case", KAISER_CALLS)
def test_kaiser_window_takes_torchs_overloads(case):
    ours, theirs = (numpy_of(KAISER_CALLS[case](t)) for t in (tilewise, real_torch))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)


def test_kaiser_window_refuses_beta_without_periodic_as_torchs_overloads():
    for torch in LIBRARIES:
        with pytest.raises(TypeError, match=r"kaiser_window\(\) received an invalid combination of arguments - got "
                                            r"\(int, beta=float\), but expected one of:"):
            torch.kaiser_window(8, beta=5.0)


BOOL_PADDING = {
    "reflect, 1-D": ("reflect", (1, 4), (1, 1), "\"reflection_pad1d\" not implemented for 'Bool'"),
    "reflect, 2-D": ("reflect", (1, 4, 4), (1, 1, 1, 1), "\"reflection_pad2d\" not implemented for 'Bool'"),
    "reflect, 3-D": ("reflect", (1, 1, 4, 4, 4), (1,) * 6, "\"reflection_pad3d\" not implemented for 'Bool'"),
    "replicate, 1-D": ("replicate", (1, 1, 4), (5, 5), "\"replication_pad1d\" not implemented for 'Bool'"),
    "replicate, 3-D": ("replicate", (1, 1, 4, 4), (1,) * 6, "\"replication_pad3d\" not implemented for 'Bool'"),
}


@pytest.mark.parametrize("case", BOOL_PADDING)
def test_reflect_and_replicate_padding_refuse_bool_as_torchs_kernels(case):
    mode, shape, pad, message = BOOL_PADDING[case]
    for torch in LIBRARIES:
        with pytest.raises(NotImplementedError, match=message):
            torch.nn.functional.pad(torch.ones(*shape, dtype=torch.bool), pad, mode=mode)
        circular = torch.nn.functional.pad(torch.ones(1, 1, 4, dtype=torch.bool), (1, 1), mode="circular")
        assert circular.dtype == torch.bool and tuple(circular.shape) == (1, 1, 6)


STFT_REFUSALS = {
    "a 3-D signal": lambda t: t.stft(t.ones(2, 2, 40), 16, return_complex=True),
    "integers, padded first": lambda t: t.stft(t.ones(40, dtype=t.int64), 16, return_complex=True),
    "bool, padded first": lambda t: t.stft(t.ones(40, dtype=t.bool), 16, return_complex=True),
    "int8 with its window": lambda t: t.stft(t.ones(40, dtype=t.int8), 16, center=False,
                                             window=t.ones(16, dtype=t.int8), return_complex=True),
    "a 2-D window": lambda t: t.stft(t.ones(40), 16, window=t.ones(2, 8), return_complex=True),
    "n_fft of 0": lambda t: t.stft(t.ones(16), 0, return_complex=True),
    "n_fft past a complex signal": lambda t: t.stft(t.ones(16, dtype=t.complex64), 32, center=False,
                                                    return_complex=True),
    "n_fft past a half signal": lambda t: t.stft(t.ones(16, dtype=t.float16), 32, center=False, return_complex=True),
    "hop_length 0 with every flag": lambda t: t.stft(t.ones(16), 8, hop_length=0, center=False, onesided=False,
                                                     normalized=True, align_to_window=True, return_complex=True),
    "a complex window of the wrong size": lambda t: t.stft(t.ones(16, dtype=t.float64), 8,
                                                           window=t.ones(5, dtype=t.complex128), return_complex=True),
    "return_complex=False": lambda t: t.stft(t.ones(16), 8, hop_length=0, return_complex=False),
    "istft with a complex window": lambda t: t.istft(t.ones(5, 3, dtype=t.complex64), 8,
                                                     window=t.ones(5, dtype=t.complex64)),
}


@pytest.mark.parametrize("case", STFT_REFUSALS)
def test_stft_refuses_in_torchs_words_naming_the_call_as_torch(case):
    seen = []
    for torch in LIBRARIES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises((RuntimeError, NotImplementedError)) as info:
                STFT_REFUSALS[case](torch)
        seen.append((info.type, str(info.value)))
    assert seen[1] == seen[0]


def test_log10_of_float32_is_exact_at_powers_of_ten_and_rounds_as_torch():
    # 10 * log10(power) in decibels: numpy's float32 log10 gives 2.0000002 for 100
    powers = [1e-3, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0, 1e4, 1e5, 1e6]
    assert tilewise.log10(tilewise.tensor(powers)).tolist() == real_torch.log10(real_torch.tensor(powers)).tolist()
    assert tilewise.log10(tilewise.tensor([10, 100, 1000])).tolist() == [1.0, 2.0, 3.0]
    x = np.random.default_rng(0).random(4096).astype(np.float32) * 1000
    ours, theirs = tilewise.log10(tilewise.from_numpy(x)).numpy(), real_torch.log10(real_torch.from_numpy(x)).numpy()
    assert (ours != theirs).mean() < 1e-3  # torch's is correctly rounded all but one time in 10^5


def unbatched_ctc(torch, targets, lengths=(12, 2)):
    log_probs = torch.from_numpy(np.log(np.full((12, 5), 0.2, np.float32))).requires_grad_()
    loss = torch.nn.functional.ctc_loss(log_probs, targets(torch), torch.tensor(lengths[0]), torch.tensor(lengths[1]))
    return [numpy_of(loss.detach()), numpy_of(torch.autograd.grad(loss, log_probs)[0])]


@pytest.mark.parametrize("targets", [lambda t: t.tensor([1, 2]), lambda t: t.tensor([[1, 2, 3]])],
                         ids=["concatenated", "padded"])
def test_unbatched_ctc_loss_takes_concatenated_or_padded_targets_as_torch(targets):
    assert_same(unbatched_ctc(tilewise, targets), unbatched_ctc(real_torch, targets))


CTC_SHAPE_REFUSALS = {
    "1-D log_probs": (lambda t: t.zeros(12), lambda t: t.tensor([1]), (12,), (1,),
                      "Expected 3-dimensional tensor, but got 2-dimensional tensor for argument #1 'log_probs'"),
    "4-D log_probs": (lambda t: t.zeros(1, 12, 2, 5), lambda t: t.tensor([[1]]), (12,), (1,),
                      "Expected 3-dimensional tensor, but got 5-dimensional tensor for argument #1 'log_probs'"),
    "3-D targets": (lambda t: t.zeros(12, 2, 5), lambda t: t.ones(2, 2, 1, dtype=t.long), (12, 9), (2, 2),
                    "Expected 1 to 2 dimensions, but got 3-dimensional tensor for argument #2 'targets'"),
    "0-D unbatched targets": (lambda t: t.zeros(12, 5), lambda t: t.tensor(1), 12, 1,
                              "Expected 1 to 2 dimensions, but got 0-dimensional tensor for argument #2 'targets'"),
    "unbatched targets of two rows": (lambda t: t.zeros(12, 5), lambda t: t.ones(2, 2, dtype=t.long), 12, 2,
                                      "Expected tensor to have size 1 at dimension 0, but got size 2 for argument "
                                      "#2 'targets'"),
    "unbatched concatenated targets too long": (lambda t: t.zeros(12, 5), lambda t: t.tensor([1, 2, 3]), 12, 2,
                                                "Expected tensor to have size 2 at dimension 0, but got size 3 for "
                                                "argument #2 'targets'"),
}


@pytest.mark.parametrize("case", CTC_SHAPE_REFUSALS)
def test_ctc_loss_refuses_misshapen_inputs_in_torchs_words(case):
    log_probs, targets, input_lengths, target_lengths, message = CTC_SHAPE_REFUSALS[case]
    message += r" \(while checking arguments for ctc_loss_allocate_outputs\)"
    for torch in LIBRARIES:
        with pytest.raises(RuntimeError, match=message):
            torch.nn.functional.ctc_loss(log_probs(torch), targets(torch), torch.tensor(input_lengths),
                                         torch.tensor(target_lengths))


RANDINT_FORMS = {
    "high, size": lambda t: t.randint(5, (3,)),
    "high, size by name": lambda t: t.randint(5, size=(3,)),
    "everything by name": lambda t: t.randint(low=1, high=5, size=(3,)),
    "high and size by name": lambda t: t.randint(high=5, size=(3,)),
    "low, then by name": lambda t: t.randint(1, high=5, size=(3,)),
    "a list size": lambda t: t.randint(1, 5, [3]),
    "a 0-dim tensor bound": lambda t: t.randint(t.tensor(5), (3,)),
    "float, requiring grad": lambda t: t.randint(5, (3,), dtype=t.float32, requires_grad=True),
}


@pytest.mark.parametrize("case", RANDINT_FORMS)
def test_randint_takes_torchs_overloads_by_position_and_name(case):
    made = [RANDINT_FORMS[case](t) for t in LIBRARIES]
    assert [tuple(m.shape) for m in made] == [(3,), (3,)]
    assert [str(m.dtype).split(".")[1] for m in made][0] == str(made[1].dtype).split(".")[1]
    assert made[0].requires_grad == made[1].requires_grad


RANDINT_REFUSALS = {
    "a number for size": (lambda t: t.randint(5, 3), TypeError,
                          "randint(): argument 'size' (position 2) must be tuple of ints, not int"),
    "a number for size by name": (lambda t: t.randint(5, size=3), TypeError,
                                  "randint(): argument 'size' must be tuple of ints, not int"),
    "three numbers": (lambda t: t.randint(2, 5, 3), TypeError,
                      "randint() received an invalid combination of arguments - got (int, int, int), but expected"),
    "a high alone": (lambda t: t.randint(5), TypeError,
                     "randint() received an invalid combination of arguments - got (int), but expected one of:"),
    "a float high": (lambda t: t.randint(5.5, (2,)), TypeError,
                     "randint(): argument 'high' (position 1) must be int, not float"),
    "a bool high": (lambda t: t.randint(True, (2,)), TypeError,
                    "randint(): argument 'high' (position 1) must be int, not bool"),
    "low by name after high": (lambda t: t.randint(5, (2,), low=1), TypeError,
                               "got (int, tuple, low=int), but expected one of:"),
    "integers requiring grad": (lambda t: t.randint(5, (2,), requires_grad=True), RuntimeError,
                                "Only Tensors of floating point and complex dtype can require gradients"),
}


@pytest.mark.parametrize("case", RANDINT_REFUSALS)
def test_randint_refuses_what_torchs_parser_refuses_in_its_words(case):
    call, error, message = RANDINT_REFUSALS[case]
    for torch in LIBRARIES:
        with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
            call(torch)


@pytest.mark.parametrize("split_size, message", [
    (0, "split_size can only be 0 if dimension size is 0, but got dimension size of 3"),
    (-1, "split expects split_size be non-negative, but got split_size=-1"),
])
def test_split_refuses_a_split_size_below_one_in_torchs_words(split_size, message):
    for torch in LIBRARIES:  # Res2Net's torch.split(x, width, 1) with a width of 0 for too few channels
        with pytest.raises(RuntimeError, match=message):
            torch.split(torch.ones(4, 3), split_size, 1)
        assert [tuple(p.shape) for p in torch.ones(4, 0).split(0, 1)] == [(4, 0)]


def test_istft_warns_of_a_missing_window_before_refusing_a_real_input_as_torch():
    # in a fresh process each: both libraries warn once per process
    code = ("import warnings, {lib} as torch\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    try:\n"
            "        torch.istft(torch.ones(9, 5), 16)\n"
            "    except RuntimeError as exc:\n"
            "        print(type(exc).__name__, str(exc))\n"
            "print([str(w.message)[:40] for w in seen])\n")
    outputs = [subprocess.run([sys.executable, "-c", code.format(lib=lib)], capture_output=True, text=True,
                              check=True).stdout for lib in ("torch", "tilewise")]
    assert "A window was not provided" in outputs[0] and outputs[1] == outputs[0]
