"""A word-level language model trainer in the style of PyTorch's classic example: a corpus of word indices cut
into ``batch_size`` columns, truncated back-propagation through ``bptt`` steps with the hidden state carried
over (and detached) between chunks, an LSTM/GRU or a Transformer encoder with a causal mask and sinusoidal
positions, plain SGD applied by hand (``p.data.add_(p.grad, alpha=-lr)``) with clipping, and the learning rate
divided by 4 when the validation loss stops improving.

    python examples/train_word_lm.py --model LSTM --steps 300
    python examples/train_word_lm.py --model Transformer --steps 300

Written against torch's API: with ``tilewise`` replaced by ``torch`` in the imports it runs under PyTorch.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_run_flags, read_text  # noqa: E402

import tilewise as torch  # noqa: E402
import tilewise.nn as nn  # noqa: E402
import tilewise.nn.functional as F  # noqa: E402


class Corpus:
    def __init__(self, words: int, vocab: int) -> None:
        tokens = re.findall(r"[a-z]+|[.,;:]", read_text().lower())[:words]
        common = [w for w, _ in Counter(tokens).most_common(vocab - 1)]
        self.idx2word = ["<unk>", *sorted(common)]
        self.word2idx = {w: i for i, w in enumerate(self.idx2word)}
        ids = torch.tensor([self.word2idx.get(t, 0) for t in tokens], dtype=torch.int64)
        split = int(0.9 * len(ids))
        self.train, self.valid = ids[:split], ids[split:]


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.0) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.0, max_len=5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.0) -> None:
        super().__init__()
        self.model_type, self.ninp = "Transformer", ninp
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.decoder = nn.Linear(ninp, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, src, has_mask=True):
        mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device) if has_mask else None
        src = self.pos_encoder(self.encoder(src) * math.sqrt(self.ninp))
        output = self.decoder(self.transformer_encoder(src, mask))
        return F.log_softmax(output, dim=-1)


def repackage_hidden(h):
    """Cut the graph between chunks: the hidden state carries values, not history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main(argv=None) -> int:
    parser = add_run_flags(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--model", default="LSTM", choices=("RNN_TANH", "RNN_RELU", "LSTM", "GRU", "Transformer"))
    parser.add_argument("--emsize", type=int, default=128)
    parser.add_argument("--nhid", type=int, default=128)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--nhead", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--words", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--eval-interval", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=20)
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(args.seed)
    corpus = Corpus(args.words, args.vocab)
    train_data = batchify(corpus.train, args.batch_size, device)
    val_data = batchify(corpus.valid, 10, device)
    ntokens = len(corpus.idx2word)
    if args.model == "Transformer":
        model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers)
    else:
        kind = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(args.model, args.model)
        model = RNNModel(kind, ntokens, args.emsize, args.nhid, args.nlayers)
    if args.save_init:
        torch.save(model.state_dict(), args.save_init)
        return 0
    ckpt_path = os.path.join(args.out, "model.pt")
    lr, step, checkpoint = args.lr, 0, None
    if args.resume:
        checkpoint = torch.load(ckpt_path)
        model.load_state_dict(checkpoint["model"])
        lr, step = checkpoint["lr"], checkpoint["step"]
    elif args.init_from:
        model.load_state_dict(torch.load(args.init_from))
    model.to(device)
    criterion = nn.NLLLoss()

    def evaluate(source) -> float:
        model.eval()
        total, count = 0.0, 0
        hidden = None if args.model == "Transformer" else model.init_hidden(10)
        with torch.no_grad():
            for i in range(0, min(source.size(0) - 1, args.eval_batches * args.bptt), args.bptt):
                data, targets = get_batch(source, i, args.bptt)
                if args.model == "Transformer":
                    output = model(data).view(-1, ntokens)
                else:
                    output, hidden = model(data, hidden)
                    hidden = repackage_hidden(hidden)
                total += len(data) * criterion(output, targets).item()
                count += len(data)
        model.train()
        return total / count

    if args.eval_only:
        print(f"val loss {evaluate(val_data):.6f}")
        return 0
    best = None
    hidden = None if args.model == "Transformer" else model.init_hidden(args.batch_size)
    batch_starts = range(0, train_data.size(0) - 1, args.bptt)
    while step < args.steps:
        for i in batch_starts:
            if step >= args.steps:
                break
            data, targets = get_batch(train_data, i, args.bptt)
            model.zero_grad()
            if args.model == "Transformer":
                output = model(data).view(-1, ntokens)
            else:
                hidden = repackage_hidden(hidden)
                output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            step += 1
            print(f"step {step} loss {loss.item():.6f} ppl {math.exp(loss.item()):.1f}", flush=True)
            if step % args.eval_interval == 0 or step == args.steps:
                val = evaluate(val_data)
                print(f"step {step}: val loss {val:.6f} lr {lr:g}", flush=True)
                if best is not None and val >= best:
                    lr /= 4.0
                best = val if best is None else min(best, val)
                os.makedirs(args.out, exist_ok=True)
                torch.save({"model": model.state_dict(), "lr": lr, "step": step}, ckpt_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
