"""An OpenAI-compatible HTTP server for one loaded model (``mlxprog serve``).

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions``
(streamed as server-sent events, or one JSON answer; with structured
output and tool calls), Anthropic's ``POST /v1/messages`` (:mod:`.anthropic`),
``POST /v1/embeddings``, ``GET /v1/models``, ``GET /health``, ``GET /metrics``; see
docs/serving.md for the fields and the behaviour.

Two threads share the work. uvicorn runs the Starlette app on one asyncio
event loop: a handler (:mod:`.routes`) validates a request (:mod:`.schemas`),
submits a :class:`~mlxprog.llm.server.scheduler.Job` to the
:class:`~mlxprog.llm.server.scheduler.Scheduler` and awaits the job's pieces,
which it renders as OpenAI's answers (:mod:`.rendering`, :mod:`.responses`).
The scheduler's thread runs the model (see :mod:`mlxprog.llm.server.scheduler`);
embeddings run on a third thread, beside it (:mod:`.embeddings`).
Rows leave the batch when they finish or when their client goes away.

The connections are uvicorn's HTTP/1.1 protocol with deadlines
(:mod:`.connections`), so that slow or silent clients, and floods of them,
are cut off rather than held; an API key and CORS are optional middleware
(:mod:`.middleware`). This module holds the :class:`Server` (its settings,
starting and stopping) and :func:`serve`. :meth:`Server.stop` (and SIGINT or
SIGTERM in :meth:`Server.run`) stops gracefully: new requests get a 503
while the running ones finish, for a grace period, then end with an error
as their clients expect it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware

from ...errors import ProgramError
from ..generate import LLM
from ..loading import load
from ..options import ModelOptions
from .connections import Connection, Guard, default_max_connections
from .embeddings import Embedder
from .middleware import CORS, AccessLog, APIKey, log
from .routes import Endpoints
from .scheduler import (
    DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING, DEFAULT_PREFILL_CHUNK, DEFAULT_PROMPT_CACHE_SIZE,
    Scheduler,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: How long a stopping server lets running responses finish, in seconds
#: (``--shutdown-grace``).
SHUTDOWN_GRACE = 5
#: After the grace, the seconds the responses cut short have to send their
#: last events before their connections are closed.
SHUTDOWN_FLUSH = 2
#: Seconds a client has to send a request's head, and as long again for its
#: body: then the connection closes (a 408 for a body).
REQUEST_TIMEOUT = 30
#: Seconds a client may leave its answer unread (the send buffer full) before
#: its connection closes, which stops its generation.
WRITE_TIMEOUT = 30
#: Connections the kernel queues before the server accepts them; it refuses more.
BACKLOG = 1024
#: What may be in ``--allowed-origins``: ``scheme://host[:port]``, no path.
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")


class ServeError(ProgramError):
    """The server cannot start: a setting is out of range, or its address
    cannot be listened on."""


def _check_settings(api_key: str | None, origins: list[str], shutdown_grace: float,
                    request_timeout: float, write_timeout: float,
                    max_connections: int | None) -> None:
    """A :class:`ServeError` naming the first :class:`Server` setting out of
    range (and its ``mlxprog serve`` flag)."""
    if api_key is not None and not api_key:
        raise ServeError("api_key (--api-key) must not be empty")
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise ServeError(f"allowed_origins (--allowed-origins): {origin!r} is not an "
                             "origin such as https://example.com:8443 (a scheme and a host, "
                             "no path), or *")
    if not shutdown_grace >= 0:
        raise ServeError(f"shutdown_grace (--shutdown-grace) must be at least 0, got "
                         f"{shutdown_grace}")
    for name, value in (("request_timeout", request_timeout), ("write_timeout", write_timeout)):
        if not value > 0:
            raise ServeError(f"{name} must be greater than 0, got {value}")
    if max_connections is not None and max_connections < 1:
        raise ServeError(f"max_connections must be at least 1, got {max_connections}")


class Server:
    """An OpenAI-compatible server of ``llm``: the Starlette :attr:`app`, its
    :attr:`scheduler`, and ways to run it: :meth:`run` (in the foreground,
    until Ctrl-C) or :meth:`start` / :meth:`stop` (in a background thread).
    ``model_id`` is the name clients see (default: :func:`model_name`).

    For shared and browser use: with ``api_key``, every request but
    ``/health`` needs ``Authorization: Bearer <api_key>``; ``allowed_origins``
    (``scheme://host[:port]``, or ``*``) may call it from web pages (CORS).
    Stopping, running requests get ``shutdown_grace`` seconds to finish.
    Against slow or greedy clients: a request's head, then its body, must
    arrive within ``request_timeout`` seconds each; an answer left unread
    for ``write_timeout`` seconds is cut off; beyond ``max_connections``
    open connections (default:
    :data:`~mlxprog.llm.server.connections.DEFAULT_MAX_CONNECTIONS`, fewer
    if the process may open few files) requests get a 503."""

    def __init__(self, llm: LLM, *, model_id: str | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH,
                 prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
                 prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 max_waiting: int = DEFAULT_MAX_WAITING,
                 api_key: str | None = None, allowed_origins: Sequence[str] = (),
                 shutdown_grace: float = SHUTDOWN_GRACE,
                 request_timeout: float = REQUEST_TIMEOUT, write_timeout: float = WRITE_TIMEOUT,
                 max_connections: int | None = None):
        origins = list(allowed_origins)
        _check_settings(api_key, origins, shutdown_grace, request_timeout, write_timeout,
                        max_connections)
        self.llm = llm
        self.model_id = model_id or model_name(llm)
        self.scheduler = Scheduler(llm, max_batch, prompt_cache_size, prefill_chunk,
                                   max_waiting)
        #: The thread that runs ``/v1/embeddings`` (beside the scheduler's batch).
        self.embedder = Embedder(llm, max_waiting)
        self.url: str | None = None
        #: The endpoints the app routes to.
        self.endpoints = Endpoints(llm, self.scheduler, self.model_id, request_timeout,
                                   self.embedder)
        self.app = Starlette(routes=self.endpoints.routes(),
                             middleware=self._middleware(api_key, origins),
                             exception_handlers=self.endpoints.exception_handlers())
        self.shutdown_grace = shutdown_grace
        self.request_timeout = request_timeout
        #: Whether :meth:`stop` has begun (new generation requests get a 503).
        self.stopping = False
        self._guard = Guard(max_connections or default_max_connections(), request_timeout,
                            write_timeout)
        self._hurry = threading.Event()  # a second signal: stop without waiting
        self._uvicorn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def connections(self) -> int:
        """The HTTP connections open."""
        return len(self._guard.open)

    def _middleware(self, api_key: str | None, origins: list[str]) -> list[Middleware]:
        """The app's middleware, outermost first: the access log; CORS, which
        must see every answer (a browser reads even an error only with its
        headers); the API key."""
        stack = [Middleware(AccessLog)]
        if origins:
            stack.append(Middleware(CORS, allow_origins=origins, allow_methods=["GET", "POST"],
                                    allow_headers=["*"]))
        if api_key is not None:
            stack.append(Middleware(APIKey, key=api_key))
        return stack

    # -- running ---------------------------------------------------------------
    def run(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        """Serve until SIGINT (Ctrl-C) or SIGTERM, then stop gracefully, as
        :meth:`stop` does (a second signal cuts the grace short), and return.
        Prints the URL on stderr once listening (``port`` 0: a free port),
        and one line when a signal stops it. Signals reach the main thread
        only, so it runs there."""
        if threading.current_thread() is not threading.main_thread():
            raise ServeError("Server.run waits for SIGINT or SIGTERM, which only the main "
                             "thread receives; from another thread, use start() and stop()")
        signals: list[int] = []
        signalled = threading.Event()

        def on_signal(number: int, frame: Any) -> None:
            signals.append(number)
            if len(signals) > 1:
                self._hurry.set()
            signalled.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._launch(host, port)
            print(f"mlxprog serve: {self.model_id} at {self.url}/v1 (max batch "
                  f"{self.scheduler.engine.max_batch}, KV cache {self.llm.max_length} tokens, "
                  f"prompt cache {self.scheduler.pool.capacity}); building the programs, "
                  f"/health says when ready; Ctrl-C stops", file=sys.stderr, flush=True)
            signalled.wait()
            self.scheduler.close()  # before saying so
            self.embedder.close()
            print(f"mlxprog serve: {signal.Signals(signals[0]).name}, stopping: new requests "
                  f"get 503, running ones have {self.shutdown_grace:g} s to finish (Ctrl-C "
                  "again: now)", file=sys.stderr, flush=True)
            self.stop()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def start(self, host: str = DEFAULT_HOST, port: int = 0) -> str:
        """Serve from a background thread; returns the URL once serving (the
        scheduler's programs built)."""
        self._launch(host, port)
        while not self.scheduler.ready.wait(0.01):
            if not self._thread.is_alive():
                raise ServeError(f"the HTTP server at {self.url} stopped while starting")
        return self.url

    def stop(self) -> None:
        """Stop gracefully: new generation requests get a 503 at once
        (``server_shutting_down``), the running ones have the shutdown grace
        to finish; those left then end with that 503 (a stream with a last
        chunk, ``finish_reason`` ``"length"``, then the error event and
        ``[DONE]``), and the server stops listening. Returns once it has."""
        self.stopping = True
        self.scheduler.close()
        self.embedder.close()
        if self._uvicorn is None or not self._thread.is_alive():  # never served, or stopped
            self.scheduler.stop()
            self.embedder.stop()
            return
        asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result()
        self._thread.join()
        self._uvicorn = None

    async def _shut_down(self) -> None:
        """:meth:`stop`, on the server's event loop: the grace, the running
        requests failed (their handlers send the 503s), then
        :data:`SHUTDOWN_FLUSH` seconds to send them; the connections still
        answering are then cut off, and uvicorn stops."""
        scheduler = self.scheduler
        await self._until(lambda: not (scheduler.busy or self.embedder.busy),
                          self.shutdown_grace)
        await asyncio.to_thread(scheduler.stop)
        await asyncio.to_thread(self.embedder.stop)
        connections = self._guard.open
        await self._until(lambda: not any(c.answering for c in connections), SHUTDOWN_FLUSH)
        for connection in [c for c in connections if c.answering]:
            connection.abort("cut off: the server stopped")
        self._uvicorn.should_exit = True

    async def _until(self, done: Callable[[], bool], seconds: float) -> None:
        """Return once ``done()``, after ``seconds`` at most, or at a second
        signal."""
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline and not self._hurry.is_set():
            await asyncio.sleep(0.05)

    def _launch(self, host: str, port: int) -> None:
        """Listen, start the scheduler, and serve HTTP from a thread of its
        own; returns once uvicorn serves."""
        sock, server = self._listen(host, port)
        self._uvicorn = server

        async def serve() -> None:
            self._loop = asyncio.get_running_loop()
            await server.serve(sockets=[sock])

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),),
                                        name="mlxprog-http", daemon=True)
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                raise ServeError(f"the HTTP server at {self.url} stopped while starting")
            time.sleep(0.01)

    def _listen(self, host: str, port: int) -> tuple[socket.socket, Any]:
        """A listening socket (so connections queue from now on), the uvicorn
        server that will serve it, and the scheduler started."""
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, kind, proto)
        except OSError as e:
            raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
        except OSError as e:
            sock.close()
            raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{sock.getsockname()[1]}"
        # The graceful shutdown is this server's (_shut_down): by uvicorn's,
        # nothing is left to wait for. No WebSockets: the server has no such
        # endpoint, and an upgraded connection would leave Connection's
        # accounting.
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="off", server_header=False, backlog=BACKLOG,
                                http=functools.partial(Connection, guard=self._guard),
                                ws="none", timeout_graceful_shutdown=SHUTDOWN_FLUSH)
        self.scheduler.start()
        self.embedder.start()
        return sock, uvicorn.Server(config)


def model_name(llm: LLM) -> str:
    """The id a model is served under by default: its file's stem (a
    directory's name)."""
    path = Path(llm.checkpoint.path)
    return path.name if path.is_dir() else path.stem


def serve(model: str | Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          *, options: ModelOptions | None = None, max_batch: int = DEFAULT_MAX_BATCH,
          prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
          prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_waiting: int = DEFAULT_MAX_WAITING,
          model_id: str | None = None, api_key: str | None = None,
          allowed_origins: Sequence[str] = (), shutdown_grace: float = SHUTDOWN_GRACE,
          adapter_path: str | Path | None = None, draft_model: str | Path | None = None,
          **overrides: Any) -> None:
    """Load ``model`` under ``options`` (:class:`~mlxprog.llm.ModelOptions`,
    and/or keyword arguments named as its fields: the KV cache's length and
    settings, ``native``, ``numerics``, ``chat_template``,
    ``extra_eos_tokens``), with the LoRA adapter ``adapter_path`` and the
    speculative ``draft_model`` (see :func:`~mlxprog.llm.load`), and serve it
    until Ctrl-C or SIGTERM, logging one line per request on stderr (see
    :class:`Server` for the other settings)."""
    options = ModelOptions.given(options, overrides)
    # Checked before the model loads, which takes a while.
    _check_settings(api_key, list(allowed_origins), shutdown_grace, REQUEST_TIMEOUT,
                    WRITE_TIMEOUT, None)
    handler = None
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        llm = load(model, options=options, adapter_path=adapter_path, draft_model=draft_model)
        Server(llm, model_id=model_id, max_batch=max_batch, prompt_cache_size=prompt_cache_size,
               prefill_chunk=prefill_chunk, max_waiting=max_waiting, api_key=api_key,
               allowed_origins=allowed_origins, shutdown_grace=shutdown_grace).run(host, port)
    finally:
        if handler is not None:  # the logger as found, for a caller that goes on (a test)
            log.removeHandler(handler)
            log.setLevel(logging.NOTSET)
            log.propagate = True
