"""sort / topk / cummax on CUDA, tilewise beside torch in one process (CUDA-event medians after warm-up).

    python benchmarks/cuda_sort.py
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cuda_eager import torch_ms, tw_ms  # noqa: E402

import tilewise as tw  # noqa: E402


def pair(shape, dtype: str, seed: int = 0):
    a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return torch.from_numpy(a).cuda().to(getattr(torch, dtype)), tw.from_numpy(a).cuda().to(tw.dtypes.from_name(dtype))


def same(ours, theirs) -> str:
    """Whether our values equal torch's (inputs are random normals, so there are no ties to order)."""
    got = [torch.from_numpy(o.float().cpu().numpy() if o.dtype == tw.bfloat16 else o.cpu().numpy()) for o in ours]
    ref = [r.float().cpu() if r.dtype == torch.bfloat16 else r.cpu() for r in theirs]
    return "values ok" if torch.equal(got[0].to(ref[0].dtype), ref[0]) else "VALUES DIFFER"


def case(label: str, t_fn, x_fn, inner: int = 5) -> None:
    check = same(x_fn(), t_fn())
    theirs = torch_ms(t_fn, inner=inner)
    ours = tw_ms(x_fn, inner=inner)
    print(f"{label:<40} {ours:>9.3f} {theirs:>9.3f} {theirs / ours:>7.2f}x  {check}", flush=True)


def main() -> None:
    props = tw.cuda.get_device_properties()
    print(f"device: {props.name} ({props.multi_processor_count} SMs); torch {torch.__version__}")
    print(f"{'case':<40} {'ours ms':>9} {'torch ms':>9} {'speed':>8}")
    for dtype in ("float32", "bfloat16"):
        for shape in ((64, 70000), (8, 1 << 20)):
            t, x = pair(shape, dtype)
            for k in (1, 4, 16, 256, 1024):
                case(f"topk k={k} {shape[0]}x{shape[1]} {dtype}", lambda t=t, k=k: t.topk(k),
                     lambda x=x, k=k: x.topk(k))
    for shape in ((4096, 1000), (64, 70000), (8, 1 << 20), (1, 1 << 22), (1, 1 << 24), (4096, 5000)):
        t, x = pair(shape, "float32", 1)
        case(f"sort {shape[0]}x{shape[1]} float32", lambda t=t: t.sort(), lambda x=x: x.sort())
    t, x = pair((64, 70000), "float32", 1)
    case("sort 64x70000 float32 descending", lambda: t.sort(descending=True), lambda: x.sort(descending=True))
    for dtype in ("bfloat16", "float64"):
        for shape in ((64, 70000), (8, 1 << 20)):
            t, x = pair(shape, dtype, 1)
            case(f"sort {shape[0]}x{shape[1]} {dtype}", lambda t=t: t.sort(), lambda x=x: x.sort())
    for dtype in ("int32", "int64"):  # values below 2**20: the high bytes of every key are equal
        a = np.random.default_rng(4).integers(0, 1 << 20, (64, 70000)).astype(dtype)
        t, x = torch.from_numpy(a).cuda(), tw.from_numpy(a).cuda()
        case(f"sort 64x70000 {dtype} (20-bit values)", lambda t=t: t.sort(), lambda x=x: x.sort())
    t, x = pair((64, 70000), "float32", 1)
    case("topk k=2048 64x70000 float32 (full sort)", lambda: t.topk(2048), lambda: x.topk(2048))
    t, x = pair((1, 1 << 24), "float32", 1)
    case("topk k=4096 1x16777216 float32", lambda: t.topk(4096), lambda: x.topk(4096))
    for shape in ((1, 1 << 22), (100000, 16), (64, 70000), (4096, 1000)):
        t, x = pair(shape, "float32", 2)
        inner = 1 if shape[0] == 1 else 5  # torch takes ~12 ms on one long row
        case(f"cummax {shape[0]}x{shape[1]} float32", lambda t=t: t.cummax(1), lambda x=x: x.cummax(1), inner)
    t, x = pair((1, 1 << 22), "bfloat16", 3)
    case("cummin 1x4194304 bfloat16", lambda: t.cummin(1), lambda: x.cummin(1), 1)


if __name__ == "__main__":
    main()
