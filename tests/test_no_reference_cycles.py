"""Eager training steps free their tensors when the last reference goes, as torch's do: no step may leave a
reference cycle behind. A cycle holding a tensor keeps its memory until the collector runs, which on a GPU is
device memory held for no reason, collector pauses of a tenth of a second, and finalizers running inside the
allocator (see [Note: frees from finalizers])."""

from __future__ import annotations

import gc

import pytest

import tilewise as tw
from tilewise import nn


@pytest.fixture
def no_cycles():
    """Call ``check(fn)``: runs ``fn`` three times, each followed by a full collection that must find nothing."""
    gc.collect()

    def check(fn):
        for call in range(3):
            fn()
            found = gc.collect()
            assert found == 0, f"call {call} left {found} objects in reference cycles"

    return check


class TinyGPT(nn.Module):
    def __init__(self, vocab=50, width=16, block=8):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.attn = nn.MultiheadAttention(width, 2, batch_first=True)
        self.ln = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(tw.arange(idx.shape[1]))
        x = x + self.attn(x, x, x, need_weights=False, is_causal=True,
                          attn_mask=nn.Transformer.generate_square_subsequent_mask(idx.shape[1]))[0]
        return self.head(x + self.mlp(self.ln(x)))


def test_an_eager_gpt_step_with_clipping_and_adamw_leaves_no_cycle(no_cycles):
    tw.manual_seed(0)
    model = TinyGPT()
    opt = tw.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    idx = tw.randint(0, 50, (2, 8))

    def step():
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = nn.functional.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    no_cycles(step)


@pytest.mark.parametrize("memory_format", ["contiguous_format", "channels_last"])
def test_an_eager_cnn_step_with_batch_norm_and_momentum_sgd_leaves_no_cycle(no_cycles, memory_format):
    tw.manual_seed(0)
    fmt = getattr(tw, memory_format)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10)).to(memory_format=fmt)
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = tw.randn(4, 3, 16, 16).to(memory_format=fmt), tw.randint(0, 10, (4,))

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    no_cycles(step)


def test_a_compiled_function_with_a_graph_break_leaves_no_cycle_per_call(no_cycles):
    """Such a function records its operators on every call (its Python runs each time): the recording must not
    keep itself alive through the frame it watches."""
    @tw.compile
    def f(x):
        y = x.sin() * 2
        if y.sum().item() > -1e9:  # a graph break
            y = y + 1
        return y.cos()

    x = tw.randn(16)
    no_cycles(lambda: f(x))


def test_an_lstm_language_model_step_with_packed_sequences_leaves_no_cycle(no_cycles):
    tw.manual_seed(0)
    emb, lstm, head = nn.Embedding(30, 8), nn.LSTM(8, 16, num_layers=2, batch_first=True), nn.Linear(16, 30)
    params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
    opt = tw.optim.Adam(params, lr=1e-3)
    tokens, lengths = tw.randint(0, 30, (3, 7)), tw.tensor([7, 5, 2])

    def step():
        packed = nn.utils.rnn.pack_padded_sequence(emb(tokens), lengths, batch_first=True)
        out, _ = lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        loss = head(padded).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()

    no_cycles(step)


def test_a_transformer_encoder_step_with_a_padding_mask_and_a_scheduler_leaves_no_cycle(no_cycles):
    tw.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = tw.optim.AdamW(encoder.parameters(), lr=1e-3)
    sched = tw.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=10)
    x = tw.randn(2, 5, 16)
    pad = tw.tensor([[False] * 5, [False, False, False, True, True]])

    def step():
        loss = encoder(x, src_key_padding_mask=pad).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()

    no_cycles(step)


def test_mixed_precision_with_a_grad_scaler_and_checkpointing_leaves_no_cycle(no_cycles):
    from tilewise.utils.checkpoint import checkpoint

    tw.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
    opt = tw.optim.SGD(block.parameters(), lr=0.1, momentum=0.9)
    scaler = tw.amp.GradScaler("cpu")
    x = tw.randn(4, 8, requires_grad=True)

    def step():
        with tw.autocast("cpu", dtype=tw.bfloat16):
            loss = checkpoint(block, x, use_reentrant=False).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    no_cycles(step)


def test_a_whole_compiled_training_step_leaves_no_cycle_per_call(no_cycles):
    tw.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = tw.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = tw.randn(6, 8), tw.randint(0, 4, (6,))

    @tw.compile
    def step(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    step(x, y)  # compiles
    no_cycles(lambda: step(x, y))


def test_iterating_a_data_loader_leaves_no_cycle(no_cycles):
    from tilewise.utils.data import DataLoader, TensorDataset

    data = TensorDataset(tw.randn(20, 3), tw.randint(0, 2, (20,)))
    loader = DataLoader(data, batch_size=6, shuffle=True, drop_last=False)
    no_cycles(lambda: [b for b in loader])
