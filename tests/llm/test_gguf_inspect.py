"""``mlxprog inspect`` on GGUF model files (:func:`mlxprog.ggml.gguf_file.describe`):
what the header says, without reading tensor data."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from llm_fixtures import smollm_path

from mlxprog.cli import main
from mlxprog.ggml.gguf_file import GGUFFile, describe, open_gguf


def write_model(path, *, retired: bool = False) -> None:
    """A small GGUF file with the keys ``inspect`` shows, F32, F16 and Q8_0
    tensors, and with ``retired`` one tensor of the retired type Q4_2."""
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_name("Tiny Test Model")
    writer.add_context_length(4096)
    writer.add_chat_template("{{ messages }}")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.zeros((3, 64), np.float32))
    writer.add_tensor("output_norm.weight", np.zeros(64, np.float16))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 2 * 34), np.uint8), raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((2, 2 * 34), np.uint8),
                      raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if retired:
        # Q4_2 (id 4) had Q4_0's 18-byte blocks: the output norm, 64 F16
        # values (128 bytes), becomes 2 blocks of Q4_2 in the same bytes.
        data = bytearray(path.read_bytes())
        name = b"output_norm.weight"
        type_at = data.index(name) + len(name) + 4 + 8
        data[type_at:type_at + 4] = (4).to_bytes(4, "little")
        path.write_bytes(bytes(data))


EXPECTED = """\
architecture: qwen3
name: Tiny Test Model
parameters: 640
context length: 4,096
chat template: yes
tokenizer: gpt2, vocabulary 3 tokens
metadata: 6 keys
tensors: 4
  type   tensors            bytes
  F16          1              128
  F32          1              768
  Q8_0         2              408
  total        4  1,304 (1.3 KiB)
every tensor type is supported"""


def test_describe(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_model(path)
    with open_gguf(path) as model:
        text = describe(model)
    assert text == f"GGUF file: {path} (version 3)\n" + EXPECTED


def test_inspect_a_gguf_file_whatever_its_name(tmp_path, capsys):
    path = tmp_path / "model.bin"
    write_model(path)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == f"GGUF file: {path} (version 3)\n" + EXPECTED + "\n"


def test_inspect_reads_no_tensor_data(tmp_path, capsys, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_model(path)

    def no_reading(self, name):
        raise AssertionError(f"inspect read tensor {name}")

    monkeypatch.setattr(GGUFFile, "read", no_reading)
    assert main(["inspect", str(path)]) == 0
    assert "every tensor type is supported" in capsys.readouterr().out


def test_inspect_lists_unsupported_types(tmp_path, capsys):
    path = tmp_path / "old.gguf"
    write_model(path, retired=True)
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  Q4_2 (retired)        1                ?\n" in out
    assert "  total                 4  1,176 (1.1 KiB)\n" in out
    assert ("unsupported types: Q4_2 (retired) (1 tensor); mlxprog cannot load this file"
            in out)
    assert "parameters: 640\n" in out


def test_inspect_a_damaged_gguf_file(tmp_path, capsys):
    path = tmp_path / "cut.gguf"
    write_model(path)
    path.write_bytes(path.read_bytes()[:100])
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot read GGUF file {path}: ") and err.count("\n") == 1


@pytest.mark.parametrize("strict", [True, False])
def test_describe_without_tokenizer_or_name(tmp_path, strict):
    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("w", np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open_gguf(path, strict_types=strict) as model:
        text = describe(model)
    assert "name: (not set)\n" in text
    assert "context length: (not set)\n" in text
    assert "chat template: no\n" in text
    assert "tokenizer: (not set), vocabulary (not set)\n" in text


def test_inspect_smollm2(capsys):
    path = smollm_path()
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    for line in ("architecture: llama", "parameters: 134,515,008 (134.5M)",
                 "context length: 8,192", "chat template: yes",
                 "tokenizer: gpt2, vocabulary 49,152 tokens", "tensors: 272",
                 "  Q4_1       210  66,355,200 (63.3 MiB)", "every tensor type is supported"):
        assert line + "\n" in out, out


@pytest.mark.parametrize("used, line", [
    (2, "experts: 4 per layer, 2 used per token (active parameters 96)"),
    (None, "experts: 4 per layer, experts used per token (not set)"),
    (5, "experts: 4 per layer, experts used per token 5"),
])
def test_describe_a_mixture_of_experts(tmp_path, used, line):
    path = tmp_path / "moe.gguf"
    writer = gguf.GGUFWriter(path, "qwen3moe")
    writer.add_expert_count(4)
    if used is not None:
        writer.add_expert_used_count(used)
    # 64 dense parameters and an expert stack of 4 experts x 2 x 8: a token
    # reads the dense ones and 2 of the 4 experts' 16.
    writer.add_tensor("token_embd.weight", np.zeros((4, 16), np.float32))
    writer.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((4, 2, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open_gguf(path) as model:
        text = describe(model)
    assert "parameters: 128\n" + line + "\n" in text, text


def test_describe_a_dense_model_names_no_experts(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_model(path)
    with open_gguf(path) as model:
        assert "experts" not in describe(model)
