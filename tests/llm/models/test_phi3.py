"""The phi3 family against mlx-lm, from tiny checkpoints mlx-lm writes and
loads itself (fused q/k/v and gate/up tensors; partial RoPE; linear and
longrope scaling): logits, greedy tokens, batches and prompt caches; the
fused tensors' split at load; the GGUF file llama.cpp's converter would
write; configs it refuses; a missing weight."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from family_checks import (MlxLmParity, MAX_LENGTH, PROMPT_IDS, TINY_CONFIG, load_tiny,
                           mlx_lm_logits, mlx_lm_model, program_logits, write_checkpoint)
from mlx.utils import tree_flatten

from mlxprog.llm import ModelError, build_prefill, load
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import model_spec

#: The sliding_window, shorter than the prompt, is ignored (as by mlx-lm and
#: Hugging Face).
PHI3 = dict(TINY_CONFIG, model_type="phi3", rope_theta=10000.0, hidden_act="silu",
            original_max_position_embeddings=128, sliding_window=16)
#: The long factors of 12 rotated features (head_dim 16, factor 0.75).
LONG_FACTOR = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0]
CONFIGS = {
    # Full rotary, linear scaling (mlx-lm reads the scaling only with a long_factor).
    "phi3-linear": dict(PHI3, tie_word_embeddings=True,
                        rope_scaling={"type": "linear", "factor": 2.0, "long_factor": [1.0]}),
    "phi3-partial": dict(PHI3, partial_rotary_factor=0.75),
    # max_position_embeddings 512 is 4 times the original 128: the rotated
    # features are scaled by sqrt(1 + log 4 / log 128).
    "phi3-longrope": dict(PHI3, partial_rotary_factor=0.75, rope_scaling={
        "type": "longrope", "long_factor": LONG_FACTOR, "short_factor": [1.0] * 6}),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm, for
    every config."""


# llama.cpp's converter refuses Phi3's linear scaling: no GGUF of phi3-linear.
@pytest.mark.parametrize("name", ["phi3-partial", "phi3-longrope"])
def test_gguf_gives_the_checkpoints_logits(tmp_path, name):
    """The GGUF file of the checkpoint (fused ``attn_qkv`` and ``ffn_up``,
    ``rope.dimension_count``, longrope factors as tensors with the
    attention factor) gives the directory's logits."""
    from gguf_writer import write_gguf_from_hf

    directory = write_checkpoint(tmp_path / name, CONFIGS[name])
    gguf = load_tiny(write_gguf_from_hf(directory, tmp_path / "model.gguf"))
    hf = load_tiny(directory)
    assert gguf.config.rope_dims == hf.config.rope_dims == 12
    assert gguf.config.rotary_freqs == hf.config.rotary_freqs
    assert gguf.config.rotated_scale == pytest.approx(hf.config.rotated_scale)
    continuation = [5, 60, 7]
    np.testing.assert_allclose(program_logits(gguf, PROMPT_IDS, continuation),
                               program_logits(hf, PROMPT_IDS, continuation),
                               rtol=1e-5, atol=1e-5)


def test_fused_tensors_are_split_at_load_and_fused_again(checkpoint):
    llm = load_tiny(checkpoint)
    stored = mx.load(str(checkpoint / "model.safetensors"))
    qkv = stored["model.layers.1.self_attn.qkv_proj.weight"]
    gate_up = stored["model.layers.1.mlp.gate_up_proj.weight"]
    w = llm.checkpoint.weights
    q, kv = 4 * 16, 2 * 16
    assert mx.array_equal(w["layers.1.self_attn.q_proj.weight"], qkv[:q])
    assert mx.array_equal(w["layers.1.self_attn.v_proj.weight"], qkv[q + kv:])
    assert mx.array_equal(w["layers.1.mlp.up_proj.weight"], gate_up[128:])
    assert llm.checkpoint.source_names["layers.1.self_attn.k_proj.weight"] == \
        f"model.layers.1.self_attn.qkv_proj.weight[{q}:{q + kv}]"
    spec = model_spec(llm.checkpoint)
    assert {"layers.1.self_attn.qkv_proj", "layers.1.mlp.gate_up_proj"} <= spec.fused.keys()
    # Split by rows like llama's projections: 2 ranks of one KV head each.
    rank1 = spec.captures(llm.checkpoint, 2, 1)
    assert mx.array_equal(rank1[f"model.layers.1.self_attn.qkv_proj.weight[{q}:{q + kv}]"],
                          qkv[q + 16:q + kv])


@pytest.mark.parametrize("name, whole_layers", [("phi3-partial", 3), ("phi3-longrope", 0)])
def test_quantized_model_matches_mlx_lm(tmp_path, name, whole_layers):
    """4-bit projections: with partial RoPE each layer is one
    ``transformer_layer`` op (rotating 12 of 16 features); longrope's scale
    keeps the layers apart. The logits match mlx-lm's on the same quantized
    model."""
    directory = write_checkpoint(tmp_path / name, CONFIGS[name])
    model = mlx_lm_model(directory)
    nn.quantize(model, group_size=32, bits=4)
    mx.save_safetensors(str(directory / "model.safetensors"),
                        dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(
        dict(CONFIGS[name], quantization={"group_size": 32, "bits": 4})))
    expected = mlx_lm_logits(mlx_lm_model(directory), PROMPT_IDS)[-1:]
    llm = load_tiny(directory, numerics="exact")
    program = build_prefill(llm.spec, MAX_LENGTH, sampling=None).model_dump_json()
    assert program.count('"op":"transformer_layer"') == whole_layers
    np.testing.assert_allclose(program_logits(llm, PROMPT_IDS), expected, rtol=1e-4, atol=1e-4)


def test_longrope_settings():
    c = config_from_hf(CONFIGS["phi3-longrope"])
    assert c.rope_dims == 12
    assert c.rotated_scale == pytest.approx(math.sqrt(1 + math.log(4) / math.log(128)))
    assert c.rotary_freqs == pytest.approx(
        [f * 10000.0 ** (i / 12) for f, i in zip(LONG_FACTOR, range(0, 12, 2))], rel=1e-6)
    # attention_factor, where given, replaces the default scale.
    c = config_from_hf(dict(CONFIGS["phi3-longrope"], rope_scaling=dict(
        CONFIGS["phi3-longrope"]["rope_scaling"], attention_factor=1.5)))
    assert c.rotated_scale == 1.5
    # Within the original context: no scale.
    c = config_from_hf(dict(CONFIGS["phi3-longrope"], max_position_embeddings=128))
    assert c.rotated_scale == 1.0


@pytest.mark.parametrize("changes, message", [
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}),
     "rope_scaling type 'yarn' is not supported by the phi3 family (supported: linear, "
     "longrope, su)"),
    (dict(rope_scaling={"type": "longrope", "long_factor": [1.0] * 3}),
     "rope_scaling long_factor has 3 entries, expected rope dims / 2 = 6"),
    (dict(rope_scaling={"type": "su", "short_factor": [1.0] * 6}),
     "rope_scaling of type 'su' lacks long_factor"),
    (dict(hidden_act="gelu_new"), "hidden_act 'gelu_new' is not supported by the phi3 family"),
    (dict(num_attention_heads=6, num_key_value_heads=6),
     "hidden_size 64 / num_attention_heads 6 must be a whole head_dim"),
    (dict(num_attention_heads=4, num_key_value_heads=3),
     "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    (dict(partial_rotary_factor=0.1),
     "partial_rotary_factor 0.1 gives 1 rotated features of head_dim 16"),
])
def test_unsupported_configs_name_the_field(changes, message):
    config = dict(CONFIGS["phi3-partial"], **changes)
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_hf(config)


def test_a_missing_weight_names_it_and_the_directory(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", CONFIGS["phi3-partial"])
    weights = mx.load(str(directory / "model.safetensors"))
    del weights["model.layers.2.mlp.gate_up_proj.weight"]
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=f"{directory}: missing weight\\(s\\) "
                       r"model.layers.2.mlp.gate_up_proj.weight \(rows 0:128\), "
                       r"model.layers.2.mlp.gate_up_proj.weight \(rows 128:256\) "
                       "that the phi3 config needs"):
        load(directory)
