"""The import path of a Python process a test starts: this checkout first, then whatever the test's own
``PYTHONPATH`` held (where a host keeps packages outside site-packages, the child needs them as well)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def python_path(*first: str | Path) -> str:
    """``PYTHONPATH`` for a child: the checkout, then ``first``, then the inherited entries."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(ROOT), *map(str, first), *inherited])


def run_together(script: str, environments: list[dict], go, cwd=ROOT, timeout: float = 300) -> list:
    """Run ``script`` in one Python process per environment, all released at once by creating the file ``go``
    (each waits for it: ``GO_FILE`` in its environment), and return each process's (returncode, stdout, stderr)."""
    import subprocess
    import sys
    import time

    processes = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=environment, cwd=cwd) for environment in environments]
    time.sleep(1.0)  # every interpreter up and waiting
    Path(go).write_text("")
    try:
        finished = [process.communicate(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return [(process.returncode, stdout, stderr) for process, (stdout, stderr) in zip(processes, finished)]
