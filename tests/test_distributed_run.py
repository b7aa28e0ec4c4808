"""The launcher, python -m tilewise.distributed.run: torchrun's environment, a failing rank stops the job."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from distributed_util import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(tmp_path, script: str, *flags: str, as_module: bool = False,
           timeout: float = 50.0) -> subprocess.CompletedProcess:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    env.pop("NCCL_NVLS_ENABLE", None)
    target = ["-m", "job"] if as_module else [str(path)]
    command = [sys.executable, "-m", "tilewise.distributed.run", *flags, *target, "arg1", "--flag"]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def test_every_rank_gets_torchruns_environment_and_joins_the_group(tmp_path):
    result = launch(tmp_path, """
        import os, sys
        import tilewise as tw, tilewise.distributed as dist
        dist.init_process_group("gloo")
        t = tw.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "NCCL_NVLS_ENABLE"]
        line = "|".join([os.environ[k] for k in keys] + [str(dist.is_torchelastic_launched()), str(t.item()),
                         " ".join(sys.argv[1:])])
        os.write(1, (line + "\\n").encode())  # one write: the ranks share the pipe
        dist.destroy_process_group()
    """, "--nproc-per-node", "2", "--standalone", as_module=True)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if "|" in line)
    assert lines == [f"{r}|{r}|2|2|0|localhost|0|True|3.0|arg1 --flag" for r in range(2)]


def test_a_failing_rank_stops_the_others_and_its_traceback_is_shown(tmp_path):
    started = time.monotonic()
    result = launch(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            raise ValueError("rank one fails on purpose")
        time.sleep(120)
    """, "--nproc_per_node=3", "--master-port", str(free_port()))
    assert time.monotonic() - started < 30  # ranks 0 and 2 were stopped, not waited for
    assert result.returncode == 1
    summary = result.stderr[result.stderr.index("ChildFailedError"):]
    assert "job.py FAILED" in summary and "<NO_OTHER_FAILURES>" in summary
    assert "rank      : 1 (local_rank: 1)" in summary and "exitcode  : 1" in summary
    assert "ValueError: rank one fails on purpose" in summary


def test_a_rank_killed_by_a_signal_is_reported(tmp_path):
    result = launch(tmp_path, """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """, "--nproc-per-node", "2", "--master-port", str(free_port()))
    assert result.returncode == 1
    assert "exitcode  : -9" in result.stderr and "Signal 9 (SIGKILL) received by PID" in result.stderr


def test_job_configuration_follows_torchruns_flags():
    from tilewise.distributed.run import JobConfig, _parser

    config = JobConfig(_parser().parse_args(["--nnodes", "2", "--node_rank", "1", "--nproc-per-node", "3",
                                             "--rdzv-endpoint", "node0:1234", "train.py", "--lr", "1"]))
    env = config.environment(local_rank=2)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["GROUP_RANK"]) == ("5", "2", "6", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["LOCAL_WORLD_SIZE"]) == ("node0", "1234", "3")
    assert config.command[-3:] == ["train.py", "--lr", "1"]
    with pytest.raises(SystemExit, match="only 0 is supported"):
        JobConfig(_parser().parse_args(["--max-restarts", "2", "train.py"]))
    with pytest.raises(SystemExit, match="node-rank 2 must be in"):
        JobConfig(_parser().parse_args(["--nnodes", "2", "--node-rank", "2", "train.py"]))


def test_ctrl_c_stops_every_rank(tmp_path):
    import signal

    path = tmp_path / "job.py"
    path.write_text("import os, time\nos.write(1, f'ready {os.getpid()}\\n'.encode())\ntime.sleep(120)\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    launcher = subprocess.Popen([sys.executable, "-m", "tilewise.distributed.run", "--nproc-per-node", "2",
                                 "--master-port", str(free_port()), str(path)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        ready = [launcher.stdout.readline() for _ in range(2)]
        assert all(line.startswith("ready") for line in ready), (ready, launcher.communicate(timeout=20))
        pids = [int(line.split()[1]) for line in ready]
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=20) == 128 + signal.SIGINT
    finally:
        launcher.kill()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
