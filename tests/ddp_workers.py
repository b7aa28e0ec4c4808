"""A small gloo job that stays up for a test module, and the DistributedDataParallel scenarios its ranks run.

``Cluster(world_size)`` spawns the ranks once (starting processes that import tilewise costs seconds on a busy
machine); ``cluster.run("scenario", *args)`` runs the module-level function ``scenario(rank, world_size, *args)``
on every rank and returns their results in rank order (numpy arrays and plain values). A rank that raises fails
the call with its traceback, and a call that outlives its timeout kills the job, so a test never hangs. The
scenarios import only tilewise and numpy, to keep the ranks light; torch stays in the test process.
"""

from __future__ import annotations

import datetime
import gc
import multiprocessing
import queue
import socket
import traceback

import numpy as np

BATCH = 4  # samples per rank per step
FEATURES = 6


# ---------------------------------------------------------------------------- the job

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, backend: str | None, port: int, requests, responses) -> None:
    import tilewise.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))
    while True:
        request = requests.get()
        if request is None:
            break
        name, args = request
        try:
            responses.put((rank, True, globals()[name](rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 (reported to the test)
            responses.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()
    gc.collect()  # the models the scenarios left in reference cycles hold the group's store: free it now


class Cluster:
    def __init__(self, world_size: int = 2, backend: str | None = "gloo") -> None:
        context = multiprocessing.get_context("spawn")
        self.world_size = world_size
        self.requests = [context.Queue() for _ in range(world_size)]
        self.responses = context.Queue()
        port = free_port()
        self.processes = [context.Process(target=_serve, args=(rank, world_size, backend, port, self.requests[rank],
                                                               self.responses), daemon=True)
                          for rank in range(world_size)]
        for process in self.processes:
            process.start()

    def run(self, name: str, *args, timeout: float = 60.0, expect_errors: bool = False) -> list:
        """Every rank's result (or, with ``expect_errors``, its traceback or its result)."""
        for requests in self.requests:
            requests.put((name, args))
        outcomes = {}
        try:
            while len(outcomes) < self.world_size:
                rank, ok, value = self.responses.get(timeout=timeout)
                outcomes[rank] = (ok, value)
        except queue.Empty:
            self.close()
            raise AssertionError(f"{name} timed out after {timeout}s; ranks done: {sorted(outcomes)}") from None
        if expect_errors:
            return [outcomes[rank][1] for rank in range(self.world_size)]
        failures = [f"rank {rank}:\n{value}" for rank, (ok, value) in sorted(outcomes.items()) if not ok]
        if failures:
            raise AssertionError("\n".join(failures))
        return [outcomes[rank][1] for rank in range(self.world_size)]

    def close(self) -> None:
        for requests, process in zip(self.requests, self.processes):
            if process.is_alive():
                requests.put(None)
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)


# ---------------------------------------------------------------------------- models and data (every process)

def global_batch(step: int, world_size: int, shape=(FEATURES,), classes: int = 3):
    """The step's inputs and targets for all ranks together; rank ``r`` reads rows ``r*BATCH:(r+1)*BATCH``."""
    rng = np.random.RandomState(100 + step)
    x = rng.standard_normal((world_size * BATCH, *shape)).astype(np.float32)
    y = rng.randint(0, classes, size=world_size * BATCH)
    return x, y


def shard(array: np.ndarray, rank: int) -> np.ndarray:
    return array[rank * BATCH:(rank + 1) * BATCH]


def mlp(seed: int):
    import tilewise as tw

    tw.manual_seed(seed)
    return tw.nn.Sequential(tw.nn.Linear(FEATURES, 16), tw.nn.Tanh(), tw.nn.Linear(16, 16), tw.nn.ReLU(),
                            tw.nn.Linear(16, 3))


def cnn(seed: int):
    import tilewise as tw

    tw.manual_seed(seed)
    return tw.nn.Sequential(tw.nn.Conv2d(2, 4, 3, padding=1), tw.nn.BatchNorm2d(4), tw.nn.ReLU(), tw.nn.Flatten(),
                            tw.nn.Linear(4 * 5 * 5, 3))


IMAGE = (2, 5, 5)


class TwoHeads:
    """Builds a module with a head that rank ``unused_on`` (or every rank, for -1) leaves out of the loss."""

    @staticmethod
    def build(seed: int, unused_on: int):
        import tilewise as tw

        class Net(tw.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = tw.nn.Linear(FEATURES, 8)
                self.head = tw.nn.Linear(8, 3)
                self.spare = tw.nn.Linear(8, 3)

            def forward(self, x, rank):
                h = self.body(x).tanh()
                return self.head(h) if unused_on in (-1, rank) else self.head(h) + self.spare(h)

        tw.manual_seed(seed)
        return Net()


def grads(module) -> list:
    return [None if p.grad is None else p.grad.cpu().numpy().copy() for p in module.parameters()]


def params(module) -> list:
    return [p.detach().cpu().numpy().copy() for p in module.parameters()]


def buffers(module) -> list:
    return [b.cpu().numpy().copy() for b in module.buffers()]


def device_of_rank(rank: int, device_type: str) -> str:
    """The rank's device: its own GPU (float32 matmuls and convolutions without TF32, as on the CPU)."""
    import tilewise as tw

    if device_type == "cpu":
        return "cpu"
    tw.backends.cuda.matmul.allow_tf32 = tw.backends.cudnn.allow_tf32 = False
    tw.cuda.set_device(rank)
    return f"cuda:{rank}"


# ---------------------------------------------------------------------------- scenarios (run on every rank)

def train(rank, world_size, model_name: str, steps: int, ddp_kwargs: dict, hook: str | None = None,
          micro_steps: int = 1, amp: bool = False, device_type: str = "cpu") -> list:
    """``steps`` SGD steps of a DDP-wrapped model, each ``micro_steps`` backward passes (all but the last under
    ``no_sync``); per step the loss, the averaged gradients, and after it the parameters and buffers. With
    ``amp`` the forward runs under bfloat16 autocast and the loss is scaled by a GradScaler (the gradients
    recorded are the unscaled ones). On ``device_type`` "cuda" each rank trains on its own GPU."""
    import tilewise as tw
    from tilewise.nn.parallel import DistributedDataParallel

    device = device_of_rank(rank, device_type)
    module = mlp(seed=rank) if model_name == "mlp" else cnn(seed=rank)  # DDP makes rank 0's the parameters
    module.to(device)
    if device != "cpu":
        ddp_kwargs = dict(ddp_kwargs, device_ids=[rank])
    model = DistributedDataParallel(module, **ddp_kwargs)
    if hook is not None:
        from tilewise.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, getattr(default_hooks, hook))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = tw.amp.GradScaler(device_type, enabled=amp)
    shape = (FEATURES,) if model_name == "mlp" else IMAGE
    record = [params(module)]
    for step in range(steps):
        opt.zero_grad()
        losses = []
        for micro in range(micro_steps):
            x, y = global_batch(step * micro_steps + micro, world_size, shape)
            sync = micro == micro_steps - 1
            with (model.no_sync() if not sync else _nothing()):
                with tw.autocast(device_type, dtype=tw.bfloat16, enabled=amp):
                    logits = model(tw.tensor(shard(x, rank), device=device))
                    loss = tw.nn.functional.cross_entropy(logits, tw.tensor(shard(y, rank), device=device))
                scaler.scale(loss).backward()
            losses.append(loss.item())
        scaler.unscale_(opt)
        record.append((losses, grads(module)))
        scaler.step(opt)
        scaler.update()
        record.append((params(module), buffers(module)))
    return record


class _nothing:  # noqa: N801 (a context manager's name)
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def unused_parameters(rank, world_size, find_unused: bool, unused_on: int, steps: int = 2) -> list:
    """Gradients after each step of a module with a head some ranks leave unused; the error text if a step
    fails."""
    import tilewise as tw
    from tilewise.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(TwoHeads.build(seed=0, unused_on=unused_on), find_unused_parameters=find_unused)
    out = []
    for step in range(steps):
        x, _ = global_batch(step, world_size)
        try:
            model(tw.tensor(shard(x, rank)), rank).sum().backward()
        except RuntimeError as error:
            out.append(("error", str(error)))
            break
        out.append(("grads", grads(model.module)))
    return out


def mismatched_models(rank, world_size, what: str) -> str:
    """Rank 0 wraps one linear layer, the others two (``what`` "count") or a wider one ("sizes"): the error each
    rank raises at construction."""
    import tilewise as tw
    from tilewise.nn.parallel import DistributedDataParallel

    if what == "count":
        module = tw.nn.Sequential(*[tw.nn.Linear(3, 3) for _ in range(1 + min(rank, 1))])
    else:
        module = tw.nn.Linear(3, 3 + min(rank, 1))
    try:
        DistributedDataParallel(module)
    except RuntimeError as error:
        return str(error)
    return "no error"


def sampler_shares(rank, world_size, n: int) -> list:
    from tilewise.utils.data import DistributedSampler

    return list(DistributedSampler(range(n), seed=3))


def compiled_train(rank, world_size, steps: int, device_type: str = "cpu", hook: str | None = None,
                   ddp_kwargs: dict | None = None) -> list:
    """``train``'s MLP steps with the whole step (forward, backward, optimizer) under ``tilewise.compile``."""
    import tilewise as tw
    from tilewise.nn.parallel import DistributedDataParallel

    device = device_of_rank(rank, device_type)
    module = mlp(seed=rank).to(device)
    model = DistributedDataParallel(module, device_ids=None if device == "cpu" else [rank], **(ddp_kwargs or {}))
    if hook is not None:
        from tilewise.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, getattr(default_hooks, hook))
    opt = tw.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    # without a hook the bucket all-reduces are nodes of the step's graph: one program, no break
    @tw.compile(fullgraph=hook is None)
    def step(x, y):
        opt.zero_grad()
        loss = tw.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    record = [params(module)]
    for k in range(steps):
        x, y = global_batch(k, world_size)
        losses = [step(tw.tensor(shard(x, rank), device=device), tw.tensor(shard(y, rank), device=device)).item()]
        record.append((losses, grads(module)))
        record.append((params(module), buffers(module)))
    return record


def destroy_with_a_live_graph(rank, world_size, steps: int = 4) -> dict:
    """A compiled DDP step over a group of its own, replayed from a CUDA graph that captured its NCCL all-reduce;
    the step is kept alive while the group is destroyed (as a training script ends), which must return: NCCL's
    ``ncclCommDestroy`` waits for every graph holding the communicator, so the graph is released first."""
    import threading

    import tilewise as tw
    import tilewise.distributed as dist
    from tilewise.nn.parallel import DistributedDataParallel

    group = dist.new_group([0, 1])
    device = device_of_rank(rank, "cuda")
    module = mlp(seed=0).to(device)
    model = DistributedDataParallel(module, device_ids=[rank], process_group=group)
    opt = tw.optim.SGD(model.parameters(), lr=0.1)

    @tw.compile
    def step(x, y):
        opt.zero_grad()
        loss = tw.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for k in range(steps):
        x, y = global_batch(k, world_size)
        step(tw.tensor(shard(x, rank), device=device), tw.tensor(shard(y, rank), device=device)).item()
    runtime = step.programs()[-1].runtime
    graphs = [g.graph for g in runtime.graphs.values()]
    done = threading.Event()
    worker = threading.Thread(target=lambda: (dist.destroy_process_group(group), done.set()), daemon=True)
    worker.start()
    worker.join(timeout=60)
    return {"replays": runtime.replays, "graphs": len(graphs), "destroyed": done.is_set(),
            "released": [g.released for g in graphs], "holds": [len(g.holds) for g in graphs]}
