"""Replies the server reads through special tokens: tool-call markers that
are special tokens (Mistral's ``[TOOL_CALLS]``, Llama 3.1's
``<|python_tag|>``) under ``tool_choice`` ``auto``, and the harmony format
(gpt-oss): reasoning in the analysis channel apart from the answer, calls
as commentary messages to ``functions.NAME``; in chat completions, the
Responses API and Anthropic's Messages API, streamed and not.

The model is the tiny random-weight one with a vocabulary that has those
markers as control tokens (special: decoding without special tokens
leaves them out), so a reply is read only if the server asks the engine
to keep them. What it generates is scripted: :func:`scripted` makes the
engine take the script's tokens (then EOS) in place of those the model
picks, so the text goes through the engine's detokenizer and the server's
readers as a real reply does. The official ``openai`` and ``anthropic``
clients talk to the servers.
"""

from __future__ import annotations

import json

import anthropic
import mlx.core as mx
import openai
import pytest
from llm_fixtures import TINY, tiny_tokenizer_metadata, write_gguf

from mlxprog.llm import load
from mlxprog.llm.engine import Request
from mlxprog.llm.server import Server

MODEL_ID = "tiny"
MAX_LENGTH = 1024
#: Control tokens added to the tiny vocabulary.
MARKERS = ["[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<|eom_id|>", "<|start|>",
           "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|call|>", "<|return|>"]
EOS = 2  # the tiny vocabulary's <|im_end|>

#: Templates that take tools and write calls with the markers (shortened).
TEMPLATES = {
    "mistral": (
        "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
        "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
        "{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS]"
        "{{ m.tool_calls | tojson }}<|im_end|>{% else %}{{ m.content }}{% endif %}"
        "{% endfor %}"),
    "llama3": (
        "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}"
        "<|python_tag|>{{ m.tool_calls[0].function | tojson }}{% else %}{{ m.content }}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # As gpt-oss's: a call's reasoning as "thinking", and content checked for
    # channel markers (which a null content would fail).
    "harmony": (
        "{% if tools %}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{% endif %}"
        "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
        "{% if 'content' in m and '<|channel|>' in m.content %}"
        "{{ raise_exception('channel markers in content') }}{% endif %}"
        "{% if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}"
        "<|end|>{% endif %}<|start|>assistant to=functions.{{ m.tool_calls[0].function.name }}"
        "<|channel|>commentary json<|message|>{{ m.tool_calls[0].function.arguments | tojson }}"
        "<|call|>{% elif m.role == 'tool' %}<|start|>functions to=assistant<|channel|>"
        "commentary<|message|>{{ m.content | tojson }}<|end|>{% else %}<|start|>{{ m.role }}"
        "{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>{{ m.content }}"
        "<|end|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|start|>assistant{% endif %}"),
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
ARGUMENTS = {"city": "Paris"}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    metadata = tiny_tokenizer_metadata()
    tokens = list(metadata["tokenizer.ggml.tokens"]) + MARKERS
    types = metadata["tokenizer.ggml.token_type"].tolist() + [3] * len(MARKERS)
    path = tmp_path_factory.mktemp("serve-reading") / "tiny.gguf"
    write_gguf(path, tied=False, sizes=dict(TINY, vocab_size=len(tokens)), **{
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32)})
    return path


@pytest.fixture(scope="module")
def servers(model_path):
    started: dict[str, Server] = {}

    def server(family: str) -> Server:
        if family not in started:
            llm = load(model_path, max_length=MAX_LENGTH, chat_template=TEMPLATES[family])
            started[family] = Server(llm, model_id=MODEL_ID, max_batch=2)
            started[family].start()
        return started[family]

    yield server
    for srv in started.values():
        srv.stop()


@pytest.fixture
def scripted(monkeypatch):
    """``script(server, text)``: the next replies are ``text`` (its
    tokens, then EOS), whatever the model picks."""
    tokens: list[int] = []
    take = Request.take

    def scripted_take(self, token, logprob, top):
        step = len(self.read)
        return take(self, tokens[step] if step < len(tokens) else EOS, logprob, top)

    monkeypatch.setattr(Request, "take", scripted_take)

    def script(server: Server, text: str) -> None:
        tokens[:] = server.llm.tokenizer.encode(text, add_special_tokens=False)
        assert set(tokens) & set(server.llm.tokenizer.encode("".join(MARKERS)))

    return script


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def _chat(server: Server, stream: bool, **kwargs):
    """The reply's (content, reasoning, [(name, arguments)], finish_reason),
    whole or assembled from the stream's deltas."""
    reply = _openai(server).chat.completions.create(
        model=MODEL_ID, messages=USER, max_tokens=200, stream=stream, **kwargs)
    if not stream:
        choice = reply.choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments))
                 for c in choice.message.tool_calls or []]
        return (choice.message.content, getattr(choice.message, "reasoning_content", None),
                calls, choice.finish_reason)
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in reply:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += call.function.name or ""
            entry[1] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return (content or None, reasoning or None,
            [(name, json.loads(arguments)) for name, arguments in calls.values()], finish)


# -- markers that are special tokens --------------------------------------------
def test_generation_keeps_special_tokens_when_asked(model_path):
    llm = load(model_path, max_length=MAX_LENGTH)
    marker = llm.tokenizer.token_id("[TOOL_CALLS]")
    assert "[TOOL_CALLS]" in llm.tokenizer.special_texts
    kwargs = dict(chat=False, max_tokens=3, logit_bias={marker: 100})
    assert llm.generate("x", **kwargs).text == ""
    kept = llm.generate("x", special_tokens=True, **kwargs)
    assert kept.text == "[TOOL_CALLS]" * 3 and kept.tokens == [marker] * 3


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family, text, shown", [
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', None),
    ("mistral", 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Checking."),
    # <|eom_id|>: Llama 3.1's end of a message with a call, which ends the
    # reply (llama.cpp takes it for an end of generation by its text).
    ("llama3", 'Let me see. <|python_tag|>{"name": "get_weather", "parameters": '
               '{"city": "Paris"}}<|eom_id|>', "Let me see. "),
])
def test_a_call_after_a_special_token_marker_is_read(servers, scripted, family, text, shown,
                                                     stream):
    server = servers(family)
    tokenizer = server.llm.tokenizer
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):  # special: left out of plain decoding
        assert tokenizer.decode(tokenizer.encode(marker), skip_special_tokens=True) == ""
    scripted(server, text)
    content, _, calls, finish = _chat(server, stream, tools=[WEATHER])
    assert calls == [("get_weather", ARGUMENTS)] and finish == "tool_calls"
    assert content == shown


@pytest.mark.parametrize("stream", [False, True])
def test_special_tokens_never_reach_the_content(servers, scripted, stream):
    server = servers("mistral")
    scripted(server, "Sure<|python_tag|>, no tool: [TOOL_CALLS] is not a call.")
    content, _, calls, finish = _chat(server, stream, tools=[WEATHER])
    assert content == "Sure, no tool:  is not a call." and not calls and finish == "stop"
    # Without tools nothing is read: the engine leaves the special tokens out itself.
    content, *_ = _chat(server, stream)
    assert content == "Sure, no tool:  is not a call."


# -- the harmony format ------------------------------------------------------------
ANALYSIS = "The user asks for the weather; I call the tool."
HARMONY_CALL = ("<|channel|>analysis<|message|>" + ANALYSIS + "<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris"}<|call|>')
HARMONY_ANSWER = ("<|channel|>analysis<|message|>Easy: say hello.<|end|><|start|>assistant"
                  "<|channel|>final<|message|>Hello there!<|return|>")


@pytest.mark.parametrize("stream", [False, True])
def test_harmony_reasoning_answer_and_calls_in_chat(servers, scripted, stream):
    server = servers("harmony")
    scripted(server, HARMONY_ANSWER)
    assert _chat(server, stream) == ("Hello there!", "Easy: say hello.", [], "stop")
    scripted(server, HARMONY_CALL)
    content, reasoning, calls, finish = _chat(server, stream, tools=[WEATHER])
    assert (reasoning, calls, finish) == (ANALYSIS, [("get_weather", ARGUMENTS)], "tool_calls")
    assert not content


def test_harmony_in_the_responses_api(servers, scripted):
    server = servers("harmony")
    client = _openai(server)
    scripted(server, HARMONY_ANSWER)
    response = client.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=200)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "Easy: say hello."
    assert message.type == "message" and response.output_text == "Hello there!"
    with client.responses.stream(model=MODEL_ID, input="Hi", max_output_tokens=200) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == \
        "Easy: say hello."
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "Hello there!"
    scripted(server, HARMONY_CALL)
    flat = {"type": "function", **WEATHER["function"]}
    called = client.responses.create(model=MODEL_ID, input="Weather?", tools=[flat],
                                     max_output_tokens=200)
    assert [item.type for item in called.output] == ["reasoning", "function_call"]
    assert json.loads(called.output[1].arguments) == ARGUMENTS


def test_harmony_in_the_messages_api(servers, scripted):
    server = servers("harmony")
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 timeout=120)
    kwargs = dict(model=MODEL_ID, max_tokens=200, messages=[{"role": "user", "content": "Hi"}])
    scripted(server, HARMONY_ANSWER)
    message = client.messages.create(**kwargs)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in message.content] == [("thinking", "Easy: say hello."),
                                          ("text", "Hello there!")]
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == "Easy: say hello."
    assert final.content[1].text == "Hello there!"


def test_harmony_reasoning_goes_back_with_its_call(servers):
    """A call's reasoning, sent back in the history as each API gives it
    (``reasoning_content``, a reasoning item, a thinking block), reaches
    the template as ``thinking``; a call's null content is left out."""
    server = servers("harmony")
    client = _openai(server)
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}

    def chat_tokens(reasoning):
        assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        return client.chat.completions.create(
            model=MODEL_ID, messages=[*USER, assistant, result], tools=[WEATHER],
            max_tokens=1).usage.prompt_tokens

    with_reasoning, without = chat_tokens(ANALYSIS), chat_tokens(None)
    encode = server.llm.tokenizer.encode
    assert with_reasoning - without == len(encode(
        "<|start|>assistant<|channel|>analysis<|message|>" + ANALYSIS + "<|end|>"))
    flat = {"type": "function", **WEATHER["function"]}
    response = client.responses.create(model=MODEL_ID, tools=[flat], max_output_tokens=1, input=[
        {"role": "user", "content": USER[0]["content"]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": ANALYSIS}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}])
    assert response.usage.input_tokens == with_reasoning
    message = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                  timeout=120).messages.create(
        model=MODEL_ID, max_tokens=1,
        tools=[{"name": "get_weather", "description": "The weather in a city.",
                "input_schema": WEATHER["function"]["parameters"]}],
        messages=[{"role": "user", "content": USER[0]["content"]},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": ANALYSIS, "signature": ""},
                      {"type": "tool_use", "id": "call_1", "name": "get_weather",
                       "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                "content": "Sunny"}]}])
    assert message.usage.input_tokens == with_reasoning
