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
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Literal, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ProgramError
from .config import ModelError
from .engine import Piece
from .generate import DEFAULT_MAX_LENGTH, LLM, MAX_TOP_LOGPROBS, GenerationOptions, Prompt, load
from .scheduler import DEFAULT_MAX_BATCH, DEFAULT_PROMPT_CACHE_SIZE, APIError, Job, Scheduler
from .tokenizer import Tokenizer

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
#: OpenAI's default temperature; 0 is greedy.
DEFAULT_TEMPERATURE = 1.0
#: OpenAI's default ``max_tokens`` for (legacy) completions; chat completions
#: default to what the KV cache has room for.
DEFAULT_COMPLETION_TOKENS = 16
#: How long a stopping server lets running responses finish, in seconds.
SHUTDOWN_GRACE = 5

log = logging.getLogger("mlxprog.serve")

T = TypeVar("T")


class ServeError(ProgramError):
    """The server cannot start: its address cannot be listened on."""


# -- errors -----------------------------------------------------------------------
def _error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """``error`` as a JSON response."""
    return _json_response(error.body(), error.status, headers)


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
        message = f"{param} must be {words} {ctx[key]}, got {_shown(first['input'])}"
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
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repetition_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: list[str] = []
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

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
    answer), the finish reason and the usage."""

    def __init__(self, token_text: TokenText, logprobs: bool):
        self.token_text = token_text
        self.logprobs = logprobs
        self.text = ""
        self.tokens: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._offset = 0  # text offset of the next token, for completions' logprobs

    def add(self, piece: Piece) -> list[TokenLogprob]:
        """Take a piece; its token's log-probability entry (none for the EOS,
        or without logprobs)."""
        self.text += piece.text
        new = []
        if self.logprobs and piece.logprob is not None and piece.finish_reason != "eos":
            new.append((piece.token, piece.logprob, piece.top_logprobs))
            self.tokens += new
        if piece.finish_reason is not None:
            self.finish_reason = _FINISH[piece.finish_reason]
            s = piece.stats
            self.usage = {"prompt_tokens": s.prompt_tokens,
                          "completion_tokens": s.generated_tokens,
                          "total_tokens": s.prompt_tokens + s.generated_tokens,
                          "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}
        return new

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


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (the body is read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _EventStream(StreamingResponse):
    """Server-sent events that cancel their job however they end: finished,
    failed, or cut short by the client going away (Starlette then cancels
    the stream)."""

    def __init__(self, events: AsyncIterator[bytes], job: Job):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def _event(data: Any) -> bytes:
    return b"data: " + _json(data) + b"\n\n"


_DONE = b"data: [DONE]\n\n"


class _AccessLog:
    """One log line per request: method, path, status, seconds, and the
    tokens when it generated."""

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
            log.info("%s %s %d %.2f s%s", scope["method"], scope["path"], status[0],
                     time.perf_counter() - start, tokens)


ENDPOINTS = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models",
             "GET /health")


class Server:
    """An OpenAI-compatible server of ``llm``: the Starlette :attr:`app`, its
    :attr:`scheduler`, and ways to run it: :meth:`run` (in the foreground,
    until Ctrl-C) or :meth:`start` / :meth:`stop` (in a background thread).
    ``model_id`` is the name clients see (default: :func:`model_name`)."""

    def __init__(self, llm: LLM, *, model_id: str | None = None,
                 max_batch: int = DEFAULT_MAX_BATCH,
                 prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE):
        self.llm = llm
        self.model_id = model_id or model_name(llm)
        self.scheduler = Scheduler(llm, max_batch, prompt_cache_size)
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
            ],
            middleware=[Middleware(_AccessLog)],
            exception_handlers={APIError: self._api_error, HTTPException: self._http_error,
                                _ClientGone: self._client_gone, Exception: self._server_error},
        )
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    # -- running ---------------------------------------------------------------
    def run(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        """Serve in this thread until Ctrl-C (returns) or SIGTERM (which then
        ends the process); prints the URL on stderr once listening (``port``
        0: a free port)."""
        sock, server = self._listen(host, port)
        print(f"mlxprog serve: {self.model_id} at {self.url}/v1 (max batch "
              f"{self.scheduler.engine.max_batch}, KV cache {self.llm.max_length} tokens, prompt "
              f"cache {self.scheduler.pool.capacity}); Ctrl-C stops", file=sys.stderr, flush=True)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass  # uvicorn raises the SIGINT it handled again once it has shut down
        finally:
            sock.close()
            self.scheduler.stop()

    def start(self, host: str = DEFAULT_HOST, port: int = 0) -> str:
        """Serve from a background thread; returns the URL once serving."""
        sock, server = self._listen(host, port)
        self._uvicorn = server
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                                        name="mlxprog-http", daemon=True)
        self._thread.start()
        while not server.started:
            if not self._thread.is_alive():
                raise ServeError(f"the HTTP server at {self.url} stopped while starting")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        """Stop a server started with :meth:`start` (running responses get
        a few seconds to finish)."""
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            self._thread.join()
            self._uvicorn = None
        self.scheduler.stop()

    def _listen(self, host: str, port: int) -> tuple[socket.socket, Any]:
        """A listening socket (so connections queue from now on), the uvicorn
        server that will serve it, and the scheduler started."""
        import uvicorn  # only a running server needs it

        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, kind, proto)
        except OSError as e:
            raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(2048)
        except OSError as e:
            sock.close()
            raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="off", server_header=False,
                                timeout_graceful_shutdown=SHUTDOWN_GRACE)
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
            await self._or_disconnect(request, job, self._collect(job, first, output))
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
            async for piece in self._pieces(job, first):
                tokens = output.add(piece)
                if piece.text or tokens:
                    content = {"delta": {"content": piece.text}} if chat else {"text": piece.text}
                    yield chunk([choice(content, tokens)])
            end = {"delta": {}} if chat else {"text": ""}
            yield chunk([choice(end, None, output.finish_reason)])
            if usage:
                yield chunk([], output.usage)

        return self._stream(request, job, events(), output)

    async def _models(self, request: HTTPRequest) -> Response:
        return _json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: HTTPRequest) -> Response:
        name = request.path_params["model"]
        if name != self.model_id:
            raise APIError(404, f"the model {name!r} does not exist; this server has "
                           f"{self.model_id!r}", "model", code="model_not_found")
        return _json_response(self._model_card())

    async def _health(self, request: HTTPRequest) -> Response:
        s = self.scheduler
        return _json_response({"status": "ok", "model": self.model_id, "running": s.running,
                               "waiting": s.waiting, "max_batch": s.engine.max_batch})

    def _model_card(self) -> dict[str, Any]:
        # OpenAI's fields, then the quantized matmuls' numerics (clients
        # ignore fields they do not know).
        return {"id": self.model_id, "object": "model", "created": self.created,
                "owned_by": "mlxprog", "numerics": self.llm.numerics}

    # -- helpers ---------------------------------------------------------------
    async def _body(self, request: HTTPRequest, model: type[T]) -> T:
        """The request's JSON body, validated."""
        raw = await request.body()
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

    async def _submit(self, request: HTTPRequest, prompt: Prompt, options: GenerationOptions,
                      prompt_param: str) -> tuple[Job, Piece]:
        """Submit a job; its first piece, once prefilled (an error raises, so
        it gets its status code before any response starts)."""
        job = Job(prompt, options, prompt_param, asyncio.get_running_loop())
        self.scheduler.submit(job)
        return job, await self._or_disconnect(request, job, job.next())

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

    def _stream(self, request: HTTPRequest, job: Job, events: AsyncIterator[bytes],
                output: _Output) -> Response:
        """The events as SSE, then ``[DONE]``; an error on the way is sent as an
        error event."""

        async def framed() -> AsyncIterator[bytes]:
            try:
                async for event in events:
                    yield event
            except APIError as e:
                yield _event(e.body())
            request.scope["mlxprog.usage"] = output.usage
            yield _DONE

        return _EventStream(framed(), job)

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


def model_name(llm: LLM) -> str:
    """The id a model is served under by default: its file's stem (a
    directory's name)."""
    path = Path(llm.checkpoint.path)
    return path.name if path.is_dir() else path.stem


def serve(model: str | Path | None = None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          max_length: int = DEFAULT_MAX_LENGTH, max_batch: int = DEFAULT_MAX_BATCH,
          prompt_cache_size: int = DEFAULT_PROMPT_CACHE_SIZE, model_id: str | None = None,
          native: bool | None = None, numerics: str | None = None) -> None:
    """Load ``model`` (see :func:`~mlxprog.llm.load` for ``native`` and
    ``numerics``) and serve it until Ctrl-C, logging one line per request on
    stderr."""
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    llm = load(model, max_length=max_length, native=native, numerics=numerics)
    Server(llm, model_id=model_id, max_batch=max_batch,
           prompt_cache_size=prompt_cache_size).run(host, port)
