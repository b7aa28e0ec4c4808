"""The ``tilewise`` command line (also ``python -m tilewise``): ``demo``, ``info``, ``explain``, ``report``,
``coverage``, ``bench``.

``demo`` is the main job: it trains the character-level GPT of ``tilewise.models`` and reports as it goes.
``explain`` follows one call through every layer (``tilewise.profiler.explain``), ``report`` draws the same
call as one HTML page (``tilewise.profiler.report``); ``bench`` says where the
benchmark scripts are (they need torch, which tilewise itself never imports).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import inspect
import platform
import re
import sys
from pathlib import Path

_DEMO_EXTRA = "pip install -e \".[demo]\""


def _positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return n


def build_parser() -> argparse.ArgumentParser:
    from tilewise.models.demo import MODEL_SIZES, DemoSettings

    defaults = DemoSettings()
    parser = argparse.ArgumentParser(prog="tilewise", description="tilewise: a deep-learning framework and compiler "
                                     "with PyTorch's API that shows every layer down to SASS.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = commands.add_parser("demo", help="train a character-level GPT on the King James Bible and sample from it",
                               description="Train a small GPT on a public-domain text shipped with tilewise, compare "
                               "it with a unigram baseline, print a sample and write a loss-curve PNG.")
    demo.add_argument("--steps", type=_positive, default=defaults.steps, help="training steps (default: %(default)s)")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available, else cpu)")
    demo.add_argument("--model-size", choices=sorted(MODEL_SIZES, key=list(MODEL_SIZES).index),
                      default=defaults.model_size, help="model preset (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=defaults.seed, help="random seed (default: %(default)s)")
    demo.add_argument("--out", type=Path, default=defaults.out,
                      help="folder for the loss curve and the checkpoint (default: ./%(default)s)")
    demo.add_argument("--batch-size", type=_positive, default=defaults.batch_size,
                      help="sequences per step (default: %(default)s)")
    demo.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate (default: %(default)s)")
    demo.add_argument("--time-limit", type=float, default=defaults.time_limit,
                      help="stop training early after this many seconds, 0 for no limit (default: %(default)s)")
    commands.add_parser("info", help="versions, devices and optional packages")
    coverage = commands.add_parser(
        "coverage", help="which of torch's public names tilewise has, and which its tests compare with torch",
        description="Count, namespace by namespace, the public torch names that training code uses which tilewise "
        "has and which a torch-comparing test refers to; write the whole list as Markdown.")
    coverage.add_argument("--out", type=Path, default=None,
                          help="Markdown report to write (default: docs/COVERAGE.md in a source checkout, "
                          "none in an installed copy)")
    explain = commands.add_parser(
        "explain", help="follow one call through every layer, down to the generated source, PTX and SASS",
        description="Show what each layer makes of a call: the operators' declarations, the graph after every "
        "compiler pass, the fused kernels' IR, schedule and source, PTX and SASS for the CUDA target (NVRTC and "
        "nvdisasm, no GPU needed), then each program step timed and placed on the device's roofline. "
        + EXPLAIN_FORMS)
    explain.add_argument("what", nargs="?", default="x.relu() * 0.5 + 1", metavar="EXPR | SCRIPT.py:FUNCTION",
                         help="a Python expression over x, y, z, w (tw and F are tilewise and its nn.functional), or "
                         "a function of a script whose ARGS give the call's arguments (default: %(default)s)")
    explain.add_argument("--shape", action="append", type=_shape, default=None,
                         help="expression form: shape of the next input, e.g. 1024x1024 (repeat for y, z, w; "
                         "default: 1024x1024)")
    explain.add_argument("--dtype", default="float32", help="expression form: input dtype (default: %(default)s)")
    explain.add_argument("--device", default="cpu",
                         help="expression form: where the inputs live and the run happens (default: cpu)")
    explain.add_argument("--target", choices=("c", "cuda"), default=None,
                         help="code to generate (default: the device's; cuda works without a GPU up to SASS)")
    explain.add_argument("--arch", type=_arch, default=None,
                         help="CUDA architecture of the PTX and SASS shown, e.g. sm_90 or sm_100 (implies "
                         "--target cuda; default: the current GPU's, else sm_90)")
    explain.add_argument("--repeats", type=_positive, default=20, help="timed calls (default: %(default)s)")
    explain.add_argument("--no-run", action="store_true", help="stop before running (no device needed)")
    explain.set_defaults(parser=explain)
    report = commands.add_parser(
        "report", help="one self-contained HTML page of a compiled call: passes, kernels, roofline, timeline, memory",
        description="Write what explain shows as one HTML page that opens offline: the graph after each pass with "
        "what it changed, the fused graph, every kernel's IR, schedule and source (PTX and SASS side by side for "
        "the CUDA target), a roofline chart, a timeline of the steps and each program's memory plan. "
        + REPORT_FORMS)
    report.add_argument("what", metavar="SCRIPT.py:FUNCTION",
                        help="a function of a script whose ARGS give the call's arguments")
    report.add_argument("--out", type=Path, default=Path("report.html"), help="the page (default: %(default)s)")
    report.add_argument("--target", choices=("c", "cuda"), default=None,
                        help="code to generate (default: the arguments' device's; cuda works without a GPU)")
    report.add_argument("--arch", type=_arch, default=None,
                        help="CUDA architecture of the PTX and SASS, e.g. sm_90 (implies --target cuda)")
    report.add_argument("--repeats", type=_positive, default=20, help="timed calls (default: %(default)s)")
    report.add_argument("--no-run", action="store_true", help="stop before running (no device needed)")
    report.set_defaults(parser=report)
    commands.add_parser("bench", help="where the benchmarks against PyTorch are")
    return parser


def _arch(text: str) -> str:
    from tilewise.codegen.toolchain.nvrtc import validate_arch

    try:
        validate_arch(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(n) for n in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 1024x1024, got {text!r}") from None
    if any(n < 0 for n in shape):
        raise argparse.ArgumentTypeError(f"expected non-negative sizes, got {text!r}")
    return shape


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        return run_demo(args)
    if args.command == "info":
        return run_info()
    if args.command == "explain":
        return run_explain(args)
    if args.command == "report":
        return run_report(args)
    if args.command == "coverage":
        return run_coverage(args)
    print("tilewise bench: the benchmarks against torch eager and torch.compile are scripts in the source tree's "
          "benchmarks/ folder (they need torch): python benchmarks/compiled_cpu.py on a CPU, "
          "bash benchmarks/run_gpu.sh LOGDIR on a GPU; benchmarks/RESULTS.md holds every recorded run. "
          "Nothing was run.", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------- coverage

def run_coverage(args: argparse.Namespace) -> int:
    from tilewise.coverage import default_tests_folder, run

    tests = default_tests_folder()
    out = args.out if args.out is not None else (tests.parent / "docs" / "COVERAGE.md" if tests else None)
    return run(out, tests)


# ---------------------------------------------------------------------------- explain

EXPLAIN_FORMS = ("Accepted forms: tilewise explain \"EXPR\" [--shape 64x64 ...] (a Python expression over inputs x, "
                 "y, z, w, one --shape each; tw and F are tilewise and tilewise.nn.functional), or tilewise explain "
                 "path/to/script.py:function (the script defines ARGS, a tuple of the call's arguments, or a "
                 "function ARGS() returning one).")
INPUT_NAMES = ("x", "y", "z", "w")
_SCRIPT_FORM = re.compile(r"^(?P<path>.+\.py):(?P<function>[A-Za-z_]\w*)$")


class ExplainInputError(ValueError):
    """What the user asked ``tilewise explain`` to explain is not something it can run."""


def run_explain(args: argparse.Namespace) -> int:
    import tilewise as tw

    try:
        fn, inputs, name = _explained_call(args)
    except ExplainInputError as exc:
        args.parser.error(f"{exc}\n{EXPLAIN_FORMS}")
    explanation = tw.explain(fn, *inputs, target=args.target, arch=args.arch, repeats=args.repeats,
                             run=not args.no_run, name=name)
    print(explanation, flush=True)
    return 0


def _explained_call(args: argparse.Namespace) -> tuple:
    """(function, its arguments, how the call is named) for the script form or the expression form."""
    script = _SCRIPT_FORM.match(args.what)
    if script is not None or args.what.endswith(".py") or ".py:" in args.what:
        if script is None:
            raise ExplainInputError(f"{args.what!r}: name the function after the script, as in "
                                    f"{args.what.split(':')[0]}:train_step")
        return (*_script_call(Path(script["path"]), script["function"]), None)
    shapes = args.shape or [(1024, 1024)]
    return (*_expression_call(args.what, shapes, args.dtype, args.device), args.what)


def _script_call(path: Path, function: str) -> tuple:
    import importlib.util

    if not path.is_file():
        raise ExplainInputError(f"no script {str(path)!r}" + (" (it is a folder)" if path.is_dir() else ""))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # the script imports its neighbours as `python script.py` would
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isfunction(v) and v.__module__ == module.__name__)
        what = "is not a function" if fn is not None else "has no function"
        raise ExplainInputError(f"{path} {what} {function!r}; its functions: {', '.join(defined) or 'none'}")
    if not hasattr(module, "ARGS"):
        raise ExplainInputError(f"{path} defines no ARGS: add ARGS = (...), the arguments to call {function} with, "
                                "or def ARGS(): return (...)")
    call_args = module.ARGS() if callable(module.ARGS) else module.ARGS
    if not isinstance(call_args, tuple):
        raise ExplainInputError(f"{path}: ARGS{'()' if callable(module.ARGS) else ''} is a "
                                f"{type(call_args).__name__}; it must be a tuple of {function}'s arguments")
    return fn, call_args


def _expression_call(expr: str, shapes: list, dtype: str, device: str) -> tuple:
    import tilewise as tw

    if not 1 <= len(shapes) <= len(INPUT_NAMES):
        raise ExplainInputError(f"give 1 to {len(INPUT_NAMES)} input shapes, got {len(shapes)}")
    names = INPUT_NAMES[:len(shapes)]
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        caret = " " * max(0, (exc.offset or 1) - 1) + "^"
        raise ExplainInputError(f"the expression does not parse ({exc.msg}):\n  {expr}\n  {caret}") from None
    known = {*names, "tw", "F", *dir(builtins)}
    unknown = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in known})
    if unknown:
        inputs = [n for n in unknown if n in INPUT_NAMES]
        hint = (f" ({', '.join(inputs)}: give one --shape per input)" if inputs else "")
        raise ExplainInputError(f"the expression uses unknown name(s) {', '.join(unknown)}{hint}; it may use "
                                f"{', '.join(names)}, tw and F")
    if not hasattr(tw, dtype) or not isinstance(getattr(tw, dtype), tw.dtype):
        raise ExplainInputError(f"unknown dtype {dtype!r}; e.g. float32, float16, bfloat16, float64")
    scope = {"tw": tw, "F": tw.nn.functional}
    fn = eval(f"lambda {', '.join(names)}: {expr}", scope)  # noqa: S307 — the user's own expression, as python -c
    tw.manual_seed(0)
    return fn, tuple(tw.randn(*s, dtype=getattr(tw, dtype), device=device) for s in shapes)


# ---------------------------------------------------------------------------- report

REPORT_FORMS = ("Accepted form: tilewise report path/to/script.py:function [--out report.html] (the script defines "
                "ARGS, a tuple of the call's arguments, or a function ARGS() returning one).")


def run_report(args: argparse.Namespace) -> int:
    import tilewise as tw

    if args.out.is_dir():
        args.parser.error(f"--out {str(args.out)!r} is a folder; name the page, as in {args.out / 'report.html'}")
    if not args.out.parent.is_dir():
        args.parser.error(f"--out {str(args.out)!r}: no folder {str(args.out.parent)!r} to write it in")
    try:
        fn, inputs = _reported_call(args.what)
    except ExplainInputError as exc:
        args.parser.error(f"{exc}\n{REPORT_FORMS}")
    path = tw.report(fn, *inputs, out=args.out, target=args.target, arch=args.arch, repeats=args.repeats,
                     run=not args.no_run)
    print(f"tilewise report: wrote {path} ({path.stat().st_size / 1e3:.0f} kB)", flush=True)
    return 0


def _reported_call(what: str) -> tuple:
    """(function, its arguments) of the script form, the one form ``report`` takes."""
    script = _SCRIPT_FORM.match(what)
    if script is None:
        hint = f"; name the function after the script, as in {what.split(':')[0]}:train_step" \
            if what.endswith(".py") or ".py:" in what else ""
        raise ExplainInputError(f"{what!r} is not SCRIPT.py:FUNCTION{hint}")
    return _script_call(Path(script["path"]), script["function"])


# ---------------------------------------------------------------------------- demo

def run_demo(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
        import rich  # noqa: F401
    except ImportError as exc:
        print(f"tilewise demo needs the demo extra ({exc.name} is missing): {_DEMO_EXTRA}", file=sys.stderr)
        return 1
    from tilewise.models.demo import DemoSettings, run

    settings = DemoSettings(steps=args.steps, device=args.device, model_size=args.model_size, seed=args.seed,
                            out=args.out, batch_size=args.batch_size, lr=args.lr, time_limit=args.time_limit)
    settings.eval_every = max(1, min(settings.eval_every, settings.steps // 4 or 1))
    run(settings, DemoReport())
    return 0


class DemoReport:
    """Prints the demo's progress with rich: a header, a live progress bar, evaluation lines and a summary."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.progress = None

    def start(self, settings, config, n_params: int, n_chars: int, vocab: int, result) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        c = self.console
        c.print(f"[bold]tilewise demo[/bold] · character-level GPT on the King James Bible (Genesis, Exodus, Psalms, "
                f"Proverbs, Ecclesiastes, Matthew: {n_chars / 1000:.0f} K characters, {vocab} distinct)")
        shape = f"{_count(config.n_layer, 'layer')}, {_count(config.n_head, 'head')}"
        c.print(f"device [bold]{result.device}[/bold] · model {settings.model_size}: {shape}, width {config.n_embd}, "
                f"context {config.block_size} · {n_params / 1e6:.3f} M parameters · "
                f"batch {settings.batch_size} × {config.block_size} tokens · seed {settings.seed}")
        if result.cpu_tuning:
            c.print(f"cpu process settings: {', '.join(result.cpu_tuning)} (see tilewise.models.demo.tune_cpu_process)")
        c.print(f"unigram baseline on validation text: [bold]{result.unigram_baseline:.3f}[/bold] nats/char")
        columns = (TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
                   TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tps]:,.0f} tokens/s"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        self.progress = Progress(*columns, console=c)
        self.progress.start()
        self.task = self.progress.add_task("train", total=settings.steps, loss=float("nan"), tps=0.0)
        self.requested_steps, self.time_limit = settings.steps, settings.time_limit

    def step(self, step: int, loss: float, tokens_per_second: float) -> None:
        self.progress.update(self.task, completed=step, loss=loss, tps=tokens_per_second)

    def evaluated(self, step: int, train_loss: float, val_loss: float) -> None:
        self.progress.console.print(f"step {step:5d} · train loss {train_loss:.3f} · validation loss {val_loss:.3f}")

    def finish(self, result) -> None:
        self.progress.stop()
        c = self.console
        first, last = result.train_losses[0], result.final_val_loss
        gap = result.unigram_baseline - last
        verdict = "below" if gap > 0 else "NOT below"
        if result.steps < self.requested_steps:
            c.print(f"stopped after {result.steps} of {self.requested_steps} steps: the time limit of "
                    f"{self.time_limit:.0f} s was reached (--time-limit 0 trains every step)")
        c.print(f"trained {result.steps} steps in {result.seconds:.1f} s · {result.tokens_per_second:,.0f} tokens/s on "
                f"{result.device}")
        c.print(f"train loss: first step {first:.3f} → last step {result.train_losses[-1]:.3f}")
        c.print(f"[bold]validation loss {last:.3f} nats/char vs unigram baseline {result.unigram_baseline:.3f}[/bold] "
                f"({abs(gap):.3f} {verdict} the baseline)")
        c.print("[bold]sample[/bold] (temperature 0.8):")
        c.print(result.sample, markup=False)
        c.print(f"loss curve: {result.plot_path}")
        c.print(f"checkpoint: {result.checkpoint_path.resolve()}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


# ---------------------------------------------------------------------------- info

def run_info() -> int:
    import numpy as np

    import tilewise as tw
    from tilewise.models.demo import best_device
    from tilewise.ops.registry import OPS

    print(f"tilewise {tw.__version__} · Python {platform.python_version()} · numpy {np.__version__} · "
          f"{platform.system()} {platform.machine()}")
    print(f"operators declared: {len(OPS)} · default dtype: {tw.get_default_dtype().name}")
    device = best_device()
    print(f"best device: {device}" + (f" ({_gpu_name()})" if device == "cuda" else ""))
    _print_rooflines(["cpu"] + ([f"cuda:{k}" for k in range(tw.cuda.device_count())] if device == "cuda" else []))
    for name in ("ml_dtypes", "safetensors", "rich", "matplotlib", "cuda-bindings", "nvmath-python"):
        print(f"  {name:<14} {_version_of(name)}")
    return 0


def _print_rooflines(devices: list[str]) -> None:
    """Each device's measured roofline, next to its name and memory (measured on first use, then cached)."""
    from tilewise.profiler.roofline import cached_roofline, roofline

    for device in devices:
        roof = cached_roofline(device)
        if roof is None:
            print(f"  measuring the roofline of {device} (first use: a few seconds; later calls read the cache)...",
                  flush=True)
            roof = roofline(device)
        peaks = ", ".join(f"{dtype} {gflops:,.1f}" for dtype, gflops in roof.peak_gflops.items())
        print(f"{device}: {roof.name}, {_memory_of(device)} · copy {roof.copy_gbs:,.1f} GB/s · peak GFLOP/s {peaks}"
              f" · ridge {roof.ridge('float32'):.2f} FLOP/B (float32)")


def _memory_of(device: str) -> str:
    if device == "cpu":
        import os

        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return "memory unknown"
        return f"{total / 2**30:.1f} GiB memory"
    from tilewise import cuda

    return f"{cuda.get_device_properties(device).total_memory / 2**30:.1f} GiB memory"


def _gpu_name() -> str:
    from tilewise import cuda

    return f"{cuda.get_device_name()}, {cuda.device_count()} visible"


def _version_of(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    sys.exit(main())
