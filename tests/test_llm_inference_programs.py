"""Inference and generation programs written the way the Llama/Mistral reference code, nanoGPT's ``sample.py`` and
HuggingFace-style model code write them, run under torch and under tilewise, and compared step by step.

Each program is a function of the framework module (``torch``, ``nn``, ``F``), so its body reads as the published code
does after ``import tilewise as torch``. The torch run is the reference: its weights are loaded into tilewise's model
from its ``state_dict``, and each ``torch.multinomial`` draw it makes is recorded with the probabilities it was drawn
from. The tilewise run must reach the same probabilities, still makes its own draw (which must have torch's shape and
dtype and lie where the probabilities are not zero), and then continues from torch's token, so logits, cache contents
and generated tokens can be compared at every step.
"""
# ruff: noqa: N806 — the programs keep the published code's names

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import pytest
import torch as real_torch
from compiled_steps import compiled_if

import tilewise

RTOL, ATOL = 2e-5, 2e-5
BF16_RTOL, BF16_ATOL = 5e-2, 5e-2


pytestmark = pytest.mark.usefixtures("torch_on_one_thread")  # (tests/conftest.py)


def as_numpy(value):
    if isinstance(value, (list, tuple)):
        return [as_numpy(v) for v in value]
    if value.dtype in (real_torch.bfloat16, tilewise.bfloat16, real_torch.float16, tilewise.float16):
        value = value.float()
    return value.detach().cpu().numpy().copy()


def dtype_name(tensor):
    return str(tensor.dtype).split(".")[-1]


class Draws:
    """torch's multinomial draws with the probabilities they were drawn from, replayed to the tilewise run."""

    def __init__(self, rtol=1e-4, atol=1e-6):
        self.records: list[tuple[np.ndarray, np.ndarray, str]] = []
        self.cursor = 0
        self.rtol, self.atol = rtol, atol

    def multinomial(self, framework):
        def multinomial(input, num_samples, replacement=False, *, generator=None):
            drawn = framework.multinomial(input, num_samples, replacement, generator=generator)
            if framework is real_torch:
                self.records.append((as_numpy(input), as_numpy(drawn), dtype_name(input)))
                return drawn
            assert self.cursor < len(self.records), "tilewise drew more often than torch"
            probs, expected, dtype = self.records[self.cursor]
            self.cursor += 1
            assert dtype_name(input) == dtype, f"draw {self.cursor}: probabilities in {input.dtype}"
            np.testing.assert_allclose(as_numpy(input), probs, rtol=self.rtol, atol=self.atol,
                                       err_msg=f"draw {self.cursor}: the probabilities differ from torch's")
            assert tuple(drawn.shape) == expected.shape and str(drawn.dtype) == "tilewise.int64"
            assert (np.take_along_axis(as_numpy(input), as_numpy(drawn), -1) > 0).all(), "drew a zero-weight token"
            return framework.tensor(expected, device=drawn.device)

        return multinomial


class Framework:
    """A framework module whose ``multinomial`` goes through the shared draw record; the rest passes through."""

    def __init__(self, module, draws: Draws):
        self._module = module
        self.multinomial = draws.multinomial(module)

    def __getattr__(self, name):
        return getattr(self._module, name)



def run_both(program, draws_tolerance=(1e-4, 1e-6), **kwargs):
    """Runs ``program(torch, init=None)`` and then ``program(tilewise, init=torch's state_dict)``; returns both
    results (dicts of name -> array or list of arrays)."""
    real_torch.manual_seed(0)
    draws = Draws(*draws_tolerance)
    theirs = program(Framework(real_torch, draws), init=None, **kwargs)
    ours = program(Framework(tilewise, draws), init=theirs.pop("init"), **kwargs)
    ours.pop("init")
    assert draws.cursor == len(draws.records), "tilewise drew fewer times than torch"
    return ours, theirs


def load_from(framework, model, init):
    """The torch run hands out its model's weights; the tilewise run loads them."""
    if init is not None:
        state = {k: framework.tensor(v).to(model.state_dict()[k].dtype) for k, v in init.items()}
        model.load_state_dict(state)
    return {k: as_numpy(v) for k, v in model.state_dict().items()}


def assert_same(ours, theirs, rtol=RTOL, atol=ATOL):
    assert ours.keys() == theirs.keys()
    for key, expected in theirs.items():
        got = ours[key]
        if isinstance(expected, list):
            assert len(got) == len(expected), f"{key}: {len(got)} steps, torch {len(expected)}"
            for step, (g, e) in enumerate(zip(got, expected)):
                compare(g, e, rtol, atol, f"{key}[{step}]")
        else:
            compare(got, expected, rtol, atol, key)


def compare(got, expected, rtol, atol, name):
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape, f"{name}: shape {got.shape}, torch {expected.shape}"
    if expected.dtype.kind in "biuU?":
        np.testing.assert_array_equal(got, expected, err_msg=name)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=name)


# ----------------------------------------------------------------------------------------------------------------------
# Llama reference code (meta-llama/llama model.py and generation.py), with grouped-query attention as Llama 2/3 and
# Mistral write it, and a choice of how the attention itself is computed


@dataclass
class ModelArgs:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = 2
    vocab_size: int = 61
    multiple_of: int = 16
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_batch_size: int = 3
    max_seq_len: int = 24
    attention: str = "matmul"  # matmul, sdpa_causal, sdpa_bool, sdpa_float
    kv_repeat: str = "expand"  # expand (Llama), repeat_interleave (Mistral)


def llama_program(torch, init, attention="matmul", kv_repeat="expand", temperature=0.0, top_p=0.9, dtype=None,
                  autocast=False, stop_tokens=None, compiled=False):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(torch.nn.Module):
        def __init__(self, dim: int, eps: float = 1e-6):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def _norm(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

        def forward(self, x):
            output = self._norm(x.float()).type_as(x)
            return output * self.weight

    def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        t = torch.arange(end, device=freqs.device, dtype=torch.float32)
        freqs = torch.outer(t, freqs)
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
        return freqs_cis

    def reshape_for_broadcast(freqs_cis, x):
        ndim = x.ndim
        assert 0 <= 1 < ndim
        assert freqs_cis.shape == (x.shape[1], x.shape[-1])
        shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
        return freqs_cis.view(*shape)

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

    def repeat_kv(x, n_rep: int):
        """torch.repeat_interleave(x, dim=2, repeats=n_rep)"""
        bs, slen, n_kv_heads, head_dim = x.shape
        if n_rep == 1:
            return x
        return (
            x[:, :, :, None, :]
            .expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
        )

    class Attention(nn.Module):
        def __init__(self, args: ModelArgs):
            super().__init__()
            self.args = args
            self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
            self.n_local_heads = args.n_heads
            self.n_local_kv_heads = self.n_kv_heads
            self.n_rep = self.n_local_heads // self.n_local_kv_heads
            self.head_dim = args.dim // args.n_heads
            self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
            self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
            self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
            self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
            self.cache_k = torch.zeros(
                (args.max_batch_size, args.max_seq_len, self.n_local_kv_heads, self.head_dim))
            self.cache_v = torch.zeros(
                (args.max_batch_size, args.max_seq_len, self.n_local_kv_heads, self.head_dim))

        def forward(self, x, start_pos: int, freqs_cis, mask):
            bsz, seqlen, _ = x.shape
            xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
            xq = xq.view(bsz, seqlen, self.n_local_heads, self.head_dim)
            xk = xk.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
            xv = xv.view(bsz, seqlen, self.n_local_kv_heads, self.head_dim)
            xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)

            self.cache_k = self.cache_k.to(xq)
            self.cache_v = self.cache_v.to(xq)
            self.cache_k[:bsz, start_pos: start_pos + seqlen] = xk
            self.cache_v[:bsz, start_pos: start_pos + seqlen] = xv
            keys = self.cache_k[:bsz, : start_pos + seqlen]
            values = self.cache_v[:bsz, : start_pos + seqlen]

            if self.args.kv_repeat == "expand":
                keys = repeat_kv(keys, self.n_rep)  # (bs, cache_len + seqlen, n_local_heads, head_dim)
                values = repeat_kv(values, self.n_rep)
            else:  # Mistral's reference code
                keys = torch.repeat_interleave(keys, repeats=self.n_rep, dim=2)
                values = torch.repeat_interleave(values, repeats=self.n_rep, dim=2)

            xq = xq.transpose(1, 2)  # (bs, n_local_heads, seqlen, head_dim)
            keys = keys.transpose(1, 2)
            values = values.transpose(1, 2)
            if self.args.attention == "matmul":
                scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
                if mask is not None:
                    scores = scores + mask  # (bs, n_local_heads, seqlen, cache_len + seqlen)
                scores = F.softmax(scores.float(), dim=-1).type_as(xq)
                output = torch.matmul(scores, values)  # (bs, n_local_heads, seqlen, head_dim)
            elif self.args.attention == "sdpa_causal":
                # the prompt alone is causal; one new token attends to the whole cache
                output = F.scaled_dot_product_attention(xq, keys, values, is_causal=start_pos == 0 and seqlen > 1)
            elif self.args.attention == "sdpa_bool":
                allowed = None if mask is None else mask == 0
                output = F.scaled_dot_product_attention(xq, keys, values, attn_mask=allowed)
            else:
                output = F.scaled_dot_product_attention(xq, keys, values, attn_mask=mask)
            output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
            return self.wo(output)

    class FeedForward(nn.Module):
        def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None):
            super().__init__()
            hidden_dim = int(2 * hidden_dim / 3)
            if ffn_dim_multiplier is not None:
                hidden_dim = int(ffn_dim_multiplier * hidden_dim)
            hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
            self.w1 = nn.Linear(dim, hidden_dim, bias=False)
            self.w2 = nn.Linear(hidden_dim, dim, bias=False)
            self.w3 = nn.Linear(dim, hidden_dim, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class TransformerBlock(nn.Module):
        def __init__(self, layer_id: int, args: ModelArgs):
            super().__init__()
            self.attention = Attention(args)
            self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of, args.ffn_dim_multiplier)
            self.layer_id = layer_id
            self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
            self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

        def forward(self, x, start_pos: int, freqs_cis, mask):
            h = x + self.attention(self.attention_norm(x), start_pos, freqs_cis, mask)
            out = h + self.feed_forward(self.ffn_norm(h))
            return out

    class Transformer(nn.Module):
        def __init__(self, params: ModelArgs):
            super().__init__()
            self.params = params
            self.vocab_size = params.vocab_size
            self.n_layers = params.n_layers
            self.tok_embeddings = nn.Embedding(params.vocab_size, params.dim)
            self.layers = torch.nn.ModuleList()
            for layer_id in range(params.n_layers):
                self.layers.append(TransformerBlock(layer_id, params))
            self.norm = RMSNorm(params.dim, eps=params.norm_eps)
            self.output = nn.Linear(params.dim, params.vocab_size, bias=False)
            self.freqs_cis = precompute_freqs_cis(
                params.dim // params.n_heads, params.max_seq_len * 2, params.rope_theta)

        @torch.inference_mode()
        def forward(self, tokens, start_pos: int):
            _bsz, seqlen = tokens.shape
            h = self.tok_embeddings(tokens)
            self.freqs_cis = self.freqs_cis.to(h.device)
            freqs_cis = self.freqs_cis[start_pos: start_pos + seqlen]
            mask = None
            if seqlen > 1:
                mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device)
                mask = torch.triu(mask, diagonal=1)
                # When performing key-value caching, we compute the attention scores only for the new sequence.
                # Thus, the matrix of scores is of size (seqlen, cache_len + seqlen), and the only masked entries
                # are (i, j) for j > cache_len + i, since row i corresponds to token cache_len + i.
                mask = torch.hstack([torch.zeros((seqlen, start_pos), device=tokens.device), mask]).type_as(h)
            for layer in self.layers:
                h = layer(h, start_pos, freqs_cis, mask)
            h = self.norm(h)
            output = self.output(h).float()
            return output

    def sample_top_p(probs, p):
        probs_sort, probs_idx = torch.sort(probs, dim=-1, descending=True)
        probs_sum = torch.cumsum(probs_sort, dim=-1)
        mask = probs_sum - probs_sort > p
        probs_sort[mask] = 0.0
        probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
        next_token = torch.multinomial(probs_sort, num_samples=1)
        next_token = torch.gather(probs_idx, -1, next_token)
        return next_token

    args = ModelArgs(attention=attention, kv_repeat=kv_repeat)
    model = Transformer(args)
    init = load_from(torch, model, init)
    if dtype is not None:
        dtype = getattr(torch, dtype)
        model.to(dtype)
        for layer in model.layers:  # the reference code allocates its caches in the default dtype, then
            layer.attention.cache_k = layer.attention.cache_k.to(dtype)  # moves them as it writes
            layer.attention.cache_v = layer.attention.cache_v.to(dtype)
    model.eval()

    prompt_tokens = [[5, 17, 3, 42, 8], [9, 1], [33, 33, 12, 60]]
    pad_id, eos_id, max_gen_len = -1, 7, 12
    logits_per_step, caches_per_step = [], []

    # Llama.generate
    bsz = len(prompt_tokens)
    min_prompt_len = min(len(t) for t in prompt_tokens)
    max_prompt_len = max(len(t) for t in prompt_tokens)
    total_len = min(args.max_seq_len, max_gen_len + max_prompt_len)
    tokens = torch.full((bsz, total_len), pad_id, dtype=torch.long)
    for k, t in enumerate(prompt_tokens):
        tokens[k, : len(t)] = torch.tensor(t, dtype=torch.long)
    prev_pos = 0
    eos_reached = torch.tensor([False] * bsz)
    input_text_mask = tokens != pad_id
    if stop_tokens is not None:  # Llama 3's generation.py
        stop_tokens = torch.tensor(stop_tokens)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    forward = compiled_if(torch, compiled)(model.forward)  # one decode step: the prompt, then a token at a time
    with torch.inference_mode(), ctx:
        for cur_pos in range(min_prompt_len, total_len):
            logits = forward(tokens[:, prev_pos:cur_pos], prev_pos)
            logits_per_step.append(as_numpy(logits))
            caches_per_step.append(as_numpy(model.layers[-1].attention.cache_k[:bsz, :cur_pos]))
            if temperature > 0:
                probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
                if top_p is None:  # every token, in vocabulary order
                    next_token = torch.multinomial(probs, num_samples=1)
                else:
                    next_token = sample_top_p(probs, top_p)
            else:
                next_token = torch.argmax(logits[:, -1], dim=-1)
            next_token = next_token.reshape(-1)
            # only replace token if prompt has already been generated
            next_token = torch.where(input_text_mask[:, cur_pos], tokens[:, cur_pos], next_token)
            tokens[:, cur_pos] = next_token
            if stop_tokens is None:
                eos_reached |= (~input_text_mask[:, cur_pos]) & (next_token == eos_id)
            else:
                eos_reached |= (~input_text_mask[:, cur_pos]) & (torch.isin(next_token, stop_tokens))
            prev_pos = cur_pos
            if all(eos_reached):
                break
    cache_v = model.layers[0].attention.cache_v
    inference = [t.is_inference() for t in (logits, tokens, cache_v, model.freqs_cis, model.output.weight)]
    return {"init": init, "logits": logits_per_step, "cache_k": caches_per_step, "tokens": as_numpy(tokens),
            "cache_v": as_numpy(cache_v), "dtypes": [dtype_name(logits), dtype_name(cache_v)],
            "inference": np.array(inference)}


ATTENTIONS = [("matmul", "expand"), ("sdpa_causal", "repeat_interleave"), ("sdpa_bool", "expand"),
              ("sdpa_float", "repeat_interleave")]


def _compiled_slow_for(cases: list, quick: set) -> list:
    """``cases`` eager and compiled, the compiled run of those not in ``quick`` marked slow (a compiled generation
    takes 10-20 s on 2 cores; the quick ones cover every attention path the compiler meets)."""
    out = []
    for case in cases:
        values = case if isinstance(case, tuple) else (case,)
        name = "-".join(values)
        out.append(pytest.param(*values, False, id=f"eager-{name}"))
        marks = () if case in quick else (pytest.mark.slow,)
        out.append(pytest.param(*values, True, id=f"compiled-{name}", marks=marks))
    return out


@pytest.mark.parametrize(("attention", "kv_repeat", "compiled"),
                         _compiled_slow_for(ATTENTIONS, {("sdpa_causal", "repeat_interleave")}))
def test_llama_reference_generation_greedy_matches_torch(attention, kv_repeat, compiled):
    ours, theirs = run_both(llama_program, attention=attention, kv_repeat=kv_repeat, compiled=compiled)
    assert_same(ours, theirs)


def test_llama_reference_generation_stops_on_stop_tokens_as_torch():
    ours, theirs = run_both(llama_program, stop_tokens=[35, 13])
    assert_same(ours, theirs)
    assert len(theirs["logits"]) == 8, "every sequence was to reach a stop token before the length limit"


# compiled, 20-30 s on 2 cores each: the compiled nanoGPT and HF-style generations keep autocast and bfloat16 in the
# default run
_EAGER_QUICK = [pytest.param(False, id="eager"), pytest.param(True, id="compiled", marks=pytest.mark.slow)]


@pytest.mark.parametrize("compiled", _EAGER_QUICK)
def test_llama_reference_generation_under_bfloat16_autocast_matches_torch(compiled):
    ours, theirs = run_both(llama_program, draws_tolerance=(BF16_RTOL, 1e-3), attention="sdpa_causal",
                            temperature=1.0, top_p=None, autocast=True, compiled=compiled)
    assert_same(ours, theirs, BF16_RTOL, BF16_ATOL)


def test_llama_reference_generation_top_p_sampling_matches_torch():
    ours, theirs = run_both(llama_program, temperature=0.8, top_p=0.7)
    assert_same(ours, theirs)


@pytest.mark.parametrize("compiled", _EAGER_QUICK)
def test_llama_reference_generation_in_bfloat16_matches_torch(compiled):
    # sampled at temperature 1 from every token in vocabulary order, so that the two runs follow torch's tokens however
    # bfloat16 rounds (after a sort, near-equal probabilities may change places)
    ours, theirs = run_both(llama_program, draws_tolerance=(BF16_RTOL, 1e-3), attention="sdpa_float",
                            temperature=1.0, top_p=None, dtype="bfloat16", compiled=compiled)
    assert_same(ours, theirs, BF16_RTOL, BF16_ATOL)


# ----------------------------------------------------------------------------------------------------------------------
# HuggingFace-style Llama (modeling_llama.py before its Cache classes: key/value tuples grown with torch.cat),
# a left-padded batch, and the generation loop of GenerationMixin with its logits processors


@dataclass
class LlamaConfig:
    vocab_size: int = 67
    hidden_size: int = 32
    intermediate_size: int = 48
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attn_implementation: str = "eager"  # eager, sdpa, sdpa_bool


def hf_program(torch, init, attn_implementation="eager", do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
               repetition_penalty=1.0, eos_token_id=None, max_new_tokens=8, dtype=None, compiled=False):
    nn = torch.nn

    class LlamaRMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class LlamaRotaryEmbedding(nn.Module):
        def __init__(self, dim, base=10000):
            super().__init__()
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        @torch.no_grad()
        def forward(self, x, position_ids):
            inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
            position_ids_expanded = position_ids[:, None, :].float()
            freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos()
            sin = emb.sin()
            return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    def rotate_half(x):
        """Rotates half the hidden dims of the input."""
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = (q * cos) + (rotate_half(q) * sin)
        k_embed = (k * cos) + (rotate_half(k) * sin)
        return q_embed, k_embed

    def repeat_kv(hidden_states, n_rep):
        batch, num_key_value_heads, slen, head_dim = hidden_states.shape
        if n_rep == 1:
            return hidden_states
        hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
        return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)

    class LlamaMLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
            self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class LlamaAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.num_heads = config.num_attention_heads
            self.head_dim = config.hidden_size // self.num_heads
            self.num_key_value_heads = config.num_key_value_heads
            self.num_key_value_groups = self.num_heads // self.num_key_value_heads
            self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

        def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value):
            bsz, q_len, _ = hidden_states.size()
            query_states = self.q_proj(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
            key_states = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
            value_states = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
            cos, sin = position_embeddings
            query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
            if past_key_value is not None:
                key_states = torch.cat([past_key_value[0], key_states], dim=2)
                value_states = torch.cat([past_key_value[1], value_states], dim=2)
            past_key_value = (key_states, value_states)

            key_states = repeat_kv(key_states, self.num_key_value_groups)
            value_states = repeat_kv(value_states, self.num_key_value_groups)
            if self.config.attn_implementation == "eager":
                attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
                causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
                attn_weights = attn_weights + causal_mask
                attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
                attn_output = torch.matmul(attn_weights, value_states)
            else:
                attn_output = torch.nn.functional.scaled_dot_product_attention(
                    query_states.contiguous(), key_states.contiguous(), value_states.contiguous(),
                    attn_mask=attention_mask, dropout_p=0.0)
            attn_output = attn_output.transpose(1, 2).contiguous()
            attn_output = attn_output.reshape(bsz, q_len, -1)
            return self.o_proj(attn_output), past_key_value

    class LlamaDecoderLayer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.self_attn = LlamaAttention(config)
            self.mlp = LlamaMLP(config)
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

        def forward(self, hidden_states, attention_mask, position_embeddings, past_key_value):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, present = self.self_attn(hidden_states, attention_mask, position_embeddings, past_key_value)
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + hidden_states
            return hidden_states, present

    def _make_causal_mask(input_ids_shape, dtype, device, past_key_values_length=0):
        bsz, tgt_len = input_ids_shape
        mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=device)
        mask_cond = torch.arange(mask.size(-1), device=device)
        mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
        mask = mask.to(dtype)
        if past_key_values_length > 0:
            mask = torch.cat([torch.zeros(tgt_len, past_key_values_length, dtype=dtype, device=device), mask], dim=-1)
        return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len + past_key_values_length)

    def _expand_mask(mask, dtype, tgt_len=None):
        bsz, src_len = mask.size()
        tgt_len = tgt_len if tgt_len is not None else src_len
        expanded_mask = mask[:, None, None, :].expand(bsz, 1, tgt_len, src_len).to(dtype)
        inverted_mask = 1.0 - expanded_mask
        return inverted_mask.masked_fill(inverted_mask.to(torch.bool), torch.finfo(dtype).min)

    def _bool_mask(attention_mask, q_len):
        kv_len = attention_mask.shape[-1]
        causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(diagonal=kv_len - q_len)
        allowed = causal[None, None, :, :] & attention_mask[:, None, None, :].bool()
        # rows that may attend to nothing (padding queries) attend to everything, as _unmask_unattended does
        return allowed | ~torch.any(allowed, dim=-1, keepdim=True)

    class LlamaForCausalLM(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.layers = nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)])
            self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.rotary_emb = LlamaRotaryEmbedding(config.hidden_size // config.num_attention_heads,
                                                   base=config.rope_theta)
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

        def forward(self, input_ids, attention_mask, position_ids, past_key_values=None):
            inputs_embeds = self.embed_tokens(input_ids)
            batch_size, seq_length = input_ids.shape
            past_length = 0 if past_key_values is None else past_key_values[0][0].shape[2]
            if self.config.attn_implementation == "sdpa_bool":
                mask = _bool_mask(attention_mask, seq_length)
            else:
                mask = _expand_mask(attention_mask, inputs_embeds.dtype, tgt_len=seq_length)
                if seq_length > 1:
                    mask = mask + _make_causal_mask((batch_size, seq_length), inputs_embeds.dtype,
                                                    inputs_embeds.device, past_length)
            hidden_states = inputs_embeds
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
            presents = ()
            for idx, decoder_layer in enumerate(self.layers):
                past = past_key_values[idx] if past_key_values is not None else None
                hidden_states, present = decoder_layer(hidden_states, mask, position_embeddings, past)
                presents += (present,)
            hidden_states = self.norm(hidden_states)
            logits = self.lm_head(hidden_states)
            logits = logits.float()
            return logits, presents

    # logits processors
    def repetition_penalty_processor(input_ids, scores, penalty):
        score = torch.gather(scores, 1, input_ids)
        score = torch.where(score < 0, score * penalty, score / penalty)
        return scores.scatter(1, input_ids, score)

    def top_k_top_p_filtering(logits, top_k=0, top_p=1.0, filter_value=-float("Inf"), min_tokens_to_keep=1):
        if top_k > 0:
            top_k = min(max(top_k, min_tokens_to_keep), logits.size(-1))  # Safety check
            indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
            logits[indices_to_remove] = filter_value
        if top_p < 1.0:
            sorted_logits, sorted_indices = torch.sort(logits, descending=True)
            cumulative_probs = torch.cumsum(torch.nn.functional.softmax(sorted_logits, dim=-1), dim=-1)
            sorted_indices_to_remove = cumulative_probs > top_p
            if min_tokens_to_keep > 1:
                sorted_indices_to_remove[..., :min_tokens_to_keep] = 0
            sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
            sorted_indices_to_remove[..., 0] = 0
            indices_to_remove = sorted_indices_to_remove.scatter(1, sorted_indices, sorted_indices_to_remove)
            logits[indices_to_remove] = filter_value
        return logits

    config = LlamaConfig(attn_implementation=attn_implementation)
    model = LlamaForCausalLM(config)
    init = load_from(torch, model, init)
    model.eval()
    if dtype is not None:
        model.to(getattr(torch, dtype))

    # a left-padded batch, as a tokenizer with padding_side="left" gives it
    pad_token_id = 0
    input_ids = torch.tensor([[0, 0, 0, 11, 12, 13], [21, 22, 23, 24, 25, 26], [0, 31, 32, 33, 34, 35]])
    attention_mask = (input_ids != pad_token_id).long()
    eos = torch.tensor(eos_token_id or [], dtype=torch.long)
    batch_size = input_ids.shape[0]
    unfinished_sequences = torch.ones(batch_size, dtype=torch.long, device=input_ids.device)
    past_key_values = None
    logits_per_step, keys_per_step, positions_per_step = [], [], []
    decode_step = compiled_if(torch, compiled)(model)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            # prepare_inputs_for_generation
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            if past_key_values is not None:
                model_input_ids = input_ids[:, -1:]
                position_ids = position_ids[:, -input_ids.shape[1] + past_key_values[0][0].shape[2]:]
            else:
                model_input_ids = input_ids
            logits, past_key_values = decode_step(model_input_ids, attention_mask, position_ids, past_key_values)
            logits_per_step.append(as_numpy(logits))
            keys_per_step.append(as_numpy(past_key_values[-1][0]))
            positions_per_step.append(as_numpy(position_ids))

            next_token_logits = logits[:, -1, :].clone().float()
            next_token_scores = next_token_logits
            if repetition_penalty != 1.0:
                next_token_scores = repetition_penalty_processor(input_ids, next_token_scores, repetition_penalty)
            if do_sample:
                next_token_scores = next_token_scores / temperature
                next_token_scores = top_k_top_p_filtering(next_token_scores, top_k=top_k, top_p=top_p)
                probs = nn.functional.softmax(next_token_scores, dim=-1)
                next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
            else:
                next_tokens = torch.argmax(next_token_scores, dim=-1)
            next_tokens = next_tokens * unfinished_sequences + pad_token_id * (1 - unfinished_sequences)
            input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
            unfinished_sequences = unfinished_sequences & ~torch.isin(input_ids[:, -1], eos)
            if unfinished_sequences.max() == 0:
                break
    return {"init": init, "logits": logits_per_step, "keys": keys_per_step, "position_ids": positions_per_step,
            "sequences": as_numpy(input_ids), "unfinished": as_numpy(unfinished_sequences),
            "dtypes": [dtype_name(t) for t in (logits, past_key_values[0][0], model.rotary_emb.inv_freq)]}


@pytest.mark.parametrize(("attn_implementation", "compiled"),
                         _compiled_slow_for(["eager", "sdpa", "sdpa_bool"], {"sdpa_bool"}))
def test_hf_style_greedy_generation_with_left_padding_matches_torch(attn_implementation, compiled):
    ours, theirs = run_both(hf_program, attn_implementation=attn_implementation, repetition_penalty=1.3,
                            compiled=compiled)
    assert_same(ours, theirs)


@pytest.mark.parametrize(("attn_implementation", "compiled"), _compiled_slow_for(["eager", "sdpa"], {"sdpa"}))
def test_hf_style_generation_in_bfloat16_matches_torch(attn_implementation, compiled):
    # masks from torch.finfo(torch.bfloat16).min; sampled over the whole vocabulary so that both runs follow torch
    ours, theirs = run_both(hf_program, draws_tolerance=(BF16_RTOL, 1e-3), attn_implementation=attn_implementation,
                            do_sample=True, dtype="bfloat16", compiled=compiled)
    assert_same(ours, theirs, BF16_RTOL, BF16_ATOL)


def test_hf_style_sampling_with_top_k_top_p_and_eos_matches_torch():
    ours, theirs = run_both(hf_program, do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.2,
                            eos_token_id=[61, 51, 45], max_new_tokens=10)
    assert_same(ours, theirs)
    assert len(theirs["logits"]) < 10, "every sequence was to reach an end-of-sequence token"
    assert (theirs["sequences"][:, -1] == 0).sum() == 2, "the sequences that ended first continue with padding"


# ----------------------------------------------------------------------------------------------------------------------
# nanoGPT (model.py and sample.py), with a tiny config


@dataclass
class GPTConfig:
    block_size: int = 12
    vocab_size: int = 53
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


def nanogpt_program(torch, init, flash=True, dtype="float32", temperature=0.8, top_k=200, max_new_tokens=10,
                    compiled=False):
    nn, F = torch.nn, torch.nn.functional

    class LayerNorm(nn.Module):
        """ LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False """

        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

        def forward(self, input):
            return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            assert config.n_embd % config.n_head == 0
            self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
            self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
            self.attn_dropout = nn.Dropout(config.dropout)
            self.resid_dropout = nn.Dropout(config.dropout)
            self.n_head = config.n_head
            self.n_embd = config.n_embd
            self.dropout = config.dropout
            self.flash = flash and hasattr(torch.nn.functional, "scaled_dot_product_attention")
            if not self.flash:
                self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                                     .view(1, 1, config.block_size, config.block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
            if self.flash:
                y = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                att = self.attn_dropout(att)
                y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            y = self.resid_dropout(self.c_proj(y))
            return y

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
            self.dropout = nn.Dropout(config.dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
            self.attn = CausalSelfAttention(config)
            self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            ))
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # https://paperswithcode.com/method/weight-tying
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

        def _init_weights(self, module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None):
            device = idx.device
            b, t = idx.size()
            assert t <= self.config.block_size, f"Cannot forward sequence of length {t}"
            pos = torch.arange(0, t, dtype=torch.long, device=device)  # shape (t)
            tok_emb = self.transformer.wte(idx)  # token embeddings of shape (b, t, n_embd)
            pos_emb = self.transformer.wpe(pos)  # position embeddings of shape (t, n_embd)
            x = self.transformer.drop(tok_emb + pos_emb)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            if targets is not None:
                logits = self.lm_head(x)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            else:
                # inference-time mini-optimization: only forward the lm_head on the very last position
                logits = self.lm_head(x[:, [-1], :])  # note: using list [-1] to preserve the time dim
                loss = None
            return logits, loss

        @torch.no_grad()
        def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
            for _ in range(max_new_tokens):
                # if the sequence context is growing too long we must crop it at block_size
                idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
                logits, _ = self(idx_cond)
                logits_per_step.append(as_numpy(logits))
                last_logits[:] = [logits]
                logits = logits[:, -1, :] / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                probs = F.softmax(logits, dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1)
                idx = torch.cat((idx, idx_next), dim=1)
            return idx

    # sample.py
    seed = 1337
    device = "cpu"
    torch.manual_seed(seed)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul
    torch.backends.cudnn.allow_tf32 = True  # allow tf32 on cudnn
    device_type = "cuda" if "cuda" in device else "cpu"  # for later use in torch.autocast
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if ptdtype == torch.float32 else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

    model = GPT(GPTConfig())
    init = load_from(torch, model, init)
    model.eval()
    model.to(device)
    model.forward = compiled_if(torch, compiled)(model.forward)  # generate's self(idx_cond) calls it
    logits_per_step, last_logits = [], []
    start_ids = [3, 14, 15, 9, 26]
    x = (torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...])
    samples = []
    try:
        with torch.no_grad():
            with ctx:
                for _k in range(2):
                    y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
                    samples.append(y[0].tolist())
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return {"init": init, "logits": logits_per_step, "samples": np.array(samples),
            "dtypes": [dtype_name(logits) for logits in last_logits]}


@pytest.mark.parametrize(("flash", "compiled"), [(True, False), (True, True), (False, False),
                                                pytest.param(False, True, marks=pytest.mark.slow)])
def test_nanogpt_sample_matches_torch(flash, compiled):
    # ten new tokens after five: the context is cropped to block_size for the last three steps
    ours, theirs = run_both(nanogpt_program, flash=flash, top_k=5, compiled=compiled)
    assert_same(ours, theirs)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_nanogpt_sample_under_bfloat16_autocast_matches_torch(compiled):
    ours, theirs = run_both(nanogpt_program, draws_tolerance=(BF16_RTOL, 1e-3), dtype="bfloat16", compiled=compiled)
    assert_same(ours, theirs, BF16_RTOL, BF16_ATOL)
