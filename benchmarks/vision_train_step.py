"""Training step of convolutional vision models: tilewise beside torch, eager and compiled, both memory formats,
float32 and bf16 autocast; and every distinct convolution of ResNet-50 timed alone, forward and both gradients.

Both frameworks run the *same model source*, ``benchmarks/vision_models.py`` (ResNet-50 as torchvision builds it,
and a small UNet): it imports ``tilewise as torch``, and for torch its import lines say ``torch`` instead (the
rest of the file is unchanged). Every side builds a fresh model from the same initial weights (torch's Kaiming
initialisation, copied through numpy, batch-norm buffers included) and sees the same batches; a step is forward
and ``cross_entropy`` (under autocast for bf16), ``loss.backward()``, ``SGD(momentum=0.9, weight_decay=1e-4)``'s
step and ``zero_grad(set_to_none=True)``.

* tilewise eager, eager with compiled backward (``tw.autograd.compiled_backward()``), and tilewise with the
  *whole step* compiled by one ``tw.compile`` (as ``gpt_train_step.py``
  compiles its step; with momentum, whose state starts as the first gradient, the step compiles again on its
  second call);
* torch eager, and torch.compile on the model with the optimizer eager;
* each in ``contiguous`` and ``channels_last`` memory format (``model.to(memory_format=...)`` and the input
  ``.to(memory_format=...)``; where tilewise has no ``channels_last`` its rows say so and torch's still run),
  and in float32 and bf16 autocast.

Reported per side, as ``gpt_train_step.py`` reports: the median step time after ``--warmup`` steps (host wall
time of the step, synchronised at its end), images/s, speed relative to torch eager and torch.compile of the same
format and precision, the seconds of the first and second steps, peak device memory on CUDA (peak statistics
reset between sides), tilewise's kernel count per compiled program, the loss after the last step and the largest
difference of the losses from torch eager's over all steps, so the comparison is known to be of the same
computation. (On a tiny batch the full ResNet-50's float32 gradients are ill-conditioned: at batch 2, 64x64, where
the last stage's batch norm sees 8 values a channel, torch's own float32 gradients differ from its float64 ones by
a third of their largest element, so the two libraries' losses agree at the first step and part after it. In
float64 they agree to rounding; ``tests/test_vision_models.py`` checks both.)

The convolution table (``--convs``): every distinct convolution of ResNet-50 at the chosen batch and image size
(read from torch's model on the meta device), in each format and dtype, timed forward, input gradient (torch:
``torch.nn.grad.conv2d_input``; tilewise: autograd with only the input requiring grad) and weight gradient
(``conv2d_weight``; autograd with only the weight requiring grad), tilewise's and torch's calls alternating;
on CUDA by events behind a spinning kernel (``cuda_eager.paired_ms``), on the CPU by wall time. Beside them the
wall time of tilewise's first call of each (a shape it has not seen: planning and kernel compilation land there).

    python benchmarks/vision_train_step.py [--device cuda|cpu] [--quick] [--model resnet50,unet] [--batch 64]
        [--image 224] [--formats contiguous,channels_last] [--dtypes fp32,bf16] [--steps 12] [--warmup 3]
        [--sides tilewise-eager,tilewise-eager-cb,tilewise-compiled,torch-eager,torch-compile] [--no-torch-compile]
        [--classes N] [--unet-base 32] [--resnet-width 64 --resnet-layers 3,4,6,3] [--lr 0.01]
        [--convs | --no-convs] [--no-steps] [--conv-repeats 15] [--conv-shapes N] [--append FILE]
    python benchmarks/vision_train_step.py --device cpu --quick --no-torch-compile   # a check in seconds
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import os
import statistics
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TILEWISE_CACHE_DIR", tempfile.mkdtemp(prefix="tilewise-bench-cache-"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="torchinductor-bench-cache-"))
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-bench-cache-"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gpt_train_step import no_kernels, ratio, report_error, seconds, whole_step_compiled  # noqa: E402
from torch_source import module_for  # noqa: E402

import tilewise as tw  # noqa: E402

MODELS_SOURCE = Path(__file__).with_name("vision_models.py")
MODELS = ("resnet50", "unet")
FORMATS = ("contiguous", "channels_last")
DTYPES = ("fp32", "bf16")
SIDES = ("tilewise-eager", "tilewise-eager-cb", "tilewise-compiled", "torch-eager", "torch-compile")
SIZES = {"resnet50": {"batch": 64, "image": 224, "classes": 1000}, "unet": {"batch": 16, "image": 128, "classes": 21}}
# a quick check: 48x48 leaves the ResNet's last stage 2x2, so its batch norm sees 8 values a channel (with 2,
# the normalised values are +-1 and the gradients so ill-conditioned that the two libraries' roundings part)
QUICK_SIZES = {"resnet50": {"batch": 2, "image": 48, "classes": 10}, "unet": {"batch": 2, "image": 32, "classes": 10}}
# three steps: with momentum the compiled step compiles again on its second call, so the third is the first timed
QUICK = {"resnet_width": 8, "resnet_layers": (1, 1, 1, 1), "unet_base": 8, "steps": 3, "warmup": 2, "conv_shapes": 2,
         "conv_repeats": 2}
NO_CHANNELS_LAST = "n/a (no channels_last)"
NAN = float("nan")


def models_for(library: types.ModuleType) -> types.ModuleType:
    """``vision_models.py`` as a module of ``library`` (tilewise or torch)."""
    return module_for(MODELS_SOURCE, library)


def build_model(library: types.ModuleType, case: Case):
    models = models_for(library)
    if case.model == "unet":
        return models.UNet(3, case.classes, base=case.unet_base)
    return models.ResNet(models.Bottleneck, list(case.resnet_layers), case.classes, base_planes=case.resnet_width)


def make_step(model, optimizer, functional, autocast: Callable = contextlib.nullcontext) -> Callable:
    def step(x, y):
        with autocast():  # the forward and the loss, as torch's mixed-precision recipe has it
            loss = functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def sgd(library: types.ModuleType, model, lr: float):
    return library.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)


def memory_format(library: types.ModuleType, fmt: str):
    """``library``'s memory format named ``fmt``, or None where it has none of that name."""
    return getattr(library, "contiguous_format" if fmt == "contiguous" else fmt, None)


def autocast_for(library: types.ModuleType, dtype: str, device: str) -> Callable:
    if dtype == "fp32":
        return contextlib.nullcontext
    return functools.partial(library.autocast, device_type=device.split(":")[0], dtype=library.bfloat16)


# ---------------------------------------------------------------------------------------------- sides

@dataclass
class Case:
    """One model at one batch, image size, memory format and precision."""

    model: str
    batch: int
    image: int
    classes: int
    fmt: str
    dtype: str
    device: str
    lr: float
    unet_base: int = 32
    resnet_width: int = 64  # ResNet-50's; smaller for quick checks
    resnet_layers: tuple[int, ...] = (3, 4, 6, 3)


@dataclass
class Side:
    name: str
    library: Any  # tilewise or torch: its cuda namespace gives the synchronisation and memory figures
    build: Callable[[], tuple[Callable, Callable[[], str]]]  # -> (step, kernel count text)
    losses: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds of every step, warm-up included
    step_ms: float = NAN  # median after warm-up
    peak_bytes: int | None = None
    kernels: str = ""
    error: str = ""


def loaded_model(library: types.ModuleType, case: Case, weights: dict[str, np.ndarray]):
    model = build_model(library, case)
    model.load_state_dict({k: library.from_numpy(v.copy()) for k, v in weights.items()})
    model = model.to(case.device)
    return model.to(memory_format=memory_format(library, case.fmt)) if case.fmt != "contiguous" else model


def sides(case: Case, weights: dict[str, np.ndarray], chosen: list[str]) -> list[Side]:
    tw_cast, torch_cast = autocast_for(tw, case.dtype, case.device), autocast_for(torch, case.dtype, case.device)

    def tilewise_eager():
        model = loaded_model(tw, case, weights)
        return make_step(model, sgd(tw, model, case.lr), tw.nn.functional, tw_cast), no_kernels

    def tilewise_eager_cb():  # eager, with the backward replayed as one compiled program from its second step
        model = loaded_model(tw, case, weights)
        step = make_step(model, sgd(tw, model, case.lr), tw.nn.functional, tw_cast)

        def run(x, y):
            with tw.autograd.compiled_backward():
                return step(x, y)

        return run, no_kernels

    def tilewise_compiled():
        model = loaded_model(tw, case, weights)
        return whole_step_compiled(make_step(model, sgd(tw, model, case.lr), tw.nn.functional, tw_cast), "default")

    def torch_eager():
        model = loaded_model(torch, case, weights)
        return make_step(model, sgd(torch, model, case.lr), torch.nn.functional, torch_cast), no_kernels

    def torch_compiled():
        model = loaded_model(torch, case, weights)
        return make_step(torch.compile(model), sgd(torch, model, case.lr), torch.nn.functional, torch_cast), no_kernels

    every = {"tilewise-eager": Side("tilewise eager", tw, tilewise_eager),
             "tilewise-eager-cb": Side("tilewise eager, compiled backward", tw, tilewise_eager_cb),
             "tilewise-compiled": Side("tilewise compiled (whole step)", tw, tilewise_compiled),
             "torch-eager": Side("torch eager", torch, torch_eager),
             "torch-compile": Side("torch.compile (model)", torch, torch_compiled)}
    return [every[name] for name in SIDES if name in chosen]


def sample_batches(case: Case, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    labels = (case.batch,) if case.model == "resnet50" else (case.batch, case.image, case.image)
    return [(rng.standard_normal((case.batch, 3, case.image, case.image), dtype=np.float32),
             rng.integers(0, case.classes, size=labels)) for _ in range(steps)]


def on_device(library: types.ModuleType, case: Case, x: np.ndarray, y: np.ndarray) -> tuple:
    fmt = memory_format(library, case.fmt)
    return library.from_numpy(x).to(case.device).to(memory_format=fmt), library.from_numpy(y).to(case.device)


def run_side(side: Side, case: Case, batches: list, warmup: int) -> None:
    if memory_format(side.library, case.fmt) is None:
        side.error = NO_CHANNELS_LAST
        return
    # one batch at a time on the device: peak memory is the step's
    measure_side(side, case.device, batches, lambda batch: on_device(side.library, case, *batch), warmup)


def measure_side(side, device: str, batches: list, put: Callable, warmup: int) -> None:
    """Run ``side``'s step on every batch (``put(batch)`` gives its inputs on ``device``), each step timed between
    synchronisations; fill in its times, losses, median, peak memory and kernel count, or its error."""
    on_cuda = device.startswith("cuda")
    sync = side.library.cuda.synchronize if on_cuda else (lambda: None)
    try:
        if on_cuda:
            side.library.cuda.reset_peak_memory_stats()
        step, kernels = side.build()
        for batch in batches:
            x, y = put(batch)
            sync()
            start = time.perf_counter()
            loss = step(x, y)
            sync()
            side.times.append(time.perf_counter() - start)
            side.losses.append(float(loss.float().item()))
        side.step_ms = statistics.median(side.times[warmup:]) * 1e3
        if on_cuda:
            side.peak_bytes = side.library.cuda.max_memory_allocated()
        side.kernels = kernels()
    except Exception as exc:  # noqa: BLE001 — report what a side cannot do, measure the others
        side.error = report_error(exc)


def free_memory(library: types.ModuleType, device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        library.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- step report

def loss_note(side: Side, reference: Side | None) -> str:
    n = min(len(side.losses), len(reference.losses)) if reference else 0
    if side is reference or not n:
        return ""
    worst = max(abs(a - b) for a, b in zip(side.losses[:n], reference.losses[:n]))
    return f"max abs loss diff vs torch eager over {n} steps: {worst:.2e}"


def step_table(all_sides: list[Side], warmup: int, images: int) -> str:
    by_name = {s.name: s for s in all_sides}
    eager, compiled = by_name.get("torch eager"), by_name.get("torch.compile (model)")
    eager_ms, compiled_ms = eager.step_ms if eager else NAN, compiled.step_ms if compiled else NAN
    lines = [f"| side | step (ms, median after {warmup} warm-up) | images/s | speed vs torch eager | "
             "speed vs torch.compile | first / second step (s) | peak memory (GiB) | kernels | loss after last step | "
             "note |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in all_sides:
        ms = s.step_ms
        rate = f"{images / ms * 1e3:,.1f}" if ms == ms else "n/a"
        step = f"{ms:.2f}" if ms == ms else "n/a"
        memory = f"{s.peak_bytes / 2**30:.2f}" if s.peak_bytes is not None else "n/a"
        last = f"{s.losses[-1]:.5f}" if s.losses else "n/a"
        note = s.error or loss_note(s, eager)
        lines.append(f"| {s.name} | {step} | {rate} | {ratio(eager_ms, ms)} | {ratio(compiled_ms, ms)} | "
                     f"{seconds(s, 0)} / {seconds(s, 1)} | {memory} | {s.kernels or 'n/a'} | {last} | "
                     f"{note.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


def model_title(case: Case) -> str:
    if case.model == "unet":
        return f"UNet (base {case.unet_base}, 4 levels)"
    if (case.resnet_width, case.resnet_layers) == (64, (3, 4, 6, 3)):
        return "ResNet-50"
    return f"ResNet-50's design with width {case.resnet_width} and blocks {list(case.resnet_layers)}"


def case_title(case: Case, steps: int) -> str:
    model = model_title(case)
    precision = "float32" if case.dtype == "fp32" else "bf16 autocast"
    return (f"### {model}, batch {case.batch}x3x{case.image}x{case.image}, {case.classes} classes, {case.fmt}, "
            f"{precision}, SGD(lr {case.lr}, momentum 0.9, weight decay 1e-4), {steps} steps")


def initial_weights(case: Case) -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    model = build_model(torch, case)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def run_case(case: Case, args: argparse.Namespace, weights: dict[str, np.ndarray]) -> str:
    batches = sample_batches(case, args.steps)
    all_sides = sides(case, weights, args.sides)
    for side in all_sides:
        run_side(side, case, batches, args.warmup)
        free_memory(side.library, case.device)
        print(f"{case.model} {case.fmt} {case.dtype} {side.name}: {side.step_ms:.2f} ms/step"
              f"{'; ' + side.error if side.error else ''}", flush=True)
    width = max(len(s.name) for s in all_sides)
    lines = [case_title(case, args.steps), "", "```"]
    lines += [f"losses  {s.name:<{width}}: " + " ".join(f"{v:.5f}" for v in s.losses) for s in all_sides]
    lines += ["```", "", step_table(all_sides, args.warmup, case.batch)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- convolutions

@dataclass(frozen=True)
class ConvShape:
    batch: int
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    padding: int
    height: int
    width: int

    def label(self) -> str:
        return (f"{self.in_channels}->{self.out_channels} k{self.kernel} s{self.stride} p{self.padding} "
                f"{self.height}x{self.width}")


def resnet_convs(case: Case) -> Counter:
    """Every distinct convolution of the case's ResNet on its input, with how often it occurs."""
    batch, image = case.batch, case.image
    with torch.device("meta"):
        model = build_model(torch, case)
    found: Counter = Counter()

    def record(module, inputs, _output):
        _, channels, height, width = inputs[0].shape
        found[ConvShape(batch, channels, module.out_channels, module.kernel_size[0], module.stride[0],
                        module.padding[0], height, width)] += 1

    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(record)
    with torch.no_grad():
        model(torch.empty(batch, 3, image, image, device="meta"))
    return found


def conv_operands(library: types.ModuleType, shape: ConvShape, fmt: str, dtype: str, device: str):
    """(input, weight, output gradient) of ``shape`` in ``library`` from one seeded generator."""
    rng = np.random.default_rng(1)
    out_size = (shape.height + 2 * shape.padding - shape.kernel) // shape.stride + 1
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in
              ((shape.batch, shape.in_channels, shape.height, shape.width),
               (shape.out_channels, shape.in_channels, shape.kernel, shape.kernel),
               (shape.batch, shape.out_channels, out_size, out_size))]
    dt = library.float32 if dtype == "fp32" else library.bfloat16
    return [library.from_numpy(a).to(device=device, dtype=dt).to(memory_format=memory_format(library, fmt))
            for a in arrays]


def torch_conv_calls(shape: ConvShape, fmt: str, dtype: str, device: str) -> dict[str, Callable]:
    x, w, g = conv_operands(torch, shape, fmt, dtype, device)
    geometry = {"stride": shape.stride, "padding": shape.padding}
    return {"fwd": lambda: torch.nn.functional.conv2d(x, w, **geometry),
            "dgrad": lambda: torch.nn.grad.conv2d_input(x.shape, w, g, **geometry),
            "wgrad": lambda: torch.nn.grad.conv2d_weight(x, w.shape, g, **geometry)}


def tilewise_conv_calls(shape: ConvShape, fmt: str, dtype: str, device: str) -> tuple[dict, dict[str, float]]:
    """Forward, and each gradient alone through autograd (only the tensor differentiated requires grad, and the
    graph is kept so that every call times the backward alone); and the milliseconds of each one's first call."""
    sync = tw.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    x, w, g = conv_operands(tw, shape, fmt, dtype, device)
    conv = functools.partial(tw.nn.functional.conv2d, stride=shape.stride, padding=shape.padding)
    calls = {"fwd": lambda: conv(x, w)}
    first = {"fwd": wall_ms(calls["fwd"], sync)}
    x_grad, w_grad = x.detach().requires_grad_(), w.detach().requires_grad_()
    y_input, y_weight = conv(x_grad, w), conv(x, w_grad)
    calls["dgrad"] = lambda: tw.autograd.grad(y_input, x_grad, g, retain_graph=True)
    calls["wgrad"] = lambda: tw.autograd.grad(y_weight, w_grad, g, retain_graph=True)
    first.update({name: wall_ms(calls[name], sync) for name in ("dgrad", "wgrad")})
    return calls, first


def wall_ms(fn, sync) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def paired_wall_ms(torch_fn, tw_fn, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """(torch's, ours) on the CPU: medians of single calls' wall times, the two sides alternating."""
    for _ in range(warmup):
        torch_fn(), tw_fn()
    theirs, ours = [], []
    for _ in range(repeats):
        theirs.append(wall_ms(torch_fn, lambda: None))
        ours.append(wall_ms(tw_fn, lambda: None))
    return statistics.median(theirs), statistics.median(ours)


def paired(torch_fn, tw_fn, device: str, repeats: int) -> tuple[float, float]:
    if device.startswith("cuda"):
        from cuda_eager import paired_ms

        return paired_ms(torch_fn, tw_fn, repeats=repeats)
    return paired_wall_ms(torch_fn, tw_fn, repeats)


@dataclass
class ConvRow:
    shape: ConvShape
    count: int
    fmt: str
    dtype: str
    torch_ms: dict[str, float] = field(default_factory=dict)
    ours_ms: dict[str, float] = field(default_factory=dict)
    first_ms: dict[str, float] = field(default_factory=dict)
    error: str = ""


PASSES = ("fwd", "dgrad", "wgrad")


def measure_conv(row: ConvRow, device: str, repeats: int) -> None:
    theirs = torch_conv_calls(row.shape, row.fmt, row.dtype, device)
    if memory_format(tw, row.fmt) is None:
        row.error = NO_CHANNELS_LAST
        for name in PASSES:
            row.torch_ms[name] = torch_only_ms(theirs[name], device, repeats)
        return
    try:
        ours, row.first_ms = tilewise_conv_calls(row.shape, row.fmt, row.dtype, device)
        for name in PASSES:
            row.torch_ms[name], row.ours_ms[name] = paired(theirs[name], ours[name], device, repeats)
    except Exception as exc:  # noqa: BLE001 — a shape tilewise cannot run is reported, the others measured
        row.error = report_error(exc)


def torch_only_ms(fn, device: str, repeats: int) -> float:
    if device.startswith("cuda"):
        from cuda_eager import torch_ms

        return torch_ms(fn, repeats=repeats)
    return paired_wall_ms(fn, lambda: None, repeats)[0]


def conv_rows(case: Case, args: argparse.Namespace) -> list[ConvRow]:
    shapes = list(resnet_convs(case).items())[:args.conv_shapes]
    rows = []
    for fmt in args.formats:
        for dtype in args.dtypes:
            for shape, count in shapes:
                row = ConvRow(shape, count, fmt, dtype)
                measure_conv(row, args.device, args.conv_repeats)
                rows.append(row)
                print(f"conv {shape.label()} {fmt} {dtype}: "
                      + " ".join(f"{p} {row.ours_ms.get(p, NAN):.3f}/{row.torch_ms.get(p, NAN):.3f} ms"
                                 for p in PASSES) + (f"; {row.error}" if row.error else ""), flush=True)
    return rows


def ms_text(value: float | None) -> str:
    return f"{value:.3f}" if value is not None and value == value else "n/a"


def conv_table(rows: list[ConvRow]) -> str:
    lines = ["| convolution (in->out, kernel, stride, padding, input HxW) | count | format | dtype | "
             "fwd ours / torch (ms) | fwd speed vs torch | dgrad ours / torch (ms) | dgrad speed vs torch | "
             "wgrad ours / torch (ms) | wgrad speed vs torch | first call fwd / dgrad / wgrad (ms) | note |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        cells = []
        for name in PASSES:
            ours, theirs = row.ours_ms.get(name, NAN), row.torch_ms.get(name, NAN)
            cells += [f"{ms_text(ours)} / {ms_text(theirs)}", ratio(theirs, ours)]
        first = " / ".join(ms_text(row.first_ms.get(name)) for name in PASSES)
        lines.append(f"| {row.shape.label()} | {row.count} | {row.fmt} | {row.dtype} | {' | '.join(cells)} | {first} | "
                     f"{row.error.replace('|', chr(92) + '|')} |")
    lines += ["", "Whole network (each convolution times its count in the network):", "",
              "| format | dtype | fwd ours / torch (ms) | dgrad ours / torch (ms) | wgrad ours / torch (ms) | "
              "all three, speed vs torch |", "|---|---|---:|---:|---:|---:|"]
    for fmt, dtype in dict.fromkeys((row.fmt, row.dtype) for row in rows):
        group = [row for row in rows if (row.fmt, row.dtype) == (fmt, dtype)]
        ours = {p: sum(r.count * r.ours_ms.get(p, NAN) for r in group) for p in PASSES}
        theirs = {p: sum(r.count * r.torch_ms.get(p, NAN) for r in group) for p in PASSES}
        lines.append(f"| {fmt} | {dtype} | " + " | ".join(f"{ms_text(ours[p])} / {ms_text(theirs[p])}" for p in PASSES)
                     + f" | {ratio(sum(theirs.values()), sum(ours.values()))} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main

def comma_list(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if item not in choices]
        if unknown or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(choices)}")
        return items

    return parse


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if tw.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true",
                        help="narrow models, tiny batches, 3 steps, 2 convolution shapes (the other flags still apply)")
    parser.add_argument("--model", type=comma_list(MODELS), default=list(MODELS), help="resnet50, unet or both")
    parser.add_argument("--batch", type=int, help="batch size (default: 64 for ResNet-50, 16 for the UNet)")
    parser.add_argument("--image", type=int, help="image side (default: 224 for ResNet-50, 128 for the UNet)")
    parser.add_argument("--classes", type=int, help="classes (default: 1000 for ResNet-50, 21 for the UNet)")
    parser.add_argument("--unet-base", type=int, default=32, help="the UNet's first width (doubling over 4 levels)")
    parser.add_argument("--resnet-width", type=int, default=64, help="ResNet's first stage width (ResNet-50: 64)")
    parser.add_argument("--resnet-layers", type=lambda text: tuple(int(n) for n in text.split(",")),
                        default=(3, 4, 6, 3), help="Bottleneck blocks per stage (ResNet-50: 3,4,6,3)")
    parser.add_argument("--formats", type=comma_list(FORMATS), default=list(FORMATS))
    parser.add_argument("--dtypes", type=comma_list(DTYPES), default=list(DTYPES),
                        help="fp32, and bf16 (autocast in the training step, bf16 tensors in the convolution table)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--sides", type=comma_list(SIDES), default=list(SIDES), help="which sides to run")
    parser.add_argument("--no-torch-compile", action="store_true", help="leave out torch.compile (it compiles slowly)")
    parser.add_argument("--convs", action=argparse.BooleanOptionalAction, default=True,
                        help="time every distinct ResNet-50 convolution alone")
    parser.add_argument("--no-steps", action="store_true", help="only the convolution table")
    parser.add_argument("--conv-repeats", type=int, default=15, help="timed repetitions per convolution and side")
    parser.add_argument("--conv-shapes", type=int, help="only the first this many convolution shapes")
    parser.add_argument("--append", help="append the result to this markdown file")
    if parser.parse_known_args()[0].quick:
        parser.set_defaults(**QUICK)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.no_torch_compile and "torch-compile" in args.sides:
        args.sides.remove("torch-compile")
    return args


def case_for(model: str, fmt: str, dtype: str, args: argparse.Namespace) -> Case:
    sizes = (QUICK_SIZES if args.quick else SIZES)[model]
    return Case(model, args.batch or sizes["batch"], args.image or sizes["image"], args.classes or sizes["classes"],
                fmt, dtype, args.device, args.lr, args.unet_base, args.resnet_width, args.resnet_layers)


def main() -> None:
    args = parse_args()
    heading = (f"## Vision training step — `benchmarks/vision_train_step.py` ({datetime.date.today()}, {args.device}, "
               f"tilewise {tw.__version__}, torch {torch.__version__})")
    sections = [heading]
    if not args.no_steps:
        for model in args.model:
            weights = initial_weights(case_for(model, "contiguous", "fp32", args))
            for fmt in args.formats:
                for dtype in args.dtypes:
                    sections.append(run_case(case_for(model, fmt, dtype, args), args, weights))
    if args.convs:
        case = case_for("resnet50", "contiguous", "fp32", args)
        sections.append(f"### {model_title(case)}: its convolutions alone, batch {case.batch}, image "
                        f"{case.image}x{case.image}\n\n" + conv_table(conv_rows(case, args)))
    text = "\n\n".join(sections) + "\n"
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
