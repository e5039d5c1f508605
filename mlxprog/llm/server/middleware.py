"""The ASGI middleware around the server's app: the access log, the
optional API key, and CORS whose refusals say what was refused."""

from __future__ import annotations

import hmac
import logging
import time

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError
from .responses import error_response

#: The server's logger: one line per request (``serve`` shows it on stderr).
log = logging.getLogger("mlxprog.serve")


class AccessLog:
    """One log line per request: method, path, status, seconds, the tokens
    when it generated (or embedded), and why it ended early if it did (the client
    disconnected, the server stopped, ...)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            usage = scope.get("mlxprog.usage")
            tokens = ""
            if usage and "completion_tokens" not in usage:  # embeddings generate nothing
                tokens = f": {usage['prompt_tokens']} input tokens"
            elif usage:
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                tokens = (f": {usage['prompt_tokens']} prompt tokens ({cached} cached), "
                          f"{usage['completion_tokens']} generated")
            ended = scope.get("mlxprog.ended")
            log.info("%s %s %d %.2f s%s%s", scope["method"], scope["path"], status[0],
                     time.perf_counter() - start, tokens, f"; {ended}" if ended else "")


class APIKey:
    """A 401 for a request without the server's API key, sent as OpenAI's
    clients send it (``Authorization: Bearer KEY``) or as Anthropic's
    (``x-api-key: KEY``), and compared in constant time. ``/health`` stays open: load balancers and orchestrators probe it
    without credentials, and it tells nothing a client could misuse."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        header = "Authorization" if "authorization" in headers or "x-api-key" not in headers \
            else "x-api-key"
        given = headers.get(header)
        scheme, _, key = (given or "").partition(" ") if header == "Authorization" \
            else ("bearer", "", given)
        # Header values arrive decoded as Latin-1: encoded back, they are the bytes sent.
        if scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode("latin-1"),
                                                              self.key):
            await self.app(scope, receive, send)
            return
        message = ("the request has no API key; send the header Authorization: Bearer <key> "
                   "(or x-api-key: <key>)" if given is None
                   else f"the API key in the {header} header is wrong")
        await error_response(APIError(
            401, f"{message} (the server's --api-key)", code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"}))(scope, receive, send)


class CORS(CORSMiddleware):
    """Starlette's CORS middleware, whose refused preflights are OpenAI-style
    errors saying what was refused."""

    def preflight_response(self, request_headers: Headers) -> Response:
        """The answer to a preflight (``OPTIONS`` with ``Origin`` and
        ``Access-Control-Request-Method``)."""
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        return error_response(APIError(
            400, f"the CORS preflight from {request_headers['origin']} is refused ({refused}); "
            f"the server allows the origins {', '.join(self.allow_origins)} (--allowed-origins) "
            f"and the methods {', '.join(self.allow_methods)}", code="cors_refused"),
            {"Vary": "Origin"})
