"""The OpenAI-compatible server (mlxprog.llm.server) against clients that
misbehave, and for shared and browser use.

Two servers of a tiny random-weight model run in this process: ``guarded``
needs an API key, allows one origin (CORS) and serves few connections;
``hasty`` has short timeouts for clients that send or read too slowly.
The ``openai`` client and raw HTTP (``http.client``, sockets) talk to them.
Each case gets an OpenAI-style error or is cut off, and the server goes on
serving the others.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
from llm_fixtures import tiny_gguf

from mlxprog.llm import LLM, load
from mlxprog.llm.server import ServeError, Server
from mlxprog.llm.server.routes import MAX_BODY_BYTES

MAX_LENGTH = 1024
MODEL_ID = "tiny"
KEY = "sk-test-key"
ORIGIN = "https://app.example"
MAX_CONNECTIONS = 8
TIMEOUT = 2  # the hasty server's request and write timeouts, in seconds
#: A completion prompt whose greedy answer runs past LONG tokens (no end of sequence).
PROMPT = "hello"
LONG = 900


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory, "guards")


@pytest.fixture(scope="module")
def reference(model_path) -> LLM:
    llm = load(model_path, max_length=MAX_LENGTH)
    assert llm.generate(PROMPT, chat=False, max_tokens=LONG).finish_reason == "length"
    return llm


@pytest.fixture(scope="module")
def guarded(model_path):
    srv = Server(load(model_path, max_length=MAX_LENGTH), model_id=MODEL_ID, max_batch=3,
                 api_key=KEY, allowed_origins=[ORIGIN], max_connections=MAX_CONNECTIONS)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hasty(model_path):
    srv = Server(load(model_path, max_length=MAX_LENGTH), model_id=MODEL_ID, max_batch=3,
                 request_timeout=TIMEOUT, write_timeout=TIMEOUT)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def slow_steps(monkeypatch):
    """Make a server's decode steps 10 ms longer, so that a long answer is
    still running while a test does its part, however fast the machine."""

    def slow_down(srv: Server) -> None:
        engine = srv.scheduler.engine
        step = engine.step

        def slow():
            time.sleep(0.01)
            return step()

        monkeypatch.setattr(engine, "step", slow)

    return slow_down


def connect(srv: Server) -> http.client.HTTPConnection:
    url = urlsplit(srv.url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=60)


def request(srv: Server, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One plain HTTP request on a connection of its own: status, headers, body."""
    conn = connect(srv)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json",
                                                   **(headers or {})})
    response = conn.getresponse()
    out = response.status, response.headers, response.read()
    conn.close()
    return out


def raw_socket(srv: Server, receive_buffer: int | None = None) -> socket.socket:
    url = urlsplit(srv.url)
    sock = socket.socket()
    if receive_buffer is not None:  # before connecting: it sets the window offered
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(60)
    sock.connect((url.hostname, url.port))
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Wait until the server closes ``sock`` (whatever it sent first is read)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def error_of(status: int, headers, body: bytes, expected: int) -> dict:
    """The OpenAI-style error of an answer with status ``expected``."""
    assert status == expected, body
    assert headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if expected < 500 else "server_error")
    return error


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- the API key ---------------------------------------------------------------------
def test_requests_need_the_api_key_but_health_does_not(guarded, reference):
    for headers, message in [({}, "the request has no API key; send the header "
                                  "Authorization: Bearer <key> (or x-api-key: <key>) (the "
                                  "server's --api-key)"),
                             ({"Authorization": "Bearer sk-wrong"},
                              "the API key in the Authorization header is wrong"),
                             ({"x-api-key": "sk-wrong"},
                              "the API key in the x-api-key header is wrong"),
                             ({"Authorization": KEY}, "is wrong"),
                             ({"Authorization": f"Basic {KEY}"}, "is wrong")]:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                             ("POST", "/v1/nowhere")]:
            status, got, body = request(guarded, method, path, {"messages": "not even valid"},
                                        headers)
            error = error_of(status, got, body, 401)
            assert message in error["message"] and error["code"] == "invalid_api_key"
            assert got["WWW-Authenticate"] == "Bearer"
    assert request(guarded, "GET", "/v1/models", headers={"Authorization": f"bearer {KEY}"}
                   )[0] == 200
    assert request(guarded, "GET", "/v1/models", headers={"x-api-key": KEY})[0] == 200
    assert request(guarded, "GET", "/health")[0] == 200  # open: load balancers probe it

    with openai.OpenAI(base_url=guarded.url + "/v1", api_key="sk-wrong", max_retries=0) as client, \
            pytest.raises(openai.AuthenticationError) as raised:
        client.models.list()
    assert raised.value.body["code"] == "invalid_api_key"
    # Anthropic's client sends its key as x-api-key.
    with anthropic.Anthropic(base_url=guarded.url, api_key=KEY, max_retries=0) as client:
        assert client.messages.create(model="any", max_tokens=1, messages=chat("hi")).content
    with anthropic.Anthropic(base_url=guarded.url, api_key="sk-wrong", max_retries=0) as client, \
            pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="any", max_tokens=1, messages=chat("hi"))
    with openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0,
                       timeout=60) as client:
        reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=5,
                                          temperature=0)
    assert reply.choices[0].text == reference.generate(PROMPT, chat=False, max_tokens=5).text


def test_bad_settings_are_refused_naming_them(model_path):
    llm = load(model_path, max_length=64)
    for settings, message in [
        ({"api_key": ""}, "api_key (--api-key) must not be empty"),
        ({"allowed_origins": ["https://app.example/"]}, "allowed_origins (--allowed-origins): "
         "'https://app.example/' is not an origin such as https://example.com:8443"),
        ({"allowed_origins": ["app.example"]}, "'app.example' is not an origin"),
        ({"shutdown_grace": -1}, "shutdown_grace (--shutdown-grace) must be at least 0"),
        ({"request_timeout": 0}, "request_timeout must be greater than 0, got 0"),
        ({"write_timeout": -5}, "write_timeout must be greater than 0, got -5"),
        ({"max_connections": 0}, "max_connections must be at least 1, got 0"),
    ]:
        with pytest.raises(ServeError, match=re.escape(message)):
            Server(llm, **settings)


# -- CORS ----------------------------------------------------------------------------
def test_cors_preflights_and_answers(guarded):
    asked = "authorization, content-type, x-stainless-os"
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": asked}
    status, headers, _ = request(guarded, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 200  # no API key: browsers send none with a preflight
    assert headers["Access-Control-Allow-Origin"] == ORIGIN
    assert headers["Access-Control-Allow-Methods"] == "GET, POST"
    assert headers["Access-Control-Allow-Headers"] == asked

    error = error_of(*request(guarded, "OPTIONS", "/v1/chat/completions",
                              headers={**preflight, "Origin": "https://evil.example"}), 400)
    assert error["message"] == ("the CORS preflight from https://evil.example is refused "
                                "(origin); the server allows the origins https://app.example "
                                "(--allowed-origins) and the methods GET, POST")
    assert error["code"] == "cors_refused"
    error = error_of(*request(guarded, "OPTIONS", "/v1/models",
                              headers={**preflight, "Access-Control-Request-Method": "DELETE"}),
                     400)
    assert "(method)" in error["message"]

    # Answers carry the origin, errors too (else the page could not read them).
    for key, expected in ((KEY, 200), ("sk-wrong", 401)):
        status, headers, _ = request(guarded, "GET", "/v1/models", headers={
            "Origin": ORIGIN, "Authorization": f"Bearer {key}"})
        assert status == expected and headers["Access-Control-Allow-Origin"] == ORIGIN
    status, headers, _ = request(guarded, "GET", "/v1/models", headers={
        "Origin": "https://evil.example", "Authorization": f"Bearer {KEY}"})
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_without_allowed_origins_there_is_no_cors(hasty):
    status, headers, body = request(hasty, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert error_of(status, headers, body, 405)["code"] == "method_not_allowed"
    assert "Access-Control-Allow-Origin" not in headers


# -- floods of connections -----------------------------------------------------------
def test_a_flood_of_connections_is_refused_while_a_stream_goes_on(guarded, reference,
                                                                  slow_steps):
    slow_steps(guarded)
    wait_for(lambda: guarded.connections == 0, "earlier tests' connections to close")
    # Long enough (10 ms a step) to outlast the flood.
    expected = reference.generate(PROMPT, chat=False, max_tokens=400).text
    conn = connect(guarded)
    conn.request("POST", "/v1/completions", json.dumps({
        "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    stream = conn.getresponse()
    assert stream.status == 200
    idle = [raw_socket(guarded) for _ in range(MAX_CONNECTIONS - 1)]
    wait_for(lambda: guarded.connections == MAX_CONNECTIONS, "the connections to be open")

    # One more is answered with a 503 (then closed), by the openai client too.
    status, headers, body = request(guarded, "GET", "/v1/models",
                                    headers={"Authorization": f"Bearer {KEY}"})
    error = error_of(status, headers, body, 503)
    assert error["code"] == "too_many_connections" and headers["Retry-After"] == "1"
    assert error["message"] == (f"the server serves {MAX_CONNECTIONS} connections at once, "
                                "and this one is beyond them; retry later")
    with openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0) as client, \
            pytest.raises(openai.InternalServerError) as raised:
        client.models.list()
    assert raised.value.status_code == 503

    # Beyond twice the limit, connections are closed as they arrive.
    idle += [raw_socket(guarded) for _ in range(MAX_CONNECTIONS)]
    wait_for(lambda: guarded.connections == 2 * MAX_CONNECTIONS, "the connections to be open")
    beyond = [raw_socket(guarded) for _ in range(5)]
    assert all(closed_by_server(sock) for sock in beyond)
    assert guarded.connections == 2 * MAX_CONNECTIONS

    # The stream went on all along; once the flood ends, the server serves.
    events = stream.read().split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    for sock in idle + beyond:
        sock.close()
    conn.close()
    wait_for(lambda: guarded.connections == 0, "the flood's connections to close")
    with openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0,
                       timeout=60) as client:
        assert [m.id for m in client.models.list().data] == [MODEL_ID]


def test_many_clients_at_once_are_all_answered(hasty, reference):
    expected = reference.generate(PROMPT, chat=False, max_tokens=3).text
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3, "temperature": 0}).encode()
    generate = (b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)
    models = b"GET /v1/models HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    # 20 generations: they all fit in the batch and its queue (--max-queue).
    sent = [generate if i % 5 == 0 else models for i in range(100)]
    socks = [raw_socket(hasty) for _ in sent]
    for sock, data in zip(socks, sent):  # all sent before any is read
        sock.sendall(data)
    for sock, data in zip(socks, sent):
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 200
        answer = json.loads(response.read())
        if data is generate:
            assert answer["choices"][0]["text"] == expected
        else:
            assert [m["id"] for m in answer["data"]] == [MODEL_ID]
        sock.close()


# -- slow clients --------------------------------------------------------------------
def test_a_body_that_does_not_arrive_is_a_408(hasty, reference):
    sock = raw_socket(hasty)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\": \"hel")
    response = http.client.HTTPResponse(sock)  # the rest of the body never comes
    response.begin()
    error = error_of(response.status, response.headers, response.read(), 408)
    assert error == {"message": f"the request body did not arrive within {TIMEOUT} s (the "
                                "server's request timeout)", "type": "invalid_request_error",
                     "param": None, "code": "request_timeout"}
    assert response.headers["Connection"] == "close"
    assert closed_by_server(sock)
    # Nothing else was held up.
    client = openai.OpenAI(base_url=hasty.url + "/v1", api_key="unused", max_retries=0)
    assert client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=3,
                                     temperature=0).choices[0].text == \
        reference.generate(PROMPT, chat=False, max_tokens=3).text


def test_a_head_that_does_not_arrive_is_cut_off(hasty):
    silent = raw_socket(hasty)
    dribbling = raw_socket(hasty)
    dribbling.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")
    stop = threading.Event()

    def dribble() -> None:  # a byte now and then: a slowloris
        try:
            while not stop.wait(0.2):
                dribbling.sendall(b"X")
        except OSError:  # the server closed it
            pass

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    try:
        assert closed_by_server(silent) and closed_by_server(dribbling)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert request(hasty, "GET", "/v1/models")[0] == 200


def test_a_client_that_does_not_read_its_stream_is_cut_off(hasty, reference, slow_steps,
                                                            caplog):
    caplog.set_level(logging.INFO, logger="mlxprog.serve")
    slow_steps(hasty)
    scheduler = hasty.scheduler
    cancelled = scheduler.cancelled
    sock = raw_socket(hasty, receive_buffer=4096)
    # Each chunk carries 20 alternatives per token: the buffers fill fast.
    body = json.dumps({"prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "logprobs": 20,
                       "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: "
                 b"application/json\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    wait_for(lambda: scheduler.cancelled == cancelled + 1, "the row to be cancelled")
    wait_for(lambda: scheduler.running == 0, "the row to leave")
    assert closed_by_server(sock)
    ending = f"generated; the client did not read its answer for {TIMEOUT} s"
    wait_for(lambda: any(r.getMessage().endswith(ending) for r in caplog.records),
             "the log line")
    assert request(hasty, "GET", "/v1/models")[0] == 200


def test_a_client_that_goes_away_is_logged_with_its_tokens(hasty, reference, slow_steps,
                                                           caplog):
    caplog.set_level(logging.INFO, logger="mlxprog.serve")
    slow_steps(hasty)
    prompt_tokens = len(reference.prompt_ids(PROMPT, chat=False))
    conn = connect(hasty)
    conn.request("POST", "/v1/completions", json.dumps({
        "prompt": PROMPT, "max_tokens": LONG, "temperature": 0, "stream": True}),
        {"Content-Type": "application/json"})
    response = conn.getresponse()
    for _ in range(3):
        assert response.readline().startswith(b"data: {") and response.readline() == b"\n"
    conn.close()
    wait_for(lambda: hasty.scheduler.running == 0, "the row to leave")
    conn = connect(hasty)  # and one that leaves before its answer
    conn.request("POST", "/v1/completions", json.dumps({
        "prompt": PROMPT, "max_tokens": LONG, "temperature": 0}),
        {"Content-Type": "application/json"})
    wait_for(lambda: hasty.scheduler.running == 1, "the request to run")
    conn.close()

    def logged(status: int) -> list[re.Match]:
        pattern = (rf"POST /v1/completions {status} \d+\.\d\d s: (\d+) prompt tokens \((\d+) "
                   r"cached\), (\d+) generated; the client disconnected")
        return [m for r in caplog.records if (m := re.fullmatch(pattern, r.getMessage()))]

    wait_for(lambda: logged(200) and logged(499), "the log lines")
    for found, least in ((logged(200)[0], 3), (logged(499)[0], 0)):
        assert int(found.group(1)) == prompt_tokens and int(found.group(3)) >= least
        assert int(found.group(2)) <= prompt_tokens - 1


# -- bodies --------------------------------------------------------------------------
def test_a_body_too_large_is_a_413(hasty):
    message = f"the request body is over {MAX_BODY_BYTES // 2**20} MiB"
    conn = connect(hasty)  # declared too large: refused before it is sent
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()
    response = conn.getresponse()
    error = error_of(response.status, response.headers, response.read(), 413)
    assert error["message"] == message and error["code"] == "request_too_large"
    assert response.headers["Connection"] == "close"
    conn.close()

    # No length said (chunked): refused once it is too large. Called on the
    # app itself: over a socket, the client may still be sending when the
    # server answers and closes, and then lose the answer to a reset.
    megabyte = b" " * 2**20
    parts = [{"type": "http.request", "body": megabyte, "more_body": True}] * 20
    sent: list[dict] = []

    async def receive() -> dict:
        return parts.pop(0) if parts else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "headers": [(b"transfer-encoding", b"chunked")]}
    asyncio.run(hasty.app(scope, receive, send))
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    assert start["status"] == 413 and (b"connection", b"close") in start["headers"]
    assert json.loads(body)["error"]["message"] == message
    assert len(parts) == 3  # it read no more than the part over the limit
    assert request(hasty, "GET", "/v1/models")[0] == 200


def test_malformed_requests_get_openai_errors(hasty):
    client = openai.OpenAI(base_url=hasty.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL_ID, messages=chat("hi"),
                                       extra_body={"stop": 5, "temperature": 3})
    assert raised.value.body["param"] == "temperature"  # the first field found wrong
    for raw, message in [(b"\xff\xfe", "the request body is not valid JSON"),
                         (b"[" * 100000, "the request body is not valid JSON"),
                         (b'{"messages": [], ', "the request body is not valid JSON")]:
        conn = connect(hasty)
        conn.request("POST", "/v1/chat/completions", body=raw,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert message in error_of(response.status, response.headers, response.read(),
                                   400)["message"]
        conn.close()
    with ThreadPoolExecutor(8) as pool:  # the server is fine after all that
        assert set(pool.map(lambda _: request(hasty, "GET", "/v1/models")[0], range(16))) == {200}
