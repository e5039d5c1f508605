"""The server's scheduler: a long prompt is prefilled in chunks between the
running rows' decode steps (so a short request is not kept behind it), the
bounded queue's 503, the warm-up before ``/health`` says ready, and the
stats of ``/health`` and ``/metrics``."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from llm_fixtures import tiny_gguf

from mlxprog.llm import load
from mlxprog.llm.server import Server
from mlxprog.llm.server.metrics import prometheus_text

MAX_LENGTH = 256


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory, "scheduler")


@pytest.fixture
def make_server(model_path):
    servers = []

    def make(**options) -> Server:
        server = Server(load(model_path, max_length=MAX_LENGTH), model_id="tiny", **options)
        server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def get(server: Server, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("GET", path)
    response = conn.getresponse()
    out = response.status, response.headers, response.read()
    conn.close()
    return out


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_a_short_request_is_not_kept_behind_a_long_prefill(make_server, monkeypatch):
    """Each prefill chunk is slowed down, so that the long prompt's 12
    chunks take a while: the short request, sent once the long one has
    begun, is answered before the long one's first token."""
    server = make_server(prefill_chunk=16)
    engine = server.scheduler.engine
    advance, events = engine.advance, []

    def slow_advance(prefill):
        time.sleep(0.05)
        pieces = advance(prefill)
        events.extend(("first", len(r.ids)) for r, _ in pieces)
        return pieces

    monkeypatch.setattr(engine, "advance", slow_advance)
    api = client(server)
    long_prompt = [5] * 190
    done = {}

    def send_long():
        done["long"] = api.completions.create(model="tiny", prompt=long_prompt, max_tokens=2,
                                              temperature=0)

    thread = threading.Thread(target=send_long)
    thread.start()
    while not engine.prefilling:  # the long prompt has begun
        time.sleep(0.005)
    short = api.completions.create(model="tiny", prompt=[7, 8, 9], max_tokens=2, temperature=0)
    assert "long" not in done and short.usage.completion_tokens == 2
    thread.join(timeout=120)
    assert done["long"].usage.prompt_tokens == 190
    assert events == [("first", 3), ("first", 190)]


def test_a_full_queue_answers_503_with_retry_after(make_server, monkeypatch):
    server = make_server(max_batch=1, max_waiting=0)
    scheduler = server.scheduler
    gate = threading.Event()
    step = scheduler.engine.step

    def held_step():
        gate.wait(30)
        return step()

    monkeypatch.setattr(scheduler.engine, "step", held_step)
    api = client(server)
    thread = threading.Thread(target=lambda: api.completions.create(
        model="tiny", prompt=[5, 6], max_tokens=4, temperature=0))
    thread.start()
    while not scheduler.engine.rows:  # the one row is taken
        time.sleep(0.005)
    with pytest.raises(openai.APIStatusError) as raised:
        api.completions.create(model="tiny", prompt=[7], max_tokens=2)
    gate.set()
    thread.join(timeout=60)
    error = raised.value
    assert error.status_code == 503 and error.response.headers["Retry-After"] == "1"
    assert error.body["code"] == "server_busy"
    assert error.body["message"] == ("the server is busy: 0 requests wait for one of 1 rows; "
                                     "retry later")


def test_health_says_loading_until_the_programs_are_built(make_server):
    server = make_server()
    server.scheduler.ready.clear()  # as while it warms up
    status, _, body = get(server, "/health")
    assert status == 503 and json.loads(body)["status"] == "loading"
    server.scheduler.ready.set()
    status, _, body = get(server, "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def traces(llm) -> dict:
    """Traces of each of ``llm``'s executables (logits programs, pickers)."""
    return {**{key: exe.stats.traces for key, exe in llm._executables.items()},
            **{key: exe.stats.traces for key, exe in llm._pickers.items()}}


def test_the_warm_up_builds_what_a_first_request_needs(make_server):
    """After the warm-up, a first short chat, greedy or sampled at OpenAI's
    default temperature, traces no program of its own."""
    server = make_server()
    before = traces(server.llm)
    assert before and all(before.values())
    api = client(server)
    for temperature in (0, 1):
        api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi."}],
                                    max_tokens=3, temperature=temperature)
    assert traces(server.llm) == before


def test_metrics_are_prometheus_text(make_server):
    server = make_server()
    client(server).completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=3,
                                      temperature=0)
    status, headers, body = get(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    stats = server.endpoints.stats()
    assert text == prometheus_text(stats, True)
    assert "# TYPE mlxprog_embedding_requests_total counter\n" in text
    assert "# TYPE mlxprog_requests_total counter\nmlxprog_requests_total 1\n" in text
    assert "mlxprog_rows_decoding 0\n" in text and "mlxprog_ready 1\n" in text
    assert stats["prompt_tokens"] == 3 and stats["generated_tokens"] == 3
