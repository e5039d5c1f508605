"""The lean decode graph (issue 20): fused q/k/v and gate/up projections
(``ModelSpec.fused``, captures joined with ``+``), one RoPE over the q and
k heads, no transposes for a single token; the same logits as the separate
projections within float32 rounding, on one rank and split over ranks, and
fewer MLX nodes per decode step.

Tiny random-weight checkpoints, written once per module: a dense float32
GGUF (untied head), a Hugging Face Qwen2 checkpoint (q/k/v biases) and one
with 4-bit projections; the uneven ones have 6 query heads over 3 KV heads.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import TINY, TINY_UNEVEN, write_gguf, write_hf

import mlxprog as mp
from mlxprog.llm import ModelSpec, build_decode, build_prefill, load_checkpoint
from mlxprog.llm.cache import CacheLayout
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.models import model_spec
from mlxprog.llm.programs import DecodeInputs, LogitsOutputs, PrefillInputs

MAX_LENGTH = 32
KINDS = ["gguf", "qwen2", "hf-q"]
PROMPT = [5, 60, 7, 200, 31, 9]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    root: Path = tmp_path_factory.mktemp("tiny-lean")
    write_gguf(root / "tiny.gguf", tied=False, sizes=TINY_UNEVEN)
    write_hf(root / "qwen2", model_type="qwen2", tied=False)
    write_hf(root / "hf-q", quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32), sizes=TINY_UNEVEN)
    return {kind: load_checkpoint(root / name) for kind, name in
            (("gguf", "tiny.gguf"), ("qwen2", "qwen2"), ("hf-q", "hf-q"))}


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


def unfused(spec: ModelSpec) -> ModelSpec:
    """The spec with every projection on its own (as before issue 20)."""
    return dataclasses.replace(spec, fused={})


def step_logits(spec: ModelSpec, checkpoint, world_size: int = 1, rank: int = 0,
                native: bool | None = None) -> tuple[np.ndarray, np.ndarray, mp.Executable]:
    """The prefill's logits of PROMPT and the next decode step's, with
    rank ``rank``'s programs (``native`` as :func:`mlxprog.compile`); and the
    decode executable."""
    c = checkpoint.config
    captures = spec.captures(checkpoint, world_size, rank)
    prefill = mp.compile(build_prefill(spec, MAX_LENGTH, None, world_size=world_size,
                                       rank=rank), captures=captures, native=native)
    decode = mp.compile(build_decode(spec, MAX_LENGTH, None, world_size=world_size,
                                     rank=rank), captures=captures, native=native)
    # The programs' float cache, of the rank's KV heads.
    layout = CacheLayout(c.num_layers, spec.shard(world_size, rank).num_kv_heads, c.head_dim)
    caches = layout.empty(1, MAX_LENGTH)
    mask, key = mx.ones((1, MAX_LENGTH), dtype=mx.bool_), mx.random.key(0)
    first = LogitsOutputs.of(prefill(**PrefillInputs(
        tokens=mx.array([PROMPT], dtype=mx.int32),
        last_index=mx.array([len(PROMPT) - 1], dtype=mx.int32),
        rope_offset=mx.array([0], dtype=mx.int32), cache_offset=mx.array(0, dtype=mx.int32),
        key_mask=mask, key=key, caches=caches).by_name(layout)))
    n = len(PROMPT)
    second = LogitsOutputs.of(decode(**DecodeInputs(
        tokens=mx.array([3], dtype=mx.int32), rope_offset=mx.array([n], dtype=mx.int32),
        cache_offset=mx.array(n, dtype=mx.int32), key_mask=mask, key=key,
        caches=first.caches).by_name(layout)))
    return np.array(first.logits), np.array(second.logits), decode


def test_projections_are_fused_where_packed_alike(checkpoints, kind):
    spec = model_spec(checkpoints[kind])
    assert spec.fused == {
        f"layers.{i}.{name}": tuple(f"layers.{i}.{p}" for p in parts)
        for i in range(TINY["num_layers"]) for name, parts in (
            ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj",
                                    "self_attn.v_proj")),
            ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))}
    program = build_decode(spec, MAX_LENGTH, None)
    names = {c.name for c in program.captures}
    q, k, v = (spec.source_names[f"layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    assert f"{q}+{k}+{v}" in names and q not in names
    if kind == "qwen2":  # the biases are joined too
        assert spec.source_names["layers.0.self_attn.qkv_proj.bias"].count("+") == 2


def test_a_projection_packed_differently_is_not_fused(checkpoints):
    checkpoint = checkpoints["hf-q"]
    quantization = dict(checkpoint.quantization)
    quantization["layers.1.self_attn.k_proj"] = Quantization(bits=8, group_size=32)
    spec = model_spec(dataclasses.replace(checkpoint, quantization=quantization))
    assert "layers.1.self_attn.qkv_proj" not in spec.fused
    assert {"layers.0.self_attn.qkv_proj", "layers.1.mlp.gate_up_proj"} <= set(spec.fused)


def test_fused_projections_give_the_separate_ones_logits(checkpoints, kind):
    checkpoint = checkpoints[kind]
    spec = model_spec(checkpoint)
    fused = step_logits(spec, checkpoint)
    separate = step_logits(unfused(spec), checkpoint)
    for a, b in zip(fused[:2], separate[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # And the step evaluates fewer MLX nodes.
    assert fused[2].stats.segments[0].nodes < separate[2].stats.segments[0].nodes


@pytest.mark.parametrize("world_size", [2, 3])
def test_fused_rank_captures_fit_the_rank_programs(checkpoints, world_size):
    # 3 KV heads: rank blocks of unequal size over 2 ranks.
    checkpoint = checkpoints["hf-q"]
    spec = model_spec(checkpoint)
    for rank in range(world_size):
        shard = spec.shard(world_size, rank)
        captures = spec.captures(checkpoint, world_size, rank)
        qkv = captures[spec.source_names["layers.0.self_attn.qkv_proj.scales"]]
        assert qkv.shape[0] == (shard.num_heads + 2 * shard.num_kv_heads) * TINY["head_dim"]
        program = build_decode(spec, MAX_LENGTH, None, world_size=world_size, rank=rank)
        assert {c.name: tuple(c.shape) for c in program.captures} == {
            c.name: tuple(captures[c.name].shape) for c in program.captures}


def test_the_decode_step_has_no_transposes(checkpoints):
    """On the CPU's native kernels (MLX's ops compose the fused ops with
    transposes)."""
    checkpoint = checkpoints["hf-q"]
    *_, decode = step_logits(model_spec(checkpoint), checkpoint, native=True)
    primitives = decode.stats.segments[0].primitives
    assert "Transpose" not in primitives
    assert decode.stats.as_dict()["segment_nodes"] == [decode.stats.segments[0].nodes]


def _ops(program) -> list[str]:
    return [inst.op for inst in program.instructions]


def test_quantized_layers_are_one_op_each(checkpoints):
    """Fused, quantized alike and without projection biases: each layer is
    one ``transformer_layer`` (one node on the CPU); the step's logits match
    the separate projections' (the test above), and the step is a few nodes
    besides the layers."""
    checkpoint = checkpoints["hf-q"]
    spec = model_spec(checkpoint)
    layers = TINY["num_layers"]
    assert _ops(build_decode(spec, MAX_LENGTH, None)).count("transformer_layer") == layers
    *_, decode = step_logits(spec, checkpoint, native=True)
    segment = decode.stats.segments[0]
    assert segment.primitives["MlxprogTransformerLayer"] == layers
    assert segment.nodes <= layers + 30


@pytest.mark.parametrize("kind, world_size", [("qwen2", 1), ("gguf", 1), ("hf-q", 2)])
def test_other_layers_keep_the_separate_ops(checkpoints, kind, world_size):
    """Projection biases (Qwen2), float weights and split ranks (whose
    partial sums meet between the ops) keep the ops one by one."""
    spec = model_spec(checkpoints[kind])
    for rank in range(world_size):
        ops = _ops(build_decode(spec, MAX_LENGTH, None, world_size=world_size, rank=rank))
        assert "transformer_layer" not in ops and "kv_cache_attention_block" in ops


@pytest.mark.parametrize("separate", [0, 1])
def test_layers_of_both_kinds_mix(checkpoints, separate):
    """A layer whose projections stay separate keeps the separate ops (its
    MLP output is added before a whole layer, or by the final norm); the
    rest are whole-layer ops, with the same logits as all separate."""
    checkpoint = checkpoints["hf-q"]
    spec = model_spec(checkpoint)
    spec = dataclasses.replace(spec, fused={name: parts for name, parts in spec.fused.items()
                                            if not name.startswith(f"layers.{separate}.")})
    ops = _ops(build_decode(spec, MAX_LENGTH, None))
    assert ops.count("transformer_layer") == TINY["num_layers"] - 1
    got = step_logits(spec, checkpoint, native=True)
    want = step_logits(unfused(spec), checkpoint, native=True)
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
