"""The main job: train a character-level GPT on the shipped text, report against a unigram baseline, sample.

[Note: the demo] The model and the training loop use only the public API a user would write
(``tilewise.nn``, ``tilewise.optim``, ``tilewise.save``); only ``tune_cpu_process`` reaches below it, to report
the CPU backend's allocator and BLAS settings in the output. The text is split 90/10 into training and validation
characters; batches are random windows drawn with tilewise's own generator, so ``--seed`` fixes the whole
run. The baseline is the unigram model of the training characters (add-one smoothed), scored on the
validation characters in nats per character — the cross-entropy a model gets by knowing letter frequencies
and nothing about context. The GPT must beat it clearly to have learned anything about sequence. The
checkpoint and the loss plot are written atomically (``tilewise.fileio``): an interrupted run leaves the
previous ones whole.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import tilewise as tw
from tilewise.backends.cpu.allocator import keep_freed_memory
from tilewise.backends.cpu.threads import GEMM_PARALLEL_MIN_FLOPS, blas_thread_counts
from tilewise.data import load_text
from tilewise.fileio import atomic_writer
from tilewise.models.gpt import GPT, CharTokenizer, GPTConfig

MODEL_SIZES: dict[str, dict] = {
    "tiny": dict(n_layer=1, n_head=2, n_embd=32, block_size=32),
    "small": dict(n_layer=2, n_head=4, n_embd=64, block_size=64),
    "medium": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "large": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
}


@dataclass
class DemoSettings:
    steps: int = 600
    device: str | None = None
    model_size: str = "small"
    seed: int = 1337
    out: Path = Path("out") / "demo"
    batch_size: int = 32
    lr: float = 3e-3
    time_limit: float = 150.0  # seconds of training (evaluations included) before stopping early; 0: none
    eval_every: int = 100
    eval_batches: int = 8
    sample_chars: int = 300


@dataclass
class DemoResult:
    device: str
    steps: int  # steps requested; after the run, steps taken
    train_losses: list[float] = field(default_factory=list)
    val_points: list[tuple[int, float]] = field(default_factory=list)
    unigram_baseline: float = math.nan
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    sample: str = ""
    plot_path: Path | None = None
    checkpoint_path: Path | None = None
    cpu_tuning: list[str] = field(default_factory=list)

    @property
    def final_val_loss(self) -> float:
        return self.val_points[-1][1]


def best_device() -> str:
    """``cuda`` when tilewise's CUDA backend is installed and sees a GPU, otherwise ``cpu``."""
    try:
        from tilewise import cuda
    except ImportError:
        return "cpu"
    return "cuda" if cuda.is_available() else "cpu"


def tune_cpu_process() -> list[str]:
    """The process settings under which numpy-backed eager execution runs fast on a small, possibly busy CPU,
    which the CPU backend now makes by default: malloc keeps freed memory ([Note: host allocator] in
    ``backends/cpu/allocator.py``) and GEMMs too small to gain from BLAS threads run on one
    ([Note: CPU threads] in ``backends/cpu/threads.py``). Returns a description of what is in force (nothing
    on platforms where neither applies).
    """
    in_force = []
    if keep_freed_memory():
        in_force.append("malloc keeps freed memory")
    if blas_thread_counts():
        in_force.append(f"GEMMs under {GEMM_PARALLEL_MIN_FLOPS / 1e6:.0f} MFLOP on 1 BLAS thread")
    return in_force


def unigram_baseline(train_ids: np.ndarray, val_ids: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/char) on ``val_ids`` of the add-one-smoothed character frequencies of ``train_ids``."""
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    return float(-log_probs[val_ids].mean())


class Batches:
    """Random windows of ``block_size + 1`` characters: inputs are the first ``block_size``, targets the last."""

    def __init__(self, ids: tw.Tensor, block_size: int, batch_size: int, generator: tw.Generator) -> None:
        self.ids, self.block_size, self.batch_size, self.generator = ids, block_size, batch_size, generator
        self.offsets = tw.arange(block_size, device=ids.device).unsqueeze(0)

    def next(self) -> tuple[tw.Tensor, tw.Tensor]:
        starts = tw.randint(0, self.ids.shape[0] - self.block_size - 1, (self.batch_size, 1),
                            generator=self.generator, device=self.ids.device)
        window = starts + self.offsets
        return self.ids[window], self.ids[window + 1]


def _optimizer(model: GPT, lr: float, steps: int) -> tuple[tw.optim.Optimizer, tw.optim.lr_scheduler.LRScheduler]:
    """AdamW with weight decay on matrices only; linear warm-up, then cosine decay to a tenth of ``lr``."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = tw.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                               lr=lr, betas=(0.9, 0.99))
    warmup = max(1, min(100, steps // 10))
    schedule = tw.optim.lr_scheduler
    scheduler = schedule.SequentialLR(optimizer, [
        schedule.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
        schedule.CosineAnnealingLR(optimizer, T_max=max(1, steps - warmup), eta_min=lr / 10),
    ], milestones=[warmup])
    return optimizer, scheduler


@tw.no_grad()
def estimate_loss(model: GPT, batches: Batches, count: int) -> float:
    model.eval()
    total = 0.0
    for _ in range(count):
        x, y = batches.next()
        total += model(x, y)[1].item()
    model.train()
    return total / count


def run(settings: DemoSettings, report) -> DemoResult:
    """Train, evaluate, sample and plot; ``report`` receives progress events (see ``cli.DemoReport``)."""
    device = settings.device or best_device()
    tuning = tune_cpu_process() if device == "cpu" and os.path.exists("/proc/self/maps") else []
    tw.manual_seed(settings.seed)
    text = load_text("kjv")
    tokenizer = CharTokenizer(text)
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    split = int(0.9 * len(ids))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, **MODEL_SIZES[settings.model_size])
    model = GPT(config).to(device)
    train_ids = tw.from_numpy(ids[:split]).to(device)
    val_ids = tw.from_numpy(ids[split:]).to(device)
    data_gen = tw.Generator().manual_seed(settings.seed)
    train = Batches(train_ids, config.block_size, settings.batch_size, data_gen)
    val = Batches(val_ids, config.block_size, settings.batch_size, tw.Generator().manual_seed(settings.seed + 1))
    result = DemoResult(device=device, steps=settings.steps, cpu_tuning=tuning,
                        unigram_baseline=unigram_baseline(ids[:split], ids[split:], tokenizer.vocab_size))
    report.start(settings, config, model.num_parameters(), len(text), tokenizer.vocab_size, result)
    optimizer, scheduler = _optimizer(model, settings.lr, settings.steps)
    tokens_per_step = settings.batch_size * config.block_size
    train_seconds = 0.0
    run_started = time.perf_counter()
    for step in range(1, settings.steps + 1):
        started = time.perf_counter()
        x, y = train.next()
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        tw.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        result.train_losses.append(loss.item())
        train_seconds += time.perf_counter() - started
        report.step(step, result.train_losses[-1], step * tokens_per_step / train_seconds)
        out_of_time = settings.time_limit > 0 and time.perf_counter() - run_started > settings.time_limit
        if step % settings.eval_every == 0 or step == settings.steps or out_of_time:
            result.val_points.append((step, estimate_loss(model, val, settings.eval_batches)))
            report.evaluated(step, result.train_losses[-1], result.val_points[-1][1])
        if out_of_time:
            break
    result.steps = len(result.train_losses)
    result.seconds = train_seconds
    result.tokens_per_second = result.steps * tokens_per_step / train_seconds
    model.eval()
    prompt = tokenizer.encode_tensor("\n", device=device).view(1, 1)
    generated = model.generate(prompt, settings.sample_chars, temperature=0.8, top_k=None,
                               generator=tw.Generator().manual_seed(settings.seed))
    result.sample = tokenizer.decode(generated[0, 1:].tolist())
    settings.out.mkdir(parents=True, exist_ok=True)
    result.plot_path = plot_losses(result, settings.out / "loss_curve.png")
    result.checkpoint_path = settings.out / "char_gpt.safetensors"
    tw.save({"model": model.state_dict(), "config": config.to_dict(), "chars": "".join(tokenizer.chars)},
            result.checkpoint_path)
    report.finish(result)
    return result


def plot_losses(result: DemoResult, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    steps = np.arange(1, len(result.train_losses) + 1)
    ax.plot(steps, result.train_losses, color="#9bb7d4", linewidth=0.8, label="train loss (per step)")
    window = max(1, len(steps) // 25)
    if window > 1:
        smooth = np.convolve(result.train_losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, color="#1f5f99", linewidth=1.6, label=f"train loss ({window}-step mean)")
    val_steps, val_losses = zip(*result.val_points)
    ax.plot(val_steps, val_losses, "o-", color="#d1495b", label="validation loss")
    ax.axhline(result.unigram_baseline, color="#666666", linestyle="--", label="unigram baseline")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_title(f"tilewise char-GPT on {result.device}")
    ax.legend(frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_writer(path) as file:  # an interrupted run leaves the previous plot, not half a PNG
        fig.savefig(file, format="png")
    plt.close(fig)
    return path.resolve()
