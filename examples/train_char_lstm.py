"""A character-level LSTM language model fed by an endless random sampler and worker processes: windows of text
drawn with replacement (``RandomSampler(replacement=True, num_samples=10**10)``, drawn lazily), decoded in
``DataLoader`` workers that stay alive between epochs, Adam with gradient clipping and a ReduceLROnPlateau
schedule on the validation loss, and a resumable checkpoint.

    python examples/train_char_lstm.py --steps 300 --workers 2

Written against torch's API: with ``tilewise`` replaced by ``torch`` in the imports it runs under PyTorch.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_run_flags, read_text  # noqa: E402

import tilewise as torch  # noqa: E402
import tilewise.nn as nn  # noqa: E402
from tilewise.utils.data import DataLoader, Dataset, RandomSampler, get_worker_info  # noqa: E402


class CharWindows(Dataset):
    """Item i: the window of ``seq_len + 1`` characters starting at i, as (input, target) index tensors."""

    def __init__(self, codes: np.ndarray, seq_len: int) -> None:
        self.codes, self.seq_len = codes, seq_len

    def __len__(self) -> int:
        return len(self.codes) - self.seq_len - 1

    def __getitem__(self, i):
        window = self.codes[i:i + self.seq_len + 1].astype(np.int64)
        return torch.from_numpy(window[:-1].copy()), torch.from_numpy(window[1:].copy())


def seed_worker(worker_id: int) -> None:
    info = get_worker_info()
    np.random.seed(info.seed % 2**32)


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True, dropout=dropout)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x, state=None):
        out, state = self.lstm(self.embed(x), state)
        return self.head(out), state


def main(argv=None) -> int:
    parser = add_run_flags(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-interval", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    text = read_text(400_000)
    chars = sorted(set(text))
    codes = np.array([chars.index(c) for c in text], dtype=np.uint8)
    split = int(0.9 * len(codes))
    train_set, val_set = CharWindows(codes[:split], args.seq_len), CharWindows(codes[split:], args.seq_len)

    model = CharLSTM(len(chars), args.hidden, args.layers, dropout=0.0)
    if args.save_init:
        torch.save(model.state_dict(), args.save_init)
        return 0
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    checkpoint = torch.load(ckpt_path, map_location="cpu") if args.resume else None
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    elif args.init_from:
        model.load_state_dict(torch.load(args.init_from))
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=2)
    step = 0
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        step = checkpoint["step"]
    loss_fn = nn.CrossEntropyLoss()

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        starts = np.linspace(0, len(val_set) - 1, args.eval_batches * args.batch_size).astype(int)
        total = 0.0
        for chunk in starts.reshape(args.eval_batches, args.batch_size):
            x, y = (torch.stack(parts).to(device) for parts in zip(*(val_set[int(i)] for i in chunk)))
            logits, _ = model(x)
            total += loss_fn(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()
        model.train()
        return total / args.eval_batches

    if args.eval_only:
        print(f"val loss {evaluate():.6f}")
        return 0

    sampler = RandomSampler(train_set, replacement=True, num_samples=10**10)  # endless, drawn lazily
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0, worker_init_fn=seed_worker,
                        pin_memory=device == "cuda", prefetch_factor=2 if args.workers else None)
    for x, y in loader:
        if step >= args.steps:
            break
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits, _ = model(x)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_interval == 0 or step == args.steps:
            val = evaluate()
            scheduler.step(val)
            print(f"step {step}: val loss {val:.6f} lr {optimizer.param_groups[0]['lr']:.2e}", flush=True)
            os.makedirs(args.out, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": step}, ckpt_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
