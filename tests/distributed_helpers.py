"""Running a Python script on several ranks of MLX's ring backend, on loopback.

:func:`run_ranks` does what ``mlx.launch --backend ring -n N`` does (a
hostfile of one ``127.0.0.1:port`` per rank in ``MLX_HOSTFILE``, the rank in
``MLX_RANK``), choosing free ports, pinning each rank to a core (ring ranks
busy-poll while they wait: two ranks sharing two cores unpinned fight for
them) and killing every rank's process group when the run passes its
timeout, so a test never hangs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parent.parent

_GRACE = 10.0  # seconds the other ranks get to finish after one fails


@dataclass
class RankResult:
    """What one rank left: its exit status and output (``returncode`` is
    None when the run was killed at its timeout)."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on loopback now."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def run_ranks(script: str, n: int, timeout: float = 60) -> list[RankResult]:
    """Run the Python source ``script`` on ``n`` ring ranks (each sees
    ``MLX_RANK`` and ``MLX_HOSTFILE``; ``mx.distributed.init()`` joins the
    group) and return each rank's result, in rank order. Past ``timeout``
    seconds (or a few seconds after a rank fails) every rank still running
    is killed (its whole process group) and reports ``returncode`` None."""
    cores = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp, "hosts.json")
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _free_ports(n)]))
        source = Path(tmp, "rank.py")
        source.write_text(script)
        env = {**os.environ, "MLX_HOSTFILE": str(hostfile), "PYTHONPATH": str(ROOT)}
        procs = []
        outs = [(Path(tmp, f"out{r}"), Path(tmp, f"err{r}")) for r in range(n)]
        for rank in range(n):
            core = cores[rank % len(cores)]
            stdout, stderr = (open(path, "w") for path in outs[rank])
            with stdout, stderr:
                procs.append(subprocess.Popen(
                    [sys.executable, str(source)], env={**env, "MLX_RANK": str(rank)},
                    stdout=stdout, stderr=stderr, start_new_session=True, cwd=str(ROOT),
                    # Pinned in the child before it starts Python.
                    preexec_fn=lambda core=core: os.sched_setaffinity(0, {core}),
                ))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                # A rank failed: the others may wait for it forever.
                deadline = min(deadline, time.monotonic() + _GRACE)
            time.sleep(0.02)
        codes = [p.poll() for p in procs]
        for proc, code in zip(procs, codes):
            if code is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return [RankResult(r, codes[r], outs[r][0].read_text(), outs[r][1].read_text())
                for r in range(n)]
