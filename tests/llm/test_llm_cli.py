"""``mlxprog generate`` and ``mlxprog chat`` as a user drives them: JSON and
quiet output, the finish reason, prompt caches in files, chats that keep
their cache and outgrow it, Ctrl-C (simulated, and a real SIGINT to a real
process); directories written by ``mlxprog export-llm`` as the model of
every command; model paths that are not models; the native build kept out
of the stats."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
from llm_fixtures import write_gguf

import mlxprog.llm.cli as llm_cli
from mlxprog import Program, native
from mlxprog.cli import main
from mlxprog.llm import load

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_gguf(path, tied=False)
    return str(path)


def generate(model: str, *flags: str) -> list[str]:
    return ["generate", "-m", model, "-p", PROMPT, "--no-chat", "--max-length", "64", *flags]


def test_generate_json_prints_one_object(model, capsys):
    expected = load(model, max_length=64).generate(PROMPT, max_tokens=6, chat=False)
    assert main(generate(model, "--max-tokens", "6", "--json", "--no-verbose")) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert (out["text"], out["tokens"], out["finish_reason"]) == (
        expected.text, expected.tokens, expected.finish_reason)
    assert out["stats"]["generated_tokens"] == 6 and "decode_tps" in out["stats"]
    assert captured.err == ""


def test_generate_names_a_full_cache_as_the_finish_reason(model, capsys):
    long_prompt = " ".join(["the quick brown fox"] * 3)
    assert main(["generate", "-m", model, "-p", long_prompt, "--no-chat", "--max-length", "64",
                 "--max-tokens", "50"]) == 0
    err = capsys.readouterr().err
    assert "finish: length (the KV cache of 64 tokens is full; raise --max-length)" in err


def test_generate_with_a_prompt_cache_file(model, tmp_path, capsys):
    path = tmp_path / "cache.safetensors"
    assert main(generate(model, "--max-tokens", "4", "--prompt-cache", str(path))) == 0
    assert path.exists()
    first = capsys.readouterr()
    assert "cached" not in first.err
    assert main(generate(model, "--max-tokens", "4", "--prompt-cache", str(path))) == 0
    second = capsys.readouterr()
    n = len(load(model, max_length=64).tokenizer.encode(PROMPT))
    assert f"({n - 1} cached)" in second.err and second.out == first.out


def test_a_prompt_too_long_names_the_flag(model, capsys):
    assert main(["generate", "-m", model, "-p", "x" * 100, "--no-chat", "--max-length", "64"]) == 1
    assert capsys.readouterr().err == (
        "error: the prompt has 100 tokens, but the KV cache holds 64 (--max-length); "
        "raise --max-length or shorten it\n")


def test_ctrl_c_during_generate_keeps_the_text_and_exits_130(model, capsys, monkeypatch):
    written: list[str] = []

    def write(text: str) -> None:
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(text)
        sys.stdout.write(text)

    monkeypatch.setattr(llm_cli, "_write", write)
    assert main(generate(model, "--max-tokens", "20")) == 130
    captured = capsys.readouterr()
    assert captured.out == "".join(written) + "\n"
    assert "finish: interrupted" in captured.err and "Traceback" not in captured.err


def chat(model: str, monkeypatch, lines: list, *flags: str) -> int:
    """Run ``mlxprog chat`` with ``lines`` typed (an exception instance is
    raised by input() instead)."""
    feed = iter(lines)

    def fake_input(prompt: str = "") -> str:
        item = next(feed)
        if isinstance(item, BaseException):
            raise item
        return item

    monkeypatch.setattr("builtins.input", fake_input)
    return main(["chat", "-m", model, "--max-length", "64", "--max-tokens", "12", *flags])


def test_chat_keeps_its_cache_across_turns(model, capsys, monkeypatch):
    assert chat(model, monkeypatch, ["he", "fox", EOFError()], "--verbose") == 0
    stats = [line for line in capsys.readouterr().err.splitlines() if line.startswith("prompt:")]
    assert len(stats) == 2
    assert "cached" not in stats[0] and "cached" in stats[1]


def test_chat_outgrowing_the_cache_drops_old_turns_and_goes_on(model, capsys, monkeypatch):
    lines = [f"the quick brown fox {i}" for i in range(5)] + ["x" * 100, "he", ""]
    assert chat(model, monkeypatch, lines) == 0
    err = capsys.readouterr().err
    assert "oldest exchange" in err and "(--max-length)" in err
    assert "error: the message makes a prompt of" in err  # the long one, and the chat goes on


def test_ctrl_c_in_chat_stops_the_reply_then_quits(model, capsys, monkeypatch):
    pieces: list[str] = []

    def write(text: str) -> None:
        pieces.append(text)
        if len(pieces) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(llm_cli, "_write", write)
    assert chat(model, monkeypatch, ["he", KeyboardInterrupt()]) == 130
    err = capsys.readouterr().err
    assert "[interrupted]" in err and "Traceback" not in err


def test_ctrl_d_in_chat_exits_0(model, capsys, monkeypatch):
    assert chat(model, monkeypatch, [EOFError()]) == 0


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_real_sigint_at_the_chat_prompt_exits_quietly(model):
    process = subprocess.Popen(
        [sys.executable, "-m", "mlxprog", "chat", "-m", model, "--max-length", "64"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = process.stderr.readline()  # printed once the model is loaded
        assert "mlxprog chat" in banner
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert "Traceback" not in err


# -- exported directories as models --------------------------------------------


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory) -> str:
    """The tiny model's programs, written by ``mlxprog export-llm -m``."""
    out = tmp_path_factory.mktemp("exported")
    assert main(["export-llm", "-m", model, "-o", str(out), "--max-length", "64"]) == 0
    return str(out)


def test_export_llm_takes_the_model_as_m_or_as_the_argument(model, exported, tmp_path, capsys):
    assert main(["export-llm", model, "-o", str(tmp_path), "--max-length", "64"]) == 0
    assert (tmp_path / "decode.json").read_text() == (Path(exported) / "decode.json").read_text()
    capsys.readouterr()
    assert main(["export-llm", model, "-m", model, "-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "mlxprog export-llm: error: argument -m/--model: not allowed with argument MODEL\n"
        "Run 'mlxprog export-llm --help' for usage.\n")


def test_generate_runs_an_exported_directory(model, exported, capsys):
    assert main(generate(model, "--max-tokens", "6", "--json", "--no-verbose")) == 0
    from_model = json.loads(capsys.readouterr().out)
    # Without --max-length: the directory's own (64), not the default 2048.
    assert main(["generate", "-m", exported, "-p", PROMPT, "--no-chat", "--max-tokens", "6",
                 "--json", "--no-verbose"]) == 0
    from_programs = json.loads(capsys.readouterr().out)
    assert from_programs["tokens"] == from_model["tokens"]
    assert from_programs["numerics"] == from_model["numerics"]


def test_an_exported_directory_refuses_another_length_or_numerics(exported, capsys):
    numerics = json.loads((Path(exported) / "manifest.json").read_text())["numerics"]
    other = "exact" if numerics == "int8" else "int8"
    for flags, given in ((["--max-length", "128"], "max_length 64, not 128"),
                         (["--numerics", other], f"numerics {numerics!r}, not {other!r}")):
        assert main(["generate", "-m", exported, "-p", PROMPT, *flags]) == 1
        assert capsys.readouterr().err == (
            f"error: {exported}: the programs were exported with {given}; export them "
            "again for another\n")


def test_chat_and_perplexity_run_an_exported_directory(model, exported, tmp_path, capsys,
                                                       monkeypatch):
    assert chat(exported, monkeypatch, ["he", EOFError()]) == 0
    assert "[the reply stopped at length (--max-tokens 12)]" in capsys.readouterr().err
    text = tmp_path / "text.txt"
    text.write_text(PROMPT * 3)
    scores = []
    for given in (model, exported):
        assert main(["perplexity", "-m", given, str(text), "--json"]) == 0
        scores.append(json.loads(capsys.readouterr().out))
    assert scores[1]["perplexity"] == pytest.approx(scores[0]["perplexity"], rel=1e-5)


def test_serve_runs_an_exported_directory(exported, capsys, monkeypatch):
    served = []

    class Server:  # records what it would serve
        def __init__(self, llm, **options):
            served.append(llm)

        def run(self, host, port):
            pass

    monkeypatch.setattr("mlxprog.llm.server.Server", Server)
    assert main(["serve", "-m", exported]) == 0
    (llm,) = served
    assert llm.max_length == 64
    assert llm.program("decode") == Program.load(Path(exported) / "decode.json")


# -- model paths that are not models ---------------------------------------------


@pytest.mark.parametrize("command", [
    ["generate", "-p", "hi", "-m"], ["chat", "-m"], ["serve", "-m"],
    ["perplexity", "-", "-m"], ["export-llm", "-o", "out", "-m"], ["export-llm", "-o", "out"],
])
def test_a_missing_model_path_is_an_error_naming_it(tmp_path, capsys, command):
    missing = tmp_path / "nope.gguf"
    assert main([*command, str(missing)]) == 1
    flag = command[-1] if command[-1] == "-m" else "model"
    assert capsys.readouterr().err == f"error: {flag} {missing}: no such file or directory\n"


def test_a_text_file_named_gguf_is_no_gguf_file(tmp_path, capsys):
    path = tmp_path / "x.gguf"
    path.write_text("hello\n")
    assert main(["generate", "-m", str(path), "-p", "hi"]) == 1
    assert capsys.readouterr().err == (
        f"error: cannot read GGUF file {path}: not a GGUF file (it starts with b'hell', "
        "not b'GGUF')\n")


# -- the native build is not timed ---------------------------------------------------


def test_load_builds_the_native_kernels_before_anything_is_timed(model, monkeypatch):
    asked = []
    monkeypatch.setattr(native, "status", lambda: asked.append("status"))
    monkeypatch.setattr(mx, "default_device", lambda: mx.cpu)
    load(model, max_length=64, native=True)
    assert asked == ["status"]  # before any generation starts its clock
    load(model, max_length=64, native=False)
    assert asked == ["status"]


@pytest.mark.parametrize("seconds, note", [
    (42.4, " (native kernels built in 42 s, not timed)"), (None, ""),
])
def test_the_stats_line_says_when_this_run_built_the_native_kernels(model, capsys,
                                                                    monkeypatch, seconds,
                                                                    note):
    monkeypatch.setattr(native, "build_seconds", lambda: seconds)
    assert main(generate(model, "--max-tokens", "2")) == 0
    stats = capsys.readouterr().err.splitlines()[-1]
    assert stats.endswith(f"| finish: length (--max-tokens 2){note}"), stats
