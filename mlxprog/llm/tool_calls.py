"""Tool calling: tool definitions, presenting them to the model, and reading
its tool calls back.

A request's ``tools`` (OpenAI's shape) become :class:`Tool` objects
(:func:`parse_tools`) and its ``tool_choice`` a :class:`ToolChoice`
(:func:`parse_tool_choice`); both check what they are given and name the
field of anything wrong (:class:`ToolError`). :func:`prepare_tools` then
says how the conversation reaches the chat template and how the reply is
read (a :class:`ToolPrompt`):

- A template that takes ``tools`` (as Hugging Face templates do) gets them
  as they are, and the history's tool calls with their arguments as
  objects; the reply is read in the model family's own syntax
  (:data:`SYNTAXES`): Qwen's and Hermes' ``<tool_call>{...}</tool_call>``,
  Llama 3's JSON (after ``<|python_tag|>`` or alone), Mistral's
  ``[TOOL_CALLS]``, the harmony format's channels (gpt-oss: reasoning in
  the ``analysis`` channel, the answer in ``final``, calls as
  ``commentary`` messages to ``functions.NAME``), or plain JSON for a
  template whose syntax is not one of these.
- A template that takes none (SmolLM2's) gets the tools described in the
  system message with a generic JSON form for calls
  (``{"tool_calls": [{"name": ..., "arguments": {...}}]}``), the history's
  calls and results written as text, and the reply constrained so that a
  reply starting with ``{`` is such a call whose arguments fit the tool's
  parameters.
- ``tool_choice`` ``required`` or a named function constrains the reply to
  the generic call of those tools, arguments included, whatever the
  template: the arguments always validate against the tool's schema.

:class:`ToolCallStream` reads a reply as it streams: text that cannot be
(part of) a tool call is content to send at once; what may be a call is
held until it is known, and complete calls come out as :class:`ToolCall`
objects (a harmony reply's analysis channel as reasoning). :meth:`ToolPrompt.parse`
reads a whole reply the same way. Their markers are special tokens in some
vocabularies (``[TOOL_CALLS]``, ``<|python_tag|>``, harmony's), so the
reply is read as decoded with special tokens (generation's
``special_tokens`` option, which :attr:`ToolPrompt.reads_reply` asks
for) and the special tokens' texts are left out of what it shows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from jinja2 import TemplateSyntaxError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .constraints import JSON_WHITESPACE, SCHEMA_DATA, Constraint, OptionError, shown

#: Tool-call syntaxes: ``hermes`` (``<tool_call>`` tags: Qwen, Hermes),
#: ``llama3`` (JSON with ``parameters``), ``mistral`` (``[TOOL_CALLS]``),
#: ``harmony`` (gpt-oss's channels), ``json`` (a template that takes tools
#: in a syntax not known here: the reply read as plain JSON) and
#: ``generic`` (a template that takes no tools: described in the system
#: message, called in generic JSON).
SYNTAXES = ("hermes", "llama3", "mistral", "harmony", "json", "generic")
#: The ``tool_choice`` modes (``function``: one named function).
TOOL_CHOICES = ("auto", "none", "required", "function")
#: OpenAI's rule for function names.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_CALLS, _MISTRAL_ARGS, _MISTRAL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_LLAMA_TAG = "<|python_tag|>"
# The harmony format's tokens: a message is [<|start|>role]<|channel|>NAME
# [ to=RECIPIENT][ <|constrain|>json]<|message|>BODY, ended by one of _HARMONY_ENDS.
_HARMONY_START, _HARMONY_CHANNEL = "<|start|>", "<|channel|>"
_HARMONY_MESSAGE, _HARMONY_CONSTRAIN = "<|message|>", "<|constrain|>"
_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
#: The harmony channel whose messages are reasoning, and the prefix of a
#: recipient that is one of the tools.
_HARMONY_REASONING, _HARMONY_FUNCTIONS = "analysis", "functions."
#: The markers each syntax reads (kept in a call's text while it is parsed).
_SYNTAX_MARKERS = {
    "hermes": (_HERMES_OPEN, _HERMES_CLOSE),
    "mistral": (_MISTRAL_CALLS, _MISTRAL_ARGS, _MISTRAL_ID),
    "llama3": (_LLAMA_TAG,),
    "harmony": (_HARMONY_START, _HARMONY_CHANNEL, _HARMONY_MESSAGE, _HARMONY_CONSTRAIN,
                *_HARMONY_ENDS),
}


class ToolError(OptionError):
    """A bad ``tools``, ``tool_choice`` or tool message: ``field`` names it
    (``tools[1].function.name``, ``messages[3].tool_call_id``)."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call: ``name``, ``description`` ("" if
    none) and ``parameters``, the JSON schema of its arguments (JSON text;
    an object with no properties when the tool takes none)."""

    name: str
    description: str
    parameters: str

    def schema(self) -> dict[str, Any]:
        """The parameters' JSON schema."""
        return json.loads(self.parameters)

    def as_openai(self) -> dict[str, Any]:
        """The tool in OpenAI's shape, which chat templates take as ``tools``."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.schema()
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """``tool_choice``: ``mode`` (one of :data:`TOOL_CHOICES`) and, for
    ``function``, the function's ``name``."""

    mode: str
    name: str | None = None

    @property
    def forced(self) -> bool:
        """Whether the reply must be a tool call."""
        return self.mode in ("required", "function")


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: ``id`` (``call_`` and 24 hex digits),
    ``name`` and ``arguments`` as JSON text (OpenAI sends them so)."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        """The call as an OpenAI message's ``tool_calls`` item (a streamed
        ``delta.tool_calls`` item adds its ``index``)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class Reading(NamedTuple):
    """What (a piece of) a reply was read as: ``content`` to show, the tool
    ``calls`` it completed and its ``reasoning`` (a harmony reply's
    analysis channel; "" in the other syntaxes)."""

    content: str
    calls: list[ToolCall]
    reasoning: str = ""


def new_call_id() -> str:
    """A fresh tool call id, as OpenAI's look: ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)


def parse_tools(value: Any, field: str = "tools") -> tuple[Tool, ...]:
    """The tools of a request: a list of OpenAI chat tools (``{"type":
    "function", "function": {"name", "description", "parameters"}}``) or
    of the flat form of OpenAI's Responses API (``{"type": "function",
    "name", ...}``). Each parameter schema is compiled for constrained
    decoding. A problem is a :class:`ToolError` (or, for a schema, a
    :class:`~mlxprog.llm.constraints.ConstraintError`) naming the field."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ToolError(field, f"expected a list of tools, got {shown(value)}")
    tools, names = [], set()
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, Mapping):
            raise ToolError(where, f"expected a tool object, got {shown(item)}")
        if item.get("type", "function") != "function":
            raise ToolError(f"{where}.type", f"only 'function' tools are supported, got "
                            f"{shown(item.get('type'))}")
        if isinstance(item.get("function"), Mapping):
            function, where = item["function"], f"{where}.function"
        elif "function" in item:
            raise ToolError(f"{where}.function", f"expected an object, got "
                            f"{shown(item['function'])}")
        else:
            function = item
        name = function.get("name")
        if name is None:
            raise ToolError(f"{where}.name", "a tool needs a name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ToolError(f"{where}.name", "must be 1 to 64 letters, digits, underscores or "
                            f"dashes, got {shown(name)}")
        if name in names:
            raise ToolError(f"{where}.name", f"two tools are named {name!r}")
        names.add(name)
        description = function.get("description") or ""
        if not isinstance(description, str):
            raise ToolError(f"{where}.description", f"must be a string, got "
                            f"{shown(description)}")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, Mapping):
            raise ToolError(f"{where}.parameters", "must be a JSON schema object, got "
                            f"{shown(parameters)}")
        source = Constraint.json_schema(parameters, f"{where}.parameters").source
        tools.append(Tool(name, description, source))
    return tuple(tools)


def parse_tool_choice(value: Any, tools: Sequence[Tool],
                      field: str = "tool_choice") -> ToolChoice:
    """A request's ``tool_choice``: ``"auto"``, ``"none"``, ``"required"``,
    or a function by name (``{"type": "function", "function": {"name":
    ...}}``, or the Responses API's ``{"type": "function", "name": ...}``).
    None means ``auto`` with tools, ``none`` without. ``required`` or a
    name without tools, or a name that is not one of ``tools``, is a
    :class:`ToolError`."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise ToolError(field, f"must be 'auto', 'none', 'required' or a function, got "
                            f"{shown(value)}")
        if value == "required" and not tools:
            raise ToolError(field, "'required' needs tools: the request has none")
        return ToolChoice(value)
    if not isinstance(value, Mapping) or value.get("type") != "function":
        raise ToolError(field, "must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                        f"\"function\": {{\"name\": ...}}}}, got {shown(value)}")
    if isinstance(value.get("function"), Mapping):
        name, where = value["function"].get("name"), f"{field}.function.name"
    else:
        name, where = value.get("name"), f"{field}.name"
    if not isinstance(name, str):
        raise ToolError(where, f"expected the function's name, got {shown(name)}")
    known = [t.name for t in tools]
    if name not in known:
        listed = ", ".join(map(repr, known)) if known else "none"
        raise ToolError(where, f"{name!r} is not one of the tools (the tools: {listed})")
    return ToolChoice("function", name)


def template_takes_tools(chat_template: str | None) -> bool:
    """Whether a chat template reads a ``tools`` variable (a template that
    does not compile takes none)."""
    if not chat_template:
        return False
    try:
        parsed = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(
            chat_template)
    except TemplateSyntaxError:
        return False
    return "tools" in meta.find_undeclared_variables(parsed)


def tool_call_syntax(chat_template: str | None) -> str:
    """The tool-call syntax (one of :data:`SYNTAXES`) a model with this
    chat template writes, known from the tokens the template writes calls
    with; ``harmony`` for a template that writes the harmony format's
    ``<|channel|>`` and ``<|message|>`` (its replies have channels, tools
    or not); otherwise ``generic`` for a template that takes no tools."""
    if chat_template is not None and _HARMONY_CHANNEL in chat_template \
            and _HARMONY_MESSAGE in chat_template:
        return "harmony"
    if chat_template is None or not template_takes_tools(chat_template):
        return "generic"
    if _HERMES_OPEN in chat_template:
        return "hermes"
    if _MISTRAL_CALLS in chat_template:
        return "mistral"
    if _LLAMA_TAG in chat_template or ("<|start_header_id|>" in chat_template
                                       and "parameters" in chat_template):
        return "llama3"
    return "json"


@dataclass(frozen=True)
class ToolPrompt:
    """How a conversation with tools is rendered and its reply read:
    ``messages`` and ``template_kwargs`` for the chat template
    (``apply_chat_template(messages, **template_kwargs)``), the
    ``constraint`` of the reply (None: unconstrained), the ``syntax`` its
    tool calls are read in (one of :data:`SYNTAXES`) and the ``tools`` they
    may call."""

    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any]
    constraint: Constraint | None
    syntax: str
    tools: tuple[Tool, ...]

    @property
    def reads_reply(self) -> bool:
        """Whether the reply is read (tools were offered, or the harmony
        format's channels are to be told apart): then it is to be decoded
        with special tokens (generation's ``special_tokens`` option), whose
        markers the reader needs."""
        return bool(self.tools) or self.syntax == "harmony"

    def stream(self, special_texts: Collection[str] = ()) -> ToolCallStream:
        """A :class:`ToolCallStream` reading this prompt's reply (decoded
        with the special tokens ``special_texts``, which it shows none of)."""
        return ToolCallStream(self.syntax, self.tools, special_texts)

    def parse(self, text: str, special_texts: Collection[str] = ()) -> Reading:
        """A whole reply as its content, tool calls and reasoning, as
        streaming it through :meth:`stream` gives them."""
        stream = self.stream(special_texts)
        first, rest = stream.feed(text), stream.finish()
        return Reading(first.content + rest.content, first.calls + rest.calls,
                       first.reasoning + rest.reasoning)


def prepare_tools(messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool],
                  choice: ToolChoice, chat_template: str | None,
                  parallel_tool_calls: bool = True, field: str = "messages") -> ToolPrompt:
    """How to render ``messages`` (OpenAI chat messages: assistant
    messages may carry ``tool_calls``, ``tool`` messages a
    ``tool_call_id``) with ``tools`` for a model with ``chat_template``,
    and how to read the reply (see the module's description).
    ``parallel_tool_calls`` false lets a forced or generic reply call one
    tool only. A tool message whose ``tool_call_id`` matches no earlier
    call, or a malformed call in the history, is a :class:`ToolError`
    naming it (under ``field``)."""
    history = _history(messages, field)
    syntax = tool_call_syntax(chat_template)
    offered = tuple(tools) if choice.mode != "none" else ()
    if syntax == "generic":
        rendered = _generic_history(history)
        if offered:
            rendered = _with_system(rendered, _generic_instructions(offered, choice,
                                                                    parallel_tool_calls))
        kwargs: dict[str, Any] = {}
    else:
        rendered = _native_history(history, syntax)
        kwargs = {"tools": [t.as_openai() for t in offered]} if offered else {}
    constraint = None
    if choice.forced:
        called = [t for t in offered if choice.mode == "required" or t.name == choice.name]
        if not called:
            raise ToolError("tool_choice", f"{choice.name or choice.mode!r} calls a tool, and "
                            "none of the tools is that one")
        constraint = Constraint.json_schema(_calls_schema(called, parallel_tool_calls),
                                            "tool_choice")
        syntax = "generic"
    elif syntax == "generic" and offered:
        constraint = Constraint.grammar(_text_or_calls(offered, parallel_tool_calls), "tools")
    return ToolPrompt(rendered, kwargs, constraint, syntax, offered)


@dataclass(frozen=True)
class _Call:
    """A tool call of the history: its ``id``, ``name`` and ``arguments``."""

    id: str
    name: str
    arguments: dict[str, Any]


def _history(messages: Sequence[Mapping[str, Any]], field: str) -> list[dict[str, Any]]:
    """The messages as dicts, each assistant message's ``tool_calls`` checked
    and read into ``_Call`` objects (under ``"calls"``), and each tool
    message matched to its call (under ``"call"``)."""
    calls: dict[str, _Call] = {}
    history = []
    for i, message in enumerate(messages):
        message = dict(message)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            message["calls"] = [_history_call(c, f"{field}[{i}].tool_calls[{j}]")
                                for j, c in enumerate(message["tool_calls"])]
            calls.update((c.id, c) for c in message["calls"])
        elif message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ToolError(f"{field}[{i}].tool_call_id", "a tool message needs the id of "
                                "the call it answers")
            if call_id not in calls:
                raise ToolError(f"{field}[{i}].tool_call_id", f"{call_id!r} matches no tool "
                                "call of an earlier assistant message")
            message["call"] = calls[call_id]
        history.append(message)
    return history


def _history_call(call: Any, where: str) -> _Call:
    """An assistant message's ``tool_calls`` item, checked."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise ToolError(where, "expected {\"id\": ..., \"type\": \"function\", \"function\": "
                        f"{{\"name\": ..., \"arguments\": ...}}}}, got {shown(call)}")
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise ToolError(f"{where}.id", f"a tool call needs an id, got {shown(call.get('id'))}")
    name = call["function"].get("name")
    if not isinstance(name, str) or not name:
        raise ToolError(f"{where}.function.name", f"expected a function name, got {shown(name)}")
    arguments = call["function"].get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ToolError(f"{where}.function.arguments", "is not JSON: "
                            f"{shown(arguments)}") from None
    if not isinstance(arguments, Mapping):
        raise ToolError(f"{where}.function.arguments", f"must be a JSON object, got "
                        f"{shown(arguments)}")
    return _Call(call["id"], name, dict(arguments))


def _native_history(history: list[dict[str, Any]], syntax: str) -> list[dict[str, Any]]:
    """The messages as Hugging Face templates take them: calls with their
    arguments as objects (templates write them with ``tojson``). Mistral's
    templates take only 9-character ids: each id becomes one derived from
    it. Harmony templates (gpt-oss's) take an assistant message's
    reasoning as ``thinking`` and test whether its content holds channel
    markers: a null content is left out."""
    def call_id(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()[:9] if syntax == "mistral" else value

    rendered = []
    for message in history:
        out = {k: v for k, v in message.items() if k not in ("calls", "call")}
        if syntax == "harmony":
            if "reasoning_content" in out:
                out["thinking"] = out.pop("reasoning_content")
            if out.get("content", "") is None:
                del out["content"]
        if "calls" in message:
            out["tool_calls"] = [{"id": call_id(c.id), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in message["calls"]]
        if "call" in message:
            out["tool_call_id"] = call_id(message["call"].id)
            out.setdefault("name", message["call"].name)
        rendered.append(out)
    return rendered


def _generic_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages for a template that knows no tools: an assistant's
    calls as the generic JSON after its text, tool results as user
    messages (consecutive ones in one)."""
    rendered: list[dict[str, Any]] = []
    for message in history:
        if "calls" in message:
            calls = json.dumps({"tool_calls": [{"name": c.name, "arguments": c.arguments}
                                               for c in message["calls"]]}, ensure_ascii=False)
            text = message.get("content") or ""
            rendered.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        elif "call" in message:
            call = message["call"]
            result = f"Tool result of {call.name} (call {call.id}):\n{message.get('content') or ''}"
            if rendered and rendered[-1].get("tool_results"):
                rendered[-1]["content"] += "\n\n" + result
            else:
                rendered.append({"role": "user", "content": result, "tool_results": True})
        else:
            rendered.append({k: v for k, v in message.items() if k != "tool_calls"})
    return [{k: v for k, v in m.items() if k != "tool_results"} for m in rendered]


def _with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The messages with ``text`` after the system message's (or as a new
    system message first)."""
    if messages and messages[0].get("role") in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _generic_instructions(tools: Sequence[Tool], choice: ToolChoice, parallel: bool) -> str:
    """The system message's description of the tools and of the generic call."""
    listed = "\n".join(json.dumps({"name": t.name, "description": t.description,
                                   "parameters": t.schema()}, ensure_ascii=False) for t in tools)
    lines = [
        "You can call these tools (one JSON description per line):",
        listed,
        "",
        "To call tools, reply with only this JSON and nothing before or after it:",
        '{"tool_calls": [{"name": "<tool name>", "arguments": {<the arguments>}}]}',
        "You may call several tools at once." if parallel else "Call one tool at a time.",
        "The results come back in a user message starting with \"Tool result\".",
    ]
    if choice.mode == "required":
        lines.append("Call a tool now.")
    elif choice.mode == "function":
        lines.append(f"Call the tool {choice.name} now.")
    else:
        lines.append("When no tool is needed, reply in plain text (not starting with \"{\").")
    return "\n".join(lines)


def _calls_schema(tools: Sequence[Tool], parallel: bool) -> dict[str, Any]:
    """The JSON schema of a generic call of one of ``tools`` (several with
    ``parallel``): each tool's parameters under ``$defs`` (their own
    references rebased), named first so that the name picks the arguments'
    schema."""
    defs, items = {}, []
    for i, tool in enumerate(tools):
        key = f"tool_{i}"
        defs[key] = _rebased(tool.schema(), f"#/$defs/{key}")
        items.append({"type": "object",
                      "properties": {"name": {"const": tool.name},
                                     "arguments": {"$ref": f"#/$defs/{key}"}},
                      "required": ["name", "arguments"], "additionalProperties": False})
    calls: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1
                             else {"anyOf": items}, "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    return {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
            "additionalProperties": False, "$defs": defs}


def _rebased(schema: Any, base: str, data: bool = False) -> Any:
    """A schema moved to ``base`` inside another: its local references
    (``#...``) point into it there, and its ``$id``/``$schema`` go (they
    would change how references resolve)."""
    if isinstance(schema, list):
        return [_rebased(item, base, data) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    if data:
        return dict(schema)
    out = {}
    for key, value in schema.items():
        if key in ("$id", "$schema") and base:
            continue
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        else:
            out[key] = _rebased(value, base, key in SCHEMA_DATA)
    return out


def _text_or_calls(tools: Sequence[Tool], parallel: bool) -> str:
    """The Lark grammar of a reply under the generic syntax: text whose
    first non-blank character is no ``{``, or a generic call whose
    arguments fit (starting with its ``{``)."""
    schema = {"x-guidance": {"whitespace_pattern": JSON_WHITESPACE},
              **_calls_schema(tools, parallel)}
    return ("start: TEXT | calls\n"
            "TEXT: /\\s*[^{\\s](.|\\n)*/\n"
            f"calls: %json {json.dumps(schema, ensure_ascii=False)}\n")


class ToolCallStream:
    """Reads a reply in ``syntax`` (one of :data:`SYNTAXES`) as it streams.

    :meth:`feed` takes the next piece of text (decoded with special tokens,
    whose texts are ``special_texts``: ``[TOOL_CALLS]``, ``<|python_tag|>``
    and harmony's markers are special tokens in their vocabularies) and
    returns a :class:`Reading`: the content that is known not to be a tool
    call, to send now, the calls completed by the piece, and reasoning;
    :meth:`finish` returns the rest at the end of the reply. Text that may
    start a call is held back until it is known: a possible start of a
    call marker (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``), or
    a reply whose first non-blank character is ``{`` or ``[`` (``llama3``
    and ``json``: an object per call, or a list of them) or ``{``
    (``generic``: only ``{"tool_calls": [...]}``, the form its constraint
    makes). Hermes calls come out as each ``</tool_call>`` arrives, harmony
    calls as each message to ``functions.NAME`` ends, the others at the
    end. What turns out not to be a valid call of one of ``tools`` is
    content after all; blanks next to ``<tool_call>`` tags are not content.
    A harmony reply's ``analysis`` messages are reasoning, its other
    messages (``final``, and ``commentary`` to no tool) content; a reply
    that does not start with a harmony header is content. Content and
    reasoning never hold the special tokens' texts. Content, calls and
    reasoning are the same however the reply is cut into pieces."""

    def __init__(self, syntax: str, tools: Sequence[Tool], special_texts: Collection[str] = ()):
        if syntax not in SYNTAXES:
            raise ValueError(f"unknown tool-call syntax {syntax!r}; one of {', '.join(SYNTAXES)}")
        self.syntax = syntax
        self._tools = {t.name: t for t in tools}
        self._marker = _MARKERS.get(syntax)
        self._held = ""         # text not yet known to be content or calls
        self._calling = False   # whether the held text starts with a call
        # The characters that start a JSON reply of calls ("" for none).
        self._json_start = {"llama3": "{[", "json": "{[", "generic": "{"}.get(syntax, "")
        self._at_start = bool(self._json_start) or syntax == "harmony"
        self._after_call = False  # whether a Hermes call just ended (blanks follow it)
        self._done = False
        # Harmony: the message being read (None: its header is being read),
        # as (channel, recipient); and whether the reply is plain text.
        self._message: tuple[str, str] | None = None
        self._plain = False
        # What is shown holds no special token; a call's text only the markers.
        special = frozenset(special_texts)
        self._content, self._reasoning = _Unspecial(special), _Unspecial(special)
        self._unmarked = _special_pattern(special - frozenset(_SYNTAX_MARKERS.get(syntax, ())))

    def feed(self, text: str) -> Reading:
        """The content to send, the calls completed and the reasoning, after ``text``."""
        if self._done:
            raise ValueError("the reply was finished")
        self._held += text
        return self._read(False)

    def finish(self) -> Reading:
        """The content, calls and reasoning held until the end of the reply."""
        self._done = True
        return self._read(True)

    def _read(self, final: bool) -> Reading:
        if self.syntax == "harmony":
            content, calls, reasoning = self._harmony(final)
        else:
            (content, calls), reasoning = (self._hermes(final) if self.syntax == "hermes"
                                           else self._whole_reply(final)), ""
        return Reading(self._content.feed(content, final), calls,
                       self._reasoning.feed(reasoning, final))

    def _hermes(self, final: bool) -> tuple[str, list[ToolCall]]:
        """``<tool_call>`` tags: text outside them is content, sent as it
        comes (but for blanks, held until it is known whether a tag
        follows); each closed tag's JSON is a call (an unclosed one at the
        end of the reply too)."""
        content, calls = "", []
        while self._held:
            if not self._calling:
                start = self._held.find(_HERMES_OPEN)
                if start < 0:
                    keep = 0 if final else _partial_suffix(self._held, _HERMES_OPEN)
                    text = self._outside(self._held[:len(self._held) - keep])
                    blanks = 0 if final else len(text) - len(text.rstrip())
                    content += text[:len(text) - blanks]
                    self._held = text[len(text) - blanks:] + self._held[len(self._held) - keep:]
                    break
                content += self._outside(self._held[:start]).rstrip()
                self._held = self._held[start:]
                self._calling = True
            end = self._held.find(_HERMES_CLOSE)
            if end < 0 and not final:
                break
            close = len(_HERMES_CLOSE) if end >= 0 else 0
            whole = self._held[:end + close] if end >= 0 else self._held
            call = self._call(_json_value(self._without_specials(
                whole[len(_HERMES_OPEN):len(whole) - close])))
            if call is None:
                content += whole
            else:
                calls.append(call)
            self._after_call = call is not None
            self._held = self._held[len(whole):]
            self._calling = False
        return content, calls

    def _outside(self, text: str) -> str:
        """Text outside the tags, less the blanks right after a call."""
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        return text

    def _whole_reply(self, final: bool) -> tuple[str, list[ToolCall]]:
        """Syntaxes whose calls run to the end of the reply: held from the
        call's start (a marker, or a JSON reply's first character) until
        the reply ends."""
        content = ""
        if not self._calling and self._at_start:
            stripped = self._held.lstrip()
            if stripped and stripped[0] in self._json_start:
                self._calling = True
            elif stripped:
                self._at_start = False
            elif not final:
                return "", []
        if not self._calling:
            start = self._held.find(self._marker) if self._marker else -1
            if start >= 0:
                content, self._held = self._held[:start], self._held[start:]
                self._calling = True
            else:
                keep = 0 if final or not self._marker else _partial_suffix(self._held,
                                                                            self._marker)
                content = self._held[:len(self._held) - keep]
                self._held = self._held[len(self._held) - keep:]
        if not final or not self._calling:
            return content, []
        calls = self._calls(self._without_specials(self._held))
        if calls is None:
            content += self._held
            calls = []
        self._held = ""
        return content, calls

    def _harmony(self, final: bool) -> tuple[str, list[ToolCall], str]:
        """The harmony format: each message's header (up to ``<|message|>``)
        says its channel and recipient; its body runs to an end marker (or
        the next ``<|start|>``, or the end of the reply). Bodies of
        ``analysis`` are reasoning and of calls to a tool are held until
        they end; others are content, sent as they come (but for an end
        that may start a marker)."""
        content, reasoning, calls = "", "", []
        while self._held:
            if self._plain:
                content, self._held = content + self._held, ""
                break
            if self._message is None:
                if self._at_start:
                    head = self._held.lstrip()
                    if head and not any(m.startswith(head[:len(m)])
                                        for m in (_HARMONY_CHANNEL, _HARMONY_START, "to=")):
                        self._plain = True  # not the harmony format: text
                        continue
                at = self._held.find(_HARMONY_MESSAGE)
                if at < 0:
                    if final:  # a header without a body
                        content, self._held = content + self._held, ""
                    break
                self._message = _harmony_header(self._held[:at])
                self._held = self._held[at + len(_HARMONY_MESSAGE):]
                self._at_start = False
            channel, recipient = self._message
            end, marker = min(((self._held.find(m), m) for m in (*_HARMONY_ENDS, _HARMONY_START)
                               if m in self._held), default=(-1, ""))
            calling = bool(recipient)
            if end < 0 and not final:
                if not calling:  # send what can be no marker's start
                    keep = max(_partial_suffix(self._held, m)
                               for m in (*_HARMONY_ENDS, _HARMONY_START))
                    body, self._held = self._held[:len(self._held) - keep], \
                        self._held[len(self._held) - keep:]
                    if channel == _HARMONY_REASONING:
                        reasoning += body
                    else:
                        content += body
                break
            body = self._held if end < 0 else self._held[:end]
            self._held = "" if end < 0 else self._held[end + (0 if marker == _HARMONY_START
                                                              else len(marker)):]
            self._message = None
            if calling:
                call = None
                if recipient.startswith(_HARMONY_FUNCTIONS):
                    call = self._call({"name": recipient[len(_HARMONY_FUNCTIONS):],
                                       "arguments": _json_value(self._without_specials(body))})
                if call is None:
                    content += body
                else:
                    calls.append(call)
            elif channel == _HARMONY_REASONING:
                reasoning += body
            else:
                content += body
        return content, calls, reasoning

    def _without_specials(self, text: str) -> str:
        """A call's text without the special tokens that are not this
        syntax's markers (an end-of-turn token the vocabulary does not
        count as EOS, say)."""
        return text if self._unmarked is None else self._unmarked.sub("", text)

    def _calls(self, text: str) -> list[ToolCall] | None:
        """The calls ``text`` (from a call's start to the end of the reply)
        holds in this syntax; None when it is not only calls of known
        tools."""
        if self.syntax == "mistral":
            return self._mistral(text.removeprefix(_MISTRAL_CALLS))
        if self.syntax == "generic":  # only the form the constraint makes
            value = _json_value(text)
            if not isinstance(value, Mapping) or set(value) != {"tool_calls"} or \
                    not isinstance(value["tool_calls"], list):
                return None
            return self._all_calls(value["tool_calls"])
        values = _json_values(text.removeprefix(_LLAMA_TAG) if self.syntax == "llama3" else text)
        if values is None:
            return None
        items: list[Any] = []
        for value in values:
            if isinstance(value, Mapping) and isinstance(value.get("tool_calls"), list):
                items.extend(value["tool_calls"])
            elif isinstance(value, list):
                items.extend(value)
            else:
                items.append(value)
        return self._all_calls(items)

    def _mistral(self, text: str) -> list[ToolCall] | None:
        """Mistral's calls after ``[TOOL_CALLS]``: a JSON list of
        ``{"name", "arguments"}``, or (newer templates) ``name[ARGS]{...}``
        (with ``[CALL_ID]id`` before ``[ARGS]`` in some), each after its
        own ``[TOOL_CALLS]``."""
        if text.lstrip().startswith("["):
            value = _json_value(text)
            return self._all_calls(value) if isinstance(value, list) else None
        items = []
        for part in text.split(_MISTRAL_CALLS):
            head, sep, arguments = part.partition(_MISTRAL_ARGS)
            if not sep:
                return None
            items.append({"name": head.split(_MISTRAL_ID)[0].strip(),
                          "arguments": _json_value(arguments)})
        return self._all_calls(items)

    def _all_calls(self, items: Sequence[Any]) -> list[ToolCall] | None:
        """The calls ``items`` are, or None unless every one is a call."""
        calls = [self._call(item) for item in items]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]

    def _call(self, value: Any) -> ToolCall | None:
        """A call of a known tool from a JSON value: ``name`` and
        ``arguments`` (or Llama's ``parameters``) as an object or as JSON
        text of one; None for anything else."""
        if not isinstance(value, Mapping) or value.get("name") not in self._tools:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, Mapping):
            return None
        return ToolCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


#: The marker that starts calls anywhere in a reply, per syntax.
_MARKERS = {"mistral": _MISTRAL_CALLS, "llama3": _LLAMA_TAG}


def _harmony_header(header: str) -> tuple[str, str]:
    """A harmony message's header (``[<|start|>role]<|channel|>NAME[
    to=RECIPIENT][ <|constrain|>json]``) as its channel and recipient ("" for none)."""
    channel = re.search(re.escape(_HARMONY_CHANNEL) + r"\s*([^\s<]+)", header)
    recipient = re.search(r"\bto=([^\s<]+)", header)
    return (channel.group(1) if channel else "", recipient.group(1) if recipient else "")


@functools.lru_cache(maxsize=16)
def _special_pattern(texts: frozenset[str]) -> re.Pattern[str] | None:
    """A regex matching any of ``texts`` (None for none)."""
    texts = sorted((t for t in texts if t), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else None


@functools.lru_cache(maxsize=16)
def _special_prefixes(texts: frozenset[str]) -> frozenset[str]:
    """The proper prefixes of ``texts``."""
    return frozenset(t[:i] for t in texts for i in range(1, len(t)))


class _Unspecial:
    """Streamed text with the special tokens' texts left out: an end that
    may start one is held until the next piece tells."""

    def __init__(self, special_texts: frozenset[str]):
        self._pattern = _special_pattern(special_texts)
        self._prefixes = _special_prefixes(special_texts)
        self._longest = max(map(len, special_texts), default=0)
        self._held = ""

    def feed(self, text: str, final: bool) -> str:
        """The text to show after ``text`` (all of it when ``final``)."""
        text, self._held = self._held + text, ""
        if self._pattern is None:
            return text
        text = self._pattern.sub("", text)
        if not final:
            for length in range(min(len(text), self._longest - 1), 0, -1):
                if text[-length:] in self._prefixes:
                    text, self._held = text[:-length], text[-length:]
                    break
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that starts ``marker``
    (and is shorter than it)."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def _json_value(text: str) -> Any:
    """The one JSON value ``text`` holds (blank around it), or None."""
    values = _json_values(text)
    return values[0] if values is not None and len(values) == 1 else None


def _json_values(text: str) -> list[Any] | None:
    """The JSON values ``text`` holds one after another (blank, ``;`` or
    ``,`` between them, as Llama writes several calls), or None when it
    holds anything else."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and (text[at].isspace() or (values and text[at] in ";,")):
            at += 1
        if at == len(text):
            return values or None
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        values.append(value)
