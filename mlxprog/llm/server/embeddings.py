"""The server's embeddings: ``POST /v1/embeddings`` requests run on a thread
of their own (:class:`Embedder`), one request after another, beside the
scheduler's generation batch.

An embedding is one forward pass with nothing to stream, so it does not
join the decode batch: the thread runs :meth:`~mlxprog.llm.LLM.embed` on a
request's inputs (tokenized there, so that a large request does not hold up
the event loop) and hands the result to the event loop that awaits it. The
thread is one, and stays the same, because MLX keeps a compile cache per
thread: the embedding program's traces are made once. Its queue follows the
scheduler's rules: at most ``max_waiting`` requests wait (more get a 503
with ``Retry-After``), and a closed embedder refuses new ones with a 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..generate import LLM, EmbeddingInput, EmbeddingInputError
from .errors import RETRY_AFTER, SHUTTING_DOWN, APIError

log = logging.getLogger("mlxprog.serve")


@dataclass(frozen=True)
class Embeddings:
    """One request's answer: ``vectors [N, hidden]`` (float32, in input
    order) and ``tokens``, the input tokens it embedded."""

    vectors: np.ndarray
    tokens: int


class EmbeddingJob:
    """One ``/v1/embeddings`` request on its way through the :class:`Embedder`:
    its inputs and pooling, and the future its answer (or an
    :class:`~mlxprog.llm.server.errors.APIError`) arrives on. A job cancelled
    before the thread reaches it is skipped."""

    def __init__(self, inputs: list[EmbeddingInput], pooling: str,
                 loop: asyncio.AbstractEventLoop):
        self.inputs = inputs
        self.pooling = pooling
        self.cancelled = False
        self._loop = loop
        self._future: asyncio.Future[Embeddings] = loop.create_future()

    async def result(self) -> Embeddings:
        """The answer, once the thread has it; an error raises."""
        return await self._future

    def cancel(self) -> None:
        """The client went away: skip the job if it has not begun (any thread)."""
        self.cancelled = True

    def deliver(self, answer: Embeddings | APIError) -> None:
        """Hand the answer to the event loop (the embedder's thread)."""

        def settle() -> None:
            if self._future.done():  # the awaiting handler was cancelled
                return
            if isinstance(answer, APIError):
                self._future.set_exception(answer)
            else:
                self._future.set_result(answer)

        try:
            self._loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the event loop is closed: nobody will read
            self.cancel()


class Embedder:
    """The thread that runs ``llm``'s embeddings for the server, a job at a
    time in arrival order, with at most ``max_waiting`` jobs waiting.
    ``requests`` counts the jobs answered, ``tokens`` the input tokens
    embedded, ``failures`` the unexpected errors."""

    def __init__(self, llm: LLM, max_waiting: int):
        self.llm = llm
        self.max_waiting = max_waiting
        self.requests = 0
        self.tokens = 0
        self.failures = 0
        self._waiting: deque[EmbeddingJob] = deque()
        self._running = False
        self._wake = threading.Condition()
        self._closed = False
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="mlxprog-embeddings",
                                        daemon=True)

    @property
    def busy(self) -> bool:
        """Whether a job waits or runs."""
        return bool(self._waiting) or self._running

    def stats(self) -> dict[str, int]:
        """The embedder's share of ``/health`` and ``/metrics``: requests
        ``embedding_waiting`` and ``embedding_running`` (0 or 1), and the
        totals ``embedding_requests``, ``embedding_tokens`` and
        ``embedding_failures`` (a snapshot, read from any thread)."""
        return {"embedding_waiting": len(self._waiting),
                "embedding_running": int(self._running),
                "embedding_requests": self.requests, "embedding_tokens": self.tokens,
                "embedding_failures": self.failures}

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(self, job: EmbeddingJob) -> None:
        """Queue ``job`` (any thread): a closed embedder, or a full queue,
        refuses it with a 503 (the latter with ``Retry-After``)."""
        with self._wake:
            if self._closed or self._stopping:
                raise APIError(503, "the server is shutting down", code=SHUTTING_DOWN)
            if len(self._waiting) >= self.max_waiting + (0 if self._running else 1):
                raise APIError(503, f"the server is busy: {len(self._waiting)} embedding "
                               "requests wait; retry later", code="server_busy",
                               headers={"Retry-After": str(RETRY_AFTER)})
            self._waiting.append(job)
            self._wake.notify()

    def close(self) -> None:
        """Refuse new jobs from now on, while the queued ones go on (any thread)."""
        with self._wake:
            self._closed = True

    def stop(self, timeout: float = 60.0) -> None:
        """Fail the jobs that wait (503) and stop once the running one is
        done; returns when the thread has ended (or after ``timeout`` s)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _main(self) -> None:
        while True:
            with self._wake:
                while not (self._stopping or self._waiting):
                    self._wake.wait()
                if self._stopping:
                    break
                job = self._waiting.popleft()
                self._running = True
            try:
                if not job.cancelled:
                    answer = self._run(job)
                    # Counted first: a client holding its answer sees it counted.
                    self.requests += 1
                    job.deliver(answer)
            finally:
                self._running = False
        with self._wake:
            waiting, self._waiting = list(self._waiting), deque()
        for job in waiting:
            job.deliver(APIError(503, "the server is shutting down", code=SHUTTING_DOWN))
        # As the scheduler's thread: MLX asks threads to clear their streams
        # and compile cache before they end (see Scheduler._main).
        mx.clear_streams()

    def _run(self, job: EmbeddingJob) -> Embeddings | APIError:
        """The job's answer, or the error its client gets: a 400 for an input
        the model rejects (the field is ``input``), a 500 for a bug."""
        try:
            ids = self.llm.embedding_ids(job.inputs)
            vectors = np.array(self.llm.embed(ids, pooling=job.pooling), dtype=np.float32)
        except EmbeddingInputError as e:
            return APIError(400, str(e), "input",
                            code=None if e.tokens is None else "context_length_exceeded")
        except Exception as e:
            self.failures += 1
            log.error("embedding failed", exc_info=e)
            return APIError(500, f"the embedding failed: {type(e).__name__}: {e}")
        tokens = sum(len(i) for i in ids)
        self.tokens += tokens
        return Embeddings(vectors, tokens)
