"""An OpenAI-compatible HTTP server for one loaded model (``mlxprog serve``).

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/completions``
(streamed as server-sent events, or one JSON answer), ``GET /v1/models``,
``GET /health``; see docs/serving.md for the fields and the behaviour.

Two threads share the work. uvicorn runs the Starlette app on one asyncio
event loop: a handler validates a request, submits a
:class:`~mlxprog.llm.scheduler.Job` to the
:class:`~mlxprog.llm.scheduler.Scheduler` and awaits the job's pieces. The
scheduler's thread runs the model (see :mod:`mlxprog.llm.scheduler`). Rows
leave the batch when they finish or when their client goes away.

The connections are uvicorn's HTTP/1.1 protocol with deadlines
(:class:`_Connection`), so that slow or silent clients, and floods of them,
are cut off rather than held; an API key and CORS are optional middleware.
:meth:`Server.stop` (and SIGINT or SIGTERM in :meth:`Server.run`) stops
gracefully: new requests get a 503 while the running ones finish, for a
grace period, then end with an error as their clients expect it.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import re
import resource
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Literal, Sequence, TypeVar

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ProgramError
from .config import ModelError
from .engine import GenerationStats, Piece
from .generate import DEFAULT_MAX_LENGTH, LLM, MAX_TOP_LOGPROBS, GenerationOptions, Prompt, load
from .scheduler import (DEFAULT_MAX_BATCH, DEFAULT_MAX_WAITING, DEFAULT_PREFILL_CHUNK,
                        DEFAULT_PROMPT_CACHE_SIZE, APIError, Job, Scheduler)
from .tokenizer import Tokenizer

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: OpenAI's default temperature; 0 is greedy.
DEFAULT_TEMPERATURE = 1.0
#: OpenAI's default ``max_tokens`` for (legacy) completions; chat completions
#: default to what the KV cache has room for.
DEFAULT_COMPLETION_TOKENS = 16
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
#: The largest request body, in bytes (a prompt that fills a 128K-token cache
#: takes well under it); more is a 413.
MAX_BODY_BYTES = 16 * 2**20
#: Connections served at once: a request on one more gets a 503, and twice as
#: many are closed as they arrive (fewer where the process may open few files).
DEFAULT_MAX_CONNECTIONS = 256
#: Bytes the kernel buffers of each connection's answer: bounded, so that a
#: client that does not read is noticed (:data:`WRITE_TIMEOUT`).
SEND_BUFFER = 64 * 1024
#: Connections the kernel queues before the server accepts them; it refuses more.
BACKLOG = 1024
#: What may be in ``--allowed-origins``: ``scheme://host[:port]``, no path.
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")

log = logging.getLogger("mlxprog.serve")

T = TypeVar("T")


class ServeError(ProgramError):
    """The server cannot start: a setting is out of range, or its address
    cannot be listened on."""


# -- errors -----------------------------------------------------------------------
def _error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """``error`` as a JSON response, with its headers and ``headers``."""
    return _json_response(error.body(), error.status, {**error.headers, **(headers or {})})


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def _json(data: Any) -> bytes:
    # Log-probabilities are clamped finite (see _logprob), so strict JSON holds.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_json(data), status, headers, media_type="application/json")


def _param(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: ``messages[0].content``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "greater than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}


def _invalid(error: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = error.errors(include_url=False)[0]
    param, kind, ctx = _param(first["loc"]), first["type"], first.get("ctx") or {}
    if kind == "missing":
        message = f"{param} is required"
    elif kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx[key]  # a float field's bound is a float: 2.0 is shown as 2
        shown = f"{bound:g}" if isinstance(bound, float) else bound
        message = f"{param} must be {words} {shown}, got {_shown(first['input'])}"
    elif kind == "too_short":
        message = f"{param} must not be empty"
    elif kind == "literal_error":
        message = f"{param} must be {ctx['expected']}, got {_shown(first['input'])}"
    elif kind == "value_error":
        message = f"{param} {ctx['error']}"
    else:  # "Input should be a valid integer" -> "max_tokens must be a valid integer"
        text = re.sub(r" or instance of \w+", "", first["msg"])
        message = re.sub(r"^Input should", f"{param} must", text)
        if message == text:
            message = f"{param}: {text}"
    return APIError(400, message, param=param or None)


# -- request bodies ---------------------------------------------------------------
# Strict types: a JSON string is no number and 1 is no boolean, as in OpenAI's
# API; fields this server does not know are ignored, as OpenAI ignores them.
_STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class ChatMessage(BaseModel):
    """One message of a chat: ``role`` and text ``content`` (a string, or
    OpenAI's list of ``{"type": "text", "text": ...}`` parts, joined by line
    breaks). ``developer`` is OpenAI's newer name for ``system``."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        if isinstance(value, list):
            texts = []
            for i, part in enumerate(value):
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise ValueError(f"part {i} is not a text part ({{\"type\": \"text\", "
                                     "\"text\": ...}); this server takes text only")
                texts.append(part["text"])
            return "\n".join(texts)
        if not isinstance(value, str):
            raise ValueError(f"must be a string or a list of text parts, got {_shown(value)}")
        return value


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` sends a last chunk with the usage."""

    model_config = _STRICT
    include_usage: bool = False


class _GenerationBody(BaseModel):
    """The fields chat and text completions share."""

    model_config = _STRICT
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = Field(None, ge=-2**63, le=2**63 - 1)  # OpenAI's: a 64-bit integer
    stop: list[str] = []
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise ValueError(f"must be a string or a list of strings, got {_shown(value)}")

    def check_supported(self) -> None:
        """Reject what OpenAI accepts but this server cannot honour (rather than
        silently ignore)."""
        if self.n not in (None, 1):
            raise APIError(400, f"n must be 1 (one choice per request), got {self.n}", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported (use repetition_penalty)", name)
        if self.logit_bias:
            raise APIError(400, "logit_bias is not supported", "logit_bias")

    def options(self, max_tokens: int, logprobs: bool, top_logprobs: int,
                chat: bool) -> GenerationOptions:
        """The generation options the body asks for. Without a ``seed`` each
        request draws one, so that sampling differs between requests."""
        seed = secrets.randbits(64) if self.seed is None else self.seed % 2**64
        try:
            return GenerationOptions(
                max_tokens=max_tokens, logprobs=logprobs, top_logprobs=top_logprobs,
                chat=chat, seed=seed,
                temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k,
                min_p=self.min_p or 0.0, repetition_penalty=self.repetition_penalty,
                stop=self.stop)
        except ModelError as e:  # the options' own rules, past the checks above
            name = str(e).split()[0]
            raise APIError(400, str(e), name if name in type(self).model_fields else None) from None


class ChatCompletionBody(_GenerationBody):
    """A ``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        """As for every generation, and: no tools, text responses only,
        ``top_logprobs`` only with ``logprobs``."""
        super().check_supported()
        if self.tools:
            raise APIError(400, "tools are not supported", "tools")
        if self.response_format and self.response_format.get("type") != "text":
            raise APIError(400, "response_format: only {\"type\": \"text\"} is supported",
                           "response_format")
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs")

    def prompt(self) -> list[dict[str, str]]:
        """The messages, as the chat template takes them."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.content}
                for m in self.messages]


class CompletionBody(_GenerationBody):
    """A ``POST /v1/completions`` body: ``prompt`` is text or token ids (one
    prompt: a list holding one is unwrapped); ``logprobs`` is the number of
    alternatives to report per token."""

    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
            if len(value) > 1:
                raise ValueError(f"must be one prompt (this server answers one per request), "
                                 f"got {len(value)}")
            value = value[0]
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(type(v) is int for v in value):
            if not value:
                raise ValueError("must not be empty")
            return value
        raise ValueError(f"must be a string or a list of token ids, got {_shown(value)}")

    def check_supported(self) -> None:
        """As for every generation, and: no ``echo``, ``suffix`` or ``best_of``."""
        super().check_supported()
        if self.echo:
            raise APIError(400, "echo is not supported", "echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1, got {self.best_of}", "best_of")


# -- responses --------------------------------------------------------------------
_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
#: OpenAI's stand-in for a log-probability of -inf.
_LOWEST_LOGPROB = -9999.0


def _logprob(value: float) -> float:
    return value if value >= _LOWEST_LOGPROB else _LOWEST_LOGPROB  # NaN too


def _byte_symbols() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the byte each vocabulary character stands for."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[chr(byte)] = byte
        else:
            symbols[chr(256 + extra)] = byte
            extra += 1
    return symbols


class TokenText:
    """Each token's text and UTF-8 bytes, as OpenAI's log-probabilities show
    them. The bytes come from the vocabulary entry (byte-level symbols, or a
    ``<0xNN>`` byte token), so a token holding part of a character has its
    own bytes; otherwise they are those of the decoded text."""

    _BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._symbols = _byte_symbols()
        self._known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        """``(text, bytes)`` of ``token``."""
        if token not in self._known:
            text = self.tokenizer.decode([token])
            entry = self.tokenizer.id_to_token(token) or ""
            byte = self._BYTE_TOKEN.fullmatch(entry)
            if byte:
                raw = [int(byte.group(1), 16)]
            elif entry and all(c in self._symbols for c in entry):
                raw = [self._symbols[c] for c in entry]
            else:
                raw = list(text.encode("utf-8"))
            self._known[token] = (text, raw)
        return self._known[token]


#: A generated token's log-probability entry: the token, its log-probability,
#: and the alternatives ``(token, logprob)``.
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


class _Output:
    """A generation's pieces as OpenAI reports them: the text, the generated
    tokens' log-probabilities (the end-of-sequence token is no part of the
    answer), the finish reason and the usage (so far, until it finishes)."""

    def __init__(self, token_text: TokenText, logprobs: bool):
        self.token_text = token_text
        self.logprobs = logprobs
        self.text = ""
        self.tokens: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.stats: GenerationStats | None = None  # the latest piece's
        self._offset = 0  # text offset of the next token, for completions' logprobs

    def add(self, piece: Piece) -> list[TokenLogprob]:
        """Take a piece; its token's log-probability entry (none for the EOS,
        or without logprobs)."""
        self.text += piece.text
        self.stats = piece.stats
        new = []
        if self.logprobs and piece.logprob is not None and piece.finish_reason != "eos":
            new.append((piece.token, piece.logprob, piece.top_logprobs))
            self.tokens += new
        if piece.finish_reason is not None:
            self.finish_reason = _FINISH[piece.finish_reason]
        return new

    def cut_short(self) -> None:
        """The answer ends before its generation did (an error after its
        stream started): its finish reason is ``"length"``, as for an answer
        that ``max_tokens`` cut."""
        self.finish_reason = "length"

    @property
    def usage(self) -> dict[str, Any] | None:
        """OpenAI's usage of the pieces so far (None before the first)."""
        s = self.stats
        return None if s is None else _usage(s.prompt_tokens, s.cached_tokens,
                                              s.generated_tokens)

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text, raw = self.token_text(token)
        return {"token": text, "logprob": _logprob(logprob), "bytes": raw}

    def chat_logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        """``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
        if not self.logprobs:
            return None
        return {"content": [{**self._entry(t, lp),
                             "top_logprobs": [self._entry(a, alp) for a, alp in top]}
                            for t, lp, top in tokens]}

    def completion_logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        """``{tokens, token_logprobs, top_logprobs, text_offset}``; the offsets
        count the tokens' texts from the start of the completion."""
        if not self.logprobs:
            return None
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                     "text_offset": []}
        for token, logprob, top in tokens:
            text = self.token_text(token)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(_logprob(logprob))
            out["top_logprobs"].append({self.token_text(a)[0]: _logprob(alp) for a, alp in top})
            out["text_offset"].append(self._offset)
            self._offset += len(text)
        return out


def _usage(prompt_tokens: int, cached_tokens: int, generated_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated_tokens,
            "total_tokens": prompt_tokens + generated_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (the body is read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _EventStream(StreamingResponse):
    """Server-sent events, then ``[DONE]``, that cancel their job however
    they end: finished, failed, or cut short by the client going away
    (Starlette then cancels the stream) or not reading (its connection is
    closed: see :class:`_Connection`). The access log gets the usage so far,
    and why a stream cut short ended."""

    def __init__(self, events: AsyncIterator[bytes], job: Job, output: _Output):
        super().__init__(self._framed(events), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job
        self.output = output
        self.complete = False

    async def _framed(self, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for event in events:
            yield event
        self.complete = True
        yield _DONE

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()
            scope["mlxprog.usage"] = self.output.usage
            if not self.complete:
                scope.setdefault("mlxprog.ended", "the client disconnected")


def _event(data: Any) -> bytes:
    return b"data: " + _json(data) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class _AccessLog:
    """One log line per request: method, path, status, seconds, the tokens
    when it generated, and why it ended early if it did (the client
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
            if usage:
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                tokens = (f": {usage['prompt_tokens']} prompt tokens ({cached} cached), "
                          f"{usage['completion_tokens']} generated")
            ended = scope.get("mlxprog.ended")
            log.info("%s %s %d %.2f s%s%s", scope["method"], scope["path"], status[0],
                     time.perf_counter() - start, tokens, f"; {ended}" if ended else "")


class _APIKey:
    """A 401 for a request without the server's API key, sent as OpenAI's
    clients send it (``Authorization: Bearer KEY``) and compared in constant
    time. ``/health`` stays open: load balancers and orchestrators probe it
    without credentials, and it tells nothing a client could misuse."""

    OPEN = frozenset({"/health"})

    def __init__(self, app: ASGIApp, key: str):
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN:
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("authorization")
        scheme, _, key = (given or "").partition(" ")
        # Header values arrive decoded as Latin-1: encoded back, they are the bytes sent.
        if scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode("latin-1"),
                                                              self.key):
            await self.app(scope, receive, send)
            return
        message = ("the request has no API key; send the header Authorization: Bearer <key>"
                   if given is None else "the API key in the Authorization header is wrong")
        await _error_response(APIError(
            401, f"{message} (the server's --api-key)", code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"}))(scope, receive, send)


class _CORS(CORSMiddleware):
    """Starlette's CORS middleware, whose refused preflights are OpenAI-style
    errors saying what was refused."""

    def preflight_response(self, request_headers: Headers) -> Response:
        """The answer to a preflight (``OPTIONS`` with ``Origin`` and
        ``Access-Control-Request-Method``)."""
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        return _error_response(APIError(
            400, f"the CORS preflight from {request_headers['origin']} is refused ({refused}); "
            f"the server allows the origins {', '.join(self.allow_origins)} (--allowed-origins) "
            f"and the methods {', '.join(self.allow_methods)}", code="cors_refused"),
            {"Vary": "Origin"})


class _Guard:
    """What the server's connections live by (their limit and timeouts),
    and the connections open (each :class:`_Connection` adds and removes
    itself)."""

    def __init__(self, max_connections: int, request_timeout: float, write_timeout: float):
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self.open: set[_Connection] = set()
        self.refuse = _AccessLog(self._refuse)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app of a connection beyond the limit: a 503, then it closes."""
        await _error_response(APIError(
            503, f"the server serves {self.max_connections} connections at once, and this one "
            "is beyond them; retry later", code="too_many_connections",
            headers={"Retry-After": "1", "Connection": "close"}))(scope, receive, send)


class _Connection(H11Protocol):
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

    def __init__(self, *args: Any, guard: _Guard, **kwargs: Any):
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


def _default_max_connections() -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, or fewer where the process may open
    few files: twice the limit (those beyond are closed as they arrive) and
    the files the model and Python hold must fit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, (soft - 64) // 2))


ENDPOINTS = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
             "GET /health", "GET /metrics")


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
    open connections (default: :data:`DEFAULT_MAX_CONNECTIONS`, fewer if
    the process may open few files) requests get a 503."""

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
        self.created = int(time.time())
        self.url: str | None = None
        self.token_text = TokenText(llm.tokenizer)
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/models/{model:path}", self._model, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ],
            middleware=self._middleware(api_key, origins),
            exception_handlers={APIError: self._api_error, HTTPException: self._http_error,
                                _ClientGone: self._client_gone, Exception: self._server_error},
        )
        self.shutdown_grace = shutdown_grace
        self.request_timeout = request_timeout
        #: Whether :meth:`stop` has begun (new generation requests get a 503).
        self.stopping = False
        self._guard = _Guard(max_connections or _default_max_connections(), request_timeout,
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
        stack = [Middleware(_AccessLog)]
        if origins:
            stack.append(Middleware(_CORS, allow_origins=origins, allow_methods=["GET", "POST"],
                                    allow_headers=["*"]))
        if api_key is not None:
            stack.append(Middleware(_APIKey, key=api_key))
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
        if self._uvicorn is None or not self._thread.is_alive():  # never served, or stopped
            self.scheduler.stop()
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
        await self._until(lambda: not scheduler.busy, self.shutdown_grace)
        await asyncio.to_thread(scheduler.stop)
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
        # endpoint, and an upgraded connection would leave _Connection's
        # accounting.
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="off", server_header=False, backlog=BACKLOG,
                                http=functools.partial(_Connection, guard=self._guard),
                                ws="none", timeout_graceful_shutdown=SHUTDOWN_FLUSH)
        self.scheduler.start()
        return sock, uvicorn.Server(config)

    # -- endpoints -------------------------------------------------------------
    async def _chat(self, request: HTTPRequest) -> Response:
        body = await self._body(request, ChatCompletionBody)
        max_tokens = body.max_completion_tokens or body.max_tokens or self.llm.max_length
        options = body.options(max_tokens, bool(body.logprobs), body.top_logprobs or 0,
                               chat=True)
        return await self._answer(request, body, body.prompt(), options, chat=True)

    async def _completions(self, request: HTTPRequest) -> Response:
        body = await self._body(request, CompletionBody)
        max_tokens = body.max_tokens or DEFAULT_COMPLETION_TOKENS
        options = body.options(max_tokens, body.logprobs is not None, body.logprobs or 0,
                               chat=False)
        return await self._answer(request, body, body.prompt, options, chat=False)

    async def _answer(self, request: HTTPRequest, body: _GenerationBody, prompt: Prompt,
                      options: GenerationOptions, chat: bool) -> Response:
        """Generate, and answer as a chat or a text completion: one JSON
        object, or (``stream``) server-sent chunks."""
        job, first = await self._submit(request, prompt, options,
                                        "messages" if chat else "prompt")
        output = _Output(self.token_text, options.logprobs)
        kind = "chat.completion" if chat else "text_completion"
        reply_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())

        def choice(content: dict[str, Any], tokens: list | None,
                   finish_reason: str | None = None) -> dict[str, Any]:
            """One choice; ``tokens`` None: no log-probabilities."""
            logprobs = None
            if tokens is not None:
                logprobs = (output.chat_logprobs if chat else output.completion_logprobs)(tokens)
            return {"index": 0, **content, "logprobs": logprobs, "finish_reason": finish_reason}

        if not body.stream:
            try:
                await self._or_disconnect(request, job, self._collect(job, first, output))
            finally:
                request.scope["mlxprog.usage"] = output.usage
            text = output.text
            content = ({"message": {"role": "assistant", "content": text}} if chat
                       else {"text": text})
            return _json_response({
                "id": reply_id, "object": kind, "created": created, "model": self.model_id,
                "choices": [choice(content, output.tokens, output.finish_reason)],
                "usage": output.usage})

        usage = body.stream_options is not None and body.stream_options.include_usage

        def chunk(choices: list[dict[str, Any]], usage_data: Any = None) -> bytes:
            data = {"id": reply_id, "object": f"{kind}.chunk" if chat else kind,
                    "created": created, "model": self.model_id, "choices": choices}
            if usage:  # null on every chunk but the last, as OpenAI's
                data["usage"] = usage_data
            return _event(data)

        async def events() -> AsyncIterator[bytes]:
            if chat:
                yield chunk([choice({"delta": {"role": "assistant", "content": ""}}, None)])
            error = None
            try:
                async for piece in self._pieces(job, first):
                    tokens = output.add(piece)
                    if piece.text or tokens:
                        content = ({"delta": {"content": piece.text}} if chat
                                   else {"text": piece.text})
                        yield chunk([choice(content, tokens)])
            except APIError as e:
                # The stream has begun (status 200): it still ends as every
                # stream does, so that any client sees its end, then says why.
                error = e
                output.cut_short()
                request.scope["mlxprog.ended"] = e.message
            end = {"delta": {}} if chat else {"text": ""}
            yield chunk([choice(end, None, output.finish_reason)])
            if usage:
                yield chunk([], output.usage)
            if error is not None:
                yield _event(error.body())

        return _EventStream(events(), job, output)

    async def _models(self, request: HTTPRequest) -> Response:
        return _json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: HTTPRequest) -> Response:
        name = request.path_params["model"]
        if name != self.model_id:
            raise APIError(404, f"the model {name!r} does not exist; this server has "
                           f"{self.model_id!r}", "model", code="model_not_found")
        return _json_response(self._model_card())

    async def _health(self, request: HTTPRequest) -> Response:
        """``status`` "ok" (200) once the server serves, "loading" (503)
        while it builds its programs; the model, and the scheduler's
        :meth:`~mlxprog.llm.scheduler.Scheduler.stats`."""
        ready = self.scheduler.ready.is_set()
        return _json_response({"status": "ok" if ready else "loading", "model": self.model_id,
                               **self.scheduler.stats()}, 200 if ready else 503)

    async def _metrics(self, request: HTTPRequest) -> Response:
        """The scheduler's stats in Prometheus' text format."""
        return Response(prometheus_text(self.scheduler.stats(), self.scheduler.ready.is_set()),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def _model_card(self) -> dict[str, Any]:
        # OpenAI's fields, then the quantized matmuls' numerics (clients
        # ignore fields they do not know).
        return {"id": self.model_id, "object": "model", "created": self.created,
                "owned_by": "mlxprog", "numerics": self.llm.numerics}

    # -- helpers ---------------------------------------------------------------
    async def _body(self, request: HTTPRequest, model: type[T]) -> T:
        """The request's JSON body, validated."""
        raw = await self._read_body(request)
        if not raw.strip():
            raise APIError(400, "the request body is empty; send a JSON object")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise APIError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise APIError(400, f"the request body must be a JSON object, got {_shown(data)}")
        try:
            body = model.model_validate(data)
        except ValidationError as e:
            raise _invalid(e) from None
        body.check_supported()
        return body

    async def _read_body(self, request: HTTPRequest) -> bytes:
        """The request's body, if it arrives within the request timeout (else
        a 408) and holds at most :data:`MAX_BODY_BYTES` (else a 413). Both
        close the connection: the rest of the body would arrive for nothing."""
        too_large = APIError(413, f"the request body is over {MAX_BODY_BYTES // 2**20} MiB",
                             code="request_too_large", headers={"Connection": "close"})
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_large
        parts: list[bytes] = []
        size = 0

        async def read() -> None:
            nonlocal size
            async for part in request.stream():
                size += len(part)
                if size > MAX_BODY_BYTES:
                    raise too_large
                parts.append(part)

        try:
            await asyncio.wait_for(read(), self.request_timeout)
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within "
                           f"{self.request_timeout:g} s (the server's request timeout)",
                           code="request_timeout", headers={"Connection": "close"}) from None
        except ClientDisconnect:
            request.scope["mlxprog.ended"] = "the client disconnected"
            raise _ClientGone from None
        return b"".join(parts)

    async def _submit(self, request: HTTPRequest, prompt: Prompt, options: GenerationOptions,
                      prompt_param: str) -> tuple[Job, Piece]:
        """Submit a job; its first piece, once prefilled (an error raises, so
        it gets its status code before any response starts)."""
        job = Job(prompt, options, prompt_param, asyncio.get_running_loop())
        self.scheduler.submit(job)
        try:
            return job, await self._or_disconnect(request, job, job.next())
        except _ClientGone:
            admitted = job.request  # set once the scheduler has tokenized the prompt
            if admitted is not None:
                request.scope["mlxprog.usage"] = _usage(len(admitted.ids), admitted.cached, 0)
            raise

    async def _or_disconnect(self, request: HTTPRequest, job: Job, work: Awaitable[T]) -> T:
        """Await ``work``, unless the client disconnects first: then the job is
        cancelled (freeing its row) and :class:`_ClientGone` raises."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is stopping
            task.cancel()
            job.cancel()
            raise
        finally:
            watch.cancel()
        if task.done():
            return task.result()
        task.cancel()
        job.cancel()
        request.scope["mlxprog.ended"] = "the client disconnected"
        raise _ClientGone

    @staticmethod
    async def _pieces(job: Job, first: Piece) -> AsyncIterator[Piece]:
        piece = first
        yield piece
        while piece.finish_reason is None:
            piece = await job.next()
            yield piece

    async def _collect(self, job: Job, first: Piece, output: _Output) -> None:
        async for piece in self._pieces(job, first):
            output.add(piece)

    # -- errors ----------------------------------------------------------------
    async def _api_error(self, request: HTTPRequest, exc: Exception) -> Response:
        return _error_response(exc)

    async def _http_error(self, request: HTTPRequest, exc: Exception) -> Response:
        """Starlette's own errors (unknown routes, wrong methods) in OpenAI's shape."""
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            message = f"there is no {method} {path}; this server has {', '.join(ENDPOINTS)}"
            return _error_response(APIError(404, message, code="not_found"))
        if exc.status_code == 405:
            allowed = exc.headers.get("Allow", "") if exc.headers else ""
            return _error_response(APIError(
                405, f"{method} is not allowed on {path} (allowed: {allowed})",
                code="method_not_allowed"), exc.headers)
        return _error_response(APIError(exc.status_code, exc.detail), exc.headers)

    async def _client_gone(self, request: HTTPRequest, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"

    async def _server_error(self, request: HTTPRequest, exc: Exception) -> Response:
        # A bug: Starlette hands the exception on to uvicorn, which logs its traceback.
        return _error_response(APIError(500, f"the server failed: {type(exc).__name__}: {exc}"))


#: Prometheus metrics: stats key -> (metric name, type, help).
_METRICS = {
    "prefilling": ("mlxprog_rows_prefilling", "gauge", "Rows being prefilled."),
    "running": ("mlxprog_rows_decoding", "gauge", "Rows decoding in the batch."),
    "waiting": ("mlxprog_requests_waiting", "gauge", "Requests waiting for a row."),
    "max_batch": ("mlxprog_max_batch", "gauge", "Rows that may prefill or decode at once."),
    "max_waiting": ("mlxprog_max_waiting", "gauge", "Requests that may wait (then 503)."),
    "cached_tokens": ("mlxprog_cached_tokens", "gauge",
                      "Tokens in the batch's KV cache and the prompt cache."),
    "requests": ("mlxprog_requests_total", "counter", "Requests answered."),
    "prompt_tokens": ("mlxprog_prompt_tokens_total", "counter",
                      "Prompt tokens prefilled (not counting prompt-cache hits)."),
    "generated_tokens": ("mlxprog_generated_tokens_total", "counter", "Tokens generated."),
    "steps": ("mlxprog_decode_steps_total", "counter", "Decode steps run."),
    "cancelled": ("mlxprog_requests_cancelled_total", "counter",
                  "Requests whose clients went away."),
    "failures": ("mlxprog_failures_total", "counter", "Unexpected errors."),
    "generated_tokens_per_second": ("mlxprog_generated_tokens_per_second", "gauge",
                                    "Tokens generated per second over the last 10 s."),
    "active_memory_bytes": ("mlxprog_mlx_active_memory_bytes", "gauge",
                            "Bytes of MLX arrays alive."),
    "cache_memory_bytes": ("mlxprog_mlx_cache_memory_bytes", "gauge",
                           "Bytes of freed buffers MLX keeps for reuse."),
}


def prometheus_text(stats: dict[str, float], ready: bool) -> str:
    """``stats`` (:meth:`~mlxprog.llm.scheduler.Scheduler.stats`) and
    whether the server is ready, in Prometheus' text exposition format."""
    lines = ["# HELP mlxprog_ready Whether the server serves (1) or builds its programs (0).",
             "# TYPE mlxprog_ready gauge", f"mlxprog_ready {int(ready)}"]
    for key, (name, kind, text) in _METRICS.items():
        value = stats[key]  # counts exact (a float's 6 digits would round them)
        shown = str(value) if isinstance(value, int) else f"{value:.6g}"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {shown}"]
    return "\n".join(lines) + "\n"


def model_name(llm: LLM) -> str:
    """The id a model is served under by default: its file's stem (a
    directory's name)."""
    path = Path(llm.checkpoint.path)
    return path.name if path.is_dir() else path.stem


def serve(model: str | Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          max_length: int = DEFAULT_MAX_LENGTH, max_batch: int = DEFAULT_MAX_BATCH,
          prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE,
          prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_waiting: int = DEFAULT_MAX_WAITING,
          model_id: str | None = None, native: bool | None = None,
          numerics: str | None = None, api_key: str | None = None,
          allowed_origins: Sequence[str] = (), shutdown_grace: float = SHUTDOWN_GRACE) -> None:
    """Load ``model`` (see :func:`~mlxprog.llm.load` for ``native`` and
    ``numerics``) and serve it until Ctrl-C or SIGTERM, logging one line per
    request on stderr (see :class:`Server` for the other settings)."""
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
        llm = load(model, max_length=max_length, native=native, numerics=numerics)
        Server(llm, model_id=model_id, max_batch=max_batch, prompt_cache_size=prompt_cache_size,
               prefill_chunk=prefill_chunk, max_waiting=max_waiting, api_key=api_key,
               allowed_origins=allowed_origins, shutdown_grace=shutdown_grace).run(host, port)
    finally:
        if handler is not None:  # the logger as found, for a caller that goes on (a test)
            log.removeHandler(handler)
            log.setLevel(logging.NOTSET)
            log.propagate = True
