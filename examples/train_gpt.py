"""A GPT trainer in the style of the popular single-file ones: character-level GPT on the King James text with
AdamW parameter groups, warm-up plus cosine learning rate, gradient accumulation, mixed precision with a
GradScaler, TF32 flags, gradient clipping, periodic evaluation and resumable checkpoints.

    python examples/train_gpt.py --steps 200            # CPU or GPU
    python examples/train_gpt.py --resume --steps 400   # continue from out/ckpt.pt
    python -m tilewise.distributed.run --nproc-per-node 2 examples/train_gpt.py --steps 200   # data parallel

Started by the launcher (RANK set), every process trains a DistributedDataParallel replica: the micro-batches of
a step are drawn from one stream seeded alike on every rank and dealt out round-robin, each rank runs
``grad_accum / world_size`` of them, and the gradients are averaged in the last one's backward; so a step sees the
same global batch and takes the same update as a single process with the same flags.

It is written against torch's API: replacing ``tilewise`` by ``torch`` in the imports gives the same program for
PyTorch (the tests run both and compare).
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_run_flags, read_text  # noqa: E402

import tilewise as torch  # noqa: E402
import tilewise.distributed as dist  # noqa: E402
import tilewise.nn as nn  # noqa: E402
from tilewise.nn import functional as F  # noqa: E402
from tilewise.nn.parallel import DistributedDataParallel as DDP  # noqa: E402, N817


@dataclass
class GPTConfig:
    block_size: int = 128
    vocab_size: int = 96
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()  # noqa: N806
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module) -> None:
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        fused = "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type == "cuda"
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **(dict(fused=True) if fused else {}))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        for _ in range(max_new_tokens):
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            logits, _ = self(idx_cond)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("Inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
        return idx


def main(argv=None) -> int:
    parser = add_run_flags(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-interval", type=int, default=100)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: bf16 on a GPU)")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    ddp = int(os.environ.get("RANK", -1)) != -1  # started by the launcher
    rank, world_size = 0, 1
    if ddp:
        dist.init_process_group(backend="nccl" if "cuda" in device else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if "cuda" in device:
            device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
            torch.cuda.set_device(device)
        if args.grad_accum % world_size:
            parser.error(f"--grad-accum {args.grad_accum} must be a multiple of the {world_size} processes")
    master_process = rank == 0
    device_type = "cuda" if "cuda" in device else "cpu"
    dtype = args.dtype or ("bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = nullcontext() if device_type == "cpu" else torch.autocast(device_type=device_type, dtype=ptdtype)

    text = read_text()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = np.array([stoi[c] for c in text], dtype=np.uint16)
    n = int(0.9 * len(data))
    train_data, val_data = data[:n], data[n:]

    def get_batch(split, keep=True):
        """A batch of random windows; with ``keep=False`` only the random draws (another rank's batch)."""
        source = train_data if split == "train" else val_data
        ix = torch.randint(len(source) - args.block_size, (args.batch_size,))
        if not keep:
            return None
        x = torch.stack([torch.from_numpy(source[i:i + args.block_size].astype(np.int64)) for i in ix.tolist()])
        y = torch.stack([torch.from_numpy(source[i + 1:i + 1 + args.block_size].astype(np.int64))
                         for i in ix.tolist()])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    def train_batches():
        """This rank's micro-batches: of the stream every rank draws alike, every ``world_size``-th."""
        while True:
            for owner in range(world_size):
                batch = get_batch("train", keep=owner == rank)
                if batch is not None:
                    yield batch

    def fixed_val_batches():
        """Evenly spaced validation windows, the same on every run (so losses compare across runs)."""
        starts = np.linspace(0, len(val_data) - args.block_size - 2, args.eval_batches * args.batch_size).astype(int)
        for chunk in starts.reshape(args.eval_batches, args.batch_size):
            x = torch.stack([torch.from_numpy(val_data[i:i + args.block_size].astype(np.int64)) for i in chunk])
            y = torch.stack([torch.from_numpy(val_data[i + 1:i + 1 + args.block_size].astype(np.int64))
                             for i in chunk])
            yield x.to(device), y.to(device)

    config = GPTConfig(block_size=args.block_size, vocab_size=len(chars), n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd)
    model = GPT(config)
    if args.save_init:
        torch.save(model.state_dict(), args.save_init)
        return 0
    iter_num, best_val_loss = 0, 1e9
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    checkpoint = None
    if args.resume:
        checkpoint = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(checkpoint["model"])
        iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    elif args.init_from:
        model.load_state_dict(torch.load(args.init_from, map_location="cpu"))
    model.to(device)

    scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers(0.1, args.lr, (0.9, 0.95), device_type)
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None
    raw_model = model  # the bare module (not compiled, not wrapped): what is saved and sampled from
    if args.compile:
        model = torch.compile(model)
    eval_model = model
    if ddp:
        model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device_type == "cuda" else None)
    micro_steps = args.grad_accum // world_size

    @torch.no_grad()
    def estimate_loss():
        eval_model.eval()
        losses = torch.zeros(args.eval_batches)
        for k, (x, y) in enumerate(fixed_val_batches()):
            with ctx:
                _, loss = eval_model(x, y)
            losses[k] = loss.item()
        eval_model.train()
        return losses.mean().item()

    if args.eval_only:
        if master_process:
            print(f"val loss {estimate_loss():.6f}")
        if ddp:
            dist.destroy_process_group()
        return 0

    warmup, lr_decay_iters, min_lr = max(1, args.steps // 10), args.steps, args.lr / 10

    def get_lr(it):
        if it < warmup:
            return args.lr * (it + 1) / (warmup + 1)
        if it > lr_decay_iters:
            return min_lr
        ratio = (it - warmup) / max(1, lr_decay_iters - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - min_lr)

    batches = train_batches()
    x, y = next(batches)
    t0 = time.time()
    while iter_num < args.steps:
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        step_loss = torch.zeros((), device=device)
        for micro_step in range(micro_steps):
            if ddp:  # average the gradients in the last micro-step's backward only
                model.require_backward_grad_sync = micro_step == micro_steps - 1
            with ctx:
                _, loss = model(x, y)
                loss = loss / micro_steps  # DDP's average over the ranks divides by world_size
            step_loss += loss.detach()
            x, y = next(batches)
            scaler.scale(loss).backward()
        if ddp:  # the mean over the whole step's batch, as one process reports it
            dist.all_reduce(step_loss)
            step_loss /= world_size
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if master_process:
            print(f"step {iter_num} loss {step_loss.item():.6f} lr {lr:.2e} "
                  f"time {(time.time() - t0) * 1000:.0f}ms", flush=True)
        t0 = time.time()
        if master_process and (iter_num % args.eval_interval == 0 or iter_num == args.steps):
            val = estimate_loss()
            print(f"step {iter_num}: val loss {val:.6f}", flush=True)
            best_val_loss = min(best_val_loss, val)
            os.makedirs(args.out, exist_ok=True)
            torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "iter_num": iter_num,
                        "best_val_loss": best_val_loss, "config": vars(config)}, ckpt_path)
    if master_process:
        context = torch.tensor([[stoi["\n"]]], device=device)
        sample = raw_model.generate(context, 60, top_k=10)[0].tolist()
        print("sample:", "".join(chars[i] for i in sample).replace("\n", " | "))
    if ddp:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
