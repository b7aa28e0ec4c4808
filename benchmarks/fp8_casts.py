"""The FP8 casts of FP8 training alone, tilewise beside torch in one process, as device time and TB/s.

``Float8Linear`` casts each operand to FP8 once as it is and once transposed (the backward GEMMs' layout), in
one kernel (``[Note: transposing tiles]``). Timed here on a bfloat16 tensor of ``--shape`` (default 8192 x 3072,
25M elements: GPT-2's MLP activation over 8192 tokens), each compiled by ``tw.compile``:

* **cast both ways**: ``(x.float() * scale).clamp(-448, 448).to(e4m3)`` and its transpose made contiguous, the
  scale given (bytes: 2 read, 1 + 1 written per element);
* **amax + cast both ways**: the same with the scale from the tensor's own amax (current scaling: one more read);
* **fp8 transposing copy**: an e4m3 tensor made contiguous transposed (1 read, 1 written);
* **copy**: the same bytes as the cast both ways (half read, half written) copied, tilewise's and torch's: the
  bandwidth the GPU gives a copy, the roof the casts are compared with;
* torch: ``(x * s).to(float8_e4m3fn)`` and ``.t().contiguous()`` eagerly (torch's own numerics: the product
  rounded to bfloat16 first), and the exact tilewise formula through ``torch.compile`` where it works.

Device time per call: CUDA-event medians of calls queued behind a spin kernel, torch's and ours alternating
(``cuda_eager.paired_ms``). Each tilewise cast is checked bit for bit against torch.compile's, or torch eager's
formula in float32, before it is timed.

    python benchmarks/fp8_casts.py [--shape 8192,3072] [--repeats 15] [--tile-elements N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import tilewise as tw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_eager import paired_ms  # noqa: E402

E4M3_MAX = 448.0


def cast_both_ways(x, amax):
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(tw.float8_e4m3fn)
    return q, q.t().contiguous()


def amax_and_cast_both_ways(x):
    return cast_both_ways(x, x.abs().amax().float())


def torch_cast_both_ways(x, amax):
    """The same formula in torch (for torch.compile, and for the bit-for-bit check)."""
    scale = E4M3_MAX / amax.float().clamp(min=1e-12)
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, q.t().contiguous()


def torch_eager_cast(x, scale):
    """torch's idiom, as torchao's hand-written casts read: ``(x * s).to(e4m3)`` and its transpose."""
    q = (x * scale).to(torch.float8_e4m3fn)
    return q, q.t().contiguous()


def same_bits(ours, theirs) -> bool:
    return all(np.array_equal(o.cpu().view(tw.uint8).numpy(), t.cpu().view(torch.uint8).numpy())
               for o, t in zip(ours, theirs))


def row(name: str, ms: float, nbytes: int, roof: float) -> str:
    """A table row: microseconds per call, TB/s (bytes read and written once each), share of the copy's TB/s."""
    tbs = nbytes / (ms * 1e-3) / 1e12
    return f"| {name:<46} | {ms * 1e3:9.1f} | {tbs:6.2f} | {tbs / roof:7.1%} |"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192,3072")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tile-elements", type=int, default=0,
                   help="elements per thread of a tiled kernel (codegen.schedule.TILE_ELEMENTS), where it exists")
    args = p.parse_args(argv)
    if args.tile_elements:
        from tilewise.codegen import schedule

        if hasattr(schedule, "TILE_ELEMENTS"):
            schedule.TILE_ELEMENTS = args.tile_elements
        else:
            print("this tilewise has no TILE_ELEMENTS: --tile-elements ignored")
    rows, cols = (int(s) for s in args.shape.split(","))
    n = rows * cols
    print(f"{torch.cuda.get_device_name()}: bfloat16 [{rows}, {cols}] ({n / 1e6:.1f}M elements), "
          f"tilewise from {Path(tw.__file__).parent}")

    data = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32) * 3
    tx = torch.from_numpy(data).cuda().bfloat16()
    x = tw.from_numpy(data).cuda().bfloat16()
    amax_value = float(tx.abs().amax().float())
    tamax, amax = torch.tensor(amax_value, device="cuda"), tw.tensor(amax_value, device="cuda")
    tscale = (E4M3_MAX / tamax.clamp(min=1e-12)).float()

    ours_cast = tw.compile(cast_both_ways)
    ours_amax_cast = tw.compile(amax_and_cast_both_ways)
    q8 = ours_cast(x, amax)[0]
    tq8 = torch.from_numpy(q8.cpu().view(tw.uint8).numpy()).cuda().view(torch.float8_e4m3fn)
    ours_transpose = tw.compile(lambda q: q.t().contiguous())
    ours_copy = tw.compile(lambda b: b.clone())  # x's 2 bytes an element read and written: the cast's 4

    try:
        theirs_compiled = torch.compile(torch_cast_both_ways)
        reference = theirs_compiled(tx, tamax)
        compiled_note = "torch.compile"
    except Exception as exc:  # no Triton or no inductor here: the reference is torch eager in float32
        theirs_compiled = None
        reference = torch_cast_both_ways(tx, tamax)
        compiled_note = f"torch eager float32 (torch.compile failed: {type(exc).__name__})"
    print(f"cast both ways, bit for bit against {compiled_note}: {same_bits(ours_cast(x, amax), reference)}")
    print(f"amax + cast both ways, bit for bit: {same_bits(ours_amax_cast(x), reference)}")
    print(f"fp8 transposing copy, bit for bit: {same_bits([ours_transpose(q8)], [tq8.t().contiguous()])}")

    cast_bytes, transpose_bytes = 4 * n, 2 * n
    copy_torch, copy_ours = paired_ms(lambda: tx.clone(), lambda: ours_copy(x), repeats=args.repeats)
    roof = cast_bytes / (min(copy_torch, copy_ours) * 1e-3) / 1e12  # the better copy's TB/s
    lines = ["| kernel(s)                                      |   us/call |   TB/s | of copy |",
             "|------------------------------------------------|-----------|--------|---------|",
             row("copy of the same bytes, torch", copy_torch, cast_bytes, roof),
             row("copy of the same bytes, tilewise", copy_ours, cast_bytes, roof)]
    eager_theirs, ours = paired_ms(lambda: torch_eager_cast(tx, tscale), lambda: ours_cast(x, amax),
                                   repeats=args.repeats)
    lines.append(row("cast both ways, tilewise", ours, cast_bytes, roof))
    lines.append(row("cast both ways, torch eager (x * s).to(), .t()", eager_theirs, cast_bytes, roof))
    if theirs_compiled is not None:
        compiled_theirs, _ = paired_ms(lambda: theirs_compiled(tx, tamax), lambda: ours_cast(x, amax),
                                       repeats=args.repeats)
        lines.append(row("cast both ways, torch.compile", compiled_theirs, cast_bytes, roof))
    amax_theirs, amax_ours = paired_ms(lambda: torch_eager_cast(tx, (E4M3_MAX / tx.abs().amax().float())),
                                       lambda: ours_amax_cast(x), repeats=args.repeats)
    lines.append(row("amax + cast both ways, tilewise", amax_ours, cast_bytes + 2 * n, roof))
    lines.append(row("amax + cast both ways, torch eager", amax_theirs, cast_bytes + 2 * n, roof))
    t_theirs, t_ours = paired_ms(lambda: tq8.t().contiguous(), lambda: ours_transpose(q8), repeats=args.repeats)
    lines.append(row("fp8 transposing copy, tilewise", t_ours, transpose_bytes, roof))
    lines.append(row("fp8 transposing copy, torch", t_theirs, transpose_bytes, roof))
    print("\n".join(lines))
    print("(TB/s: the bytes each call must read and write, once each; of copy: that over the faster copy's TB/s)")


if __name__ == "__main__":
    main()
