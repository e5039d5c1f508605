"""The parent side: a persistent worker process that runs cases one at a time.

One process serves many cases (importing MLX takes a second; a case takes
milliseconds). Because it runs one case at a time, a crash or a hang is
blamed on the case it was running: the process is then killed if needed and
a fresh one started for the next case. Since MLX keeps state between cases,
a crash is confirmed by running the case again alone in a fresh process
(``Outcome.reproducible``).

The worker runs under ``RLIMIT_AS`` (the address-space limit, so a runaway
allocation fails instead of swapping the machine) in its own session, so a
hang is ended by killing its whole process group.
"""

from __future__ import annotations

import json
import re
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .case import Case, Outcome

TOOLS = Path(__file__).resolve().parents[1]
REPO = TOOLS.parent
STARTUP_TIMEOUT = 120.0
_STDERR_TAIL = 1500
_DEATHS = ("killed by", "exited with", "no answer")
"""How the errors of outcomes the worker could not report itself begin."""


class Worker:
    """A worker process (see :mod:`fuzzing.worker`), restarted after a crash
    or a hang. ``run(case)`` returns the case's :class:`Outcome`."""

    def __init__(self, timeout: float = 10.0, memory_limit: int = 4 << 30,
                 confirm: bool = True):
        self.timeout = timeout
        self.memory_limit = memory_limit
        self.confirm = confirm
        self.restarts = 0
        self._process: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile()
        self._buffer = b""

    # -- process management ---------------------------------------------------

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(TOOLS), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        env["FUZZ_MEMORY_LIMIT"] = str(self.memory_limit)
        env.setdefault("PYTHONFAULTHANDLER", "1")
        limit = self.memory_limit

        def limits() -> None:
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        self._stderr.seek(0)
        self._stderr.truncate()
        self._buffer = b""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "fuzzing.worker"], cwd=str(REPO), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
            preexec_fn=limits, start_new_session=True, bufsize=0)
        line = self._read_line(STARTUP_TIMEOUT)
        if line is None or not json.loads(line).get("ready"):
            tail = self._stderr_tail(0)
            self._stop()
            raise RuntimeError(f"the fuzz worker did not start:\n{tail}")

    def close(self) -> None:
        """Stop the process and release the worker's files."""
        self._stop()
        self._stderr.close()

    def _stop(self) -> None:
        """Stop the process (if any); the next case starts a fresh one."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait()
        for stream in (process.stdin, process.stdout):
            stream.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running --------------------------------------------------------------

    def run(self, case: Case, timeout: float | None = None) -> Outcome:
        """Run one case, within ``timeout`` seconds (default: the case's
        ``timeout`` option, else the worker's); a crash or a hang is
        confirmed in a fresh process."""
        timeout = timeout or case.options.get("timeout") or self.timeout
        outcome = self._run_once(case, timeout)
        if self.confirm and outcome.error.startswith(_DEATHS):
            self._stop()
            again = self._run_once(case, timeout)
            outcome.reproducible = again.cls == outcome.cls
        return outcome

    def _run_once(self, case: Case, timeout: float) -> Outcome:
        if self._process is None:
            self._start()
        offset = self._stderr.seek(0, os.SEEK_END)
        request = (json.dumps(case.to_dict()) + "\n").encode()
        try:
            self._process.stdin.write(request)
        except BrokenPipeError:
            return self._died(offset)
        line = self._read_line(timeout)
        if line is not None:
            return Outcome(**json.loads(line))
        if self._process.poll() is None:
            stage, tail = self._last_stage(offset), self._stderr_tail(offset)
            self._stop()
            self.restarts += 1
            return Outcome("hang", stage, f"no answer within {timeout:g} s", tail)
        return self._died(offset)

    def _died(self, offset: int) -> Outcome:
        """The outcome of a process that ended during a case."""
        code = self._process.wait()
        stage = self._last_stage(offset)
        tail = self._stderr_tail(offset)
        self._stop()
        self.restarts += 1
        if code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code} without reporting"
        cls = "memory" if any(t in tail.lower() for t in ("bad_alloc", "memoryerror",
                                                            "out of memory")) else "crash"
        return Outcome(cls, stage, how, tail)

    def _read_line(self, timeout: float) -> str | None:
        """The next answer line, or None on timeout or end of file."""
        deadline = time.monotonic() + timeout
        stdout = self._process.stdout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([stdout], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(stdout.fileno(), 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def _last_stage(self, offset: int) -> str:
        """The stage the worker last announced on stderr for this case."""
        self._stderr.seek(offset)
        stages = re.findall(r"^--- stage (\S+)$", self._stderr.read().decode(errors="replace"),
                            re.MULTILINE)
        return stages[-1] if stages else "start"

    def _stderr_tail(self, offset: int) -> str:
        self._stderr.seek(offset)
        text = self._stderr.read().decode(errors="replace")
        # Only the case's own part: after the worker's "=== case" marker.
        text = text.split("\n=== case", 1)[-1].split("\n", 1)[-1] if "=== case" in text else text
        text = re.sub(r"^--- stage \S+\n", "", text, flags=re.MULTILINE)
        return text[-_STDERR_TAIL:].strip()
