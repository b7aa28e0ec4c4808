"""searchsorted, nonzero, repeat_interleave, randperm and multinomial on CUDA, tilewise beside torch in one process:
median of 20 timed calls after 3 warm-ups, host-synchronised per call (these ops read a count back or are short, so
per-call wall time is what a user sees). "speed" is torch's time over ours: above 1 means tilewise is faster.

    python benchmarks/cuda_search.py
"""
import statistics
import time

import numpy as np
import torch

import tilewise as tw


def timed(fn, sync, reps=20):
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def both(name, ours, theirs):
    a = timed(ours, tw.cuda.synchronize)
    b = timed(theirs, torch.cuda.synchronize)
    print(f"{name:58s} tilewise {a:9.1f} us   torch {b:9.1f} us   speed {b / a:5.2f}x", flush=True)


rng = np.random.default_rng(0)


def pair(a):
    return tw.from_numpy(a).cuda(), torch.from_numpy(a).cuda()


seq, tseq = pair(np.sort(rng.standard_normal(1 << 20).astype(np.float32)))
val, tval = pair(rng.standard_normal(1 << 20).astype(np.float32))
both("searchsorted 1M values in 1M sorted (f32)", lambda: tw.searchsorted(seq, val),
     lambda: torch.searchsorted(tseq, tval))
rows, trows = pair(np.sort(rng.standard_normal((1024, 1024)).astype(np.float32), -1))
rv, trv = pair(rng.standard_normal((1024, 64)).astype(np.float32))
both("searchsorted rows (1024, 1024), values (1024, 64)", lambda: tw.searchsorted(rows, rv, right=True),
     lambda: torch.searchsorted(trows, trv, right=True))
order, torder = pair(np.argsort(rng.random(1 << 20)))
both("searchsorted 1M values, sorter (1M)", lambda: tw.searchsorted(seq, val, sorter=order),
     lambda: torch.searchsorted(tseq, tval, sorter=torder))

for n, density in ((1 << 24, 0.1), (1 << 20, 0.5), (4096, 0.5)):
    x, tx = pair((rng.random(n) < density).astype(np.float32))
    both(f"nonzero {n} f32, density {density}", x.nonzero, tx.nonzero)
x2, tx2 = pair((rng.random((4096, 4096)) < 0.05).astype(np.float32))
both("nonzero (4096, 4096) f32, density 0.05", lambda: x2.nonzero(), lambda: tx2.nonzero())

for n in (1 << 20, 1000):
    r, tr = pair(rng.integers(0, 5, n))
    both(f"repeat_interleave(repeats) n={n}", lambda r=r: tw.repeat_interleave(r),
         lambda tr=tr: torch.repeat_interleave(tr))
emb, temb = pair(rng.standard_normal((4096, 256)).astype(np.float32))
rr, trr = pair(rng.integers(0, 4, 4096))
both("x.repeat_interleave(repeats, dim=0), x (4096, 256)", lambda: emb.repeat_interleave(rr, dim=0),
     lambda: temb.repeat_interleave(trr, dim=0))

for n in (1000, 1 << 20, 1 << 24):
    both(f"randperm {n}", lambda n=n: tw.randperm(n, device="cuda"), lambda n=n: torch.randperm(n, device="cuda"))

for shape, samples, replacement in (((64, 50304), 1, True), ((64, 50304), 16, False), ((1, 1000), 100000, True),
                                    ((1024, 100), 10, True), ((1024, 100), 10, False)):
    p, tp = pair(rng.random(shape).astype(np.float32))
    both(f"multinomial {shape} samples={samples} replacement={replacement}",
         lambda p=p, k=samples, r=replacement: tw.multinomial(p, k, r),
         lambda tp=tp, k=samples, r=replacement: torch.multinomial(tp, k, r))
