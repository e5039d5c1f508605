"""Anthropic's Messages API (``POST /v1/messages``) over the chat machinery:
a request becomes an OpenAI chat body (system, content blocks, ``tool_use``
and ``tool_result`` blocks, tools and ``tool_choice``), and the reply,
read by :class:`~mlxprog.llm.server.rendering.ChatReply`, comes back as
Anthropic's message, or as its stream of events, with Anthropic's errors."""

from __future__ import annotations

import json
import secrets
from typing import Any, Iterator

from pydantic import BaseModel, Field

from ..constraints import shown
from .errors import APIError
from .rendering import ChatReply
from .responses import named_event as sse
from .schemas import _STRICT

#: The engine's finish reasons as Anthropic's ``stop_reason``.
STOP_REASONS = {"eos": "end_turn", "cancelled": "end_turn", "length": "max_tokens",
                "stop": "stop_sequence"}
#: The ``error.type`` of each status, as Anthropic names them.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               408: "request_too_large", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


class MessagesBody(BaseModel):
    """A ``POST /v1/messages`` body: the fields this server reads (others,
    such as ``metadata``, are ignored). ``max_tokens`` is required, as
    Anthropic's API requires it."""

    model_config = _STRICT
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = None  # an extension, as in the chat body
    stream: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None

    def check_supported(self) -> None:
        """The fields are checked as the chat body they become (:meth:`chat_body`)."""

    def chat_body(self) -> dict[str, Any]:
        """The OpenAI chat completion body asking for the same."""
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": _text(self.system, "system")})
        for i, message in enumerate(self.messages):
            messages += _chat_messages(message, f"messages[{i}]")
        body: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens,
                                "temperature": 1.0 if self.temperature is None
                                else self.temperature}
        for name in ("top_p", "top_k", "seed", "stream"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.stop_sequences:
            body["stop"] = self.stop_sequences
        if self.tools:
            body["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(self.tools)]
        if self.tool_choice is not None:
            body.update(_tool_choice(self.tool_choice))
        return body


def _text(value: Any, where: str) -> str:
    """A string, or a list of text blocks joined by line breaks."""
    if isinstance(value, str):
        return value
    texts = []
    for i, block in enumerate(value if isinstance(value, list) else [value]):
        if not (isinstance(block, dict) and block.get("type") == "text"
                and isinstance(block.get("text"), str)):
            raise APIError(400, f"{where}[{i}] must be a text block ({{\"type\": \"text\", "
                           f"\"text\": ...}}), got {shown(block)}", f"{where}[{i}]")
        texts.append(block["text"])
    return "\n".join(texts)


def _chat_messages(message: Any, where: str) -> list[dict[str, Any]]:
    """An Anthropic message as OpenAI chat messages: a user message's
    ``tool_result`` blocks become ``tool`` messages (before its text), an
    assistant message's ``tool_use`` blocks its ``tool_calls`` and its
    ``thinking`` blocks its ``reasoning_content``."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise APIError(400, f"{where} must be a message with role 'user' or 'assistant', got "
                       f"{shown(message)}", f"{where}.role")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise APIError(400, f"{where}.content must be a string or a list of content blocks, "
                       f"got {shown(content)}", f"{where}.content")
    texts, calls, results, thinking = [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"),
                                                                        str):
            thinking.append(block["thinking"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("input", {}), dict):
                raise APIError(400, f"{at}.input must be an object, got "
                               f"{shown(block.get('input'))}", f"{at}.input")
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and role == "user":
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                            "content": _text(block.get("content", ""), f"{at}.content")})
        else:
            allowed = "text, thinking and tool_use" if role == "assistant" \
                else "text and tool_result"
            raise APIError(400, f"{at} is not a block this server takes in a {role} message "
                           f"({allowed}), got {shown(block)}", f"{at}.type")
    out = results
    if role == "assistant":
        out.append({"role": "assistant", "content": "\n".join(texts) or None,
                    **({"tool_calls": calls} if calls else {}),
                    **({"reasoning_content": "\n".join(thinking)} if thinking else {})})
    elif texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool(tool: Any, where: str) -> dict[str, Any]:
    """An Anthropic tool (``name``, ``description``, ``input_schema``) as an OpenAI one."""
    if not isinstance(tool, dict):
        raise APIError(400, f"{where} must be a tool object, got {shown(tool)}", where)
    if tool.get("type") not in (None, "custom"):
        raise APIError(400, f"{where}.type: only custom tools (name, description, input_schema) "
                       f"are supported, got {shown(tool.get('type'))}", f"{where}.type")
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """Anthropic's ``tool_choice`` as OpenAI's fields."""
    kind = choice.get("type")
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind == "tool":
        out: dict[str, Any] = {"tool_choice": {"type": "function",
                                               "function": {"name": choice.get("name")}}}
    elif kind in modes:
        out = {"tool_choice": modes[kind]}
    else:
        raise APIError(400, "tool_choice.type must be 'auto', 'any', 'tool' or 'none', got "
                       f"{shown(kind)}", "tool_choice.type")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def anthropic_param(param: str | None) -> str | None:
    """A chat body's field as the Messages request names it (the tools'
    ``parameters`` are its ``input_schema``; messages may differ in number,
    tool results being messages of their own in a chat)."""
    if param is None:
        return None
    return param.replace(".function.parameters", ".input_schema").replace(
        ".function.name", ".name")


def anthropic_error(error: APIError) -> dict[str, Any]:
    """An error as Anthropic's API answers it."""
    param = anthropic_param(error.param)
    message = error.message if param == error.param else error.message.replace(
        error.param or "", param or "", 1)
    return {"type": "error", "error": {"type": ERROR_TYPES.get(
        error.status, "api_error" if error.status >= 500 else "invalid_request_error"),
        "message": message}}


def new_message_id() -> str:
    """A message id as Anthropic's look."""
    return "msg_" + secrets.token_hex(12)


def content_blocks(reply: ChatReply) -> list[dict[str, Any]]:
    """A finished reply's content: its reasoning (if any) as a ``thinking``
    block (with no signature: nothing is signed here), its text, then a
    ``tool_use`` block per call."""
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.calls:
        blocks.append({"type": "text", "text": reply.content})
    blocks += [{"type": "tool_use", "id": call.id, "name": call.name,
                "input": json.loads(call.arguments)} for call in reply.calls]
    return blocks


def stop_reason(reply: ChatReply, finish_reason: str | None) -> str | None:
    """Anthropic's ``stop_reason`` of a reply the engine ended with ``finish_reason``."""
    return "tool_use" if reply.calls else STOP_REASONS.get(finish_reason or "", "end_turn")


class BlockEvents:
    """A streamed reply's content-block events: OpenAI deltas (from
    :class:`~mlxprog.llm.server.rendering.ChatReply`) become
    ``content_block_start``/``_delta``/``_stop`` events, a ``thinking``
    block while reasoning comes, a text block while text comes, a
    ``tool_use`` block per call."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the kind of the block open

    def of(self, delta: dict[str, Any]) -> Iterator[bytes]:
        """The events of one delta."""
        if delta.get("reasoning_content"):
            if self.open != "thinking":
                yield from self._start({"type": "thinking", "thinking": "", "signature": ""})
            yield sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                              "delta": {"type": "thinking_delta",
                                                        "thinking": delta["reasoning_content"]}})
        if delta.get("content"):
            if self.open != "text":
                yield from self._start({"type": "text", "text": ""})
                self.open = "text"
            yield sse("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                              "delta": {"type": "text_delta",
                                                        "text": delta["content"]}})
        for call in delta.get("tool_calls", []):
            if "id" in call:
                yield from self._start({"type": "tool_use", "id": call["id"],
                                        "name": call["function"]["name"], "input": {}})
                self.open = "tool_use"
            elif call["function"]["arguments"]:
                yield sse("content_block_delta", {
                    "type": "content_block_delta", "index": self.index,
                    "delta": {"type": "input_json_delta",
                              "partial_json": call["function"]["arguments"]}})

    def close(self) -> Iterator[bytes]:
        """The last block's stop (an empty text block if none was sent)."""
        if self.open is None:
            yield from self._start({"type": "text", "text": ""})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _start(self, block: dict[str, Any]) -> Iterator[bytes]:
        if self.open is not None:
            yield sse("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.index += 1
        self.open = block["type"]
        yield sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                          "content_block": block})
