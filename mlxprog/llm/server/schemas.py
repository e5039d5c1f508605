"""The request bodies of the generation endpoints (pydantic models, strict
as OpenAI's API), what they ask for as
:class:`~mlxprog.llm.GenerationOptions`, and pydantic's first complaint
worded as OpenAI's 400 naming the field."""

from __future__ import annotations

import re
import secrets
from typing import Any, Literal, Sequence

from pydantic import (
    BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator,
)

from ...errors import ModelError
from ..constraints import Constraint, LogitBias, OptionError, shown
from ..options import (
    DEFAULT_DRAFT_TOKENS, DEFAULT_LOOKUP_NGRAM, DRAFTS, MAX_DRAFT_TOKENS, MAX_LOOKUP_NGRAM,
    MAX_TOP_LOGPROBS, GenerationOptions,
)
from ..programs import POOLINGS
from ..tool_calls import ToolPrompt, parse_tool_choice, parse_tools, prepare_tools
from .errors import APIError

#: OpenAI's default temperature; 0 is greedy.
DEFAULT_TEMPERATURE = 1.0


def _param(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path: ``messages[0].content``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "greater than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}


def invalid(error: ValidationError) -> APIError:
    """The first problem pydantic found, as a 400 naming the field."""
    first = error.errors(include_url=False)[0]
    param, kind, ctx = _param(first["loc"]), first["type"], first.get("ctx") or {}
    if kind == "missing":
        message = f"{param} is required"
    elif kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx[key]  # a float field's bound is a float: 2.0 is shown as 2
        bound_text = f"{bound:g}" if isinstance(bound, float) else bound
        message = f"{param} must be {words} {bound_text}, got {shown(first['input'])}"
    elif kind == "too_short":
        message = f"{param} must not be empty"
    elif kind == "literal_error":
        message = f"{param} must be {ctx['expected']}, got {shown(first['input'])}"
    elif kind == "value_error":
        message = f"{param} {ctx['error']}"
    else:  # "Input should be a valid integer" -> "max_tokens must be a valid integer"
        text = re.sub(r" or instance of \w+", "", first["msg"])
        message = re.sub(r"^Input should", f"{param} must", text)
        if message == text:
            message = f"{param}: {text}"
    return APIError(400, message, param=param or None)


# Strict types: a JSON string is no number and 1 is no boolean, as in OpenAI's
# API; fields this server does not know are ignored, as OpenAI ignores them.
_STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class ChatMessage(BaseModel):
    """One message of a chat: ``role`` and text ``content`` (a string, or
    OpenAI's list of ``{"type": "text", "text": ...}`` parts, joined by line
    breaks). ``developer`` is OpenAI's newer name for ``system``. An
    assistant message may carry ``tool_calls`` (its content may then be
    null or left out) and its ``reasoning_content`` (as this server's
    replies give it), and a ``tool`` message answers the call
    ``tool_call_id``; :func:`~mlxprog.llm.tool_calls.prepare_tools` checks
    them against each other."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _calls_without_content(cls, value: Any) -> Any:
        if isinstance(value, dict) and "content" not in value and value.get("tool_calls"):
            return {**value, "content": None}
        return value

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
        if value is not None and not isinstance(value, str):
            raise ValueError(f"must be a string or a list of text parts, got {shown(value)}")
        return value

    @model_validator(mode="after")
    def _content_needed(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("has no content (only an assistant message with tool_calls may "
                             "have none)")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (``developer`` as ``system``)."""
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": self.content}
        for key in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


def option_error(error: OptionError) -> APIError:
    """An option's error (a constraint, a tool, ``logit_bias``) as a 400
    naming its field."""
    return APIError(400, str(error), param=error.field)


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` sends a last chunk with the usage."""

    model_config = _STRICT
    include_usage: bool = False


class GenerationBody(BaseModel):
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
    response_format: dict[str, Any] | None = None
    # Speculative decoding (mlxprog's; see GenerationOptions).
    draft: Literal[DRAFTS] | None = None
    num_draft_tokens: int | None = Field(None, ge=1, le=MAX_DRAFT_TOKENS)
    prompt_lookup_ngram: int | None = Field(None, ge=1, le=MAX_LOOKUP_NGRAM)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return value
        raise ValueError(f"must be a string or a list of strings, got {shown(value)}")

    def check_supported(self) -> None:
        """Reject what OpenAI accepts but this server cannot honour (rather than
        silently ignore)."""
        if self.n not in (None, 1):
            raise APIError(400, f"n must be 1 (one choice per request), got {self.n}", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise APIError(400, f"{name} is not supported (use repetition_penalty)", name)

    def constraint(self) -> Constraint | None:
        """The constraint ``response_format`` asks for (None: plain text)."""
        try:
            return Constraint.from_response_format(self.response_format)
        except OptionError as e:
            raise option_error(e) from None

    def options(self, max_tokens: int, logprobs: bool, top_logprobs: int, chat: bool,
                vocab_size: int, constraint: Constraint | None,
                special_tokens: bool = False) -> GenerationOptions:
        """The generation options the body asks for, with ``constraint`` and
        ``logit_bias`` (checked against the model's ``vocab_size``), and the
        special tokens' texts kept when ``special_tokens`` (for a reader of
        the reply). Without a ``seed`` each request draws one, so that
        sampling differs between requests."""
        seed = secrets.randbits(64) if self.seed is None else self.seed % 2**64
        try:
            logit_bias = LogitBias.parse(self.logit_bias, vocab_size)
        except OptionError as e:
            raise option_error(e) from None
        try:
            return GenerationOptions(
                max_tokens=max_tokens, logprobs=logprobs, top_logprobs=top_logprobs,
                chat=chat, seed=seed,
                temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k,
                min_p=self.min_p or 0.0, repetition_penalty=self.repetition_penalty,
                stop=self.stop, draft=self.draft,
                num_draft_tokens=self.num_draft_tokens or DEFAULT_DRAFT_TOKENS,
                prompt_lookup_ngram=self.prompt_lookup_ngram or DEFAULT_LOOKUP_NGRAM,
                constraint=constraint, logit_bias=logit_bias, special_tokens=special_tokens)
        except ModelError as e:  # the options' own rules, past the checks above
            name = str(e).split()[0]
            raise APIError(400, str(e), name if name in type(self).model_fields else None) from None


class ChatCompletionBody(GenerationBody):
    """A ``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    def check_supported(self) -> None:
        """As for every generation, and: ``top_logprobs`` only with ``logprobs``."""
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs set to true", "top_logprobs")

    def tool_prompt(self, chat_template: str | None) -> ToolPrompt:
        """How the messages reach a model with ``chat_template``, with the
        tools offered, and how its reply is read (see
        :func:`~mlxprog.llm.tool_calls.prepare_tools`)."""
        try:
            tools = parse_tools(self.tools)
            choice = parse_tool_choice(self.tool_choice, tools)
            prompt = prepare_tools([m.for_template() for m in self.messages], tools, choice,
                                   chat_template, self.parallel_tool_calls is not False)
        except OptionError as e:
            raise option_error(e) from None
        if prompt.tools and (self.response_format or {}).get("type", "text") != "text":
            raise APIError(400, "response_format: a JSON reply cannot be asked for together "
                           "with tools (a reply is either a tool call or the JSON); send "
                           "tool_choice 'none' or no tools", "response_format")
        return prompt

    def reply_constraint(self, prompt: ToolPrompt) -> Constraint | None:
        """The constraint of the reply: the tool calls' (``tool_choice``
        ``required`` or a function, or a template that takes no tools),
        else ``response_format``'s."""
        return prompt.constraint or self.constraint()


class CompletionBody(GenerationBody):
    """A ``POST /v1/completions`` body: ``prompt`` is text or token ids (one
    prompt: a list holding one is unwrapped); ``logprobs`` is the number of
    alternatives to report per token."""

    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    # llama.cpp's constraint fields.
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None

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
        raise ValueError(f"must be a string or a list of token ids, got {shown(value)}")

    def check_supported(self) -> None:
        """As for every generation, and: no ``echo``, ``suffix`` or ``best_of``."""
        super().check_supported()
        if self.echo:
            raise APIError(400, "echo is not supported", "echo")
        if self.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1, got {self.best_of}", "best_of")

    def constraint(self) -> Constraint | None:
        """The constraint of one of ``response_format``, ``json_schema`` or
        ``grammar`` (llama.cpp's: Lark or GBNF); more than one is a 400
        naming the second."""
        given = [name for name in ("response_format", "json_schema", "grammar")
                 if getattr(self, name) is not None]
        if len(given) > 1:
            raise APIError(400, f"{given[1]}: give one of response_format, json_schema and "
                           f"grammar, not {' and '.join(given)}", given[1])
        try:
            if self.json_schema is not None:
                return Constraint.json_schema(self.json_schema, "json_schema")
            if self.grammar is not None:
                return Constraint.grammar(self.grammar, "grammar")
        except OptionError as e:
            raise option_error(e) from None
        return super().constraint()


#: The most inputs one ``/v1/embeddings`` request may hold (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048


class EmbeddingBody(BaseModel):
    """A ``POST /v1/embeddings`` body: ``input`` is a text, a list of texts,
    a list of token ids, or a list of such lists (held as a list of texts
    and token-id lists, at most :data:`MAX_EMBEDDING_INPUTS`, none empty);
    ``encoding_format`` ``"float"`` (lists of numbers) or ``"base64"``
    (little-endian float32 bytes, as OpenAI's); ``dimensions``, if given,
    must be the model's hidden size (the route checks it: a decoder's
    embeddings cannot be shortened). ``pooling`` (an extension, as
    llama-server's ``--pooling``) is ``"mean"`` (default) or ``"last"``."""

    model_config = _STRICT
    model: str | None = None
    input: list[str | list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    pooling: str = "mean"

    @field_validator("input", mode="before")
    @classmethod
    def _inputs(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and value
                                      and all(type(v) is int for v in value)):
            value = [value]  # one input
        if not isinstance(value, list) or not value:
            raise ValueError("must be a string, a list of strings, a list of token ids or a "
                             f"list of token-id lists, not empty; got {shown(value)}")
        if len(value) > MAX_EMBEDDING_INPUTS:
            raise ValueError(f"holds {len(value)} inputs; at most {MAX_EMBEDDING_INPUTS} per "
                             "request")
        for i, item in enumerate(value):
            if not (isinstance(item, str) or (isinstance(item, list)
                                              and all(type(v) is int for v in item))):
                raise ValueError(f"item {i} must be a string or a list of integer token ids, "
                                 f"got {shown(item)}")
            if not item:
                raise ValueError(f"item {i} is empty")
        return value

    @field_validator("pooling")
    @classmethod
    def _pooling(cls, value: str) -> str:
        if value not in POOLINGS:
            raise ValueError(f"must be one of {', '.join(map(repr, POOLINGS))}, got "
                             f"{shown(value)}")
        return value

    def check_supported(self) -> None:
        """Every field is checked by its type and validators; ``dimensions``
        against the model by :meth:`check_dimensions`."""

    def check_dimensions(self, hidden_size: int) -> None:
        """``dimensions``, if given, must be the model's ``hidden_size``."""
        if self.dimensions is not None and self.dimensions != hidden_size:
            raise APIError(400, f"dimensions must be {hidden_size}, this model's embedding size "
                           f"(its embeddings cannot be shortened), got {self.dimensions}",
                           "dimensions")
