"""The launcher: ``python -m tilewise.distributed.run`` starts one process per rank, as torchrun does.

[Note: launcher] The launcher takes torchrun's flags (``--nproc-per-node``, ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``, ``--standalone``, ``--rdzv-endpoint``, ``-m``) and starts
``nproc_per_node`` copies of the script with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID, ...), so that
``init_process_group()`` with its ``env://`` default finds the job; rank 0's process hosts the TCPStore at
MASTER_ADDR:MASTER_PORT. Rendezvous is static: nodes are numbered by ``--node-rank`` and there are no restarts
(``--max-restarts 0``). Every child gets NCCL_NVLS_ENABLE=0 unless the caller set it (NVLink multicast hangs
on the hosts this runs on).

A job never hangs on a dead rank: the launcher polls its children, and when one exits non-zero it stops the
others (SIGTERM, then SIGKILL after ``STOP_GRACE_SECONDS``), prints torch's ``ChildFailedError`` summary with
the failing rank's exit code and the traceback it wrote to stderr (each child's stderr passes through the
launcher, which keeps its last lines), and exits 1. Ctrl-C or SIGTERM to the launcher stops every child.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

STOP_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05
_KEPT_STDERR_LINES = 200


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilewise.distributed.run",
                                     description="Start a tilewise.distributed job (torchrun's flags).")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1",
                        help="processes per node: an integer, 'cpu' (one per core) or 'auto'")
    parser.add_argument("--nnodes", default="1", help="number of nodes (a fixed number: MIN:MAX must be equal)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's rank")
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1", help="rank 0's host")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500, help="rank 0's store port")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default="", help="host:port of the store")
    parser.add_argument("--rdzv-backend", "--rdzv_backend", default="static", help="accepted; rendezvous is static")
    parser.add_argument("--rdzv-id", "--rdzv_id", default="none", help="the job id (TORCHELASTIC_RUN_ID)")
    parser.add_argument("--standalone", action="store_true", help="one node, the store on a free local port")
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=0, help="only 0 is supported")
    parser.add_argument("--monitor-interval", "--monitor_interval", type=float, default=_POLL_SECONDS)
    parser.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    parser.add_argument("--no-python", "--no_python", action="store_true",
                        help="run the script as an executable, not through python")
    parser.add_argument("training_script", help="the script (or module with -m) each rank runs")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return parser


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _nproc(value: str) -> int:
    if value in ("cpu", "auto"):
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        raise SystemExit(f"error: --nproc-per-node must be an integer, 'cpu' or 'auto', got {value!r}") from None
    if count < 1:
        raise SystemExit(f"error: --nproc-per-node must be at least 1, got {count}")
    return count


def _nnodes(value: str) -> int:
    low, _, high = value.partition(":")
    if high and high != low:
        raise SystemExit(f"error: --nnodes {value}: elastic node ranges are not supported; give a fixed number")
    return int(low)


class JobConfig:
    """Everything the children's environments are computed from."""

    def __init__(self, args: argparse.Namespace):
        if args.max_restarts != 0:
            raise SystemExit(f"error: --max-restarts {args.max_restarts}: only 0 is supported (no elastic restarts)")
        self.nproc = _nproc(args.nproc_per_node)
        self.nnodes = 1 if args.standalone else _nnodes(args.nnodes)
        self.node_rank = 0 if args.standalone else args.node_rank
        if not 0 <= self.node_rank < self.nnodes:
            raise SystemExit(f"error: --node-rank {self.node_rank} must be in [0, {self.nnodes})")
        self.master_addr, self.master_port = args.master_addr, args.master_port
        if args.rdzv_endpoint:
            host, _, port = args.rdzv_endpoint.rpartition(":")
            self.master_addr, self.master_port = (host or args.rdzv_endpoint), int(port) if host else 29400
        self.run_id = args.rdzv_id
        if args.standalone:
            self.master_addr, self.master_port = "localhost", _free_port()
            self.run_id = str(uuid.uuid4())
        self.world_size = self.nproc * self.nnodes
        self.command = self._command(args)

    @staticmethod
    def _command(args: argparse.Namespace) -> list[str]:
        script_args = list(args.training_script_args)
        if args.no_python:
            return [args.training_script, *script_args]
        if args.module:
            return [sys.executable, "-m", args.training_script, *script_args]
        return [sys.executable, args.training_script, *script_args]

    def environment(self, local_rank: int) -> dict[str, str]:
        rank = self.node_rank * self.nproc + local_rank
        env = dict(os.environ)
        env.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(self.world_size),
                   LOCAL_WORLD_SIZE=str(self.nproc), GROUP_RANK=str(self.node_rank), GROUP_WORLD_SIZE=str(self.nnodes),
                   ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(self.world_size), ROLE_NAME="default",
                   MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port),
                   TORCHELASTIC_RUN_ID=self.run_id, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        if self.nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")
        return env


class Child:
    """One rank's process; its stderr passes through the launcher, which keeps the last lines."""

    def __init__(self, config: JobConfig, local_rank: int):
        self.local_rank = local_rank
        self.rank = config.node_rank * config.nproc + local_rank
        self.process = subprocess.Popen(config.command, env=config.environment(local_rank), stderr=subprocess.PIPE,
                                        start_new_session=True)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_KEPT_STDERR_LINES)
        self.exit_time: float | None = None
        self._relay = threading.Thread(target=self._relay_stderr, daemon=True)
        self._relay.start()

    def _relay_stderr(self) -> None:
        for raw in iter(self.process.stderr.readline, b""):
            line = raw.decode(errors="replace")
            self.stderr_tail.append(line)
            sys.stderr.write(line)
            sys.stderr.flush()

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.exit_time is None:
            self.exit_time = time.time()
        return code

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)  # the child's own session: its children are stopped too
        except ProcessLookupError:
            pass

    def finish_relay(self) -> None:
        self._relay.join(timeout=2.0)

    def traceback(self) -> str:
        """The last Python traceback the child wrote to stderr, else a note on how it ended."""
        lines = list(self.stderr_tail)
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        if starts:
            return "".join(lines[starts[-1]:]).rstrip("\n")
        code = self.process.returncode
        if code is not None and code < 0:
            return f"Signal {-code} ({signal.Signals(-code).name}) received by PID {self.process.pid}"
        return "".join(lines[-20:]).rstrip("\n") or "<no traceback: the process wrote nothing to stderr>"


def _stop(children: list[Child], grace: float) -> None:
    for child in children:
        if child.poll() is None:
            child.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(child.poll() is None for child in children):
        time.sleep(_POLL_SECONDS)
    for child in children:
        if child.poll() is None:
            child.signal(signal.SIGKILL)
            child.process.wait()
    for child in children:
        child.finish_relay()


def _failure_summary(script: str, failed: list[Child]) -> str:
    def entry(index: int, child: Child) -> str:
        when = datetime.datetime.fromtimestamp(child.exit_time or time.time()).strftime("%Y-%m-%d_%H:%M:%S")
        details = child.traceback().replace("\n", "\n    ")
        return (f"[{index}]:\n  time      : {when}\n  host      : {socket.gethostname()}\n"
                f"  rank      : {child.rank} (local_rank: {child.local_rank})\n"
                f"  exitcode  : {child.process.returncode} (pid: {child.process.pid})\n"
                f"  error_file: <N/A>\n  traceback :\n    {details}")

    bar, rule = "=" * 60, "-" * 60
    others = "\n".join(entry(i, c) for i, c in enumerate(failed[1:], start=1)) or "  <NO_OTHER_FAILURES>"
    return (f"ChildFailedError: \n{bar}\n{script} FAILED\n{rule}\nFailures:\n{others}\n{rule}\n"
            f"Root Cause (first observed failure):\n{entry(0, failed[0])}\n{bar}")


def launch(config: JobConfig, script: str, poll_seconds: float = _POLL_SECONDS) -> int:
    """Run the job to the end; returns the launcher's exit status (0, or 1 when a rank failed)."""
    children: list[Child] = []
    interrupted: list[int] = []

    def on_signal(signum, _frame) -> None:
        interrupted.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        children = [Child(config, local_rank) for local_rank in range(config.nproc)]
        failed: list[Child] = []
        while not interrupted:
            codes = [child.poll() for child in children]
            failed = sorted((c for c, code in zip(children, codes) if code not in (None, 0)),
                            key=lambda c: c.exit_time)
            if failed or all(code == 0 for code in codes):
                break
            time.sleep(poll_seconds)
        _stop(children, STOP_GRACE_SECONDS)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if interrupted or sys.exc_info()[0] is not None:
            _stop(children, STOP_GRACE_SECONDS)
    if interrupted:
        print(f"tilewise.distributed.run: received {signal.Signals(interrupted[0]).name}; stopped every rank",
              file=sys.stderr)
        return 128 + interrupted[0]
    if failed:
        print(_failure_summary(script, failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return launch(JobConfig(args), args.training_script, args.monitor_interval)


if __name__ == "__main__":
    sys.exit(main())
