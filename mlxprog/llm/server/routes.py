"""The server's endpoints: a handler validates a request, submits a
:class:`~mlxprog.llm.server.scheduler.Job` to the scheduler and awaits the job's
pieces, answering as OpenAI does (one JSON object, or server-sent chunks);
errors of every kind are answered in OpenAI's shape."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive

from ...errors import ModelError
from ..constraints import shown
from ..engine import Piece
from ..generate import LLM, Prompt
from ..options import GenerationOptions
from ..tool_calls import ToolPrompt
from .anthropic import (
    BlockEvents, MessagesBody, anthropic_error, content_blocks, new_message_id, sse, stop_reason,
)
from .embeddings import Embedder, EmbeddingJob
from .errors import APIError
from .metrics import prometheus_text
from .openai_responses import (
    ItemEvents, ResponsesBody, ResponseStore, conversation, new_id, output_items,
    response_object, responses_error,
)
from .openai_responses import usage as responses_usage
from .rendering import ChatReply, Output, TokenText, usage
from .responses import EventStream, error_response, event, json_response
from .scheduler import Job, Scheduler
from .schemas import (
    ChatCompletionBody, CompletionBody, EmbeddingBody, GenerationBody, invalid,
)

#: OpenAI's default ``max_tokens`` for (legacy) completions; chat completions
#: default to what the KV cache has room for.
DEFAULT_COMPLETION_TOKENS = 16
#: The largest request body, in bytes (a prompt that fills a 128K-token cache
#: takes well under it); more is a 413.
MAX_BODY_BYTES = 16 * 2**20

ENDPOINTS = ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
             "POST /v1/responses", "GET /v1/responses/{id}", "DELETE /v1/responses/{id}",
             "POST /v1/embeddings", "GET /v1/models", "GET /health", "GET /metrics")

T = TypeVar("T")


def _without_oldest(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Chat messages without their oldest item (a system message stays):
    the first message after the system ones goes, and with it what follows
    up to the next user message (the answers and tool results of a turn
    whose question is gone); None when no user message would be left."""
    first = next((i for i, m in enumerate(messages) if m.get("role") not in
                  ("system", "developer")), len(messages))
    after = next((i for i in range(first + 1, len(messages))
                  if messages[i].get("role") == "user"), None)
    return None if after is None else messages[:first] + messages[after:]


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(receive: Receive) -> None:
    """Return once the client has disconnected (the body is read by then)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Endpoints:
    """The endpoints serving ``llm`` through ``scheduler`` (and its
    embeddings through ``embedder``) under the name ``model_id``:
    :meth:`routes` and :meth:`exception_handlers` make the Starlette app. A
    request's body must arrive within ``request_timeout`` seconds."""

    def __init__(self, llm: LLM, scheduler: Scheduler, model_id: str, request_timeout: float,
                 embedder: Embedder):
        self.llm = llm
        self.scheduler = scheduler
        self.embedder = embedder
        self.model_id = model_id
        self.request_timeout = request_timeout
        self.created = int(time.time())
        self.token_text = TokenText(llm.tokenizer)
        self.stored = ResponseStore()

    def routes(self) -> list[Route]:
        """The app's routes (:data:`ENDPOINTS`, and ``GET /v1/models/{model}``)."""
        return [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", self._stored_response,
                  methods=["GET", "DELETE"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/models/{model:path}", self._model, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]

    def exception_handlers(self) -> dict[Any, Any]:
        """The app's exception handlers: every error answered in OpenAI's shape."""
        return {APIError: self._api_error, HTTPException: self._http_error,
                ClientGone: self._client_gone, Exception: self._server_error}

    # -- endpoints -------------------------------------------------------------
    async def _chat(self, request: HTTPRequest) -> Response:
        body = await self._body(request, ChatCompletionBody)
        tool_prompt = body.tool_prompt(self.llm.tokenizer.chat_template)
        max_tokens = body.max_completion_tokens or body.max_tokens or self.llm.max_length
        options = body.options(max_tokens, bool(body.logprobs), body.top_logprobs or 0,
                               chat=False, vocab_size=self.llm.config.vocab_size,
                               constraint=body.reply_constraint(tool_prompt),
                               special_tokens=tool_prompt.reads_reply)
        return await self._answer(request, body, self._rendered(tool_prompt), options,
                                  self._reply(tool_prompt))

    async def _completions(self, request: HTTPRequest) -> Response:
        body = await self._body(request, CompletionBody)
        max_tokens = body.max_tokens or DEFAULT_COMPLETION_TOKENS
        options = body.options(max_tokens, body.logprobs is not None, body.logprobs or 0,
                               chat=False, vocab_size=self.llm.config.vocab_size,
                               constraint=body.constraint())
        return await self._answer(request, body, body.prompt, options, None)

    def _reply(self, tool_prompt: ToolPrompt) -> ChatReply:
        """The reader of a chat's reply (decoded with this model's special
        tokens where it is read: see :attr:`ToolPrompt.reads_reply`)."""
        return ChatReply(tool_prompt, self.llm.tokenizer.special_texts)

    def _rendered(self, tool_prompt: ToolPrompt) -> str:
        """A chat's prompt text: its messages (and tools) through the chat template."""
        try:
            return self.llm.tokenizer.apply_chat_template(tool_prompt.messages,
                                                          **tool_prompt.template_kwargs)
        except ModelError as e:
            raise APIError(400, str(e), "messages") from None

    async def _answer(self, request: HTTPRequest, body: GenerationBody, prompt: Prompt,
                      options: GenerationOptions, reply: ChatReply | None) -> Response:
        """Generate, and answer as a chat (``reply`` reads its message) or a
        text completion (``reply`` None): one JSON object, or (``stream``)
        server-sent chunks."""
        chat = reply is not None
        job, first = await self._submit(request, prompt, options,
                                        "messages" if chat else "prompt")
        output = Output(self.token_text, options.logprobs)
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
            if reply is None:
                content, finish_reason = {"text": output.text}, output.finish_reason
            else:
                reply.feed(output.text)
                reply.finish()
                content = {"message": reply.message()}
                finish_reason = reply.finish_reason(output.finish_reason)
            return json_response({
                "id": reply_id, "object": kind, "created": created, "model": self.model_id,
                "choices": [choice(content, output.tokens, finish_reason)],
                "usage": output.usage})

        include_usage = body.stream_options is not None and body.stream_options.include_usage

        def chunk(choices: list[dict[str, Any]], usage_data: Any = None) -> bytes:
            data = {"id": reply_id, "object": f"{kind}.chunk" if chat else kind,
                    "created": created, "model": self.model_id, "choices": choices}
            if include_usage:  # null on every chunk but the last, as OpenAI's
                data["usage"] = usage_data
            return event(data)

        async def events() -> AsyncIterator[bytes]:
            if chat:
                yield chunk([choice({"delta": {"role": "assistant", "content": ""}}, None)])
            error = None
            try:
                async for piece in self._pieces(job, first):
                    tokens = output.add(piece)
                    if reply is None:
                        if piece.text or tokens:
                            yield chunk([choice({"text": piece.text}, tokens)])
                        continue
                    deltas = reply.feed(piece.text)
                    if tokens and not deltas:  # a token of no text yet: its logprobs
                        deltas = [{"content": ""}]
                    for i, delta in enumerate(deltas):  # the piece's logprobs on its first
                        yield chunk([choice({"delta": delta}, tokens if i == 0 else None)])
            except APIError as e:
                # The stream has begun (status 200): it still ends as every
                # stream does, so that any client sees its end, then says why.
                error = e
                output.cut_short()
                request.scope["mlxprog.ended"] = e.message
            if reply is None:
                end, finish_reason = {"text": ""}, output.finish_reason
            else:
                for delta in reply.finish():
                    yield chunk([choice({"delta": delta}, None)])
                end, finish_reason = {"delta": {}}, reply.finish_reason(output.finish_reason)
            yield chunk([choice(end, None, finish_reason)])
            if include_usage:
                yield chunk([], output.usage)
            if error is not None:
                yield event(error.body())

        return EventStream(events(), job, output)

    async def _messages(self, request: HTTPRequest) -> Response:
        """Anthropic's Messages API (see :mod:`.anthropic`), its errors in
        Anthropic's shape."""
        try:
            return await self._anthropic_message(request)
        except APIError as e:
            return json_response(anthropic_error(e), e.status, e.headers)

    async def _converted_chat(self, request: HTTPRequest, chat_body: dict[str, Any],
                              max_tokens: Callable[[ChatCompletionBody], int],
                              logprobs: bool = False, fit: bool = False
                              ) -> tuple[ChatCompletionBody, GenerationOptions, Job, Piece,
                                         Output, ChatReply]:
        """Submit another API's request converted to a chat-completions body
        (checked as one): the body, its options, its job and first piece, and
        the output and reply readers; ``max_tokens`` picks the token budget
        from the body; ``logprobs`` asks for the tokens' log-probabilities;
        ``fit`` drops the oldest messages (:func:`_without_oldest`) until the
        prompt fits the KV cache."""
        body, tool_prompt, prompt = self._chat_prompt(chat_body)
        while fit and len(self.llm.tokenizer.encode(prompt)) > self.llm.prompt_limit:
            messages = _without_oldest(chat_body["messages"])
            if messages is None:  # only the last user turn is left: the limit's error
                break
            chat_body = {**chat_body, "messages": messages}
            body, tool_prompt, prompt = self._chat_prompt(chat_body)
        options = body.options(max_tokens(body), logprobs, 0, chat=False,
                               vocab_size=self.llm.config.vocab_size,
                               constraint=body.reply_constraint(tool_prompt),
                               special_tokens=tool_prompt.reads_reply)
        job, first = await self._submit(request, prompt, options, "messages")
        return (body, options, job, first, Output(self.token_text, logprobs),
                self._reply(tool_prompt))

    def _chat_prompt(self, chat_body: dict[str, Any]) -> tuple[ChatCompletionBody, ToolPrompt,
                                                               str]:
        """A chat-completions body checked, how its messages and tools reach
        the template, and the prompt they render to."""
        try:
            body = ChatCompletionBody.model_validate(chat_body)
        except ValidationError as e:
            raise invalid(e) from None
        body.check_supported()
        tool_prompt = body.tool_prompt(self.llm.tokenizer.chat_template)
        return body, tool_prompt, self._rendered(tool_prompt)

    async def _anthropic_message(self, request: HTTPRequest) -> Response:
        messages_body = await self._body(request, MessagesBody)
        body, options, job, first, output, reply = await self._converted_chat(
            request, messages_body.chat_body(), lambda body: messages_body.max_tokens)
        head = {"id": new_message_id(), "type": "message", "role": "assistant",
                "model": self.model_id}
        finish: list[str | None] = [None]  # the engine's finish reason

        def stop_sequence() -> str | None:
            # The engine says a stop string ended the reply, not which: known
            # when only one was given.
            stops = options.stop
            return stops[0] if finish[0] == "stop" and len(stops) == 1 else None

        def anthropic_usage() -> dict[str, int]:
            stats = output.stats
            return {"input_tokens": stats.prompt_tokens, "output_tokens":
                    stats.generated_tokens}

        if not body.stream:
            async def collect() -> None:
                async for piece in self._pieces(job, first):
                    output.add(piece)
                    finish[0] = piece.finish_reason
            try:
                await self._or_disconnect(request, job, collect())
            finally:
                request.scope["mlxprog.usage"] = output.usage
            reply.feed(output.text)
            reply.finish()
            return json_response({**head, "content": content_blocks(reply),
                                  "stop_reason": stop_reason(reply, finish[0]),
                                  "stop_sequence": stop_sequence(), "usage": anthropic_usage()})

        async def events() -> AsyncIterator[bytes]:
            yield sse("message_start", {"type": "message_start", "message": {
                **head, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": first.stats.prompt_tokens, "output_tokens": 0}}})
            blocks, error = BlockEvents(), None
            try:
                async for piece in self._pieces(job, first):
                    output.add(piece)
                    finish[0] = piece.finish_reason
                    for delta in reply.feed(piece.text):
                        for data in blocks.of(delta):
                            yield data
            except APIError as e:  # the stream has begun: it ends, then says why
                error = e
                finish[0] = "length"
                request.scope["mlxprog.ended"] = e.message
            for delta in reply.finish():
                for data in blocks.of(delta):
                    yield data
            for data in blocks.close():
                yield data
            yield sse("message_delta", {
                "type": "message_delta", "delta": {"stop_reason": stop_reason(reply, finish[0]),
                                                   "stop_sequence": stop_sequence()},
                "usage": {"output_tokens": anthropic_usage()["output_tokens"]}})
            yield sse("message_stop", {"type": "message_stop"})
            if error is not None:
                yield sse("error", anthropic_error(error))

        return EventStream(events(), job, output, last=b"")

    async def _responses(self, request: HTTPRequest) -> Response:
        """OpenAI's Responses API (see :mod:`.openai_responses`), its errors
        naming the Responses request's fields."""
        try:
            return await self._openai_response(request)
        except APIError as e:
            if e.code == "context_length_exceeded":
                e = APIError(e.status, f"{e.message} (truncation is 'disabled'; with "
                             "truncation 'auto' the oldest input items are dropped until it "
                             "fits)", e.param, e.code)
            raise responses_error(e) from None

    async def _stored_response(self, request: HTTPRequest) -> Response:
        """``GET /v1/responses/{id}``: a stored response object; ``DELETE``
        forgets it. A response not stored (``store: false``), deleted, or
        forgotten as the store filled is a 404."""
        response_id = request.path_params["response_id"]
        if request.method == "DELETE":
            self.stored.delete(response_id)
            return json_response({"id": response_id, "object": "response", "deleted": True})
        return json_response(self.stored.response(response_id))

    async def _openai_response(self, request: HTTPRequest) -> Response:
        responses_body = await self._body(request, ResponsesBody)
        history = self.stored.history(responses_body.previous_response_id)
        body, options, job, first, output, reply = await self._converted_chat(
            request, responses_body.chat_body(history),
            lambda body: body.max_tokens or self.llm.max_length,
            logprobs=responses_body.logprobs, fit=responses_body.truncation == "auto")
        response_id, created = new_id("resp"), int(time.time())

        def answer(items: list[dict[str, Any]], finish_reason: str | None) -> dict[str, Any]:
            stats = output.stats
            usage_data = None if finish_reason is None else responses_usage(
                stats.prompt_tokens, stats.cached_tokens, stats.generated_tokens)
            return response_object(response_id, created, self.model_id, responses_body, items,
                                   finish_reason, usage_data)

        def finished(response: dict[str, Any]) -> dict[str, Any]:
            if responses_body.store:
                self.stored.keep(response, conversation(history, responses_body, reply))
            return response

        def text_logprobs() -> list[dict[str, Any]] | None:
            # The tokens' log-probabilities are the text's only when the
            # reply is its text (not read for calls or reasoning).
            if not responses_body.logprobs or reply.reads:
                return None
            return (output.chat_logprobs(output.tokens) or {}).get("content")

        if not body.stream:
            try:
                await self._or_disconnect(request, job, self._collect(job, first, output))
            finally:
                request.scope["mlxprog.usage"] = output.usage
            reply.feed(output.text)
            reply.finish()
            return json_response(finished(answer(output_items(reply, text_logprobs()),
                                                  output.finish_reason)))

        async def events() -> AsyncIterator[bytes]:
            items = ItemEvents()
            yield items.event("response.created", response=answer([], None))
            yield items.event("response.in_progress", response=answer([], None))
            error = None
            try:
                async for piece in self._pieces(job, first):
                    output.add(piece)
                    for delta in reply.feed(piece.text):
                        for data in items.of(delta):
                            yield data
            except APIError as e:  # the stream has begun: it ends, then says why
                error = e
                output.cut_short()
                request.scope["mlxprog.ended"] = e.message
            for delta in reply.finish():
                for data in items.of(delta):
                    yield data
            items.text_logprobs = text_logprobs()
            for data in items.close():
                yield data
            final = finished(answer(items.items, output.finish_reason))
            yield items.event("response.completed" if final["status"] == "completed"
                              else "response.incomplete", response=final)
            if error is not None:
                yield items.event("error", **error.body()["error"])

        return EventStream(events(), job, output, last=b"")

    async def _embeddings(self, request: HTTPRequest) -> Response:
        """OpenAI's embeddings: one ``embedding`` per input, in input order,
        as numbers or (``encoding_format`` ``"base64"``) little-endian
        float32 bytes; computed on the :class:`Embedder`'s thread."""
        body = await self._body(request, EmbeddingBody)
        body.check_dimensions(self.llm.config.hidden_size)
        job = EmbeddingJob(body.input, body.pooling, asyncio.get_running_loop())
        self.embedder.submit(job)
        answer = await self._or_disconnect(request, job, job.result())
        request.scope["mlxprog.usage"] = {"prompt_tokens": answer.tokens,
                                          "total_tokens": answer.tokens}
        if body.encoding_format == "base64":
            vectors = [base64.b64encode(v.astype("<f4").tobytes()).decode()
                       for v in answer.vectors]
        else:
            vectors = answer.vectors.tolist()
        return json_response({
            "object": "list", "model": self.model_id,
            "data": [{"object": "embedding", "index": i, "embedding": v}
                     for i, v in enumerate(vectors)],
            "usage": request.scope["mlxprog.usage"]})

    async def _models(self, request: HTTPRequest) -> Response:
        return json_response({"object": "list", "data": [self._model_card()]})

    async def _model(self, request: HTTPRequest) -> Response:
        name = request.path_params["model"]
        if name != self.model_id:
            raise APIError(404, f"the model {name!r} does not exist; this server has "
                           f"{self.model_id!r}", "model", code="model_not_found")
        return json_response(self._model_card())

    async def _health(self, request: HTTPRequest) -> Response:
        """``status`` "ok" (200) once the server serves, "loading" (503)
        while it builds its programs; the model, and the :meth:`stats`."""
        ready = self.scheduler.ready.is_set()
        return json_response({"status": "ok" if ready else "loading", "model": self.model_id,
                              **self.stats()}, 200 if ready else 503)

    async def _metrics(self, request: HTTPRequest) -> Response:
        """The :meth:`stats` in Prometheus' text format."""
        return Response(prometheus_text(self.stats(), self.scheduler.ready.is_set()),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    def stats(self) -> dict[str, float]:
        """The scheduler's :meth:`~mlxprog.llm.server.scheduler.Scheduler.stats`
        and the embedder's :meth:`~mlxprog.llm.server.embeddings.Embedder.stats`."""
        return {**self.scheduler.stats(), **self.embedder.stats()}

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
            raise APIError(400, f"the request body must be a JSON object, got {shown(data)}")
        try:
            body = model.model_validate(data)
        except ValidationError as e:
            raise invalid(e) from None
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
            raise ClientGone from None
        return b"".join(parts)

    async def _submit(self, request: HTTPRequest, prompt: Prompt, options: GenerationOptions,
                      prompt_param: str) -> tuple[Job, Piece]:
        """Submit a job; its first piece, once prefilled (an error raises, so
        it gets its status code before any response starts)."""
        job = Job(prompt, options, prompt_param, asyncio.get_running_loop())
        self.scheduler.submit(job)
        try:
            return job, await self._or_disconnect(request, job, job.next())
        except ClientGone:
            admitted = job.request  # set once the scheduler has tokenized the prompt
            if admitted is not None:
                request.scope["mlxprog.usage"] = usage(len(admitted.ids), admitted.cached, 0)
            raise

    async def _or_disconnect(self, request: HTTPRequest, job: Job, work: Awaitable[T]) -> T:
        """Await ``work``, unless the client disconnects first: then the job is
        cancelled (freeing its row) and :class:`ClientGone` raises."""
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
        raise ClientGone

    @staticmethod
    async def _pieces(job: Job, first: Piece) -> AsyncIterator[Piece]:
        piece = first
        yield piece
        while piece.finish_reason is None:
            piece = await job.next()
            yield piece

    async def _collect(self, job: Job, first: Piece, output: Output) -> None:
        async for piece in self._pieces(job, first):
            output.add(piece)

    # -- errors ----------------------------------------------------------------
    async def _api_error(self, request: HTTPRequest, exc: Exception) -> Response:
        return error_response(exc)

    async def _http_error(self, request: HTTPRequest, exc: Exception) -> Response:
        """Starlette's own errors (unknown routes, wrong methods) in OpenAI's shape."""
        method, path = request.method, request.url.path
        if exc.status_code == 404:
            message = f"there is no {method} {path}; this server has {', '.join(ENDPOINTS)}"
            return error_response(APIError(404, message, code="not_found"))
        if exc.status_code == 405:
            allowed = exc.headers.get("Allow", "") if exc.headers else ""
            return error_response(APIError(
                405, f"{method} is not allowed on {path} (allowed: {allowed})",
                code="method_not_allowed"), exc.headers)
        return error_response(APIError(exc.status_code, exc.detail), exc.headers)

    async def _client_gone(self, request: HTTPRequest, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"

    async def _server_error(self, request: HTTPRequest, exc: Exception) -> Response:
        # A bug: Starlette hands the exception on to uvicorn, which logs its traceback.
        return error_response(APIError(500, f"the server failed: {type(exc).__name__}: {exc}"))
