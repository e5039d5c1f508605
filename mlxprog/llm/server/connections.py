"""The server's HTTP connections: uvicorn's HTTP/1.1 protocol with a
connection limit and deadlines, so that slow or silent clients, and floods
of them, are cut off rather than held."""

from __future__ import annotations

import asyncio
import resource
import socket
from typing import Any

from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError
from .middleware import AccessLog
from .responses import error_response

#: Connections served at once: a request on one more gets a 503, and twice as
#: many are closed as they arrive (fewer where the process may open few files).
DEFAULT_MAX_CONNECTIONS = 256
#: Bytes the kernel buffers of each connection's answer: bounded, so that a
#: client that does not read is noticed (the write timeout).
SEND_BUFFER = 64 * 1024


def default_max_connections() -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, or fewer where the process may open
    few files: twice the limit (those beyond are closed as they arrive) and
    the files the model and Python hold must fit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, (soft - 64) // 2))


class Guard:
    """What the server's connections live by (their limit and timeouts),
    and the connections open (each :class:`Connection` adds and removes
    itself)."""

    def __init__(self, max_connections: int, request_timeout: float, write_timeout: float):
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self.open: set[Connection] = set()
        self.refuse = AccessLog(self._refuse)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app of a connection beyond the limit: a 503, then it closes."""
        await error_response(APIError(
            503, f"the server serves {self.max_connections} connections at once, and this one "
            "is beyond them; retry later", code="too_many_connections",
            headers={"Retry-After": "1", "Connection": "close"}))(scope, receive, send)


class Connection(H11Protocol):
    """uvicorn's HTTP/1.1 connection, kept from hogging the server:

    - Beyond the connection limit, its requests get a 503 (and it closes);
      beyond twice the limit, it is closed as it arrives, unread, so that a
      flood cannot use up the process's file descriptors.
    - A request's head must arrive within the request timeout of the
      connection opening or of its last answer, or the connection closes
      (uvicorn's keep-alive timeout closes a silent connection sooner, but
      not one that sends a byte now and then).
    - Its kernel send buffer is bounded (:data:`SEND_BUFFER`), and an answer
      left unread for the write timeout (the buffers full) closes the
      connection: its handler sees the client gone, which stops the
      generation.
    """

    def __init__(self, *args: Any, guard: Guard, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._head_deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None

    @property
    def answering(self) -> bool:
        """Whether a request is being answered (from its head on)."""
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        guard.open.add(self)
        if len(guard.open) > 2 * guard.max_connections:
            transport.abort()
            return
        if len(guard.open) > guard.max_connections:
            self.app = guard.refuse
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        for deadline in (self._head_deadline, self._write_deadline):
            if deadline is not None:
                deadline.cancel()
        self.guard.open.discard(self)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        # Armed first: uvicorn may begin a pipelined request in there.
        self._await_request()
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            seconds = self.guard.write_timeout
            self._write_deadline = self.loop.call_later(
                seconds, self.abort, f"the client did not read its answer for {seconds:g} s")

    def resume_writing(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None
        super().resume_writing()

    def abort(self, reason: str) -> None:
        """Close the connection now, its answer unfinished; ``reason`` goes to
        the access log line of the request it was answering."""
        if self.answering:
            self.cycle.scope["mlxprog.ended"] = reason  # type: ignore[typeddict-unknown-key]
        self.transport.abort()

    def _await_request(self) -> None:
        """Close the connection unless a request's head arrives within the
        request timeout (each head begins a new cycle)."""
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.guard.request_timeout,
                                                   self._head_late, self.cycle)

    def _head_late(self, cycle: Any) -> None:
        if self.cycle is cycle:
            self.transport.close()
