"""OpenAI's Responses API (``POST /v1/responses``) on the server of the
tiny random-weight model (with a Hermes-style template, so that tools and
tool history reach the prompt), talked to by the official ``openai``
client: text replies checked against ``LLM.generate``, streams against
whole replies, ``previous_response_id`` chaining, forced function calls and
errors naming the Responses request's fields."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pydantic
import pytest
from test_server_tools import (
    HERMES_TEMPLATE, MAX_LENGTH, MODEL_ID, TIME, WEATHER, _client, _serve, constrained,
    engine_constrains, hermes_reference, model_path, reference,
)

from mlxprog.llm import load

__all__ = ["constrained", "engine_constrains", "hermes_reference", "model_path", "reference"]

#: The tools in the Responses API's flat shape.
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in (WEATHER, TIME)]


@pytest.fixture(scope="module")
def server(model_path):
    srv = _serve(load(model_path, max_length=MAX_LENGTH, chat_template=HERMES_TEMPLATE))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return _client(server)


def test_a_text_response_is_the_chat_reply(client, hermes_reference):
    response = client.responses.create(model=MODEL_ID, input="Hello", instructions="Be brief.",
                                       max_output_tokens=8, temperature=0)
    expected = hermes_reference.generate(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        max_tokens=8)
    assert response.id.startswith("resp_") and response.object == "response"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant"
    assert response.output_text == expected.text
    assert response.status == ("incomplete" if expected.finish_reason == "length"
                               else "completed")
    assert response.usage.output_tokens == len(expected.tokens) or expected.finish_reason == "eos"
    assert response.usage.total_tokens == (response.usage.input_tokens
                                           + response.usage.output_tokens)


def test_a_streamed_response_is_the_same_text(client):
    kwargs = dict(model=MODEL_ID, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Tell me"}]}], max_output_tokens=12, temperature=0)
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                           "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == text
    assert events[-1].response.output_text == text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_previous_response_id_continues_the_conversation(client, hermes_reference):
    first = client.responses.create(model=MODEL_ID, input="One", max_output_tokens=4,
                                    temperature=0)
    second = client.responses.create(model=MODEL_ID, input="Two", max_output_tokens=4,
                                     temperature=0, previous_response_id=first.id)
    expected = hermes_reference.generate(
        [{"role": "user", "content": "One"},
         {"role": "assistant", "content": first.output_text},
         {"role": "user", "content": "Two"}], max_tokens=4)
    assert second.output_text == expected.text
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # Not stored: no follow-up.
    unstored = client.responses.create(model=MODEL_ID, input="One", max_output_tokens=1,
                                       store=False)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="x", previous_response_id=unstored.id)
    assert e.value.body["param"] == "previous_response_id"


def test_function_call_items_are_the_chat_history(client):
    # The same conversation as chat completion messages: the same prompt, the same reply.
    arguments = '{"city": "Oslo", "unit": "C"}'
    items = [{"role": "user", "content": "Weather?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": arguments},
             {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"}]
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                                      "function": {"name": "get_weather",
                                                                   "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}]
    response = client.responses.create(model=MODEL_ID, input=items, tools=FLAT_TOOLS,
                                       tool_choice="none", max_output_tokens=3, temperature=0)
    chat = client.chat.completions.create(model=MODEL_ID, messages=messages,
                                          tools=[WEATHER, TIME], tool_choice="none",
                                          max_tokens=3, temperature=0)
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content


@pytest.mark.parametrize("fields, param", [
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0]"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"},
      "tools": FLAT_TOOLS}, "tool_choice.name"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
])
def test_bad_requests_name_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, **fields)
    assert e.value.status_code == 400 and e.value.body["param"] == param


def test_a_forced_function_call(constrained, client):
    kwargs = dict(model=MODEL_ID, input="Weather in Paris?", tools=FLAT_TOOLS,
                  tool_choice={"type": "function", "name": "get_weather"},
                  parallel_tool_calls=False, max_output_tokens=200, temperature=1.0,
                  extra_body={"seed": 1})
    response = client.responses.create(**kwargs)
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    events = list(client.responses.create(stream=True, **kwargs))
    streamed = "".join(e.delta for e in events
                       if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert streamed == done.arguments == call.arguments
    (item,) = [e.item for e in events if e.type == "response.output_item.done"
               and e.item.type == "function_call"]
    assert item.name == "get_weather" and item.arguments == call.arguments
    # The call's output continues the stored conversation.
    follow = client.responses.create(
        model=MODEL_ID, previous_response_id=response.id, tools=FLAT_TOOLS, max_output_tokens=2,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "20 C"}])
    assert follow.status in ("completed", "incomplete")


# -- stored responses, include, truncation -----------------------------------------
def test_stored_responses_are_retrieved_and_deleted(client):
    response = client.responses.create(model=MODEL_ID, input="Hello", max_output_tokens=4,
                                       temperature=0)
    stored = client.responses.retrieve(response.id)
    assert stored.id == response.id and stored.output_text == response.output_text
    assert [item.id for item in stored.output] == [item.id for item in response.output]
    assert stored.usage.output_tokens == response.usage.output_tokens
    with client.responses.stream(model=MODEL_ID, input="Hello", max_output_tokens=4,
                                 temperature=0) as stream:
        # Cut by max_output_tokens: response.incomplete, which the helper
        # does not take for a final response.
        streamed = list(stream)[-1].response
    assert streamed.output_text == response.output_text
    assert client.responses.retrieve(streamed.id).output_text == streamed.output_text
    client.responses.delete(response.id)
    for gone in (lambda: client.responses.retrieve(response.id),
                 lambda: client.responses.delete(response.id)):
        with pytest.raises(openai.NotFoundError) as e:
            gone()
        assert e.value.body["param"] == "response_id" and response.id in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # deleted: no follow-up either
        client.responses.create(model=MODEL_ID, input="x", previous_response_id=response.id)
    unstored = client.responses.create(model=MODEL_ID, input="Hello", max_output_tokens=1,
                                       store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_include_takes_the_documented_values(client, hermes_reference):
    response = client.responses.create(
        model=MODEL_ID, input="Hello", max_output_tokens=6, temperature=0,
        include=["reasoning.encrypted_content", "message.output_text.logprobs"])
    (part,) = response.output[0].content
    expected = hermes_reference.generate([{"role": "user", "content": "Hello"}], max_tokens=6,
                                         logprobs=True)
    assert [entry.logprob for entry in part.logprobs] == pytest.approx(expected.logprobs,
                                                                      abs=1e-4)
    assert "".join(entry.token for entry in part.logprobs) == part.text
    events = list(client.responses.create(
        model=MODEL_ID, input="Hello", max_output_tokens=6, temperature=0, stream=True,
        include=["message.output_text.logprobs"]))
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [entry.logprob for entry in done.logprobs] == \
        [entry.logprob for entry in part.logprobs]
    final = events[-1].response.output[0].content[0].logprobs
    assert [(e.token, e.logprob) for e in final] == [(e.token, e.logprob) for e in done.logprobs]
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="x",
                                include=["message.output_text.logprobs", "everything"])
    assert e.value.body["param"] == "include[1]" and 'got "everything"' in e.value.body["message"]


LONG = " the" * 600  # 600 tokens: two do not fit the 1024-slot cache


def test_truncation(client):
    turns = [{"role": "user", "content": "First" + LONG},
             {"role": "assistant", "content": "Yes."},
             {"role": "user", "content": "Second" + LONG}]
    with pytest.raises(openai.BadRequestError) as e:  # "disabled", the default
        client.responses.create(model=MODEL_ID, input=turns, max_output_tokens=1)
    body = e.value.body
    assert body["param"] == "input" and body["code"] == "context_length_exceeded"
    assert "truncation" in body["message"]
    fitted = client.responses.create(model=MODEL_ID, input=turns, max_output_tokens=1,
                                     truncation="auto", instructions="Be brief.")
    assert fitted.truncation == "auto" and fitted.status in ("completed", "incomplete")
    last = client.responses.create(model=MODEL_ID, input=turns[2:], max_output_tokens=1,
                                   instructions="Be brief.")
    assert fitted.usage.input_tokens == last.usage.input_tokens  # the oldest turn dropped
    # A stored conversation is dropped from the oldest too.
    first = client.responses.create(model=MODEL_ID, input=turns[0]["content"],
                                    max_output_tokens=1)
    follow = client.responses.create(model=MODEL_ID, input=turns[2]["content"],
                                     previous_response_id=first.id, max_output_tokens=1,
                                     truncation="auto")
    alone = client.responses.create(model=MODEL_ID, input=turns[2]["content"],
                                    max_output_tokens=1)
    assert follow.usage.input_tokens == alone.usage.input_tokens
    # Only the last turn left and still too long: the limit's error.
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="Both" + LONG + LONG,
                                truncation="auto", max_output_tokens=1)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_ID, input="x", truncation="sometimes")
    assert e.value.body["param"] == "truncation"


class Verdict(pydantic.BaseModel):
    city: Literal["Paris", "Oslo"]
    sunny: bool


def test_parse_with_a_pydantic_text_format(constrained, client):
    for seed in range(3):
        response = client.responses.parse(model=MODEL_ID, input="Weather, as JSON",
                                          text_format=Verdict, max_output_tokens=200,
                                          temperature=1.0, extra_body={"seed": seed})
        assert response.status == "completed"
        assert isinstance(response.output_parsed, Verdict)
        stored = client.responses.retrieve(response.id)
        assert Verdict.model_validate_json(stored.output_text) == response.output_parsed
