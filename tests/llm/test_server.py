"""The OpenAI-compatible server (mlxprog.llm.server).

The real server (uvicorn on a free loopback port) runs in this process, from
a background thread (``Server.start``), with a tiny random-weight GGUF
model, so the tests can look at its scheduler; the official ``openai``
client and plain HTTP (``http.client``) talk to it. One test runs the
``python -m mlxprog serve`` command in a subprocess and stops it
with SIGINT, another runs the curl and Python examples of docs/serving.md.

Answers are checked against ``LLM.generate`` of a second copy of the model
(loaded from the same file), called while the server is idle.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import openai
import pytest
from llm_fixtures import tiny_gguf

from mlxprog.llm import LLM, ModelError, load
from mlxprog.llm.cache import common_prefix
from mlxprog.cli import main as cli_main
from mlxprog.llm.server import Server

ROOT = Path(__file__).parents[2]
MAX_LENGTH = 256
MAX_BATCH = 3
MODEL_ID = "tiny"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory, "serve")


@pytest.fixture(scope="module")
def reference(model_path) -> LLM:
    """The model the answers are checked against (not the server's copy)."""
    return load(model_path, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def server(model_path):
    srv = Server(load(model_path, max_length=MAX_LENGTH), model_id=MODEL_ID,
                 max_batch=MAX_BATCH)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture
def slow_steps(server, monkeypatch):
    """Each decode step takes 20 ms longer, so that concurrent requests
    overlap and a long one is still running when its client leaves, however
    fast the machine."""
    engine = server.scheduler.engine
    step = engine.step

    def slow():
        time.sleep(0.02)
        return step()

    monkeypatch.setattr(engine, "step", slow)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def request(server: Server, method: str, path: str, body: Any = None,
            raw: bytes | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One plain HTTP request: status, headers, body."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    out = response.status, response.headers, response.read()
    conn.close()
    return out


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def assert_error(status: int, headers, body: bytes, expected: int, message: str,
                 param: str | None = None) -> dict:
    assert status == expected, body
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert message in error["message"]
    assert error["param"] == param
    assert error["type"] == ("invalid_request_error" if expected < 500 else "server_error")
    return error


# -- plain HTTP ------------------------------------------------------------------
def test_health_and_models(server, client):
    status, headers, body = request(server, "GET", "/health")
    assert status == 200 and headers["Content-Type"] == "application/json"
    health = json.loads(body)
    assert {k: health[k] for k in ("status", "model", "prefilling", "running", "waiting",
                                   "max_batch", "max_waiting", "failures")} == {
        "status": "ok", "model": MODEL_ID, "prefilling": 0, "running": 0, "waiting": 0,
        "max_batch": MAX_BATCH, "max_waiting": 64, "failures": 0}
    assert set(health) == {"status", "model", *server.scheduler.stats(),
                           *server.embedder.stats()}
    assert health["embedding_requests"] == health["embedding_failures"] == 0
    status, _, body = request(server, "GET", "/v1/models")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [MODEL_ID]
    assert [m.id for m in client.models.list().data] == [MODEL_ID]
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_unknown_routes_and_methods(server):
    assert_error(*request(server, "POST", "/v1/audio/speech", {}), 404, "there is no POST "
                 "/v1/audio/speech; this server has POST /v1/chat/completions")
    status, headers, body = request(server, "GET", "/v1/chat/completions")
    assert_error(status, headers, body, 405, "GET is not allowed on /v1/chat/completions")
    assert headers["Allow"] == "POST"
    assert_error(*request(server, "DELETE", "/health"), 405, "DELETE is not allowed")


@pytest.mark.parametrize("raw, message", [
    (b"{not json", "the request body is not valid JSON: Expecting property name"),
    (b"", "the request body is empty"),
    (b"[1, 2]", "the request body must be a JSON object, got [1, 2]"),
])
def test_malformed_bodies(server, raw, message):
    for path in ("/v1/chat/completions", "/v1/completions"):
        assert_error(*request(server, "POST", path, raw=raw), 400, message)


def test_sse_framing(server):
    status, headers, body = request(server, "POST", "/v1/completions", {
        "prompt": "hello", "max_tokens": 6, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = body.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "length"
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_unknown_fields_are_ignored(server):
    status, _, body = request(server, "POST", "/v1/chat/completions", {
        "messages": chat("hi"), "max_tokens": 2, "user": "someone", "metadata": {"a": 1},
        "something_new": [1, 2, 3]})
    assert status == 200, body
    assert json.loads(body)["object"] == "chat.completion"


# -- chat completions ------------------------------------------------------------
def test_chat_matches_generate_with_usage(server, client, reference):
    messages = chat("What is the capital of France?")
    expected = reference.generate(messages, max_tokens=12)
    ids = reference.prompt_ids(messages)
    # The earlier tests' answers are in the prompt cache (they share the chat
    # template's start); the engine reuses the longest prefix, leaving at
    # least one token to prefill.
    cached, _ = server.scheduler.pool.lookup(ids)
    expected_cached = min(common_prefix(cached, ids), len(ids) - 1)
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12,
                                           temperature=0)
    assert reply.object == "chat.completion" and reply.model == MODEL_ID
    assert reply.id.startswith("chatcmpl-")
    choice, = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[expected.finish_reason]
    assert choice.logprobs is None
    usage = reply.usage
    assert usage.prompt_tokens == len(reference.prompt_ids(messages))
    assert usage.completion_tokens == expected.stats.generated_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == expected_cached
    again = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12,
                                           temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == len(ids) - 1  # all it may reuse
    assert again.choices[0].message.content == expected.text


def test_any_model_name_is_accepted(client):
    reply = client.chat.completions.create(model="gpt-4o", messages=chat("hi"), max_tokens=2)
    assert reply.model == MODEL_ID


def test_chat_stream(client, reference):
    messages = chat("Tell me a story.")
    expected = reference.generate(messages, max_tokens=20)
    chunks = list(client.chat.completions.create(
        model=MODEL_ID, messages=messages, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    *body, finish, usage = chunks
    assert finish.choices[0].finish_reason == {"eos": "stop",
                                               "length": "length"}[expected.finish_reason]
    assert all(c.choices[0].finish_reason is None for c in body)
    assert usage.choices == [] and usage.usage.completion_tokens == expected.stats.generated_tokens
    assert usage.usage.prompt_tokens == len(reference.prompt_ids(messages))


def test_max_completion_tokens_and_roles(client, reference):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                             {"type": "text", "text": "there"}]}]
    expected = reference.generate([{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Hi\nthere"}], max_tokens=5)
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=50,
                                           max_completion_tokens=5, temperature=0)
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == expected.stats.generated_tokens <= 5


def test_chat_logprobs(client, reference):
    messages = chat("Count to ten.")
    expected = reference.generate(messages, max_tokens=10, logprobs=True, top_logprobs=3)
    reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10,
                                           temperature=0, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == len(expected.tokens)
    for entry, token, logprob in zip(content, expected.tokens, expected.logprobs):
        assert entry.token == reference.tokenizer.decode([token])
        assert entry.logprob == pytest.approx(logprob, abs=1e-4)
        assert len(entry.top_logprobs) == 3
        # Greedy: the token is the most likely one.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert entry.top_logprobs[0].bytes == entry.bytes
    # A token's bytes are its own, even when they are part of a character.
    raw = b"".join(bytes(entry.bytes) for entry in content)
    assert raw.decode("utf-8", errors="replace") == reference.tokenizer.decode(expected.tokens)

    streamed = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=10,
                                              temperature=0, logprobs=True, stream=True)
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in entries] == [e.logprob for e in content]
    assert all(e.top_logprobs == [] for e in entries)


def test_stop_strings(client, reference):
    messages = chat("Say something.")
    full = reference.generate(messages, max_tokens=30).text
    ascii_at = [i for i, c in enumerate(full) if c.isascii() and c.isprintable()]
    assert len(ascii_at) > 3, full
    stop = full[ascii_at[2]]
    expected = full[:full.index(stop)]
    for stops in (stop, [stop, "not in the text"]):
        reply = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=30,
                                               temperature=0, stop=stops)
        assert reply.choices[0].message.content == expected
        assert reply.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=30,
                                            temperature=0, stop=stop, stream=True)
    chunks = list(chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_makes_sampling_reproducible(client, reference):
    options = dict(model=MODEL_ID, prompt="once upon a time", max_tokens=16, temperature=1.0)
    first = client.completions.create(seed=7, **options).choices[0].text
    assert client.completions.create(seed=7, **options).choices[0].text == first
    assert first == reference.generate("once upon a time", chat=False, max_tokens=16,
                                       temperature=1.0, seed=7).text
    assert client.completions.create(seed=8, **options).choices[0].text != first
    extensions = dict(top_k=5, min_p=0.01, repetition_penalty=1.3)
    sampled = client.completions.create(seed=3, extra_body=extensions, **options)
    assert sampled.choices[0].text == reference.generate(
        "once upon a time", chat=False, max_tokens=16, temperature=1.0, seed=3,
        **extensions).text


def test_the_prompt_cache_serves_the_next_turn(client, reference):
    turn1 = chat("My name is Ada. What is mine?")
    reply = client.chat.completions.create(model=MODEL_ID, messages=turn1, max_tokens=8,
                                           temperature=0)
    turn2 = [*turn1, {"role": "assistant", "content": reply.choices[0].message.content},
             {"role": "user", "content": "Say it again."}]
    again = client.chat.completions.create(model=MODEL_ID, messages=turn2, max_tokens=8,
                                           temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= len(reference.prompt_ids(turn1))
    assert again.choices[0].message.content == reference.generate(turn2, max_tokens=8).text


# -- text completions ------------------------------------------------------------
def test_completions(client, reference):
    expected = reference.generate("the quick brown fox", chat=False, max_tokens=10)
    reply = client.completions.create(model=MODEL_ID, prompt="the quick brown fox",
                                      max_tokens=10, temperature=0)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == expected.text
    assert reply.usage.prompt_tokens == len(reference.prompt_ids("the quick brown fox",
                                                                 chat=False))
    ids = reference.prompt_ids("the quick brown fox", chat=False)
    for prompt in (ids, [ids], ["the quick brown fox"]):
        again = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=10,
                                          temperature=0)
        assert again.choices[0].text == expected.text
    # OpenAI's default for completions: 16 tokens.
    default = client.completions.create(model=MODEL_ID, prompt="the quick brown fox",
                                        temperature=0)
    assert default.usage.completion_tokens <= 16
    streamed = client.completions.create(model=MODEL_ID, prompt="the quick brown fox",
                                         max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_completion_logprobs(client, reference):
    expected = reference.generate("abc", chat=False, max_tokens=8, logprobs=True,
                                  top_logprobs=2)
    reply = client.completions.create(model=MODEL_ID, prompt="abc", max_tokens=8,
                                      temperature=0, logprobs=2)
    logprobs = reply.choices[0].logprobs
    n = len(expected.tokens)
    assert logprobs.tokens == [reference.tokenizer.decode([t]) for t in expected.tokens]
    assert logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert len(logprobs.top_logprobs) == n
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets


# -- batching and cancellation ---------------------------------------------------
def test_concurrent_clients_are_batched_and_match_sequential(server, client, reference,
                                                             slow_steps):
    prompts = ["red apples", "green fields", "blue skies over the sea", "yellow"]
    expected = [reference.generate(chat(p), max_tokens=24).text for p in prompts]

    def ask(prompt: str) -> str:
        reply = client.chat.completions.create(model=MODEL_ID, messages=chat(prompt),
                                               max_tokens=24, temperature=0)
        return reply.choices[0].message.content

    server.scheduler.largest_batch = 0
    with ThreadPoolExecutor(len(prompts)) as pool:
        texts = list(pool.map(ask, prompts))
    assert texts == expected
    # Decoded together, and never more rows than max_batch (the fourth waited).
    assert 1 < server.scheduler.largest_batch <= MAX_BATCH


def post_unread(server, path: str, body: dict) -> http.client.HTTPConnection:
    """A connection that has sent a JSON POST and not read the answer yet."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return conn


def test_a_stream_cut_short_frees_its_row(server, slow_steps):
    scheduler = server.scheduler
    cancelled = scheduler.cancelled
    conn = post_unread(server, "/v1/chat/completions", {
        "messages": chat("Write a very long poem."), "max_tokens": 200, "temperature": 0,
        "stream": True})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    assert scheduler.running == 1
    conn.close()  # the client goes away mid-stream
    wait_for(lambda: scheduler.cancelled == cancelled + 1, "the row to be cancelled")
    wait_for(lambda: scheduler.running == 0, "the row to leave")
    assert json.loads(request(server, "GET", "/health")[2])["running"] == 0


def test_a_request_closed_before_its_answer_frees_its_row(server, slow_steps):
    scheduler = server.scheduler
    cancelled = scheduler.cancelled
    conn = post_unread(server, "/v1/completions", {
        "prompt": "a long text", "max_tokens": 200, "temperature": 0})
    wait_for(lambda: scheduler.running == 1, "the request to run")
    conn.close()
    wait_for(lambda: scheduler.cancelled == cancelled + 1, "the row to be cancelled")
    wait_for(lambda: scheduler.running == 0, "the row to leave")


# -- errors ----------------------------------------------------------------------
@pytest.mark.parametrize("fields, message, param", [
    ({"n": 2}, "n must be 1 (one choice per request), got 2", "n"),
    ({"max_tokens": 0}, "max_tokens must be at least 1, got 0", "max_tokens"),
    ({"max_completion_tokens": -3}, "max_completion_tokens must be at least 1",
     "max_completion_tokens"),
    ({"temperature": -1}, "temperature must be at least 0", "temperature"),
    ({"temperature": "hot"}, "temperature must be a valid number", "temperature"),
    ({"top_p": 0}, "top_p must be greater than 0", "top_p"),
    ({"top_k": 0}, "top_k must be at least 1", "top_k"),
    ({"min_p": 1}, "min_p must be less than 1", "min_p"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs must be at most 20",
     "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs set to true", "top_logprobs"),
    ({"stream": "yes"}, "stream must be a valid boolean", "stream"),
    ({"stop": 5}, "stop must be a string or a list of strings, got 5", "stop"),
    ({"stop": ["a", 5]}, "stop must be a string or a list of strings, got [\"a\", 5]", "stop"),
    ({"temperature": 2.5}, "temperature must be at most 2, got 2.5", "temperature"),
    ({"top_p": 1.5}, "top_p must be at most 1, got 1.5", "top_p"),
    ({"presence_penalty": 3}, "presence_penalty must be at most 2, got 3", "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be at least -2, got -2.5",
     "frequency_penalty"),
    ({"frequency_penalty": 0.5}, "frequency_penalty is not supported", "frequency_penalty"),
    ({"n": 0}, "n must be 1 (one choice per request), got 0", "n"),
    ({"n": 1.5}, "n must be a valid integer", "n"),
    ({"seed": 1.5}, "seed must be a valid integer", "seed"),
    ({"seed": "7"}, "seed must be a valid integer", "seed"),
    ({"seed": 2**63}, "seed must be at most 9223372036854775807", "seed"),
    ({"max_tokens": 1e9}, "max_tokens must be a valid integer", "max_tokens"),
    ({"top_logprobs": -1, "logprobs": True}, "top_logprobs must be at least 0", "top_logprobs"),
    ({"logprobs": 1}, "logprobs must be a valid boolean", "logprobs"),
    ({"messages": []}, "messages must not be empty", "messages"),
    ({"messages": None}, "messages must be a valid list", "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]},
     "messages[0].role must be 'system', 'developer', 'user', 'assistant' or 'tool', got "
     "\"robot\"",
     "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content is required",
     "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content part 0 is not a text part", "messages[0].content"),
    ({"messages": ["hello"]}, "messages[0] must be a valid dictionary", "messages[0]"),
    ({"presence_penalty": 0.5}, "presence_penalty is not supported", "presence_penalty"),
    ({"logit_bias": {"x": 10}}, "logit_bias.x: the key must be a token id", "logit_bias.x"),
    ({"logit_bias": {"5": 101}}, "logit_bias.5: the bias must be a number in [-100, 100], "
     "got 101", "logit_bias.5"),
    ({"logit_bias": {"100000": 1}}, "the key must be a token id (an integer in [0, 262))",
     "logit_bias.100000"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name: a tool needs "
     "a name", "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}}}}]},
     "tools[0].function.parameters", "tools[0].function.parameters"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]},
     "'g' is not one of the tools (the tools: 'f')", "tool_choice.function.name"),
    ({"tool_choice": "required"}, "'required' needs tools", "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "tool", "tool_call_id": "call_1", "content": "42"}]},
     "messages[1].tool_call_id: 'call_1' matches no tool call", "messages[1].tool_call_id"),
    ({"messages": [{"role": "tool", "content": "42"}]},
     "messages[0].tool_call_id: a tool message needs the id", "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0] has no content",
     "messages[0]"),
    ({"response_format": {"type": "xml"}}, "response_format.type: must be 'text', "
     "'json_object' or 'json_schema', got \"xml\"", "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema: is required", "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "strin"}}}}, "response_format.json_schema.schema", 
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_object"},
      "tools": [{"type": "function", "function": {"name": "f"}}]},
     "response_format: a JSON reply cannot be asked for together with tools",
     "response_format"),
])
def test_bad_chat_requests(server, client, fields, message, param):
    body = {"model": MODEL_ID, "messages": chat("hi"), "max_tokens": 4, **fields}
    error = assert_error(*request(server, "POST", "/v1/chat/completions", body), 400,
                         message, param)
    # The openai client raises BadRequestError with the same error.
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL_ID, messages=body.pop("messages"),
            extra_body={k: v for k, v in body.items() if k != "model"})
    assert raised.value.status_code == 400
    assert raised.value.body == error


@pytest.mark.parametrize("fields, message, param", [
    ({}, "prompt is required", "prompt"),
    ({"prompt": ""}, "the prompt is empty", "prompt"),
    ({"prompt": []}, "prompt must not be empty", "prompt"),
    ({"prompt": ["a", "b"]}, "prompt must be one prompt (this server answers one per "
     "request), got 2", "prompt"),
    ({"prompt": [1, "a"]}, "prompt must be a string or a list of token ids", "prompt"),
    ({"prompt": [10**6]}, "prompt token 0 is 1000000, outside the vocabulary", "prompt"),
    # JSON's "\ud800" escape: a lone surrogate, which no tokenizer takes.
    ({"prompt": "a\ud800"}, "the text is not valid Unicode: it holds '\\ud800' (an unpaired "
     "surrogate) at character 1", "prompt"),
    ({"prompt": "x", "logprobs": 21}, "logprobs must be at most 20", "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs must be at least 0", "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs must be a valid integer", "logprobs"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens must be at least 1, got 0", "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature must be at least 0", "temperature"),
    ({"prompt": "x", "stop": {"a": 1}}, "stop must be a string or a list of strings",
     "stop"),
    ({"prompt": "x", "echo": True}, "echo is not supported", "echo"),
    ({"prompt": "x", "best_of": 3}, "best_of must be 1, got 3", "best_of"),
    ({"prompt": "x", "suffix": "end"}, "suffix is not supported", "suffix"),
    ({"prompt": "x", "grammar": "root ::= (", }, "grammar: ", "grammar"),
    ({"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {"type": "object"}},
     "grammar: give one of response_format, json_schema and grammar, not json_schema and "
     "grammar", "grammar"),
    ({"prompt": "x", "json_schema": {"type": 3}}, "json_schema", "json_schema"),
    ({"prompt": "x", "response_format": {"type": "regex"}}, "response_format.type",
     "response_format.type"),
    ({"prompt": "x", "logit_bias": {"1": "a"}}, "logit_bias.1: the bias must be a number",
     "logit_bias.1"),
])
def test_bad_completion_requests(server, fields, message, param):
    body = {"model": MODEL_ID, "max_tokens": 4, **fields}
    assert_error(*request(server, "POST", "/v1/completions", body), 400, message, param)


def test_a_prompt_longer_than_the_cache_is_a_400_and_the_server_goes_on(server, client):
    too_long = "x " * MAX_LENGTH
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_ID, messages=chat(too_long), max_tokens=4)
    error = raised.value.body
    assert re.fullmatch(r"the prompt has \d+ tokens, but the KV cache holds 256 \(the "
                        r"server's --max-length\); shorten the prompt", error["message"])
    assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")
    for stream in (False, True):
        status, headers, body = request(server, "POST", "/v1/completions", {
            "prompt": [5] * MAX_LENGTH, "stream": stream})
        assert_error(status, headers, body, 400, "the prompt has 256 tokens, but the KV cache "
                     "holds 256", "prompt")
    reply = client.chat.completions.create(model=MODEL_ID, messages=chat("hi"), max_tokens=3)
    assert reply.usage.completion_tokens >= 1
    assert json.loads(request(server, "GET", "/health")[2])["status"] == "ok"


@pytest.mark.parametrize("max_tokens", [100, 10**12])  # more than any cache: no error
def test_a_long_answer_ends_when_the_cache_is_full(client, reference, max_tokens):
    prompt = [5] * (MAX_LENGTH - 4)
    reply = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=max_tokens,
                                      temperature=0)
    expected = reference.generate(prompt, max_tokens=100)
    assert expected.cache_full
    assert reply.choices[0].text == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5  # the 4 free slots, and the last token unwritten


def test_a_model_error_fails_only_its_request(server, client, reference, slow_steps,
                                              monkeypatch):
    engine = server.scheduler.engine
    begin = engine.begin

    def begin_failing_on_marker(requests):
        if any(reference.tokenizer.encode("MARKER")[0] in r.ids for r in requests):
            raise ModelError("injected model error")
        return begin(requests)

    monkeypatch.setattr(engine, "begin", begin_failing_on_marker)
    messages = chat("A long answer, please.")
    expected = reference.generate(messages, max_tokens=60).text
    stream = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=60,
                                            temperature=0, stream=True)
    chunks = [next(iter(stream))]  # the other request is running
    with pytest.raises(openai.BadRequestError, match="injected model error"):
        client.completions.create(model=MODEL_ID, prompt="MARKER", max_tokens=4)
    chunks += list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected


def test_an_engine_failure_is_a_500_and_the_server_goes_on(server, client, reference,
                                                           monkeypatch):
    # The failure is injected in the decode step, so each request must reach
    # one: greedy, and not ended by its first token. (Sampled, as this test
    # once was, the first token was the end of sequence about one time in 30:
    # the request finished in its prefill, no step ran, and it succeeded.)
    assert reference.generate(chat("hi"), max_tokens=8).finish_reason == "length"
    assert reference.generate("hi", chat=False, max_tokens=8).finish_reason == "length"
    scheduler = server.scheduler
    broken = scheduler.engine
    failures = scheduler.failures

    def fail():
        raise RuntimeError("injected engine failure")

    def break_engine():  # the current one: each failure replaces it
        monkeypatch.setattr(scheduler.engine, "step", fail)

    break_engine()
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model=MODEL_ID, messages=chat("hi"), max_tokens=8,
                                       temperature=0)
    assert raised.value.status_code == 500
    assert raised.value.body == {
        "message": "the generation failed: RuntimeError: injected engine failure",
        "type": "server_error", "param": None, "code": None}
    assert scheduler.engine is not broken and scheduler.failures == failures + 1

    # Once a stream has started, it ends as streams do (a last chunk with a
    # finish reason), then the failure arrives as an error event.
    break_engine()
    stream = client.chat.completions.create(model=MODEL_ID, messages=chat("hi"), max_tokens=8,
                                            temperature=0, stream=True)
    received = []
    with pytest.raises(openai.APIError, match="injected engine failure"):
        received += stream
    assert received[-1].choices[0].finish_reason == "length"
    break_engine()
    status, _, body = request(server, "POST", "/v1/completions", {
        "prompt": "hi", "max_tokens": 8, "temperature": 0, "stream": True})
    events = body.split(b"\n\n")
    assert status == 200 and events[-2:] == [b"data: [DONE]", b""]
    assert json.loads(events[-3].removeprefix(b"data: "))["error"]["type"] == "server_error"
    assert json.loads(events[-4].removeprefix(b"data: "))["choices"][0]["finish_reason"] == \
        "length"

    monkeypatch.undo()
    reply = client.chat.completions.create(model=MODEL_ID, messages=chat("hi"), max_tokens=8,
                                           temperature=0)
    assert reply.choices[0].message.content == reference.generate(chat("hi"), max_tokens=8).text


# -- the docs and the command line -----------------------------------------------
def doc_block(language: str, containing: str) -> str:
    text = (ROOT / "docs" / "serving.md").read_text()
    blocks = re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
    found = [b for b in blocks if containing in b]
    assert len(found) == 1, f"docs/serving.md needs one {language} block with {containing!r}"
    return found[0]


def test_docs_examples_work(server, capsys):
    curl = doc_block("sh", "curl ")
    python = doc_block("python", "OpenAI(")
    default = "http://127.0.0.1:8080"
    assert default in curl and default in python
    done = subprocess.run(["bash", "-c", curl.replace(default, server.url)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["object"] == "chat.completion"
    assert 1 <= answer["usage"]["completion_tokens"] <= 32
    exec(compile(python.replace(default, server.url), "serving.md", "exec"), {})
    assert capsys.readouterr().out.endswith("\n")  # the streamed reply (random weights)


def main(argv: list[str]) -> int:
    return cli_main(["serve", *argv])


def test_command_line_flags(model_path, capsys):
    assert main(["--max-batch", "0"]) == 2
    assert "argument --max-batch: must be in [1, 64], got 0" in capsys.readouterr().err
    assert main(["--port", "http"]) == 2
    assert "argument --port: expected an integer, got 'http'" in capsys.readouterr().err
    assert main(["--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 127.0.0.1)", "(default: 8080)", "(default: 2048)",
                    "(default: 8)"):
        assert default in shown
    assert main(["-m", "/nonexistent/model.gguf", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "/nonexistent/model.gguf" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["-m", str(model_path), "--port", str(port)]) == 1
    assert capsys.readouterr().err == (f"error: cannot listen on 127.0.0.1:{port}: "
                                       "Address already in use\n")
    # serve() leaves its logger as it found it (else later tests' logs go to
    # this test's stderr, closed by now).
    logger = logging.getLogger("mlxprog.serve")
    assert logger.handlers == [] and logger.propagate


@pytest.mark.parametrize("flags, message", [
    (["--shutdown-grace", "-1"], "argument --shutdown-grace: must be at least 0, got -1"),
    (["--shutdown-grace", "soon"], "argument --shutdown-grace: expected a number, got 'soon'"),
    (["--api-key", ""], "argument --api-key: the API key must not be empty"),
    (["--allowed-origins", "https://app.example/"], "argument --allowed-origins: "
     "'https://app.example/' is not an origin such as https://example.com:8443"),
    (["--allowed-origins", " , "], "argument --allowed-origins: no origin given"),
])
def test_bad_sharing_and_shutdown_flags_are_usage_errors(capsys, flags, message):
    assert main(flags) == 2
    assert message in capsys.readouterr().err


def test_sharing_and_shutdown_flags_reach_the_server(capsys, monkeypatch):
    given = []
    monkeypatch.setattr("mlxprog.llm.server.serve", lambda model, **settings: given.append(
        settings))
    assert main(["--api-key", "sk-1", "--allowed-origins",
                 "https://a.example, http://localhost:3000", "--shutdown-grace", "0.5"]) == 0
    assert main([]) == 0
    (first, default) = given
    assert (first["api_key"], first["allowed_origins"], first["shutdown_grace"]) == (
        "sk-1", ["https://a.example", "http://localhost:3000"], 0.5)
    assert (default["api_key"], default["allowed_origins"], default["shutdown_grace"]) == (
        None, [], 5)


def test_the_entry_point_serves_and_stops_on_ctrl_c(model_path):
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxprog", "serve", "-m", str(model_path), "--port", "0",
         "--max-length", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in process.stderr], daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=120)
        found = re.fullmatch(r"mlxprog serve: tiny at (http://127\.0\.0\.1:\d+)/v1 \(max batch "
                             r"8, KV cache 128 tokens, prompt cache 8\); building the "
                             r"programs, /health says when ready; Ctrl-C stops\n", first)
        assert found, first
        assert re.fullmatch(r"mlxprog serve: programs and kernels built in \d+\.\d s; ready\n",
                            lines.get(timeout=120))
        url = urlsplit(found.group(1))
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        # Greedy: sampled at the default temperature, the tiny model's random
        # weights can end the completion with EOS before its third token (a
        # run of the suite with the native kernels off did once).
        conn.request("POST", "/v1/completions",
                     json.dumps({"prompt": "hi", "max_tokens": 3, "temperature": 0}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["usage"]["completion_tokens"] == 3
        conn.close()
        assert re.fullmatch(r"POST /v1/completions 200 \d+\.\d\d s: 2 prompt tokens "
                            r"\(0 cached\), 3 generated\n", lines.get(timeout=60))
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    rest = "".join(lines.queue)
    assert "Traceback" not in rest and "terminate called" not in rest, rest
