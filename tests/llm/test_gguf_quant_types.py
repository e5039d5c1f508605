"""GGUF files whose weights are GGML block types, as llama.cpp's quantizer
mixes them: for every family, a tiny checkpoint converted as llama.cpp's
converter would, each matrix stored as another type (K-quants, IQ types,
the legacy types, MXFP4), against the same file with those matrices stored
as float32 (gguf's own dequantization of the blocks): the same logits in
exact numerics and the same greedy tokens; int8 numerics close to them.
Also: the blocks stay blocks in memory (or MLX's affine form) and hostile
scales are refused at load."""

from __future__ import annotations

import itertools
import json

import gguf
import mlx.core as mx
import numpy as np
import pytest
from family_checks import (MAX_LENGTH, PROMPT_IDS, TINY_CONFIG, load_tiny, program_logits,
                           write_checkpoint)
from ggml_blocks import blocks_with_std, reference
from gguf_writer import write_gguf_from_hf

import mlxprog as mp
from mlxprog import native
from mlxprog.llm import ModelError
from mlxprog.llm.cache import CacheLayout
from mlxprog.llm.checkpoint import GGMLQuantization
from mlxprog.llm.models import FAMILIES, family_for_model_type
from mlxprog.llm.programs import PrefillInputs, build_prefill

#: Rows of 256 values and more, so that every type's blocks fit (K-quants
#: and IQ types store 256-value super-blocks).
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64)
CONFIGS = {
    "llama": dict(TINY_CONFIG, **SIZES, model_type="llama"),
    "qwen2": dict(TINY_CONFIG, **SIZES, model_type="qwen2", tie_word_embeddings=True),
    "qwen3": dict(TINY_CONFIG, **SIZES, model_type="qwen3", use_sliding_window=False,
                  rope_theta=1e6),
    "gemma2": dict(TINY_CONFIG, **SIZES, model_type="gemma2", tie_word_embeddings=True,
                   query_pre_attn_scalar=64, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, sliding_window=8),
    "gemma3_text": dict(TINY_CONFIG, **SIZES, model_type="gemma3_text", sliding_window=8,
                        sliding_window_pattern=2, query_pre_attn_scalar=64,
                        rope_local_base_freq=1e4),
    "phi3": dict(TINY_CONFIG, **SIZES, model_type="phi3", hidden_act="silu",
                 partial_rotary_factor=1.0),
    # Mixtures of experts: their [experts, out, in] stacks get block types
    # too (llama.cpp's *_exps tensors).
    "qwen3_moe": dict(TINY_CONFIG, **SIZES, model_type="qwen3_moe", rope_theta=1e6,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                      norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen2_moe": dict(TINY_CONFIG, **SIZES, model_type="qwen2_moe", rope_theta=1e6,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                      shared_expert_intermediate_size=256),
    "mixtral": dict(TINY_CONFIG, **dict(SIZES, intermediate_size=256), model_type="mixtral",
                    num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(TINY_CONFIG, **dict(SIZES, intermediate_size=256, rms_norm_eps=1e-5),
                  model_type="olmoe", num_experts=4, num_experts_per_tok=2),
    "gpt_oss": dict(TINY_CONFIG, **dict(SIZES, intermediate_size=256), model_type="gpt_oss",
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    rope_theta=150000.0,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 128}),
}

def test_every_family_is_in_the_table():
    # A family added under mlxprog/llm/models/ fails here until it is in CONFIGS.
    assert {family_for_model_type(c["model_type"]).name for c in CONFIGS.values()} == \
        set(FAMILIES)


#: The types a mixture cycles through: what llama.cpp's quantizer writes
#: for its common file types (and the types it falls back to), then the
#: rest.
MIXTURE = ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "Q3_K", "Q5_K", "Q2_K", "IQ4_XS", "IQ4_NL",
           "Q4_0", "Q4_1", "Q5_1", "MXFP4", "IQ3_S", "IQ2_XS", "IQ3_XXS", "IQ2_XXS", "IQ2_S",
           "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0")


def write_pair(config: dict, directory) -> tuple:
    """The quantized file and its float twin of one tiny checkpoint, and the
    type each matrix got."""
    checkpoint = write_checkpoint(directory / "hf", config)
    rng = np.random.default_rng(len(config["model_type"]))
    types = itertools.cycle(MIXTURE)
    chosen: dict[str, str] = {}
    blocks: dict[str, np.ndarray] = {}

    def quantized(name: str, data: np.ndarray):
        # llama.cpp's quantizer keeps the routers (ffn_gate_inp) and every
        # bias (gpt-oss's experts' are 2-D) as they are.
        if (data.ndim not in (2, 3) or data.shape[-1] % 256 or "ffn_gate_inp" in name
                or not name.endswith(".weight")):
            return data, None
        type_name = chosen.setdefault(name, next(types))
        rows = blocks_with_std(rng, type_name, int(np.prod(data.shape[:-1])), data.shape[-1],
                               float(np.std(data)))
        blocks[name] = rows.reshape(*data.shape[:-1], rows.shape[-1])
        return blocks[name], gguf.GGMLQuantizationType[type_name]

    def dequantized(name: str, data: np.ndarray):
        if name not in chosen:
            return data, None
        return reference(chosen[name], blocks[name]), None

    q_path = write_gguf_from_hf(checkpoint, directory / "model-q.gguf", stored=quantized)
    f_path = write_gguf_from_hf(checkpoint, directory / "model-f.gguf", stored=dequantized)
    return q_path, f_path, chosen


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    return write_pair(CONFIGS[request.param], tmp_path_factory.mktemp(request.param))


def test_blocks_stay_quantized_and_match_their_float_twin(pair):
    q_path, f_path, chosen = pair
    quantized = load_tiny(q_path, numerics="exact")
    # In a mixture every quantized tensor stays in its blocks, Q4_0/Q8_0 too.
    assert all(isinstance(q, GGMLQuantization)
               for q in quantized.checkpoint.quantization.values())
    blocks = [q.type for q in quantized.checkpoint.quantization.values()
              if isinstance(q, GGMLQuantization)]
    assert len(set(blocks)) >= 3, blocks
    continuation = [5, 77, 200, 9, 31, 150]
    want = program_logits(load_tiny(f_path, numerics="exact"), PROMPT_IDS, continuation)
    got = program_logits(quantized, PROMPT_IDS, continuation)
    assert np.abs(want).max() > 1  # not trivially small
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    tokens = quantized.generate(PROMPT_IDS, max_tokens=8).tokens
    assert tokens == load_tiny(f_path, numerics="exact").generate(PROMPT_IDS,
                                                                  max_tokens=8).tokens


def test_int8_numerics_stay_close(pair):
    q_path, f_path, _ = pair
    if mx.default_device() != mx.cpu:
        pytest.skip("int8 numerics run on the CPU's native kernels")
    continuation = [5, 77, 200]
    want = program_logits(load_tiny(f_path, numerics="exact"), PROMPT_IDS, continuation)
    got = program_logits(load_tiny(q_path, numerics="int8"), PROMPT_IDS, continuation)
    # 8-bit activations move the logits by a few percent on average (these
    # random tiny models amplify them: 2.5% for llama, 5.3% for gemma3,
    # up to 12% for one logit); a wrong
    # kernel moves them by as much as they are.
    assert np.abs(got - want).mean() <= 0.08 * np.abs(want).mean()


def test_nonfinite_scale_is_refused_naming_the_tensor(tmp_path):
    config = CONFIGS["llama"]
    checkpoint = write_checkpoint(tmp_path / "hf", config)
    rng = np.random.default_rng(3)

    def poisoned(name: str, data: np.ndarray):
        if name != "blk.1.ffn_down.weight":
            return data, None
        raw = blocks_with_std(rng, "Q4_K", data.shape[0], data.shape[1], 0.02)
        raw[3, 0:2] = np.array([np.inf], np.float16).view(np.uint8)  # row 3 of 2 blocks
        return raw, gguf.GGMLQuantizationType.Q4_K

    path = write_gguf_from_hf(checkpoint, tmp_path / "bad.gguf", stored=poisoned)
    with pytest.raises(ModelError, match=r"blk\.1\.ffn_down\.weight.*Q4_K.*block 6 "):
        load_tiny(path)


def test_exported_program_binds_its_blocks_from_the_file(pair):
    """A program built for the quantized model binds its captures straight
    from the GGUF file (``mlxprog.compile(..., weights=path)``: fused
    projections' joined names included) and gives the model's logits."""
    q_path, _, _ = pair
    llm = load_tiny(q_path, numerics="exact")
    if llm.config.architecture == "phi3":
        pytest.skip("phi3's q/k/v rows are cut from one stored tensor at load: its programs "
                    "bind from the model, not by name from the file (as for float files)")
    c = llm.config
    program = build_prefill(llm.spec, MAX_LENGTH, sampling=None, numerics="exact")
    inputs = PrefillInputs(
        tokens=mx.array([PROMPT_IDS], dtype=mx.int32),
        last_index=mx.array([len(PROMPT_IDS) - 1], dtype=mx.int32),
        rope_offset=mx.array([0], dtype=mx.int32), cache_offset=mx.array(0, dtype=mx.int32),
        key_mask=mx.ones((1, MAX_LENGTH), dtype=mx.bool_), key=mx.random.key(0),
        caches=CacheLayout.of(c).empty(1, MAX_LENGTH)).by_name(CacheLayout.of(c))
    from_file = mp.compile(program, weights=str(q_path))(**inputs)[0]
    from_model = mp.compile(program, captures=llm.spec.captures(llm.checkpoint))(**inputs)[0]
    np.testing.assert_array_equal(np.array(from_file), np.array(from_model))


MOE_FAMILIES = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "gpt_oss")


@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_expert_stacks_match_their_float_twin(tmp_path, family, mix):
    """A mixture of experts as llama.cpp's Q4_K_M stores it (Q4_K matrices
    and gate/up experts, Q6_K down experts: block stacks ``uint8 [experts,
    rows, row_bytes]`` read by ``ggml_gather_matmul``) or as Q8_0 alone
    in the layers (the stacks re-laid as MLX's affine form, read by
    ``gather_quantized_matmul``), against the float file of the same
    values: the same logits in exact numerics, the same greedy tokens."""
    checkpoint = write_checkpoint(tmp_path / "hf", CONFIGS[family])
    rng = np.random.default_rng(7)
    values: dict[str, np.ndarray] = {}

    def type_of(name: str) -> str:
        if mix == "Q8_0":
            return "Q8_0"
        return "Q6_K" if "down" in name else "Q4_K"

    def quantized(name: str, data: np.ndarray):
        # The embeddings too: their Q8_0 rows, re-laid as affine ones, are
        # exact only when dequantized in float32.
        if (data.ndim not in (2, 3) or data.shape[-1] % 256 or "ffn_gate_inp" in name
                or not name.endswith(".weight")):
            return data, None
        rows = blocks_with_std(rng, type_of(name), int(np.prod(data.shape[:-1])),
                               data.shape[-1], float(np.std(data)))
        values[name] = rows.reshape(*data.shape[:-1], rows.shape[-1])
        return values[name], gguf.GGMLQuantizationType[type_of(name)]

    def dequantized(name: str, data: np.ndarray):
        if name not in values:
            return data, None
        return reference(type_of(name), values[name]), None

    q_path = write_gguf_from_hf(checkpoint, tmp_path / "model-q.gguf", stored=quantized)
    f_path = write_gguf_from_hf(checkpoint, tmp_path / "model-f.gguf", stored=dequantized)
    llm = load_tiny(q_path, numerics="exact")
    stack = next(w for name, w in llm.checkpoint.weights.items()
                 if name.startswith("layers.0.") and name.endswith("down_proj.weight"))
    # A Q8_0 file stays blocks where the native kernels run, else it is
    # re-laid as affine (mlxprog/ggml/tensors.py).
    blocks = mix == "Q4_K_M" or native.default_enabled()
    assert stack.ndim == 3 and stack.dtype == (mx.uint8 if blocks else mx.uint32)
    continuation = [5, 77, 200, 9]
    float_llm = load_tiny(f_path, numerics="exact")
    want = program_logits(float_llm, PROMPT_IDS, continuation)
    np.testing.assert_allclose(program_logits(llm, PROMPT_IDS, continuation), want,
                               rtol=1e-3, atol=1e-3 * np.abs(want).max())
    assert llm.generate(PROMPT_IDS, max_tokens=8).tokens == float_llm.generate(
        PROMPT_IDS, max_tokens=8).tokens


def test_prefill_takes_int8_only_in_layers_wholly_of_superblock_types(tmp_path):
    """In int8 numerics the prefill runs a layer (and the output head) in int8
    where all its dense projections are super-block types (program_numerics:
    K-quants, or IQ and TQ types), and keeps the exact path in a layer with
    one 32-element matrix; decode steps take int8 everywhere, and an exact
    model stays exact."""
    config = dict(CONFIGS["llama"], num_hidden_layers=3)
    checkpoint = write_checkpoint(tmp_path / "hf", config)
    rng = np.random.default_rng(5)

    def mixed(name: str, data: np.ndarray):
        if data.ndim != 2 or not name.endswith(".weight"):
            return data, None
        # Layer 1 has one matrix of a 32-element type, layer 2 is IQ2_XXS
        # and TQ2_0; the rest K-quants.
        type_name = "Q5_0" if name == "blk.1.attn_q.weight" else (
            "TQ2_0" if name.startswith("blk.2.ffn") else
            "IQ2_XXS" if name.startswith("blk.2.") else
            "Q6_K" if name in ("output.weight", "blk.0.ffn_down.weight") else "Q4_K")
        raw = blocks_with_std(rng, type_name, data.shape[0], data.shape[1], float(np.std(data)))
        return raw, gguf.GGMLQuantizationType[type_name]

    path = write_gguf_from_hf(checkpoint, tmp_path / "mixed.gguf", stored=mixed)

    def numerics(llm, kind):
        """(op, numerics) of the program's layers and GGML matmuls, in order."""
        program = json.loads(llm.program(kind).to_json())
        return [(i["op"], i.get("attrs", {}).get("numerics", "exact"))
                for i in program["instructions"] if i["op"] in ("transformer_layer", "ggml_matmul")]

    int8 = load_tiny(path, numerics="int8")
    # Layers 0, 1 and 2, then the output head.
    assert numerics(int8, "prefill") == [
        ("transformer_layer", "int8"), ("transformer_layer", "exact"),
        ("transformer_layer", "int8"), ("ggml_matmul", "int8")]
    assert {n for _, n in numerics(int8, "decode")} == {"int8"}
    assert {n for _, n in numerics(load_tiny(path, numerics="exact"), "prefill")} == {"exact"}
