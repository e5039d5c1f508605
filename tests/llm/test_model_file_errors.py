"""Model files that are not what their names say, in our words (naming the
file) rather than MLX's, and exported directories given where a model is."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import pytest
from llm_fixtures import tiny_tokenizer_metadata, write_gguf, write_hf

from mlxprog.ggml.gguf_file import open_gguf
from mlxprog.llm import ModelError, export, load, load_checkpoint
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import (
    FAMILIES, family_for_gguf, supported_gguf_architectures, supported_model_types,
)
from mlxprog.llm.models.base import GGUFMetadata
from mlxprog.llm.tokenizer import Tokenizer


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


# Values of every other kind than a GGUF key's own: a file's metadata is as
# hostile as its tensors.
_WRONG_KINDS = {
    "a string": "abc",
    "strings": ["a", "b"],
    "a negative integer": mx.array(-1, dtype=mx.int32),
    "a huge integer": mx.array(2**40, dtype=mx.uint64),
    "a fraction": mx.array(1.5),
    "NaN": mx.array(float("nan")),
    "integers": mx.array([1, 2], dtype=mx.int32),
}
# The keys of write_gguf's llama file.
_TINY_KEYS = (
    "general.architecture", "llama.attention.head_count", "llama.attention.head_count_kv",
    "llama.attention.key_length", "llama.attention.layer_norm_rms_epsilon", "llama.block_count",
    "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
    "llama.rope.freq_base", "tokenizer.chat_template", "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.merges",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.token_type",
    "tokenizer.ggml.tokens")


@pytest.mark.parametrize("key", _TINY_KEYS)
def test_a_metadata_value_of_another_kind_is_refused_in_our_words_or_loads(tmp_path, key):
    for kind, value in _WRONG_KINDS.items():
        path = tmp_path / f"{kind}.gguf"
        write_gguf(path, **{key: value})
        try:
            checkpoint = load_checkpoint(path)
        except ModelError as e:
            assert str(path) in str(e), (kind, str(e))
            continue
        # What loads is a model that runs (a value the loader may take:
        # an out-of-vocabulary token id is left out, as llama.cpp does).
        assert checkpoint.tokenizer.decode(checkpoint.tokenizer.encode("Hi")) == "Hi", kind


def test_metadata_errors_name_the_key_and_what_it_must_be(tmp_path):
    cases = {
        "tokenizer.ggml.bos_token_id": ("abc", "GGUF metadata key tokenizer.ggml.bos_token_id "
                                               "must be an integer, got 'abc'"),
        "tokenizer.ggml.tokens": (mx.array([1, 2], dtype=mx.int32),
                                  "GGUF metadata key tokenizer.ggml.tokens must be an array of "
                                  "strings, got [1, 2]"),
        "llama.rope.freq_base": ("abc", "GGUF metadata key llama.rope.freq_base must be a "
                                        "finite number, got 'abc'"),
        "llama.embedding_length": (mx.array(0, dtype=mx.int32),
                                   "GGUF metadata key llama.embedding_length must be positive, "
                                   "got 0"),
        # Checked before any per-layer list is built from it.
        "llama.block_count": (mx.array(2**40, dtype=mx.uint64),
                              "GGUF metadata key llama.block_count is 1,099,511,627,776; it must "
                              "be from 1 to {tensors} (the file's tensors)"),
    }
    for key, (value, message) in cases.items():
        path = tmp_path / "bad.gguf"
        write_gguf(path, **{key: value})
        with open_gguf(path) as gguf:
            tensors = len(gguf.tensors)
        with pytest.raises(ModelError, match=re.escape(f"{path}: " + message.format(
                tensors=tensors))):
            load_checkpoint(path)


def test_a_special_token_id_outside_the_vocabulary_is_left_out_with_a_notice(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_gguf(path, **{"tokenizer.ggml.bos_token_id": mx.array(10**6, dtype=mx.uint32)})
    checkpoint = load_checkpoint(path)
    assert checkpoint.tokenizer.bos_token_id is None
    assert ("GGUF metadata key tokenizer.ggml.bos_token_id is 1000000, outside the vocabulary"
            in capsys.readouterr().err)


def test_a_merge_that_is_not_two_tokens_is_named(tmp_path):
    path = tmp_path / "tiny.gguf"
    merges = list(tiny_tokenizer_metadata()["tokenizer.ggml.merges"])
    write_gguf(path, **{"tokenizer.ggml.merges": [*merges[:3], "abc", *merges[3:]]})
    with pytest.raises(ModelError, match=re.escape(
            "GGUF metadata key tokenizer.ggml.merges: entry 3 ('abc') is not two tokens joined "
            "by a space")):
        load_checkpoint(path)


def test_every_familys_gguf_keys_of_another_kind_are_refused_in_our_words():
    """Each family's own keys (sliding windows, soft-caps, RoPE scaling,
    expert counts, ...) with values of every other kind: the config is a
    :class:`ModelError` or builds."""
    tokenizer = Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata())
    sizes = {"embedding_length": 64, "block_count": 2, "feed_forward_length": 128,
             "attention.head_count": 4, "attention.head_count_kv": 2,
             "attention.key_length": 16, "attention.layer_norm_rms_epsilon": 1e-5,
             "context_length": 256, "expert_count": 4, "expert_used_count": 2,
             "expert_feed_forward_length": 32, "expert_shared_feed_forward_length": 32}
    family_keys = ["attention.sliding_window", "attn_logit_softcapping",
                   "final_logit_softcapping", "attention.sliding_window_pattern",
                   "rope.freq_base", "rope.freq_base_swa", "rope.dimension_count",
                   "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear",
                   "rope.scaling.original_context_length", "rope.scaling.attn_factor",
                   "rope.scaling.yarn_beta_fast", "expert_weights_norm", "vocab_size",
                   "attention.value_length", *sizes]
    wrong = ["abc", ["a", "b"], [[1]], -1, 0, 2**40, 1.5, float("nan"), float("inf"), True]
    tensors = {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight"}
    dense = {k: v for k, v in sizes.items() if not k.startswith("expert")}
    bases = [{"general.architecture": architecture,
              **{f"{architecture}.{k}": v for k, v in keys.items()}}
             for architecture in supported_gguf_architectures() for keys in (dense, sizes)]
    reached = set()
    for base in bases:
        architecture = base["general.architecture"]
        try:
            family = family_for_gguf(architecture, base)
        except ModelError:  # a dense architecture with experts, or the reverse
            continue
        reached.add(family.name)
        for key in family_keys:
            for value in wrong:
                metadata = {**base, f"{architecture}.{key}": value}
                try:
                    family.config_from_gguf(GGUFMetadata(metadata, tensors, tokenizer))
                except ModelError:
                    pass
    assert reached == set(FAMILIES)


def test_every_model_types_config_fields_of_another_kind_are_refused_in_our_words(tmp_path):
    """config.json is hostile input too: each field a family reads, with
    values of every other kind, is a :class:`ModelError` or a config."""
    write_hf(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    tokenizer = Tokenizer.from_hf(tmp_path)
    fields = [*raw, "rope_scaling", "sliding_window", "num_local_experts", "num_experts",
              "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
              "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
              "rope_local_base_freq", "sliding_window_pattern", "partial_rotary_factor",
              "original_max_position_embeddings", "norm_topk_prob", "rope_parameters",
              "layer_types", "mlp_only_layers"]
    wrong = ["abc", ["a", "b"], [[1]], {"a": 1}, -1, 0, 2**40, 1.5, float("nan"), True]
    for model_type in supported_model_types():
        for field in fields:
            for value in wrong:
                try:
                    config_from_hf({**raw, "model_type": model_type, field: value}, tokenizer)
                except ModelError:
                    pass


def test_tokenizer_config_fields_of_another_kind_are_refused_in_our_words(tmp_path):
    write_hf(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    wrong = [7, ["a"], [{"name": "default"}], [7], {"content": 7}, {"a": 1}, True, 1.5]
    for key in ("bos_token", "eos_token", "chat_template"):
        for value in wrong:
            config_path.write_text(json.dumps({**config, key: value}))
            try:
                Tokenizer.from_hf(tmp_path)
            except ModelError as e:
                assert str(config_path) in str(e)
    for text in ("[1, 2]", '"text"', "7"):
        config_path.write_text(text)
        with pytest.raises(ModelError, match=re.escape(f"{config_path}: not a JSON object")):
            Tokenizer.from_hf(tmp_path)
    config_path.write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ bad")
    with pytest.raises(ModelError, match="cannot read the chat template"):
        Tokenizer.from_hf(tmp_path)
