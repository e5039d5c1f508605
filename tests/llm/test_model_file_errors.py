"""Model files that are not what their names say, in our words (naming the
file) rather than MLX's, and exported directories given where a model is."""

from __future__ import annotations

import re

import pytest
from llm_fixtures import write_gguf, write_hf

from mlxprog.llm import ModelError, export, load, load_checkpoint


def test_a_text_file_named_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_text("hello\n")
    with pytest.raises(ModelError, match=re.escape(
            f"cannot read GGUF file {path}: not a GGUF file (it starts with b'hell', "
            "not b'GGUF')")):
        load_checkpoint(path)


def test_a_gguf_file_damaged_after_its_magic_keeps_mlxs_reason(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 8)
    with pytest.raises(ModelError, match=re.escape(f"cannot read GGUF file {path}: ")):
        load_checkpoint(path)


def test_a_hugging_face_directory_with_a_text_file_named_safetensors(tmp_path):
    write_hf(tmp_path)
    shard = tmp_path / "model-00001-of-00002.safetensors"
    shard.write_text("hello\n")
    with pytest.raises(ModelError, match=re.escape(
            f"cannot read safetensors file {shard}: not a safetensors file (it does not "
            "start with the length of a JSON header)")):
        load_checkpoint(tmp_path)


def test_an_exported_directory_is_no_checkpoint_but_load_runs_it(tmp_path):
    model = tmp_path / "tiny.gguf"
    write_gguf(model, tied=False)
    out = tmp_path / "exported"
    export(load(model, max_length=64), out)
    with pytest.raises(ModelError, match=re.escape(
            f"{out} holds programs written by mlxprog export-llm, not a model; "
            "mlxprog.llm.load runs them with the model their manifest names")):
        load_checkpoint(out)
    llm = load(out)
    assert (llm.max_length, llm.checkpoint.path) == (64, model)
    with pytest.raises(ModelError, match=re.escape(
            f"{out}: the programs were exported with max_length 64, not 2048; export them "
            "again for another")):
        load(out, max_length=2048)
