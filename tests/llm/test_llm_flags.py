"""The model settings and runtime flags of the LLM commands: --chat-template,
--extra-eos-token and --threads, and their Python API (load(chat_template=...,
extra_eos_tokens=...), mlxprog.native.set_threads)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from llm_fixtures import write_gguf

from mlxprog import native
from mlxprog.cli import main
from mlxprog.llm import Chat, SettingError, load
from mlxprog.llm.server import Server
from mlxprog.llm.tokenizer import ChatTemplate

PROMPT = "the quick brown fox"
#: A template unlike the tiny model's own (ChatML).
BRACKETS = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("flags") / "tiny.gguf"
    write_gguf(path, tied=False)
    return str(path)


@pytest.fixture(scope="module")
def llm(model):
    return load(model, max_length=64)


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "brackets.jinja"
    path.write_text(BRACKETS, encoding="utf-8")
    return path


def rendered(text: str) -> str:
    """What BRACKETS makes of ``text`` as the user's message."""
    return f"[user] {text}\n[assistant] "


def stop_token(llm, prompt, index: int = 3, **options) -> tuple[str, list[int]]:
    """A token the model emits greedily for ``prompt``, first at position
    ``index`` or later: its vocabulary text, and the tokens before it."""
    tokens = llm.generate(prompt, max_tokens=12, **options).tokens
    for i in range(index, len(tokens)):
        if tokens[i] not in tokens[:i]:
            return llm.tokenizer.id_to_token(tokens[i]), tokens[:i]
    pytest.fail(f"no new token at {index} or later in {tokens}")


def post(llm, path: str, body: dict) -> tuple[int, dict]:
    """Serve ``llm`` for one greedy ``POST path`` request: its status and reply."""
    server = Server(llm, model_id="tiny")
    server.start()
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps({"model": "tiny", "temperature": 0, **body}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()
        server.stop()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- --chat-template ----------------------------------------------------------------
def test_a_template_replaces_the_models_own(model, llm, template_file):
    assert llm.prompt_ids(PROMPT) != llm.tokenizer.encode(rendered(PROMPT))
    for given in (BRACKETS, template_file, str(template_file), ChatTemplate.of(BRACKETS)):
        custom = load(model, max_length=64, chat_template=given)
        assert custom.tokenizer.chat_template == BRACKETS
        assert custom.prompt_ids(PROMPT) == llm.tokenizer.encode(rendered(PROMPT))
    # The setting is the LLM's: a model loaded without it keeps its template.
    assert llm.prompt_ids(PROMPT) == load(model, max_length=64).prompt_ids(PROMPT)


def test_the_generate_flag_feeds_the_rendered_prompt(model, llm, template_file, capsys):
    want = llm.generate(rendered(PROMPT), chat=False, max_tokens=6)
    for given in (str(template_file), BRACKETS):
        code, out, _ = run_cli(capsys, "generate", "-m", model, "-p", PROMPT, "--max-length",
                               "64", "--max-tokens", "6", "--json", "--no-verbose",
                               "--chat-template", given)
        assert code == 0
        got = json.loads(out)
        assert got["tokens"] == want.tokens
        assert got["stats"]["prompt_tokens"] == len(llm.tokenizer.encode(rendered(PROMPT)))


def test_the_chat_command_takes_a_template(model, llm, template_file, capsys, monkeypatch):
    want = llm.generate(rendered("fox"), chat=False, max_tokens=5).text
    lines = iter(["fox", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    code, out, _ = run_cli(capsys, "chat", "-m", model, "--max-length", "64", "--max-tokens",
                           "5", "--chat-template", str(template_file))
    assert code == 0
    assert want and want in out


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m.content }", "does not compile: line 1"),
    ("{% if %}{{ x }}{% endif %}", "does not compile"),
    ("{{ messages[0].content + 1 }}", "fails on a sample conversation"),
    ("{{ raise_exception('no user role') if messages[-1].role == 'user' }}",
     "fails on a sample conversation: no user role"),
])
def test_a_broken_template_exits_2_naming_the_flag(model, template, message, capsys):
    for command in ("generate", "chat", "serve"):
        extra = ["-p", PROMPT] if command == "generate" else []
        code, out, err = run_cli(capsys, command, "-m", model, *extra,
                                 "--chat-template", template)
        assert code == 2, (command, err)
        assert err.startswith("error: --chat-template: the inline template "), err
        assert message in err
        assert out == ""


def test_a_broken_template_file_is_named(model, tmp_path, capsys):
    path = tmp_path / "broken.jinja"
    path.write_text("{% for m in messages %}", encoding="utf-8")
    code, _, err = run_cli(capsys, "generate", "-m", model, "-p", PROMPT,
                           "--chat-template", str(path))
    assert code == 2
    assert f"--chat-template: the template file '{path}' does not compile" in err


def test_a_missing_template_file_exits_2(model, tmp_path, capsys):
    missing = tmp_path / "nope.jinja"
    code, _, err = run_cli(capsys, "generate", "-m", model, "-p", PROMPT,
                           "--chat-template", str(missing))
    assert code == 2
    assert f"--chat-template: cannot read the template file '{missing}'" in err
    assert "No such file" in err


def test_the_api_names_the_parameter(model, tmp_path):
    with pytest.raises(SettingError, match=r"^chat_template: the inline template does not "):
        load(model, chat_template="{{ oops")
    with pytest.raises(SettingError, match=r"^chat_template: cannot read the template file"):
        load(model, chat_template=tmp_path / "missing.jinja")


def test_a_template_refusing_system_messages_is_accepted(model):
    # As Gemma's: a system message is the template's own error, not a bug.
    template = ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not "
                "supported') }}{% endif %}" + BRACKETS)
    custom = load(model, max_length=64, chat_template=template)
    assert custom.prompt_ids(PROMPT) == custom.tokenizer.encode(rendered(PROMPT))


def test_the_server_renders_chats_with_the_template(model, llm):
    want = llm.generate(rendered(PROMPT), chat=False, max_tokens=5)
    status, reply = post(load(model, max_length=64, chat_template=BRACKETS),
                         "/v1/chat/completions", {"max_tokens": 5, "messages": [
                             {"role": "user", "content": PROMPT}]})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == want.text
    assert reply["usage"]["prompt_tokens"] == len(llm.tokenizer.encode(rendered(PROMPT)))


# -- --extra-eos-token --------------------------------------------------------------
def test_an_extra_eos_token_ends_generation(model, llm):
    token, before = stop_token(llm, PROMPT, chat=False)
    stopping = load(model, max_length=64, extra_eos_tokens=[token])
    result = stopping.generate(PROMPT, chat=False, max_tokens=12)
    assert result.tokens == before
    assert result.finish_reason == "eos"
    in_program = stopping.generate_in_program(PROMPT, chat=False, max_tokens=12)
    assert in_program.tokens == before and in_program.finish_reason == "eos"
    # The model's own EOS still ends generation.
    assert set(llm.tokenizer.eos_token_ids) < set(stopping.tokenizer.eos_token_ids)


def test_extra_eos_tokens_stop_each_row_of_a_batch(model, llm):
    prompts = [PROMPT, "he said the"]
    stops = [stop_token(llm, p, index=2 + i, chat=False) for i, p in enumerate(prompts)]
    stopping = load(model, max_length=64, extra_eos_tokens=[t for t, _ in stops])
    results = stopping.generate_batch(prompts, chat=False, max_tokens=12)
    for result, prompt in zip(results, prompts):
        # Each row stops at the first of the extra tokens it emits.
        alone = llm.generate(prompt, chat=False, max_tokens=12).tokens
        extra = set(stopping.tokenizer.eos_token_ids) - set(llm.tokenizer.eos_token_ids)
        first = next(i for i, t in enumerate(alone) if t in extra)
        assert result.tokens == alone[:first]
        assert result.finish_reason == "eos"


def test_the_generate_flag_stops_at_the_token(model, llm, capsys):
    token, before = stop_token(llm, PROMPT, chat=False)
    code, out, _ = run_cli(capsys, "generate", "-m", model, "-p", PROMPT, "--no-chat",
                           "--max-length", "64", "--max-tokens", "12", "--json",
                           "--no-verbose", "--extra-eos-token", "<|im_start|>",
                           "--extra-eos-token", token)
    assert code == 0
    got = json.loads(out)
    assert got["tokens"] == before
    assert got["finish_reason"] == "eos"


def test_a_chat_stops_at_an_extra_eos_token(model, llm):
    token, before = stop_token(llm, [{"role": "user", "content": "fox"}])
    chat = Chat(load(model, max_length=64, extra_eos_tokens=[token]))
    reply = "".join(piece.text for piece in chat.send("fox"))
    assert reply == llm.tokenizer.decode(before, skip_special_tokens=True)
    assert chat.llm.last_generation.finish_reason == "eos"


def test_the_server_stops_at_an_extra_eos_token(model, llm):
    token, before = stop_token(llm, PROMPT, chat=False)
    status, reply = post(load(model, max_length=64, extra_eos_tokens=[token]),
                         "/v1/completions", {"max_tokens": 12, "prompt": PROMPT})
    assert status == 200, reply
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == len(before) + 1  # the EOS counts


@pytest.mark.parametrize("text", ["the quick", "\u2603 snow"])
def test_a_text_of_several_tokens_exits_2(model, text, capsys):
    for command in ("generate", "chat", "serve"):
        extra = ["-p", PROMPT] if command == "generate" else []
        code, out, err = run_cli(capsys, command, "-m", model, *extra,
                                 "--extra-eos-token", text)
        assert code == 2, (command, err)
        assert f"error: --extra-eos-token: {text!r} is not one token" in err
        assert out == ""


def test_extra_eos_tokens_in_the_api(model):
    with pytest.raises(SettingError, match=r"^extra_eos_tokens: 'the quick' is not one token"):
        load(model, extra_eos_tokens=["the quick"])
    with pytest.raises(SettingError, match="extra_eos_tokens: expected token texts"):
        load(model, extra_eos_tokens=[""])
    # One string is one token's text, not one per character.
    llm = load(model, extra_eos_tokens="<|im_start|>")
    assert llm.tokenizer.eos_token_ids == (2, 0, 1)  # 0: <|endoftext|>, by its text


# -- --threads ----------------------------------------------------------------------
needs_native = pytest.mark.skipif(not native.status().available,
                                  reason="the native kernels are unavailable here")


def python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a new Python process (the thread pool is per process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)


@needs_native
def test_threads_sets_the_pool_size(model):
    done = python(f"""
        from mlxprog import native
        from mlxprog.cli import main
        code = main(["generate", "-m", {model!r}, "-p", "the", "--no-chat", "--max-tokens",
                     "2", "--max-length", "64", "--no-verbose", "--threads", "3"])
        print("RESULT", code, native.status().threads)
        """)
    assert "RESULT 0 3" in done.stdout, done.stderr


@needs_native
def test_set_threads_before_the_pool_starts_and_not_after():
    done = python("""
        from mlxprog import native
        native.set_threads(3)
        print("threads", native.status().threads)
        native.set_threads(3)  # the same count: nothing to change
        try:
            native.set_threads(2)
        except RuntimeError as exc:
            print("refused", exc)
        """)
    assert "threads 3" in done.stdout, done.stderr
    assert "refused the native kernels' thread pool already runs 3 thread(s) and cannot " \
           "resize to 2" in done.stdout


@pytest.mark.parametrize("value, message", [
    ("0", "must be in [1, 256], got 0"), ("100000", "must be in [1, 256], got 100000"),
    ("two", "expected an integer, got 'two'"),
])
def test_a_bad_thread_count_exits_2(model, value, message, capsys):
    for command in (["generate", "-p", PROMPT], ["chat"], ["serve"], ["perplexity", "-"]):
        code, _, err = run_cli(capsys, *command, "-m", model, "--threads", value)
        assert code == 2
        assert f"argument --threads: {message}" in err


@pytest.mark.parametrize("value", [0, -1, 257, 2.0, True, "4"])
def test_set_threads_checks_the_count(value):
    with pytest.raises(ValueError, match=r"threads must be an integer in \[1, 256\]"):
        native.set_threads(value)


def test_threads_refused_once_the_pool_runs_is_an_error_naming_the_flag(model, capsys):
    status = native.status()
    if not status.available:
        pytest.skip("the native kernels are unavailable here")
    other = 1 if status.threads != 1 else 2
    code, _, err = run_cli(capsys, "generate", "-m", model, "-p", PROMPT, "--threads",
                           str(other))
    assert code == 1
    assert f"error: --threads {other}: the native kernels' thread pool already runs" in err
