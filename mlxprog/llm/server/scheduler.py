"""The server's scheduling: a :class:`Job` is one generation on its way
through the server, and the :class:`Scheduler`'s thread runs the model for
all of them (the HTTP side is the rest of :mod:`mlxprog.llm.server`).

The scheduler's thread owns the :class:`~mlxprog.llm.engine.Engine` (whose
methods must all be called from one thread) and a
:class:`~mlxprog.llm.PromptCachePool`; it hands every piece to the event
loop that awaits it with ``call_soon_threadsafe``. An
:class:`~mlxprog.llm.server.errors.APIError` is an OpenAI-style error, which
a job's client receives instead of pieces.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import deque

import mlx.core as mx

from ...errors import ModelError
from ..cache import PromptCachePool
from ..engine import SIZE_FLAGS, Engine, Piece, PromptTooLongError, Request
from ..generate import LLM, Prompt
from ..options import GenerationOptions
from .errors import RETRY_AFTER, SHUTTING_DOWN, APIError

DEFAULT_MAX_BATCH = 8
DEFAULT_PROMPT_CACHE_SIZE = 8
#: Prompt tokens a prefill runs at a time before the running rows get their
#: next token (measured on SmolLM2, 2 cores: see docs/benchmarks.md).
DEFAULT_PREFILL_CHUNK = 128
#: Jobs that may wait for a row before the server answers 503.
DEFAULT_MAX_WAITING = 64
#: Prompt lengths the scheduler prefills before it serves (their prefill
#: buckets 8 to 128 tokens, and a second cache width), greedy; the shortest
#: also with OpenAI's default temperature and two of them together: the
#: programs and kernels of the common shapes are then built (see
#: :meth:`Scheduler.warm_up`).
WARM_UP_PROMPTS = (5, 12, 28, 60, 120, 250)
WARM_UP_TEMPERATURE = 1.0

log = logging.getLogger("mlxprog.serve")


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
    most ``max_batch`` rows, prefilling or decoding) and a
    :class:`~mlxprog.llm.PromptCachePool` of ``prompt_cache_size``
    prefixes, and blocks while there is nothing to do.

    Each turn of its loop begins the jobs that wait, in arrival order, while
    the batch has room (those that arrived together are prefilled together),
    runs one chunk of ``prefill_chunk`` tokens of one prefill (the one with
    the fewest tokens left, so a short prompt is not kept behind a long
    one), then one decode step of the running rows. A long prompt thus
    delays the others' tokens by one chunk at a time, never by its whole
    prefill. At most ``max_waiting`` jobs wait beyond the rows free;
    :meth:`submit` refuses more with a 503 and a ``Retry-After``.

    A request the model rejects (a :class:`~mlxprog.llm.ModelError`: a prompt
    too long for the cache, ...) fails alone with a 400. An unexpected error
    in a prefill fails its rows with a 500; in a step, every row, and the
    engine starts afresh; the thread goes on serving.

    ``largest_batch`` is the most rows one step has decoded, ``steps`` the
    steps run, ``cancelled`` the requests that left cancelled (their clients
    went away), ``failures`` the unexpected errors; :meth:`stats` has the
    rest."""

    def __init__(self, llm: LLM, max_batch: int = DEFAULT_MAX_BATCH,
                 prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 max_waiting: int = DEFAULT_MAX_WAITING):
        if max_waiting < 0:
            raise ModelError(f"max_waiting must be at least 0, got {max_waiting}")
        self.llm = llm
        self.engine = Engine(llm, max_batch, prefill_chunk)
        self.pool = PromptCachePool(llm.cache_layout, prompt_cache_size)
        self.max_waiting = max_waiting
        self.largest_batch = 0
        self.steps = 0
        self.cancelled = 0
        self.failures = 0
        self.requests = 0          # jobs answered (finished, failed or cancelled)
        self.prompt_tokens = 0     # prefilled (not counting prompt-cache hits)
        self.generated_tokens = 0
        self._rate = _Rate()
        self._waiting: deque[Job] = deque()
        self._jobs: dict[Request, Job] = {}   # the prefilling and running rows' jobs
        self._wake = threading.Condition()
        self._stopping = False
        self._closed = False
        self._parked = threading.Event()
        self._warm = True
        #: Set once the thread serves (after its warm-up).
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="mlxprog-scheduler", daemon=True)

    @property
    def running(self) -> int:
        """Rows decoding in the batch."""
        return len(self.engine.rows)

    @property
    def prefilling(self) -> int:
        """Rows being prefilled."""
        return sum(len(p.rows) for p in self.engine.prefilling)

    @property
    def waiting(self) -> int:
        """Jobs waiting for a row."""
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        """Whether any job waits or runs."""
        return bool(self._waiting or self._jobs)

    def stats(self) -> dict[str, float]:
        """What the scheduler is doing and has done: rows ``prefilling``,
        ``running`` (decoding) and ``waiting``; ``cached_tokens``, the
        tokens the batch's rows hold in the KV cache plus those the prompt
        cache keeps; totals of ``requests``, ``prompt_tokens`` (prefilled),
        ``generated_tokens``, ``steps``, ``cancelled`` and ``failures``;
        ``generated_tokens_per_second`` over the last 10 seconds; and MLX's
        ``active_memory_bytes`` (arrays alive) and ``cache_memory_bytes``
        (freed buffers it keeps for reuse). Read from
        any thread (a snapshot, not locked against the scheduler)."""
        rows = list(self.engine.rows)
        return {"prefilling": self.prefilling, "running": len(rows), "waiting": self.waiting,
                "max_batch": self.engine.max_batch, "max_waiting": self.max_waiting,
                "cached_tokens": sum(r.length for r in rows) + self.pool.tokens,
                "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens, "steps": self.steps,
                "cancelled": self.cancelled, "failures": self.failures,
                "generated_tokens_per_second": self._rate.per_second(),
                "active_memory_bytes": mx.get_active_memory(),
                "cache_memory_bytes": mx.get_cache_memory()}

    def start(self, warm_up: bool = True) -> None:
        """Start the thread; with ``warm_up`` it first runs :meth:`warm_up`.
        :attr:`ready` is set once it serves."""
        self._warm = warm_up
        self._thread.start()

    def warm_up(self) -> float:
        """Generate a few tokens of throw-away prompts (a chat message, and
        the :data:`WARM_UP_PROMPTS` lengths that fit the cache), so the
        programs of the common shapes are traced and their kernels compiled
        before the first request (which otherwise waits seconds for them).
        Runs on the scheduler's thread (MLX keeps a compile cache per
        thread); returns the seconds it took."""
        start = time.perf_counter()
        engine = Engine(self.llm, self.engine.max_batch, self.engine.prefill_chunk)
        vocab = self.llm.config.vocab_size

        def run(requests: list[Request]) -> None:
            if self._stopping:  # a server stopped while it warms up stops at once
                return
            requests = [r for r in requests if len(r.ids) + 3 <= self.llm.prompt_limit]
            for prefill in engine.begin(requests):
                while prefill in engine.prefilling:
                    engine.advance(prefill)
            while engine.rows:
                engine.step()

        greedy = GenerationOptions(max_tokens=3, temperature=0.0, chat=False)
        sampled = dataclasses.replace(greedy, temperature=WARM_UP_TEMPERATURE)
        # The chat template, rendered once; sampling; two rows together.
        try:
            run([self.llm.request([{"role": "user", "content": "Hi."}],
                                  dataclasses.replace(greedy, chat=True))])
        except PromptTooLongError:  # a cache too small for the template
            pass
        # Token ids other than the specials, which could end a row early.
        prompt = [[(7 + i + n) % vocab] * n for i, n in enumerate(WARM_UP_PROMPTS)
                  if n <= self.llm.prompt_limit]
        run([Request(self.llm, prompt[0], sampled)])
        if self.engine.max_batch > 1:
            run([Request(self.llm, p, greedy) for p in prompt[:2]])
        for ids in prompt:
            run([Request(self.llm, ids, greedy)])
        mx.synchronize()
        return time.perf_counter() - start

    def submit(self, job: Job) -> None:
        """Queue ``job`` (any thread). A stopping scheduler refuses it, and so
        does a full queue: a 503 (the latter with ``Retry-After``)."""
        with self._wake:
            if self._stopping or self._closed:
                raise APIError(503, "the server is shutting down", code=SHUTTING_DOWN)
            free = self.engine.max_batch - self.engine.occupied
            if len(self._waiting) >= self.max_waiting + max(free, 0):
                raise APIError(503, f"the server is busy: {len(self._waiting)} requests wait "
                               f"for one of {self.engine.max_batch} rows; retry later",
                               code="server_busy", headers={"Retry-After": str(RETRY_AFTER)})
            self._waiting.append(job)
            self._wake.notify()

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
        if self._warm:
            try:
                seconds = self.warm_up()
                log.info(f"mlxprog serve: programs and kernels built in {seconds:.1f} s; ready")
            except Exception as e:  # serving still works, each shape built when first used
                log.error("warming up failed", exc_info=e)
        self.ready.set()
        engine_busy = lambda: self.engine.rows or self.engine.prefilling  # noqa: E731
        while True:
            with self._wake:
                while not (self._stopping or self._waiting or engine_busy()):
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self._begin_waiting()
                prefill_seconds = self._prefill() if self.engine.prefilling else 0.0
                self._decode(prefill_seconds)
            except Exception as e:  # a bug of the scheduler itself: keep serving
                self._fail_running(e)
        self._fail_all(APIError(503, "the server is shutting down", code=SHUTTING_DOWN))
        # MLX keeps streams and a compile cache per thread; left to the
        # thread's exit, their destructor takes the GIL, which aborts the
        # process if the interpreter is finalizing by then ("terminate called
        # without an active exception"). MLX asks threads to clear them.
        mx.clear_streams()
        self._parked.set()

    def _begin_waiting(self) -> None:
        """Begin prefilling the waiting jobs, in order, while the batch has
        room: together, in one :meth:`Engine.begin`."""
        begun: list[tuple[Job, Request]] = []
        while self.engine.occupied + len(begun) < self.engine.max_batch:
            with self._wake:
                if not self._waiting:
                    break
                job = self._waiting.popleft()
            request = self._request(job)
            if request is not None:
                begun.append((job, request))
        if not begun:
            return
        try:
            self.engine.begin([request for _, request in begun])
        except Exception as e:
            for job, request in begun:
                request.cancel()
                self._answered(job, self._error(e))
            return
        for job, request in begun:
            self._jobs[request] = job

    def _request(self, job: Job) -> Request | None:
        """The engine's request for ``job``, or None (the job is cancelled,
        or its prompt rejected: it has its error)."""
        if job.cancelled:
            self._answered(job, None)
            return None
        try:
            request = self.llm.request(job.prompt, job.options, self.pool)
        except PromptTooLongError as e:
            self._answered(job, APIError(
                400, f"the prompt has {e.prompt_tokens} tokens, but the KV cache holds "
                f"{e.max_length} (the server's {SIZE_FLAGS[e.setting]}); shorten the prompt",
                job.prompt_param, code="context_length_exceeded"))
            return None
        except Exception as e:  # a ModelError is about the prompt: empty, bad ids, ...
            self._answered(job, APIError(400, str(e), job.prompt_param)
                           if isinstance(e, ModelError) else self._error(e))
            return None
        job.attach(request)
        if request.cancelled:
            self._answered(job, None)
            return None
        return request

    def _decode(self, prefill_seconds: float) -> None:
        """Decode steps of the running rows: one, or, after a prefill chunk
        that took ``prefill_seconds``, as many as fit in that time (so while
        a long prompt is prefilled the running rows get half the time, not
        one token a chunk), unless new jobs wait to begin."""
        start = time.perf_counter()
        while self.engine.rows:
            self._step()
            if (time.perf_counter() - start >= prefill_seconds
                    or (self._waiting and not self.engine.full)):
                return

    def _prefill(self) -> float:
        """One chunk of the prefill with the fewest tokens left; the seconds
        it took."""
        start = time.perf_counter()
        prefill = min(self.engine.prefilling, key=lambda p: p.remaining)
        rows = list(prefill.rows)
        before = prefill.done
        try:
            pieces = self.engine.advance(prefill)
        except Exception as e:
            # Only these rows' caches are in doubt: they fail, the batch goes on.
            if prefill in self.engine.prefilling:
                self.engine.prefilling.remove(prefill)
            error = self._error(e)
            for request in rows:
                request.cancel()
                job = self._jobs.pop(request, None)
                if job is not None:
                    self._answered(job, error)
            return time.perf_counter() - start
        at, step = prefill.start + before, prefill.done - before
        self.prompt_tokens += sum(max(min(len(r.ids), at + step) - at, 0) for r in rows
                                  if r.finish_reason != "cancelled")
        self._deliver(pieces)
        for request in rows:  # rows cancelled while prefilling
            if request.finished and request in self._jobs:
                self._leave(request)
        return time.perf_counter() - start

    def _step(self) -> None:
        rows = len(self.engine.rows)
        try:
            pieces = self.engine.step()
        except Exception as e:
            self._fail_running(e)
            return
        self.steps += 1
        self.largest_batch = max(self.largest_batch, rows)
        self._deliver(pieces)
        for request in [r for r in self._jobs if r.finished]:
            self._leave(request)

    def _deliver(self, pieces: list[tuple[Request, Piece]]) -> None:
        """Hand each piece to its job; the jobs of finished rows are done."""
        for request, piece in pieces:
            job = self._jobs.get(request)
            if job is None:
                continue
            self.generated_tokens += 1
            self._rate.add(1)
            job.deliver(piece)
            if request.finished:
                self._leave(request)
        self.largest_batch = max(self.largest_batch, len(self.engine.rows))

    def _leave(self, request: Request) -> None:
        """A finished row's job is answered: it is no longer tracked."""
        del self._jobs[request]
        if request.finish_reason == "cancelled":
            self.cancelled += 1
        self.requests += 1

    def _answered(self, job: Job, error: APIError | None) -> None:
        """A job that ends without a row: with ``error`` (None: cancelled)."""
        self.requests += 1
        if error is None:
            self.cancelled += 1
        else:
            job.deliver(error)

    def _error(self, e: Exception) -> APIError:
        """What a request that ``e`` ended gets: the ModelError's text (400),
        or a 500 (the traceback goes to the log)."""
        if isinstance(e, ModelError):
            return APIError(400, str(e))
        self.failures += 1
        log.error("generation failed", exc_info=e)
        return APIError(500, f"the generation failed: {type(e).__name__}: {e}")

    def _fail_running(self, e: Exception) -> None:
        """Fail every prefilling and running row after ``e`` and start a new
        engine: the batch's caches may be inconsistent. The new engine is in
        place before any client hears of the failure, so its next request
        finds it."""
        error = self._error(e)
        jobs = list(self._jobs.values())
        self._jobs.clear()
        engine = self.engine
        self.engine = Engine(self.llm, engine.max_batch, engine.prefill_chunk)
        for job in jobs:
            self._answered(job, error)

    def _fail_all(self, error: APIError) -> None:
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for job in [*waiting, *self._jobs.values()]:
            self._answered(job, error)
        for request in self._jobs:
            request.cancel()
        self._jobs.clear()


class _Rate:
    """Events per second over the last ``window`` seconds."""

    def __init__(self, window: float = 10.0):
        self.window = window
        self._events: deque[tuple[float, int]] = deque()

    def add(self, n: int) -> None:
        """Count ``n`` events now."""
        now = time.monotonic()
        self._events.append((now, n))
        while self._events and self._events[0][0] < now - self.window:
            self._events.popleft()

    def per_second(self) -> float:
        """The rate over the window (events since ``window`` seconds ago)."""
        now = time.monotonic()
        events = [(t, n) for t, n in list(self._events) if t >= now - self.window]
        return sum(n for _, n in events) / self.window
