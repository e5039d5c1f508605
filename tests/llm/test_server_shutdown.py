"""Stopping the OpenAI-compatible server (mlxprog.llm.server) gracefully.

``mlxprog serve`` runs in a subprocess, stopped by SIGINT or SIGTERM while a
stream runs: the stream must end as streams do (a last chunk with a finish
reason, then an error event and ``[DONE]``), and the process must exit 0
with one line about it and no traceback. ``Server.stop`` (the same path,
from a background thread) is checked in this process: running requests
finish within the grace, new ones get a 503, and what is left after it is
cut short with a proper end.

A tiny random-weight model serves; its greedy answer to :data:`PROMPT` is
long (checked against ``LLM.generate``), so a stream is still running when
the server stops.
"""

from __future__ import annotations

import http.client
import json
import logging
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import openai
import pytest
from llm_fixtures import TINY, tiny_tokenizer_metadata, write_gguf

from mlxprog.llm import LLM, load
from mlxprog.llm.server import Server

ROOT = Path(__file__).parents[2]
MAX_LENGTH = 2048
#: A completion prompt whose greedy answer runs past LONG tokens (no end of
#: sequence): a second or so of decoding, to stop the server in.
PROMPT = "abcabc"
LONG = 1200
MODEL_ID = "tiny"


def one_end() -> dict:
    """The tiny vocabulary with EOS as its only end of generation: its
    ``<|endoftext|>``, which ends a generation by its text as in llama.cpp,
    renamed, so that the random models' long answers run their length."""
    tokens = list(tiny_tokenizer_metadata()["tokenizer.ggml.tokens"])
    tokens[tokens.index("<|endoftext|>")] = "<|unused|>"
    return {"tokenizer.ggml.tokens": tokens}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shutdown") / "tiny.gguf"
    write_gguf(path, tied=False, **one_end())
    return path


@pytest.fixture(scope="module")
def reference(model_path) -> LLM:
    llm = load(model_path, max_length=MAX_LENGTH)
    assert llm.generate(PROMPT, chat=False, max_tokens=LONG).finish_reason == "length"
    return llm


#: A model some 40x slower than the tiny one (6 wider layers), for the
#: server started as a command: its answer to SLOW_PROMPT must still be
#: running when the test's signals arrive (the tiny model's 1,200 tokens
#: take well under a second, less than a signal's round trip may on a busy
#: machine); its greedy answer runs past SLOW_LONG tokens.
SLOW_SIZES = dict(TINY, num_layers=6, hidden_size=256, intermediate_size=768, head_dim=64)
SLOW_PROMPT = "aaaa"
SLOW_LONG = 600


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory) -> LLM:
    path = tmp_path_factory.mktemp("shutdown") / "slow.gguf"
    write_gguf(path, tied=False, sizes=SLOW_SIZES, **one_end())
    llm = load(path, max_length=MAX_LENGTH)
    assert llm.generate(SLOW_PROMPT, chat=False, max_tokens=SLOW_LONG).finish_reason == "length"
    return llm


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def post(url: str, body: dict) -> http.client.HTTPResponse:
    """A JSON POST to ``url``'s /v1/completions; the response, its body unread."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn.getresponse()


def events_of(raw: bytes) -> list[Any]:
    """A stream's events: JSON objects, and "[DONE]"."""
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and all(e.startswith(b"data: ") for e in events[:-1]), raw[-200:]
    return [e[6:].decode() if e == b"data: [DONE]" else json.loads(e[6:]) for e in events[:-1]]


def assert_cut_short(reference: LLM, events: list[Any], prompt: str = PROMPT,
                     long: int = LONG) -> int:
    """``events`` are a stream of ``prompt``'s completion of at most ``long``
    tokens (with the usage) cut short as the server stops: text chunks, a
    last chunk (finish reason "length"), the usage, the 503 error, then
    [DONE]. Returns the tokens the usage counts."""
    *text_chunks, last, usage, error, done = events
    assert done == "[DONE]"
    assert error == {"error": {"message": "the server is shutting down", "type": "server_error",
                               "param": None, "code": "server_shutting_down"}}
    assert usage["choices"] == []
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["text"] == ""
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks)
    text = "".join(c["choices"][0]["text"] for c in text_chunks)
    generated = usage["usage"]["completion_tokens"]
    assert 1 <= generated < long
    assert usage["usage"]["prompt_tokens"] == len(reference.prompt_ids(prompt, chat=False))
    # What was sent is what those tokens say (a character still incomplete is held back).
    assert reference.generate(prompt, chat=False, max_tokens=generated).text.startswith(text)
    return generated


# -- the command, stopped by a signal ---------------------------------------------
@pytest.mark.parametrize("signal_number, grace, signals", [
    (signal.SIGTERM, 0, 1),   # no grace: the stream is cut at once
    (signal.SIGINT, 600, 2),  # Ctrl-C twice: the second cuts the grace short
])
def test_a_signal_stops_the_command_and_ends_the_running_stream(slow_reference, signal_number,
                                                                grace, signals):
    reference = slow_reference
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxprog", "serve", "-m", str(reference.checkpoint.path),
         "--model-id", MODEL_ID, "--port", "0",
         "--max-length", str(MAX_LENGTH), "--shutdown-grace", str(grace)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in process.stderr], daemon=True)
    reader.start()
    try:
        found = re.match(r"mlxprog serve: tiny at (http://127\.0\.0\.1:\d+)/v1 ",
                         lines.get(timeout=120))
        assert found
        assert lines.get(timeout=120).endswith("; ready\n")
        response = post(found.group(1), {"prompt": SLOW_PROMPT, "max_tokens": SLOW_LONG,
                                         "temperature": 0, "stream": True,
                                         "stream_options": {"include_usage": True}})
        assert response.status == 200
        first = response.readline() + response.readline()  # one event, and its blank line
        name = signal.Signals(signal_number).name
        process.send_signal(signal_number)
        assert lines.get(timeout=60) == (
            f"mlxprog serve: {name}, stopping: new requests get 503, running ones have "
            f"{grace} s to finish (Ctrl-C again: now)\n")
        if signals == 2:
            process.send_signal(signal_number)
        raw = first + response.read()  # to the end: the chunked body is complete
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    generated = assert_cut_short(reference, events_of(raw), SLOW_PROMPT, SLOW_LONG)
    prompt_tokens = len(reference.prompt_ids(SLOW_PROMPT, chat=False))
    rest = list(lines.queue)
    assert rest == [f"POST /v1/completions 200 {rest[0].split()[3]} s: {prompt_tokens} prompt "
                    f"tokens (0 cached), {generated} generated; the server is shutting down\n"]
    assert process.stdout.read() == ""


# -- Server.stop ------------------------------------------------------------------
@pytest.fixture
def make_server(model_path):
    """Servers of their own (a stopped one cannot start again), stopped at
    the end; their decode steps take 10 ms longer, so that the requests
    overlap the stop however fast the machine."""
    made = []

    def make(**settings: Any) -> Server:
        srv = Server(load(model_path, max_length=MAX_LENGTH), model_id=MODEL_ID, max_batch=4,
                     **settings)
        srv.start()
        engine = srv.scheduler.engine
        step = engine.step

        def slow():
            time.sleep(0.01)
            return step()

        engine.step = slow
        made.append(srv)
        return srv

    yield make
    for srv in made:
        srv.stop()


def in_thread(work: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``work`` in a thread; the function that waits for its result."""
    result: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: result.put(_outcome(work)), daemon=True).start()

    def wait() -> Any:
        ok, value = result.get(timeout=120)
        if not ok:
            raise value
        return value

    return wait


def _outcome(work: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, work()
    except Exception as e:
        return False, e


def test_stop_lets_running_requests_finish_and_refuses_new_ones(make_server, reference):
    srv = make_server(shutdown_grace=600)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    # Long enough to outlast the refused request below (10 ms a step), well within the grace.
    expected = reference.generate(PROMPT, chat=False, max_tokens=200).text
    stream = post(srv.url, {"prompt": PROMPT, "max_tokens": 200, "temperature": 0,
                            "stream": True})
    first = stream.readline() + stream.readline()
    answer = in_thread(lambda: client.completions.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=200, temperature=0))
    wait_for(lambda: srv.scheduler.running == 2, "both requests to run")
    stopped = in_thread(srv.stop)
    wait_for(lambda: srv.stopping, "the stop to begin")
    with pytest.raises(openai.InternalServerError) as refused:
        client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4)
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "server_shutting_down"

    events = events_of(first + stream.read())
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == expected
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert answer().choices[0].text == expected
    stopped()  # once they finished: well before the 600 s grace


def test_stop_cuts_short_what_outlasts_the_grace(make_server, reference, caplog):
    caplog.set_level(logging.INFO, logger="mlxprog.serve")
    srv = make_server(shutdown_grace=0.2)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    stream = post(srv.url, {"prompt": PROMPT, "max_tokens": LONG, "temperature": 0,
                            "stream": True, "stream_options": {"include_usage": True}})
    first = stream.readline() + stream.readline()
    answer = in_thread(lambda: client.completions.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=LONG, temperature=0))
    wait_for(lambda: srv.scheduler.running == 2, "both requests to run")
    srv.stop()

    generated = assert_cut_short(reference, events_of(first + stream.read()))
    with pytest.raises(openai.InternalServerError) as cut:
        answer()
    assert cut.value.status_code == 503
    assert cut.value.body == {"message": "the server is shutting down", "type": "server_error",
                              "param": None, "code": "server_shutting_down"}
    logged = [r.getMessage() for r in caplog.records if r.name == "mlxprog.serve"]
    assert len([m for m in logged if m.startswith("POST /v1/completions 200 ") and m.endswith(
        f", {generated} generated; the server is shutting down")]) == 1
    assert len([m for m in logged if m.startswith("POST /v1/completions 503 ")]) == 1
