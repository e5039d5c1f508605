"""The server's HTTP answers: strict JSON bodies, OpenAI-style errors, and
server-sent event streams that cancel their job however they end."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from .errors import APIError
from .rendering import Output
from .scheduler import Job


def json_bytes(data: Any) -> bytes:
    """``data`` as compact UTF-8 JSON."""
    # Log-probabilities are clamped finite (see rendering.finite_logprob), so strict JSON holds.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``data`` as a JSON response."""
    return Response(json_bytes(data), status, headers, media_type="application/json")


def error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """``error`` as a JSON response, with its headers and ``headers``."""
    return json_response(error.body(), error.status, {**error.headers, **(headers or {})})


def event(data: Any) -> bytes:
    """``data`` as one server-sent event."""
    return b"data: " + json_bytes(data) + b"\n\n"


def named_event(kind: str, data: Any) -> bytes:
    """``data`` as one server-sent event with its ``event:`` name, as
    Anthropic's and OpenAI's Responses streams send them."""
    return f"event: {kind}\n".encode() + event(data)


DONE = b"data: [DONE]\n\n"
"""The event that ends every stream, as OpenAI's do."""


class EventStream(StreamingResponse):
    """Server-sent events, then ``last`` (OpenAI's ``[DONE]``; empty: none,
    as Anthropic's streams end), that cancel their job however
    they end: finished, failed, or cut short by the client going away
    (Starlette then cancels the stream) or not reading (its connection is
    closed: see :class:`~mlxprog.llm.server.connections.Connection`). The
    access log gets the usage so far, and why a stream cut short ended."""

    def __init__(self, events: AsyncIterator[bytes], job: Job, output: Output,
                 last: bytes = DONE):
        super().__init__(self._framed(events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.last = last
        self.job = job
        self.output = output
        self.complete = False

    async def _framed(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for data in events:
            yield data
        self.complete = True
        if self.last:
            yield self.last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()
            scope["mlxprog.usage"] = self.output.usage
            if not self.complete:
                scope.setdefault("mlxprog.ended", "the client disconnected")
