"""OpenAI's Responses API (``POST /v1/responses``) over the chat machinery:
a request's ``input`` items (messages, ``function_call`` and
``function_call_output`` items), ``instructions``, flat tools,
``tool_choice`` and ``text.format`` become an OpenAI chat body; the reply,
read by :class:`~mlxprog.llm.server.rendering.ChatReply`, comes back as a
response object with ``message`` and ``function_call`` output items, or as
the Responses stream of events. Stored responses (:class:`ResponseStore`)
let ``previous_response_id`` continue a conversation."""

from __future__ import annotations

import secrets
from collections import OrderedDict
from typing import Any, Iterator, Literal

from pydantic import BaseModel, Field

from ..constraints import shown
from .errors import APIError
from .rendering import ChatReply
from .responses import named_event
from .schemas import _STRICT

#: How many stored responses the server keeps (the least recently used go first).
STORED_RESPONSES = 256
#: The ``include`` values OpenAI documents. This server has no file or web
#: search, images, code interpreter or encrypted reasoning, so there is
#: nothing more to include for those; ``message.output_text.logprobs`` adds
#: each output text's log-probabilities.
INCLUDABLE = ("file_search_call.results", "web_search_call.results",
              "web_search_call.action.sources", "message.input_image.image_url",
              "computer_call_output.output.image_url", "code_interpreter_call.outputs",
              "reasoning.encrypted_content", "message.output_text.logprobs")
#: The ``include`` value that asks for the output text's log-probabilities.
INCLUDE_LOGPROBS = "message.output_text.logprobs"
#: The chat body's fields as the Responses request names them.
_PARAMS = {"max_tokens": "max_output_tokens", "response_format": "text.format",
           "messages": "input"}


class ResponsesBody(BaseModel):
    """A ``POST /v1/responses`` body: the fields this server reads (others,
    such as ``metadata`` or ``reasoning``, are ignored). ``truncation``
    ``"auto"`` drops the oldest input items (those of a stored previous
    response first) until the prompt fits the KV cache; ``"disabled"``
    (the default) answers a prompt that does not fit with a 400."""

    model_config = _STRICT
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None  # an extension, as in the chat body
    stream: bool | None = None
    store: bool = True
    previous_response_id: str | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None

    def check_supported(self) -> None:
        """``include`` holds only values OpenAI documents (:data:`INCLUDABLE`);
        the other fields are checked as the chat body they become
        (:meth:`chat_body`)."""
        for i, value in enumerate(self.include or []):
            if value not in INCLUDABLE:
                raise APIError(400, f"include[{i}] must be one of "
                               f"{', '.join(map(repr, INCLUDABLE))}, got {shown(value)}",
                               f"include[{i}]")

    @property
    def logprobs(self) -> bool:
        """Whether ``include`` asks for the output text's log-probabilities."""
        return INCLUDE_LOGPROBS in (self.include or [])

    def chat_body(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """The OpenAI chat completion body asking for the same, after the
        conversation ``history`` (a stored response's, as chat messages)."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        body: dict[str, Any] = {"messages": messages + history + self.input_messages()}
        if self.max_output_tokens is not None:
            body["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p", "seed", "stream", "tools", "tool_choice",
                     "parallel_tool_calls"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.text is not None and self.text.get("format") is not None:
            body["response_format"] = _response_format(self.text["format"])
        return body

    def input_messages(self) -> list[dict[str, Any]]:
        """``input`` as chat messages: consecutive ``function_call`` items
        make one assistant message's ``tool_calls``, a ``function_call_output``
        a ``tool`` message; a ``reasoning`` item (as an earlier response
        gave it) is the next assistant message's ``reasoning_content``."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        if not self.input:
            raise APIError(400, "input must not be empty", "input")
        messages: list[dict[str, Any]] = []
        reasoning: list[str] = []  # for the next assistant message
        for i, item in enumerate(self.input):
            where = f"input[{i}]"
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind == "reasoning":
                reasoning.append(_text(item.get("content") or [], f"{where}.content"))
                continue
            if kind == "message" and isinstance(item, dict) and "role" in item:
                messages.append(_message(item, where))
            elif kind == "function_call":
                call = {"id": _string(item, "call_id", where), "type": "function", "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where)}}
                last = messages[-1] if messages else {}
                if last.get("role") == "assistant" and last.get("tool_calls") and not reasoning:
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                                 "content": _text(item.get("output"), f"{where}.output")})
            else:
                raise APIError(400, f"{where} must be a message (role and content), a "
                               f"function_call, a function_call_output or a reasoning item, "
                               f"got {shown(item)}", f"{where}.type")
            if reasoning and messages[-1]["role"] == "assistant":
                messages[-1]["reasoning_content"] = "\n".join(reasoning)
                reasoning = []
        return messages


def _string(item: dict[str, Any], key: str, where: str) -> str:
    if not isinstance(item.get(key), str):
        raise APIError(400, f"{where}.{key} must be a string, got {shown(item.get(key))}",
                       f"{where}.{key}")
    return item[key]


def _text(value: Any, where: str) -> str:
    """A string, or a list of ``input_text``/``output_text`` (or a reasoning
    item's ``reasoning_text``) parts joined by line breaks."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise APIError(400, f"{where} must be a string or a list of text parts, got "
                       f"{shown(value)}", where)
    texts = []
    for i, part in enumerate(value):
        if not (isinstance(part, dict) and part.get("type") in ("input_text", "output_text",
                                                                "reasoning_text")
                and isinstance(part.get("text"), str)):
            raise APIError(400, f"{where}[{i}] must be a text part ({{\"type\": \"input_text\", "
                           f"\"text\": ...}}); this server takes text only, got {shown(part)}",
                           f"{where}[{i}]")
        texts.append(part["text"])
    return "\n".join(texts)


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise APIError(400, f"{where}.role must be 'user', 'assistant', 'system' or "
                       f"'developer', got {shown(role)}", f"{where}.role")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def _response_format(value: Any) -> Any:
    """``text.format`` (flat: ``{"type": "json_schema", "name", "schema",
    "strict"}``) as the chat body's ``response_format``."""
    if isinstance(value, dict) and value.get("type") == "json_schema":
        spec = {key: value[key] for key in ("name", "description", "schema", "strict")
                if key in value}
        return {"type": "json_schema", "json_schema": spec}
    return value


def responses_param(param: str | None) -> str | None:
    """A chat body's field as the Responses request names it (the chat's
    messages may differ in number from the input items: instructions and
    stored history are messages too)."""
    if param is None:
        return None
    head, sep, rest = param.partition(".")
    name = head.split("[")[0]
    if name not in _PARAMS:
        return param.replace(".function.", ".")
    renamed = _PARAMS[name] + head[len(name):] + sep + rest
    return renamed.replace("text.format.json_schema.", "text.format.")


def responses_error(error: APIError) -> APIError:
    """``error`` naming the field as the Responses request names it."""
    param = responses_param(error.param)
    if param == error.param:
        return error
    return APIError(error.status, error.message.replace(error.param or "", param or "", 1),
                    param, error.code, error.type, error.headers)


def new_id(prefix: str) -> str:
    """An id as OpenAI's look: ``resp_...``, ``msg_...``, ``fc_...``."""
    return f"{prefix}_{secrets.token_hex(24)}"


class ResponseStore:
    """The stored responses by id: each response object and its
    conversation (chat messages, the reply's included), at most ``size``,
    the least recently used forgotten first."""

    def __init__(self, size: int = STORED_RESPONSES):
        self.size = size
        self._stored: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = \
            OrderedDict()

    def history(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation of ``response_id`` (None: none); an unknown id is a 400."""
        if response_id is None:
            return []
        if response_id not in self._stored:
            raise APIError(400, f"previous_response_id: {self._unknown(response_id)}",
                           "previous_response_id", code="previous_response_not_found")
        self._stored.move_to_end(response_id)
        return list(self._stored[response_id][1])

    def response(self, response_id: str) -> dict[str, Any]:
        """The response object stored as ``response_id``; an unknown id is a 404."""
        if response_id not in self._stored:
            raise APIError(404, self._unknown(response_id), "response_id",
                           code="response_not_found")
        self._stored.move_to_end(response_id)
        return self._stored[response_id][0]

    def delete(self, response_id: str) -> None:
        """Forget ``response_id``; an unknown id is a 404."""
        self.response(response_id)
        del self._stored[response_id]

    def keep(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        """Store ``response`` (a response object) and its ``conversation``."""
        self._stored[response["id"]] = (response, conversation)
        self._stored.move_to_end(response["id"])
        while len(self._stored) > self.size:
            self._stored.popitem(last=False)

    def _unknown(self, response_id: str) -> str:
        return (f"no stored response {response_id!r} (it was not stored, was deleted, or is "
                f"one of the oldest beyond the {self.size} this server keeps)")


def conversation(history: list[dict[str, Any]], body: ResponsesBody,
                 reply: ChatReply) -> list[dict[str, Any]]:
    """The conversation to store: ``history``, the request's input and the
    reply (not the instructions: a follow-up gives its own)."""
    return history + body.input_messages() + [reply.message()]


def usage(prompt_tokens: int, cached_tokens: int, generated_tokens: int) -> dict[str, Any]:
    """The Responses API's ``usage`` object."""
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens":
                                                                   cached_tokens},
            "output_tokens": generated_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + generated_tokens}


def message_item(item_id: str, text: str, status: str,
                 logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``message`` output item holding ``text`` (with its tokens'
    ``logprobs``, if asked for)."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if status == "in_progress" else [_text_part(text, logprobs)]}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """A ``reasoning`` output item holding ``text`` (a harmony model's
    analysis channel) as its content; no summary."""
    return {"id": item_id, "type": "reasoning", "summary": [], "status": status,
            "content": [] if status == "in_progress" else [_reasoning_part(text)]}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def output_items(reply: ChatReply,
                 logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A finished reply's output: its reasoning (if any) as a reasoning
    item, its text as a message (with the reply's tokens' ``logprobs``, if
    asked for), then an item per call."""
    items = [reasoning_item(new_id("rs"), reply.reasoning, "completed")] if reply.reasoning \
        else []
    if reply.content or not reply.calls:
        items.append(message_item(new_id("msg"), reply.content, "completed", logprobs))
    items += [call_item(new_id("fc"), call.id, call.name, call.arguments, "completed")
              for call in reply.calls]
    return items


def response_object(response_id: str, created: int, model: str, body: ResponsesBody,
                    output: list[dict[str, Any]], finish_reason: str | None,
                    usage_data: dict[str, Any] | None) -> dict[str, Any]:
    """The response object; ``finish_reason`` None: still in progress."""
    if finish_reason is None:
        status, incomplete = "in_progress", None
    elif finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    else:
        status, incomplete = "completed", None
    return {"id": response_id, "object": "response", "created_at": created, "model": model,
            "status": status, "incomplete_details": incomplete, "error": None,
            "instructions": body.instructions, "output": output,
            "tools": body.tools or [], "tool_choice": body.tool_choice or "auto",
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id, "store": body.store,
            "truncation": body.truncation or "disabled",
            "text": body.text or {"format": {"type": "text"}}, "usage": usage_data,
            "metadata": {}}


class ItemEvents:
    """A streamed reply's output-item events: OpenAI chat deltas (from
    :class:`~mlxprog.llm.server.rendering.ChatReply`) become a
    ``reasoning`` item with its ``reasoning_text`` deltas while reasoning
    comes, a ``message`` item with its ``output_text`` deltas while text
    comes, and a ``function_call`` item with its arguments per call; each
    event gets the next ``sequence_number``. :attr:`items` are the
    finished items."""

    def __init__(self) -> None:
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        #: The log-probabilities of a message's text, given when it closes.
        self.text_logprobs: list[dict[str, Any]] | None = None

    def event(self, kind: str, **data: Any) -> bytes:
        """One event of ``kind``, numbered."""
        self.sequence += 1
        return named_event(kind, {"type": kind, "sequence_number": self.sequence - 1, **data})

    def of(self, delta: dict[str, Any]) -> Iterator[bytes]:
        """The events of one delta."""
        if delta.get("reasoning_content"):
            if self._open is None or self._open["type"] != "reasoning":
                yield from self._close()
                yield from self._add(reasoning_item(new_id("rs"), "", "in_progress"))
                self._open["text"] = ""
            self._open["text"] += delta["reasoning_content"]
            yield self.event("response.reasoning_text.delta", item_id=self._open["id"],
                             output_index=len(self.items), content_index=0,
                             delta=delta["reasoning_content"])
        if delta.get("content"):
            if self._open is None or self._open["type"] != "message":
                yield from self._close()
                yield from self._start_message()
            self._open["text"] += delta["content"]
            yield self.event("response.output_text.delta", item_id=self._open["id"],
                             output_index=len(self.items), content_index=0,
                             delta=delta["content"], logprobs=[])
        for call in delta.get("tool_calls", []):
            if "id" in call:
                yield from self._close()
                yield from self._add(call_item(new_id("fc"), call["id"],
                                               call["function"]["name"], "", "in_progress"))
            elif call["function"]["arguments"]:
                self._open["arguments"] += call["function"]["arguments"]
                yield self.event("response.function_call_arguments.delta",
                                 item_id=self._open["id"], output_index=len(self.items),
                                 delta=call["function"]["arguments"])

    def close(self) -> Iterator[bytes]:
        """The last item's end (an empty message if nothing was sent)."""
        if self._open is None and not self.items:
            yield from self._start_message()
        yield from self._close()

    def _start_message(self) -> Iterator[bytes]:
        yield from self._add(message_item(new_id("msg"), "", "in_progress"))
        self._open["text"] = ""
        yield self.event("response.content_part.added", item_id=self._open["id"],
                         output_index=len(self.items), content_index=0, part=_text_part(""))

    def _add(self, item: dict[str, Any]) -> Iterator[bytes]:
        self._open = item
        yield self.event("response.output_item.added", output_index=len(self.items),
                         item=dict(item))

    def _close(self) -> Iterator[bytes]:
        item, index = self._open, len(self.items)
        if item is None:
            return
        if item["type"] == "message":
            text, logprobs = item.pop("text", ""), self.text_logprobs or []
            yield self.event("response.output_text.done", item_id=item["id"],
                             output_index=index, content_index=0, text=text, logprobs=logprobs)
            yield self.event("response.content_part.done", item_id=item["id"],
                             output_index=index, content_index=0,
                             part=_text_part(text, logprobs))
            item = message_item(item["id"], text, "completed", logprobs)
        elif item["type"] == "reasoning":
            text = item.pop("text", "")
            yield self.event("response.reasoning_text.done", item_id=item["id"],
                             output_index=index, content_index=0, text=text)
            item = reasoning_item(item["id"], text, "completed")
        else:
            yield self.event("response.function_call_arguments.done", item_id=item["id"],
                             output_index=index, name=item["name"],
                             arguments=item["arguments"])
            item = {**item, "status": "completed"}
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.items.append(item)
        self._open = None
