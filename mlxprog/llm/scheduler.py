"""The server's scheduling: a :class:`Job` is one generation on its way
through the server, and the :class:`Scheduler`'s thread runs the model for
all of them (see :mod:`mlxprog.llm.server` for the HTTP side).

The scheduler's thread owns the :class:`~mlxprog.llm.engine.Engine` (whose
methods must all be called from one thread) and a
:class:`~mlxprog.llm.PromptCachePool`; it hands every piece to the event
loop that awaits it with ``call_soon_threadsafe``. An :class:`APIError` is
an OpenAI-style error, which a job's client receives instead of pieces.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

import mlx.core as mx

from .cache import PromptCachePool
from .config import ModelError
from .engine import Engine, Piece, PromptTooLongError, Request
from .generate import LLM, GenerationOptions, Prompt

DEFAULT_MAX_BATCH = 8
DEFAULT_PROMPT_CACHE_SIZE = 8
#: The ``code`` of the error a job gets when the server stops before its end.
SHUTTING_DOWN = "server_shutting_down"

log = logging.getLogger("mlxprog.serve")


class APIError(Exception):
    """A request answered with an OpenAI-style error body: ``status`` (4xx: the
    request's fault, 5xx: the server's), ``message``, the request field it is
    about (``param``), the error ``type`` and ``code``."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class Job:
    """One generation on its way through the server: what to generate, and
    the asyncio queue its pieces (or an :class:`APIError`) arrive on.

    The scheduler's thread calls :meth:`attach` and :meth:`deliver`; the
    event loop calls :meth:`next` and :meth:`cancel`."""

    def __init__(self, prompt: Prompt, options: GenerationOptions, prompt_param: str,
                 loop: asyncio.AbstractEventLoop):
        self.prompt = prompt
        self.options = options
        self.prompt_param = prompt_param   # the body field an error in the prompt names
        self.request: Request | None = None
        self.cancelled = False
        self.done = False
        self._loop = loop
        self._queue: asyncio.Queue[Piece | APIError] = asyncio.Queue()

    def attach(self, request: Request) -> None:
        """The engine's request for this job (scheduler thread)."""
        self.request = request
        if self.cancelled:  # cancelled while the request was being made
            request.cancel()

    def deliver(self, item: Piece | APIError) -> None:
        """Hand a piece or an error to the event loop (scheduler thread)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody will read
            self.cancel()

    async def next(self) -> Piece:
        """The next piece; an error raises."""
        item = await self._queue.get()
        if isinstance(item, APIError):
            self.done = True
            raise item
        if item.finish_reason is not None:
            self.done = True
        return item

    def cancel(self) -> None:
        """Stop generating: a waiting job is dropped, a running row leaves the
        batch at the next step (any thread; nothing once done)."""
        if self.done:
            return
        self.cancelled = True
        request = self.request
        if request is not None:
            request.cancel()


class Scheduler:
    """The thread that runs the model: it owns ``llm``'s :class:`Engine` (at
    most ``max_batch`` rows) and a :class:`~mlxprog.llm.PromptCachePool` of
    ``prompt_cache_size`` prefixes, admits submitted jobs in arrival order
    between decode steps, and blocks while there is nothing to do.

    A request the model rejects (a :class:`~mlxprog.llm.ModelError`: a prompt
    too long for the cache, ...) fails alone with a 400. An unexpected error
    in a step fails the running requests with a 500 and the engine starts
    afresh; the thread goes on serving.

    ``largest_batch`` is the most rows one step has decoded, ``steps`` the
    steps run, ``cancelled`` the requests that left cancelled (their clients
    went away), ``failures`` the unexpected errors."""

    def __init__(self, llm: LLM, max_batch: int = DEFAULT_MAX_BATCH,
                 prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE):
        self.llm = llm
        self.engine = Engine(llm, max_batch)
        self.pool = PromptCachePool(llm.cache_layout, prompt_cache_size)
        self.largest_batch = 0
        self.steps = 0
        self.cancelled = 0
        self.failures = 0
        self._waiting: deque[Job] = deque()
        self._jobs: dict[Request, Job] = {}   # the running rows' jobs
        self._wake = threading.Condition()
        self._stopping = False
        self._closed = False
        self._parked = threading.Event()
        self._thread = threading.Thread(target=self._main, name="mlxprog-scheduler", daemon=True)

    @property
    def running(self) -> int:
        """Rows in the batch."""
        return len(self.engine.rows)

    @property
    def waiting(self) -> int:
        """Jobs waiting for a row."""
        return len(self._waiting)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job`` (any thread); a stopping scheduler refuses it (503)."""
        with self._wake:
            if self._stopping or self._closed:
                raise APIError(503, "the server is shutting down", code=SHUTTING_DOWN)
            self._waiting.append(job)
            self._wake.notify()

    @property
    def busy(self) -> bool:
        """Whether any job waits or runs."""
        return bool(self._waiting or self._jobs)

    def close(self) -> None:
        """Refuse new jobs from now on (503, as :meth:`submit` says), while
        the ones submitted go on (any thread)."""
        with self._wake:
            self._closed = True

    def stop(self, timeout: float = 60.0) -> None:
        """Fail what waits or runs (503) and stop working; returns once the
        thread is idle for good (or after ``timeout`` seconds)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._parked.wait(timeout)

    def _main(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._waiting or self.engine.rows):
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self._admit_waiting()
                if self.engine.rows:
                    self._step()
            except Exception as e:  # a bug of the scheduler itself: keep serving
                self._fail_running(e)
        self._fail_all(APIError(503, "the server is shutting down", code=SHUTTING_DOWN))
        # MLX keeps streams and a compile cache per thread; left to the
        # thread's exit, their destructor takes the GIL, which aborts the
        # process if the interpreter is finalizing by then ("terminate called
        # without an active exception"). MLX asks threads to clear them.
        mx.clear_streams()
        self._parked.set()

    def _admit_waiting(self) -> None:
        """Prefill waiting jobs, in order, while the batch has room."""
        while not self.engine.full:
            with self._wake:
                if not self._waiting:
                    return
                job = self._waiting.popleft()
            self._admit(job)

    def _admit(self, job: Job) -> None:
        if job.cancelled:
            return
        try:
            request = self.llm.request(job.prompt, job.options, self.pool)
        except PromptTooLongError as e:
            job.deliver(APIError(
                400, f"the prompt has {e.prompt_tokens} tokens, but the KV cache holds "
                f"{e.max_length} (the server's --max-length); shorten the prompt",
                job.prompt_param, code="context_length_exceeded"))
            return
        except Exception as e:  # a ModelError is about the prompt: empty, bad ids, ...
            job.deliver(APIError(400, str(e), job.prompt_param) if isinstance(e, ModelError)
                        else self._error(e))
            return
        job.attach(request)
        if request.cancelled:
            return
        try:
            piece = self.engine.add(request)
        except Exception as e:
            # If the row joined the batch, it leaves at the next step; the
            # rows already there are not affected.
            request.cancel()
            job.deliver(self._error(e))
            return
        if not request.finished:
            self._jobs[request] = job
            self.largest_batch = max(self.largest_batch, len(self.engine.rows))
        job.deliver(piece)

    def _step(self) -> None:
        rows = len(self.engine.rows)
        try:
            pieces = self.engine.step()
        except Exception as e:
            self._fail_running(e)
            return
        self.steps += 1
        self.largest_batch = max(self.largest_batch, rows)
        for request, piece in pieces:
            job = self._jobs.get(request)
            if job is not None:
                job.deliver(piece)
        for request in [r for r in self._jobs if r.finished]:
            if request.finish_reason == "cancelled":
                self.cancelled += 1
            del self._jobs[request]

    def _error(self, e: Exception) -> APIError:
        """What a request that ``e`` ended gets: the ModelError's text (400),
        or a 500 (the traceback goes to the log)."""
        if isinstance(e, ModelError):
            return APIError(400, str(e))
        self.failures += 1
        log.error("generation failed", exc_info=e)
        return APIError(500, f"the generation failed: {type(e).__name__}: {e}")

    def _fail_running(self, e: Exception) -> None:
        """Fail every running row after ``e`` and start a new engine: the
        batch's caches may be inconsistent. The new engine is in place before
        any client hears of the failure, so its next request finds it."""
        error = self._error(e)
        jobs = list(self._jobs.values())
        self._jobs.clear()
        self.engine = Engine(self.llm, self.engine.max_batch)
        for job in jobs:
            job.deliver(error)

    def _fail_all(self, error: APIError) -> None:
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for job in [*waiting, *self._jobs.values()]:
            job.deliver(error)
        for request in self._jobs:
            request.cancel()
        self._jobs.clear()
