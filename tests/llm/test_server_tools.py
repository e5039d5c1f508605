"""Structured output and tool calling in the server's chat and text
completions: ``tools``/``tool_choice``, tool history, ``response_format``,
``logit_bias`` and llama.cpp's ``grammar``/``json_schema``.

Two servers of the tiny random-weight model: one with its own chat
template (which takes no tools: the generic form), one with a Hermes-style
template (``<tool_call>`` tags, as Qwen's). Their replies are checked
against ``LLM.generate`` of a second copy of the model, and against the
schemas with ``jsonschema``. The official ``openai`` client talks to them.

Tests marked ``constrained`` need the generation core to apply a
request's ``constraint`` and ``logit_bias`` (its masks and biases): they
are skipped while it does not (:func:`engine_constrains` tries it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import jsonschema
import openai
import pydantic
import pytest
from llm_fixtures import tiny_gguf
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessage

from mlxprog.llm import LLM, load
from mlxprog.llm.constraints import Constraint
from mlxprog.llm.server import Server
from mlxprog.llm.server.rendering import ChatReply
from mlxprog.llm.tool_calls import ToolChoice, parse_tools, prepare_tools

MAX_LENGTH = 1024
MODEL_ID = "tiny"

#: A Hermes-style template (Qwen 2.5's form, shortened): tools in the
#: system message, calls in <tool_call> tags, results in <tool_response>.
HERMES_TEMPLATE = """\
{% if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a function in <tool_call></tool_call> tags.<|im_end|>
{% endif %}
{% for m in messages %}
{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for c in m.tool_calls %}<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tiny_gguf(tmp_path_factory, "serve-tools")


@pytest.fixture(scope="module")
def reference(model_path) -> LLM:
    return load(model_path, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def hermes_reference(model_path) -> LLM:
    return load(model_path, max_length=MAX_LENGTH, chat_template=HERMES_TEMPLATE)


def _serve(llm: LLM):
    server = Server(llm, model_id=MODEL_ID, max_batch=2)
    server.start()
    return server


@pytest.fixture(scope="module")
def server(model_path):
    srv = _serve(load(model_path, max_length=MAX_LENGTH))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hermes_server(model_path):
    srv = _serve(load(model_path, max_length=MAX_LENGTH, chat_template=HERMES_TEMPLATE))
    yield srv
    srv.stop()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return _client(server)


@pytest.fixture(scope="module")
def hermes_client(hermes_server) -> openai.OpenAI:
    return _client(hermes_server)


def engine_constrains(llm: LLM) -> bool:
    """Whether the generation core applies a request's constraint: three
    tokens constrained to ``aaa`` (a random model writes it unconstrained
    with a chance of about 262**-3)."""
    try:
        return llm.generate("x", chat=False, max_tokens=3,
                            constraint=Constraint.regex("aaa")).text == "aaa"
    except TypeError:  # GenerationOptions without a constraint field
        return False


@pytest.fixture(scope="module")
def constrained(reference):
    if not engine_constrains(reference):
        pytest.skip("the generation core does not apply constraints yet (GenerationOptions."
                    "constraint/logit_bias, from the i37-gen branch)")


USER = [{"role": "user", "content": "What is the weather in Paris?"}]
HISTORY = [*USER,
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather",
                             "arguments": '{"city": "Paris", "unit": "C"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"}]


#: HISTORY with the tool WEATHER, as HERMES_TEMPLATE renders it.
HERMES_HISTORY = (
    '<|im_start|>system\n# Tools\n<tools>\n'
    + json.dumps(WEATHER, ensure_ascii=False) + '\n</tools>\n'
    'Call a function in <tool_call></tool_call> tags.<|im_end|>\n'
    '<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n'
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "Paris", "unit": "C"}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n21 degrees\n</tool_response><|im_end|>\n'
    '<|im_start|>assistant\n')


# -- the tool calls of a reply, as the server reads and streams them -----------
def _hermes_prompt():
    return prepare_tools(USER, parse_tools([WEATHER, TIME]), ToolChoice("auto"),
                         HERMES_TEMPLATE)


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_a_hermes_reply_streams_as_openai_streams_tool_calls(size):
    text = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
            '"Paris", "unit": "C"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
            '"arguments": {"zone": "UTC"}}\n</tool_call>')
    reply = ChatReply(_hermes_prompt())
    deltas = []
    for start in range(0, len(text), size):
        deltas += reply.feed(text[start:start + size])
    deltas += reply.finish()
    for delta in deltas:  # each is a valid chunk of OpenAI's
        ChatCompletionChunk.model_validate({
            "id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    assert "".join(d.get("content", "") for d in deltas) == "Let me look."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    # Per call: its id, type and name with empty arguments, then the arguments.
    assert [(c["index"], sorted(c)) for c in calls] == [
        (0, ["function", "id", "index", "type"]), (0, ["function", "index"]),
        (1, ["function", "id", "index", "type"]), (1, ["function", "index"])]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert json.loads(calls[1]["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[2]["id"]
    message = reply.message()
    ChatCompletionMessage.model_validate(message)
    assert message["content"] == "Let me look."
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
    assert message["tool_calls"][0]["id"] == calls[0]["id"]
    assert reply.finish_reason("stop") == "tool_calls"


def test_a_reply_without_calls_is_content_and_keeps_its_finish_reason():
    reply = ChatReply(_hermes_prompt())
    text = "No tools needed:<tool_call>{\"name\": \"unknown\"}</tool_call> and more"
    assert "".join(d.get("content", "") for d in [*reply.feed(text), *reply.finish()]) == text
    assert reply.message() == {"role": "assistant", "content": text}
    assert reply.finish_reason("length") == "length"


# -- prompts: tools and tool history through the chat template -----------------
def test_tools_reach_a_template_that_takes_them(hermes_server, hermes_client,
                                                hermes_reference):
    tokenizer = hermes_reference.tokenizer
    reply = hermes_client.chat.completions.create(
        model=MODEL_ID, messages=HISTORY, tools=[WEATHER], max_tokens=8, temperature=0)
    expected = HERMES_HISTORY
    assert reply.usage.prompt_tokens == len(tokenizer.encode(expected))
    # The random model calls no tool: its text is the content, as generated.
    generated = hermes_reference.generate(expected, chat=False, max_tokens=8)
    assert reply.choices[0].message.content == generated.text
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == {"eos": "stop"}.get(generated.finish_reason,
                                                                 generated.finish_reason)
    # tool_choice "none": the tools are not shown (the history still is).
    none = hermes_client.chat.completions.create(
        model=MODEL_ID, messages=HISTORY, tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert none.usage.prompt_tokens == len(tokenizer.encode(expected[expected.index(
        "<|im_start|>user"):]))


def test_a_template_without_tools_gets_them_in_the_system_message(server, client, reference):
    tokenizer = reference.tokenizer
    reply = client.chat.completions.create(model=MODEL_ID, messages=HISTORY, tools=[WEATHER],
                                           max_tokens=1)
    prompt = prepare_tools(HISTORY, parse_tools([WEATHER]), ToolChoice("auto"),
                           tokenizer.chat_template)
    rendered = tokenizer.apply_chat_template(prompt.messages)
    assert rendered.startswith("<|im_start|>system\nYou can call these tools")
    assert '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", ' \
           '"unit": "C"}}]}' in rendered
    assert "Tool result of get_weather (call call_1):\n21 degrees" in rendered
    assert reply.usage.prompt_tokens == len(tokenizer.encode(rendered))


def test_an_assistant_reply_with_tool_calls_goes_back_as_history(hermes_client):
    """The message a reply holds (content null, tool_calls) is taken back as
    it is, as clients send it."""
    reply = hermes_client.chat.completions.create(
        model=MODEL_ID, max_tokens=2, tools=[WEATHER], messages=[
            *USER, {"role": "assistant", "tool_calls": HISTORY[1]["tool_calls"]},
            HISTORY[2]])
    assert reply.usage.completion_tokens >= 1


# -- constrained replies (need the generation core's constraints) -------------
@pytest.mark.parametrize("which", ["hermes", "generic"])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_a_forced_tool_call_validates(constrained, which, choice, request):
    client = request.getfixturevalue("hermes_client" if which == "hermes" else "client")
    tool_choice = choice if choice == "required" else {
        "type": "function", "function": {"name": choice}}
    for seed in range(3):
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=USER, tools=[WEATHER, TIME], tool_choice=tool_choice,
            max_tokens=200, temperature=1.0, seed=seed, parallel_tool_calls=False)
        message = reply.choices[0]
        assert message.finish_reason == "tool_calls"
        (call,) = message.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        if choice != "required":
            assert call.function.name == choice
        jsonschema.validate(json.loads(call.function.arguments),
                            tool["function"]["parameters"])


def test_a_streamed_tool_call_is_the_same_call(constrained, client):
    # Seeded sampling: greedy, the random model pads the JSON with all the
    # whitespace allowed until max_tokens.
    kwargs = dict(model=MODEL_ID, messages=USER, tools=[WEATHER, TIME], tool_choice="required",
                  parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=1)
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["id"] = delta.id or call.get("id")
            call["name"] += (delta.function.name or "")
            call["arguments"] += (delta.function.arguments or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    # The openai client's own stream helper assembles the same calls.
    with client.beta.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    assert [c.function.arguments for c in final.choices[0].message.tool_calls] == \
        [c.function.arguments for c in whole.message.tool_calls]


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    country: str = pydantic.Field(pattern="^[A-Z][a-z]{2,8}$")
    population: int = pydantic.Field(ge=0, le=10**8)
    capital: bool


def test_response_format_json_schema_with_pydantic_parse(constrained, client):
    for seed in range(3):
        completion = client.beta.chat.completions.parse(
            model=MODEL_ID, messages=[{"role": "user", "content": "A city, as JSON"}],
            response_format=City, max_tokens=300, temperature=1.0, seed=seed)
        choice = completion.choices[0]
        if choice.finish_reason == "length":  # cut short: no claim that it parses
            continue
        assert isinstance(choice.message.parsed, City)


def test_response_format_json_object_streams_json(constrained, client):
    chunks = client.chat.completions.create(
        model=MODEL_ID, messages=USER, response_format={"type": "json_object"},
        max_tokens=200, temperature=0, stream=True)
    pieces, finish = [], None
    for chunk in chunks:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads("".join(pieces)), dict)


def test_a_constraint_cut_by_max_tokens_ends_with_length(constrained, client):
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=3, response_format={
            "type": "json_schema", "json_schema": {"name": "long", "strict": True, "schema": {
                "type": "object", "properties": {"text": {"type": "string", "minLength": 50}},
                "required": ["text"]}}})
    assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize("fields, check", [
    ({"grammar": 'root ::= "yes" | "no"'}, lambda text: text in ("yes", "no")),
    ({"grammar": 'start: "a"+ "b"'}, lambda text: set(text[:-1]) == {"a"} and text[-1] == "b"),
    ({"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
     lambda text: isinstance(json.loads(text), list) and len(json.loads(text)) <= 3),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "enum": ["red", "green"]}}}}, lambda text: json.loads(text) in ("red", "green")),
])
def test_completion_constraints(constrained, client, fields, check):
    for seed in range(3):
        reply = client.completions.create(model=MODEL_ID, prompt="Answer:", max_tokens=40,
                                          temperature=1.0, seed=seed, extra_body=fields)
        if reply.choices[0].finish_reason == "stop":
            assert check(reply.choices[0].text), reply.choices[0].text


def test_logit_bias_bans_and_forces_tokens(constrained, client, reference):
    greedy = reference.generate("Once", chat=False, max_tokens=1)
    first = greedy.tokens[0]
    banned = client.completions.create(model=MODEL_ID, prompt="Once", max_tokens=1,
                                       temperature=0, logit_bias={str(first): -100},
                                       logprobs=0)
    assert banned.choices[0].text != reference.tokenizer.decode([first])
    forced = reference.tokenizer.encode("z")[0]
    for stream in (False, True):
        reply = client.chat.completions.create(
            model=MODEL_ID, messages=USER, max_tokens=4, temperature=0, stream=stream,
            logit_bias={str(forced): 100})
        text = ("".join(c.choices[0].delta.content or "" for c in reply if c.choices)
                if stream else reply.choices[0].message.content)
        assert text == "zzzz"


# -- Anthropic's Messages API ----------------------------------------------------
def _anthropic(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                               timeout=120)


def test_anthropic_messages_with_system_and_stop_sequences(hermes_server, hermes_reference):
    client = _anthropic(hermes_server)
    # (This anthropic client takes no temperature argument: it goes in the body.)
    kwargs = dict(model=MODEL_ID, max_tokens=12, extra_body={"temperature": 0},
                  system="Be brief.",
                  messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    prompt = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
              "<|im_start|>assistant\n")
    generated = hermes_reference.generate(prompt, chat=False, max_tokens=12)
    message = client.messages.create(**kwargs)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert [(b.type, b.text) for b in message.content] == [("text", generated.text)]
    assert message.stop_reason == {"eos": "end_turn", "length": "max_tokens"}[
        generated.finish_reason]
    assert message.usage.input_tokens == len(hermes_reference.tokenizer.encode(prompt))
    assert message.usage.output_tokens == len(generated.tokens) + (
        generated.finish_reason == "eos")
    # Streamed: the same text, and the events the client assembles into the same message.
    with client.messages.stream(**kwargs) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == generated.text
    assert final.content[0].text == generated.text and final.stop_reason == message.stop_reason
    # A stop sequence from the middle of the text ends the reply before it.
    stop = generated.text[3:5]
    cut = client.messages.create(**kwargs, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == generated.text[:generated.text.index(stop)]


def test_anthropic_tool_use_and_tool_result_blocks_reach_the_template(hermes_server,
                                                                       hermes_reference):
    tool = {"name": "get_weather", "description": "The weather in a city.",
            "input_schema": WEATHER["function"]["parameters"]}
    message = _anthropic(hermes_server).messages.create(
        model=MODEL_ID, max_tokens=1, tools=[tool], messages=[
            {"role": "user", "content": USER[0]["content"]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                               "name": "get_weather",
                                               "input": {"city": "Paris", "unit": "C"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                          "content": "21 degrees"}]}])
    assert message.usage.input_tokens == len(hermes_reference.tokenizer.encode(HERMES_HISTORY))


@pytest.mark.parametrize("fields, message, param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0] is not a block this server takes", None),
    ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]},
     "tools[0].name: must be 1 to 64 letters", None),
    ({"tool_choice": {"type": "tool", "name": "nope"},
      "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
     "tool_choice.name: 'nope' is not one of the tools", None),
    ({"max_tokens": 0}, "max_tokens must be at least 1", None),
])
def test_bad_anthropic_requests_are_anthropic_errors(hermes_server, fields, message, param):
    body = {"model": MODEL_ID, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            **fields}
    with pytest.raises(anthropic.BadRequestError) as raised:
        _anthropic(hermes_server).messages.create(**body)
    error = raised.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]
    # The server goes on serving.
    assert _anthropic(hermes_server).messages.create(
        model=MODEL_ID, max_tokens=1, messages=[{"role": "user", "content": "hi"}]).content


def test_anthropic_forced_tool_use(constrained, server):
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    # Seeded (an extension of the Messages API): greedy, the random model pads
    # the JSON with all the whitespace allowed until max_tokens.
    kwargs = dict(model=MODEL_ID, max_tokens=200, extra_body={"temperature": 1.0, "seed": 1},
                  tools=[tool],
                  tool_choice={"type": "any", "disable_parallel_tool_use": True},
                  messages=[{"role": "user", "content": "Paris?"}])
    message = _anthropic(server).messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(use.input, tool["input_schema"])
    with _anthropic(server).messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.input for b in final.content if b.type == "tool_use"] == [use.input]


# -- the docs' examples ------------------------------------------------------------
def _doc_block(containing: str) -> str:
    text = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    found = [b for b in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
             if containing in b]
    assert len(found) == 1, f"docs/serving.md needs one python block with {containing!r}"
    return found[0]


def test_docs_anthropic_example_works(server, capsys):
    code = _doc_block("anthropic.Anthropic(").replace("http://127.0.0.1:8080", server.url)
    exec(compile(code, "serving.md", "exec"), {})
    assert capsys.readouterr().out.endswith("\n")


@pytest.mark.parametrize("containing", ["response_format=City", "tool_choice=\"required\""])
def test_docs_structured_examples_work(constrained, server, client, containing, capsys):
    scope = {"client": client}
    # Seeded sampling for the random model, which greedy pads the JSON with
    # all the whitespace allowed until max_tokens.
    code = _doc_block(containing).replace("temperature=0", "temperature=1.0, seed=1")
    exec(compile(code, "serving.md", "exec"), scope)
    if containing.startswith("tool_choice"):
        assert scope["reply"].choices[0].finish_reason == "tool_calls"
        assert scope["messages"][-1]["role"] == "tool"
