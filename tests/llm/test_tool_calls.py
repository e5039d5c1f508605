"""Tool calling (mlxprog.llm.tool_calls): tools and tool_choice checked with
errors naming the field, tools rendered through templates that take them
and described for SmolLM2's, which takes none; each family's call syntax
read whole and streamed; and forced calls, decoded greedily from random
logits over the SmolLM2 vocabulary, always call a tool with arguments its
schema validates."""

from __future__ import annotations

import json
import re

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_fixtures import smollm_tokenizer
from pydantic import BaseModel, Field

from mlxprog.llm.constraints import (
    ConstraintError, ConstraintVocabulary, LogitBias, OptionError,
)
from mlxprog.llm.tool_calls import (
    SYNTAXES, Tool, ToolCallStream, ToolChoice, ToolError, new_call_id,
    parse_tool_choice, parse_tools, prepare_tools, template_takes_tools, tool_call_syntax,
)

_SETTINGS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


class Place(BaseModel):
    city: str = Field(max_length=12)
    country: str = Field(pattern=r"^[A-Z]{2}$")


class Forecast(BaseModel):
    place: Place
    days: int = Field(ge=1, le=7)
    unit: str = Field(json_schema_extra={"enum": ["C", "F"]})


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string",
                                                                 "maxLength": 12}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "required": ["a", "b"], "properties": {
            "a": {"type": "integer", "minimum": -99, "maximum": 99},
            "b": {"type": "integer", "minimum": -99, "maximum": 99}}}}},
    {"type": "function", "function": {"name": "forecast",
                                      "parameters": Forecast.model_json_schema()}},
    {"type": "function", "function": {"name": "now"}},
]

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{{ messages[0].content if messages[0].role == 'system' else 'You are helpful.' }}
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call functions inside <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% elif not (m.role == 'system' and tools) %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

MISTRAL_TEMPLATE = """\
{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in messages %}
{%- if m.role == 'user' or m.role == 'system' %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS][
{%- for tc in m.tool_calls %}
{%- if tc.id | length != 9 %}{{ raise_exception('ids of 9') }}{% endif %}
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}, \
"id": "{{ tc.id }}"}{% if not loop.last %}, {% endif %}
{%- endfor %}]</s>
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{"call_id": "{{ m.tool_call_id }}", \
"content": {{ m.content | tojson }}}[/TOOL_RESULTS]
{%- else %}{{ m.content }}</s>{% endif %}
{%- endfor %}"""

LLAMA3_TEMPLATE = """\
{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{% if m.tool_calls %}{% for tc in m.tool_calls %}\
{"name": "{{ tc.function.name }}", "parameters": {{ tc.function.arguments | tojson }}}\
{% endfor %}{% else %}{{ m.content }}{% endif %}<|eot_id|>
{%- endfor %}
{%- if tools %}<|start_header_id|>user<|end_header_id|>

Functions: {% for t in tools %}{{ t | tojson }}{% endfor %}<|eot_id|>{% endif %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

JSON_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}assistant:")


@pytest.fixture(scope="module")
def tokenizer():
    return smollm_tokenizer()


@pytest.fixture(scope="module")
def vocabulary(tokenizer) -> ConstraintVocabulary:
    return ConstraintVocabulary.of(tokenizer)


@pytest.fixture(scope="module")
def tools() -> tuple[Tool, ...]:
    return parse_tools(TOOLS)


def schemas(tools) -> dict[str, dict]:
    return {t.name: t.schema() for t in tools}


# ---------------------------------------------------------------------------
# tools and tool_choice


def test_tools_in_both_openai_shapes(tools):
    assert [t.name for t in tools] == ["get_weather", "add", "forecast", "now"]
    assert tools[0].description == "The weather in a city" and tools[1].description == ""
    assert tools[3].schema() == {"type": "object", "properties": {}}
    flat = parse_tools([{"type": "function", "name": "add",
                         "parameters": TOOLS[1]["function"]["parameters"]}])
    assert flat == (tools[1],)
    assert tools[1].as_openai() == TOOLS[1]
    assert parse_tools(None) == ()


@pytest.mark.parametrize("value, field, problem", [
    ({"name": "x"}, "tools", "expected a list of tools"),
    ([3], "tools[0]", "expected a tool object"),
    ([{"type": "retrieval"}], "tools[0].type", "only 'function' tools are supported"),
    ([{"type": "function", "function": "f"}], "tools[0].function", "expected an object"),
    ([{"type": "function", "function": {"description": "no name"}}],
     "tools[0].function.name", "a tool needs a name"),
    ([{"type": "function", "name": None}], "tools[0].name", "a tool needs a name"),
    ([{"type": "function", "function": {"name": "get weather"}}], "tools[0].function.name",
     r"must be 1 to 64 letters, digits, underscores or dashes, got \"get weather\""),
    ([{"type": "function", "function": {"name": "a" * 65}}], "tools[0].function.name",
     "must be 1 to 64"),
    ([TOOLS[0], TOOLS[0]], "tools[1].function.name", "two tools are named 'get_weather'"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}],
     "tools[0].function.description", "must be a string"),
    ([{"type": "function", "function": {"name": "f", "parameters": "object"}}],
     "tools[0].function.parameters", "must be a JSON schema object"),
    ([TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}],
     "tools[1].function.parameters", "uniqueItems is not supported"),
])
def test_bad_tools_name_the_field(value, field, problem):
    with pytest.raises(OptionError) as caught:
        parse_tools(value)
    assert caught.value.field == field
    assert re.search(problem, caught.value.problem), caught.value.problem
    kind = ConstraintError if field.endswith("parameters") and "uniqueItems" in problem \
        else ToolError
    assert isinstance(caught.value, kind)


def test_tool_choices(tools):
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, ()) == ToolChoice("none")
    for mode in ("auto", "none", "required"):
        assert parse_tool_choice(mode, tools) == ToolChoice(mode)
    named = ToolChoice("function", "add")
    assert parse_tool_choice({"type": "function", "function": {"name": "add"}}, tools) == named
    assert parse_tool_choice({"type": "function", "name": "add"}, tools) == named
    assert named.forced and ToolChoice("required").forced and not ToolChoice("auto").forced


@pytest.mark.parametrize("value, tools, field, problem", [
    ({"type": "function", "function": {"name": "subtract"}}, True, "tool_choice.function.name",
     r"'subtract' is not one of the tools \(the tools: 'get_weather', 'add', 'forecast', "
     r"'now'\)"),
    ({"type": "function", "name": "add"}, False, "tool_choice.name",
     r"'add' is not one of the tools \(the tools: none\)"),
    ({"type": "function", "function": {}}, True, "tool_choice.function.name",
     "expected the function's name"),
    ("required", False, "tool_choice", "'required' needs tools"),
    ("any", True, "tool_choice", "must be 'auto', 'none', 'required' or a function"),
    ({"type": "tool"}, True, "tool_choice", "must be 'auto', 'none', 'required' or"),
])
def test_bad_tool_choice_names_the_field(value, tools, field, problem):
    with pytest.raises(ToolError) as caught:
        parse_tool_choice(value, parse_tools(TOOLS) if tools else ())
    assert caught.value.field == field
    assert re.search(problem, caught.value.problem), caught.value.problem


# ---------------------------------------------------------------------------
# Templates


def test_which_templates_take_tools_and_their_syntax(tokenizer):
    assert not template_takes_tools(tokenizer.chat_template)  # SmolLM2's
    assert tool_call_syntax(tokenizer.chat_template) == "generic"
    assert tool_call_syntax(HERMES_TEMPLATE) == "hermes"
    assert tool_call_syntax(MISTRAL_TEMPLATE) == "mistral"
    assert tool_call_syntax(LLAMA3_TEMPLATE) == "llama3"
    assert tool_call_syntax(JSON_TEMPLATE) == "json"
    assert tool_call_syntax(None) == "generic"
    assert tool_call_syntax("{% if tools %}") == "generic"  # does not compile


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and 2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add",
                                                          "arguments": {"a": 2, "b": 3}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"},
]


def test_a_template_that_takes_tools_gets_them_and_the_history_as_objects(tokenizer, tools):
    prompt = prepare_tools(HISTORY, tools, ToolChoice("auto"), HERMES_TEMPLATE)
    assert prompt.syntax == "hermes" and prompt.constraint is None
    assert prompt.template_kwargs == {"tools": [t.as_openai() for t in tools]}
    calls = prompt.messages[2]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"city": "Paris"}, {"a": 2, "b": 3}]
    assert prompt.messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny",
                                  "name": "get_weather"}
    text = tokenizer.with_chat_template(HERMES_TEMPLATE).apply_chat_template(
        prompt.messages, **prompt.template_kwargs)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert json.dumps(tools[2].as_openai(), ensure_ascii=False) in text
    assert "<tool_response>5</tool_response>" in text


def test_mistral_templates_get_nine_character_ids(tokenizer, tools):
    prompt = prepare_tools(HISTORY, tools, ToolChoice("auto"), MISTRAL_TEMPLATE)
    ids = [c["id"] for c in prompt.messages[2]["tool_calls"]]
    assert all(re.fullmatch(r"[0-9a-f]{9}", i) for i in ids) and len(set(ids)) == 2
    assert [m["tool_call_id"] for m in prompt.messages[3:]] == ids
    text = tokenizer.with_chat_template(MISTRAL_TEMPLATE).apply_chat_template(
        prompt.messages, add_generation_prompt=False, **prompt.template_kwargs)
    assert f'[TOOL_RESULTS]{{"call_id": "{ids[1]}", "content": "5"}}[/TOOL_RESULTS]' in text


def test_a_template_without_tools_gets_them_described_in_the_system_message(tokenizer, tools):
    prompt = prepare_tools(HISTORY, tools, ToolChoice("auto"), tokenizer.chat_template)
    assert prompt.syntax == "generic" and prompt.template_kwargs == {}
    system = prompt.messages[0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\n")
    for tool in tools:
        assert json.dumps({"name": tool.name, "description": tool.description,
                           "parameters": tool.schema()}) in system["content"]
    assert '{"tool_calls": [{"name": "<tool name>"' in system["content"]
    assert prompt.messages[2] == {"role": "assistant", "content": json.dumps({"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "add", "arguments": {"a": 2, "b": 3}}]})}
    assert prompt.messages[3] == {
        "role": "user", "content": "Tool result of get_weather (call call_1):\nsunny\n\n"
                                   "Tool result of add (call call_2):\n5"}
    assert len(prompt.messages) == 4
    text = tokenizer.apply_chat_template(prompt.messages)
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    assert prompt.constraint is not None and prompt.constraint.kind == "grammar"
    # Without a system message, one is added first.
    alone = prepare_tools(HISTORY[1:2], tools, ToolChoice("auto"), tokenizer.chat_template)
    assert alone.messages[0]["role"] == "system"
    assert alone.messages[0]["content"].startswith("You can call these tools")


def test_a_forced_choice_needs_its_tool(tools):
    with pytest.raises(ToolError, match="^tool_choice: 'gone' calls a tool, and none"):
        prepare_tools(HISTORY[:2], tools[:1], ToolChoice("function", "gone"), HERMES_TEMPLATE)
    with pytest.raises(ToolError, match="^tool_choice: 'required' calls a tool"):
        prepare_tools(HISTORY[:2], (), ToolChoice("required"), HERMES_TEMPLATE)


def test_tool_choice_none_offers_no_tools(tokenizer, tools):
    for template in (HERMES_TEMPLATE, tokenizer.chat_template):
        prompt = prepare_tools(HISTORY, tools, ToolChoice("none"), template)
        assert prompt.constraint is None and prompt.template_kwargs == {}
        assert prompt.tools == () and "You can call" not in prompt.messages[0]["content"]


@pytest.mark.parametrize("messages, field, problem", [
    ([*HISTORY[:3], {"role": "tool", "tool_call_id": "call_9", "content": "?"}],
     "messages[3].tool_call_id", "'call_9' matches no tool call of an earlier assistant message"),
    ([{"role": "tool", "content": "?"}], "messages[0].tool_call_id",
     "a tool message needs the id of the call it answers"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "add", "arguments": "{oops"}}]}], "messages[0].tool_calls[0].function.arguments",
     "is not JSON"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "add", "arguments": "[1]"}}]}], "messages[0].tool_calls[0].function.arguments",
     "must be a JSON object"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "add"}}]}],
     "messages[0].tool_calls[0].id", "a tool call needs an id"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}],
     "messages[0].tool_calls[0].function.name", "expected a function name"),
    ([{"role": "assistant", "tool_calls": ["add"]}], "messages[0].tool_calls[0]",
     "expected {\"id\": ..."),
])
def test_a_bad_history_names_the_message(tools, messages, field, problem):
    with pytest.raises(ToolError) as caught:
        prepare_tools(messages, tools, ToolChoice("auto"), HERMES_TEMPLATE)
    assert caught.value.field == field
    assert problem in caught.value.problem


# ---------------------------------------------------------------------------
# Forced calls: arguments always validate


@pytest.fixture(scope="module")
def closing_bias(vocabulary) -> LogitBias:
    """A bias towards tokens that close JSON strings, objects and arrays,
    so that random logits end JSON."""
    closers = [i for i in range(vocabulary.size)
               if any(c in vocabulary.token_bytes(i) for c in b'"}],')]
    return LogitBias(tuple(closers), (3.0,) * len(closers))


def greedy_reply(prompt, vocabulary, tokenizer, bias, seed: int, start: str = "") -> str:
    """Greedy decoding of random logits with ``bias`` under the prompt's
    constraint, after the text ``start``."""
    rng = np.random.default_rng(seed)
    state = prompt.constraint.start(vocabulary)
    ids = tokenizer.encode(start, add_special_tokens=False) if start else []
    state.advance_all(ids)
    for _ in range(500):
        logits = bias.apply(mx.array(rng.normal(size=(vocabulary.size,)).astype(np.float32)))
        token = int(mx.argmax(state.apply(logits)).item())
        if token in vocabulary.eos_token_ids:
            return tokenizer.decode(ids)
        state.advance(token)
        ids.append(token)
    raise AssertionError(f"no end within 500 tokens: {tokenizer.decode(ids)!r}")


def test_required_calls_a_tool_whose_arguments_validate(
        tokenizer, vocabulary, tools, closing_bias):
    prompt = prepare_tools(HISTORY[:2], tools, ToolChoice("required"), tokenizer.chat_template)
    assert prompt.syntax == "generic" and prompt.constraint.kind == "json_schema"
    # A template that takes tools gets them, and the same forced generic call.
    native = prepare_tools(HISTORY[:2], tools, ToolChoice("required"), HERMES_TEMPLATE)
    assert native.template_kwargs["tools"] and native.syntax == "generic"
    assert native.constraint == prompt.constraint
    called = set()
    for seed in range(6):
        reply = greedy_reply(prompt, vocabulary, tokenizer, closing_bias, seed)
        content, calls, _ = prompt.parse(reply)
        assert content == "" and calls
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas(tools)[call.name])
            called.add(call.name)
    assert len(called) > 1


def test_a_named_function_is_called_alone_with_valid_arguments(
        tokenizer, vocabulary, tools, closing_bias):
    prompt = prepare_tools(HISTORY[:2], tools, ToolChoice("function", "forecast"),
                           tokenizer.chat_template, parallel_tool_calls=False)
    assert "Call the tool forecast now." in prompt.messages[0]["content"]
    for seed in range(4):
        reply = greedy_reply(prompt, vocabulary, tokenizer, closing_bias, seed)
        content, calls, _ = prompt.parse(reply)
        assert content == "" and [c.name for c in calls] == ["forecast"]
        Forecast.model_validate_json(calls[0].arguments)  # $ref to Place, rebased, resolved


def test_auto_with_a_generic_template_takes_text_or_valid_calls(
        tokenizer, vocabulary, tools, closing_bias):
    prompt = prepare_tools(HISTORY[:2], tools, ToolChoice("auto"), tokenizer.chat_template)
    state = prompt.constraint.start(vocabulary)
    allowed = state.allowed()
    assert allowed[tokenizer.token_id("{")] and allowed[tokenizer.token_id("Hello")]
    text_reply = tokenizer.encode("Hello {there}", add_special_tokens=False)
    assert state.fitting_prefix(text_reply) == len(text_reply)
    # JSON after blanks is neither text nor a call: every reply whose first
    # non-blank character is "{" is a call the grammar checks.
    assert state.fitting_prefix(tokenizer.encode(" {", add_special_tokens=False)) == 0
    for seed in range(3):
        reply = greedy_reply(prompt, vocabulary, tokenizer, closing_bias, seed,
                             start='{"tool_calls": [')
        content, calls, _ = prompt.parse(reply)
        assert content == "" and calls
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas(tools)[call.name])
    bad = tokenizer.encode('{"tool_calls": [{"name": "delete_all"', add_special_tokens=False)
    assert state.fitting_prefix(bad) < len(bad)


# ---------------------------------------------------------------------------
# Reading calls


def read(syntax: str, text: str, tools) -> tuple[str, list[tuple[str, dict]]]:
    stream = ToolCallStream(syntax, tools)
    content, calls, _ = stream.feed(text)
    more, more_calls, _ = stream.finish()
    return content + more, [(c.name, json.loads(c.arguments)) for c in calls + more_calls]


WEATHER = ("get_weather", {"city": "Paris"})
ADD = ("add", {"a": 1, "b": 2})

READINGS = [
    ("hermes", 'I will check.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": '
               '{"a": 1, "b": 2}}\n</tool_call>', "I will check.", [WEATHER, ADD]),
    ("hermes", '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}',
     "", [ADD]),  # unclosed at the end, arguments as JSON text
    ("hermes", '<tool_call>{"name": "rm", "arguments": {}}</tool_call> done',
     '<tool_call>{"name": "rm", "arguments": {}}</tool_call> done', []),  # unknown tool
    ("hermes", "<tool_call>{oops</tool_call>", "<tool_call>{oops</tool_call>", []),
    ("hermes", "No tools: 2 < 3 and <tool>.", "No tools: 2 < 3 and <tool>.", []),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [WEATHER]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "add", "parameters": {"a": 1, "b": 2}}', "", [WEATHER, ADD]),
    ("llama3", 'Let me see. <|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
     "Let me see. ", [ADD]),
    ("llama3", '{"answer": 42}', '{"answer": 42}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 2}}]', "", [WEATHER, ADD]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add'
                '[CALL_ID]a1b2c3d4e[ARGS]{"a": 1, "b": 2}', "", [WEATHER, ADD]),
    ("mistral", "Sure.[TOOL_CALLS]add", "Sure.[TOOL_CALLS]add", []),
    ("mistral", "[1, 2] are numbers", "[1, 2] are numbers", []),
    ("json", ' {"name": "add", "arguments": {"a": 1, "b": 2}}', "", [ADD]),
    ("json", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [WEATHER]),
    ("json", 'Plain {"name": "add"}', 'Plain {"name": "add"}', []),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 2}}]}', "", [WEATHER, ADD]),
    ("generic", '{"tool_calls": [{"name": "now"}]}', "", [("now", {})]),
    ("generic", '{"tool_calls": []}', '{"tool_calls": []}', []),
    ("generic", '[{"name": "add", "arguments": {}}]', '[{"name": "add", "arguments": {}}]', []),
    ("generic", '{"name": "add", "arguments": {}}', '{"name": "add", "arguments": {}}', []),
    ("generic", "Hello there", "Hello there", []),
    ("generic", "  \n", "  \n", []),
    ("harmony", "<|channel|>analysis<|message|>They want the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris"}<|call|>', "", [WEATHER]),
    ("harmony", "<|channel|>commentary<|message|>Adding.<|end|><|start|>assistant "
                "to=functions.add<|channel|>commentary json<|message|>{\"a\": 1, \"b\": 2}",
     "Adding.", [ADD]),  # a preamble, then the recipient before the channel
    ("harmony", " to=functions.add<|channel|>commentary json<|message|>{\"a\": 1, "
                "\"b\": 2}<|call|>", "", [ADD]),  # right after "<|start|>assistant"
    ("harmony", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final"
                "<|message|>It is 3.<|return|>", "It is 3.", []),
    ("harmony", "<|channel|>commentary to=functions.rm<|message|>{}<|call|>", "{}", []),
    ("harmony", "Plain text, no header.", "Plain text, no header.", []),
]


@pytest.mark.parametrize("syntax, text, content, calls", READINGS)
def test_each_syntax_is_read(tools, syntax, text, content, calls):
    assert read(syntax, text, tools) == (content, calls)


def test_calls_have_openai_ids_and_shape(tools):
    stream = ToolCallStream("generic", tools)
    stream.feed('{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}')
    (call,) = stream.finish().calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.id != new_call_id()
    assert call.as_openai() == {"id": call.id, "type": "function", "function": {
        "name": "add", "arguments": '{"a": 1, "b": 2}'}}
    with pytest.raises(ValueError, match="unknown tool-call syntax 'xml'"):
        ToolCallStream("xml", tools)
    with pytest.raises(ValueError, match="the reply was finished"):
        stream.feed("more")


@_SETTINGS
@given(reading=st.sampled_from(READINGS), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_streaming_gives_what_reading_whole_gives(tools, reading, cuts):
    syntax, text, content, calls = reading
    stream = ToolCallStream(syntax, tools)
    streamed, got = "", []
    edges = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for start, end in zip(edges, edges[1:]):
        piece, done, _ = stream.feed(text[start:end])
        streamed += piece
        got += done
    piece, done, _ = stream.finish()
    assert (streamed + piece, [(c.name, json.loads(c.arguments)) for c in got + done]) == \
        (content, calls)


def test_content_streams_before_the_reply_ends(tools):
    stream = ToolCallStream("hermes", tools)
    assert stream.feed("I will check <tool") == ("I will check", [], "")
    assert stream.feed("_call>\n{\"name\": \"add\", ") == ("", [], "")
    content, calls, _ = stream.feed('"arguments": {"a": 1, "b": 2}}\n</tool_call>\nThen')
    assert content == "Then" and [c.name for c in calls] == ["add"]
    plain = ToolCallStream("generic", tools)
    assert plain.feed("  ") == ("", [], "")
    assert plain.feed("Hi {") == ("  Hi {", [], "")  # not JSON at its start: content
    mistral = ToolCallStream("mistral", tools)
    assert mistral.feed("Sure [TOOL") == ("Sure ", [], "")
    assert mistral.feed("_CALLS][") == ("", [], "")


#: Special tokens of the vocabularies these syntaxes come from.
SPECIALS = frozenset({"[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<|eom_id|>", "<|eot_id|>",
                      "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                      "<|call|>", "<|return|>", "<|reserved_200013|>"})


@_SETTINGS
@given(cuts=st.lists(st.integers(0, 300), max_size=12))
def test_harmony_reasoning_streams_apart_from_the_answer(tools, cuts):
    text = ("<|channel|>analysis<|message|>Need the <b>weather</b>; call it.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>"
            'json<|message|>{"city": "Paris"}<|call|><|start|>assistant<|channel|>final'
            "<|message|>Sunny<|reserved_200013|> in Paris.")
    stream = ToolCallStream("harmony", tools, SPECIALS)
    parts = []
    edges = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for start, end in zip(edges, edges[1:]):
        parts.append(stream.feed(text[start:end]))
    parts.append(stream.finish())
    assert "".join(p.reasoning for p in parts) == "Need the <b>weather</b>; call it."
    assert "".join(p.content for p in parts) == "Sunny in Paris."  # no special token shown
    assert [(c.name, json.loads(c.arguments)) for p in parts for c in p.calls] == [WEATHER]


@pytest.mark.parametrize("syntax, text, content, calls", [
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}<|eom_id|>', "",
     [ADD]),  # an end-of-message token the vocabulary does not count as EOS
    ("llama3", "<|python_tag|>print(1)<|eom_id|>", "print(1)", []),  # code, not a call
    ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', "", [ADD]),
    ("mistral", "Sure.[TOOL_CALLS]add", "Sure.add", []),  # not a call: no marker shown
    ("generic", "Hello<|eot_id|> there", "Hello there", []),
])
def test_special_token_markers_are_read_and_never_shown(tools, syntax, text, content, calls):
    for size in (1, 3, len(text)):
        stream = ToolCallStream(syntax, tools, SPECIALS)
        parts = [stream.feed(text[i:i + size]) for i in range(0, len(text), size)]
        parts.append(stream.finish())
        assert "".join(p.content for p in parts) == content
        assert [(c.name, json.loads(c.arguments)) for p in parts for c in p.calls] == calls


def test_every_syntax_is_covered():
    assert {r[0] for r in READINGS} == set(SYNTAXES)
