"""The LLM layer's numerics choice (``numerics="exact" | "int8"``, the
``quantized_matmul`` op's attribute): its default by device, the programs it
builds, export and ``load_exported``, the CLI's ``--numerics`` and where the
resolved choice shows (``--json``, ``--verbose``, the server's model card)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import mlx.core as mx
import pytest
from llm_fixtures import write_hf

from mlxprog.cli import main
from mlxprog.format.program import Program
from mlxprog.llm import (
    ModelError, build_decode, build_decode_loop, build_prefill, export, load, load_exported,
)
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.compiled import program_numerics
from mlxprog.llm.options import resolve_numerics
from mlxprog.llm.server import Server

MAX_LENGTH = 64
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    """A tiny quantized model: 4-bit projections, an 8-bit tied embedding."""
    path = tmp_path_factory.mktemp("tiny-q") / "hf-q"
    write_hf(path, quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32))
    return path


def quantized_matmuls(program) -> list[dict]:
    """Every instruction of ``program`` that multiplies quantized weights
    (``quantized_matmul``, ``transformer_layer``), subprograms included."""
    found: list[dict] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if node.get("op") in ("quantized_matmul", "transformer_layer"):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(program.to_dict())
    return found


# -- the default ----------------------------------------------------------------


def test_auto_is_int8_on_the_cpu_with_native_kernels(monkeypatch):
    assert mx.default_device() == mx.cpu
    monkeypatch.setenv("MLXPROG_NATIVE", "1")
    assert resolve_numerics(None) == resolve_numerics("auto") == "int8"
    # Only the native kernels implement int8: without them, auto is exact.
    assert resolve_numerics(None, native=False) == "exact"
    monkeypatch.setenv("MLXPROG_NATIVE", "0")
    assert resolve_numerics(None) == "exact"
    assert resolve_numerics(None, native=True) == "int8"
    # An explicit choice is kept whatever the device and kernels.
    assert resolve_numerics("int8", native=False) == "int8"
    assert resolve_numerics("exact", native=True) == "exact"


def test_auto_is_exact_off_the_cpu(monkeypatch):
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    assert resolve_numerics(None, native=True) == "exact"


def test_a_bad_numerics_is_an_error_naming_the_choices(model_path):
    with pytest.raises(ModelError, match="numerics must be one of 'auto', 'exact', 'int8' or "
                                         "None, got 'fp16'"):
        load(model_path, max_length=MAX_LENGTH, numerics="fp16")


def test_the_llm_exposes_the_resolved_numerics(model_path, monkeypatch):
    monkeypatch.setenv("MLXPROG_NATIVE", "1")
    assert load(model_path, max_length=MAX_LENGTH).numerics == "int8"
    assert load(model_path, max_length=MAX_LENGTH, numerics="exact").numerics == "exact"
    assert load(model_path, max_length=MAX_LENGTH, native=False).numerics == "exact"


# -- the programs ------------------------------------------------------------------


@pytest.mark.parametrize("kind, builder", [
    ("prefill", build_prefill), ("decode", build_decode), ("decode_loop", build_decode_loop),
])
def test_programs_carry_the_attribute_only_in_int8_mode(model_path, kind, builder):
    exact = load(model_path, max_length=MAX_LENGTH, numerics="exact")
    int8 = load(model_path, max_length=MAX_LENGTH, numerics="int8")
    # Exact programs are the ones built without a numerics choice, byte for byte.
    # What generation runs: steps returning logits, a greedy decode loop.
    before = builder(exact.spec, MAX_LENGTH, *([] if kind == "decode_loop" else [None]))
    assert exact.program(kind).to_json() == before.to_json()
    assert '"numerics"' not in before.to_json()
    if kind == "prefill":  # int8 saves a prefill no time: it stays exact (program_numerics)
        assert int8.program(kind).to_json() == before.to_json()
        return
    # The same quantized matmuls (the layers' and the tied head's), each int8.
    matmuls = quantized_matmuls(int8.program(kind))
    assert len(matmuls) == len(quantized_matmuls(exact.program(kind))) > 2
    assert all(m["attrs"]["numerics"] == "int8" for m in matmuls)


def test_generation_runs_in_both_modes(model_path):
    # Until the integer kernel lands, int8 computes what exact does; afterwards
    # both must still generate (the tokens may part).
    for numerics in ("exact", "int8"):
        out = load(model_path, max_length=MAX_LENGTH, numerics=numerics).generate(
            PROMPT, max_tokens=6, chat=False)
        assert out.stats.generated_tokens == 6


# -- export --------------------------------------------------------------------------


def test_export_round_trip_keeps_the_numerics(model_path, tmp_path):
    llm = load(model_path, max_length=MAX_LENGTH, numerics="int8")
    export(llm, tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["numerics"] == "int8"
    exported = load_exported(tmp_path)
    assert exported.numerics == "int8"
    for kind in ("prefill", "decode", "decode_loop"):
        assert Program.load(tmp_path / f"{kind}.json").to_json() == llm.program(kind).to_json()
        assert all(m["attrs"].get("numerics", "exact") == program_numerics(kind, "int8").dense
                   for m in quantized_matmuls(exported.program(kind)))
    expected = llm.generate(PROMPT, max_tokens=8, chat=False).tokens
    assert exported.generate(PROMPT, max_tokens=8, chat=False).tokens == expected


def test_a_manifest_without_numerics_is_exact_and_a_bad_one_an_error(model_path, tmp_path):
    export(load(model_path, max_length=MAX_LENGTH, numerics="exact"), tmp_path)
    path = tmp_path / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest.pop("numerics") == "exact"
    path.write_text(json.dumps(manifest))  # as written before the choice existed
    assert load_exported(tmp_path).numerics == "exact"
    path.write_text(json.dumps({**manifest, "numerics": "int4"}))
    with pytest.raises(ModelError, match=f"{path}: numerics 'int4' is not one of 'exact', "
                                         "'int8'"):
        load_exported(tmp_path)


def test_export_llm_numerics_flag(model_path, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export-llm", str(model_path), "-o", str(out), "--max-length",
                 str(MAX_LENGTH), "--numerics", "int8"]) == 0
    capsys.readouterr()
    assert json.loads((out / "manifest.json").read_text())["numerics"] == "int8"
    assert all(m["attrs"]["numerics"] == "int8"
               for m in quantized_matmuls(load_exported(out).program("decode")))
    assert main(["export-llm", str(model_path), "-o", str(out), "--max-length",
                 str(MAX_LENGTH), "--numerics", "exact"]) == 0
    assert '"numerics"' not in (out / "decode.json").read_text()
    assert load_exported(out).numerics == "exact"


# -- where the choice shows --------------------------------------------------------------


@pytest.mark.parametrize("numerics", ["exact", "int8"])
def test_generate_shows_the_numerics(model_path, capsys, numerics):
    argv = ["generate", "-m", str(model_path), "-p", PROMPT, "--no-chat", "--max-length",
            str(MAX_LENGTH), "--max-tokens", "3", "--numerics", numerics]
    assert main([*argv, "--json", "--no-verbose"]) == 0
    assert json.loads(capsys.readouterr().out)["numerics"] == numerics
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f" | numerics: {numerics} | finish: length (--max-tokens 3)" in err


def test_the_servers_model_card_names_the_numerics(model_path):
    server = Server(load(model_path, max_length=MAX_LENGTH, numerics="int8"), model_id="tiny")
    url = server.start()
    try:
        with urllib.request.urlopen(f"{url}/v1/models/tiny", timeout=60) as response:
            card = json.loads(response.read())
    finally:
        server.stop()
    assert (card["id"], card["numerics"]) == ("tiny", "int8")
