"""A straightforward llama-family forward pass in plain MLX, for tests and benchmarks.

This is the yardstick program-built models are checked against, so it favours
plain, readable operations over speed: explicit RoPE and attention (no fused
kernels), a KV cache that grows by concatenation, float32 activations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from mlxprog.ggml.dequantize import dequantize as dequantize_blocks
from mlxprog.llm import Checkpoint
from mlxprog.llm.checkpoint import GGMLQuantization


@dataclass
class KVCache:
    """Keys and values of every layer so far, each (1, kv_heads, length, head_dim)."""

    keys: list[mx.array | None]
    values: list[mx.array | None]

    @classmethod
    def empty(cls, num_layers: int) -> KVCache:
        return cls([None] * num_layers, [None] * num_layers)

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def append(self, layer: int, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Add this step's keys/values to ``layer``; return all of them."""
        if self.keys[layer] is not None:
            k = mx.concatenate([self.keys[layer], k], axis=2)
            v = mx.concatenate([self.values[layer], v], axis=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class ReferenceModel:
    """Forward pass of a :class:`~mlxprog.llm.Checkpoint` (batch size 1)."""

    def __init__(self, checkpoint: Checkpoint):
        self.config = checkpoint.config
        self.weights = checkpoint.weights
        self.quantization = checkpoint.quantization
        c = self.config
        if c.rope_freqs is not None:
            periods = mx.array(c.rope_freqs, dtype=mx.float32)
        else:
            periods = c.rope_theta ** (mx.arange(0, c.head_dim, 2, dtype=mx.float32) / c.head_dim)
        self.inv_periods = c.rope_scale / periods

    def linear(self, name: str, x: mx.array) -> mx.array:
        """``x @ W.T (+ b)`` for layer ``name``, quantized or not."""
        w = self.weights
        q = self.quantization.get(name)
        if isinstance(q, GGMLQuantization):  # a GGUF file's blocks, dequantized
            y = x @ dequantize_blocks(q.type, w[f"{name}.weight"]).astype(x.dtype).T
        elif q is not None:
            y = mx.quantized_matmul(x, w[f"{name}.weight"], w[f"{name}.scales"],
                                    w[f"{name}.biases"], transpose=True,
                                    group_size=q.group_size, bits=q.bits)
        else:
            y = x @ w[f"{name}.weight"].astype(x.dtype).T
        if f"{name}.bias" in w:
            y = y + w[f"{name}.bias"]
        return y

    def embed(self, ids: mx.array) -> mx.array:
        """Embedding rows of ``ids`` (dequantizing just those rows)."""
        w = self.weights
        q = self.quantization.get("embed_tokens")
        if isinstance(q, GGMLQuantization):
            rows = dequantize_blocks(q.type, w["embed_tokens.weight"][ids])
        elif q is not None:
            rows = mx.dequantize(w["embed_tokens.weight"][ids], w["embed_tokens.scales"][ids],
                                 w["embed_tokens.biases"][ids], group_size=q.group_size,
                                 bits=q.bits)
        else:
            rows = w["embed_tokens.weight"][ids]
        return rows.astype(mx.float32)

    def rms_norm(self, name: str, x: mx.array) -> mx.array:
        scale = mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + self.config.norm_eps)
        return x * scale * self.weights[name]

    def rope(self, x: mx.array, offset: int) -> mx.array:
        """Rotate (1, heads, T, head_dim) ``x`` for positions offset..offset+T-1."""
        positions = mx.arange(offset, offset + x.shape[2], dtype=mx.float32)
        angles = positions[:, None] * self.inv_periods[None, :]
        cos, sin = mx.cos(angles), mx.sin(angles)
        if self.config.rope_traditional:  # rotate interleaved pairs (x0, x1), (x2, x3), ...
            x1, x2 = x[..., 0::2], x[..., 1::2]
            out = mx.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
            return out.reshape(x.shape)
        half = x.shape[-1] // 2  # rotate pairs (x[i], x[i + half])
        x1, x2 = x[..., :half], x[..., half:]
        return mx.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def attention(self, layer: int, x: mx.array, cache: KVCache, offset: int) -> mx.array:
        """Self-attention of ``x``, whose first token sits at position ``offset``."""
        c, p = self.config, f"layers.{layer}.self_attn"
        T = x.shape[1]

        def heads(name: str, n: int) -> mx.array:
            return self.linear(f"{p}.{name}", x).reshape(1, T, n, c.head_dim).transpose(0, 2, 1, 3)

        q = self.rope(heads("q_proj", c.num_heads), offset)
        k = self.rope(heads("k_proj", c.num_kv_heads), offset)
        k, v = cache.append(layer, k, heads("v_proj", c.num_kv_heads))
        group = c.num_heads // c.num_kv_heads  # query heads per KV head
        k, v = mx.repeat(k, group, axis=1), mx.repeat(v, group, axis=1)

        scores = (q @ k.transpose(0, 1, 3, 2)) * c.head_dim ** -0.5
        query_pos = mx.arange(offset, offset + T)[:, None]
        key_pos = mx.arange(k.shape[2])[None, :]
        scores = mx.where(key_pos <= query_pos, scores, -mx.inf)
        out = mx.softmax(scores, axis=-1) @ v
        out = out.transpose(0, 2, 1, 3).reshape(1, T, c.num_heads * c.head_dim)
        return self.linear(f"{p}.o_proj", out)

    def mlp(self, layer: int, x: mx.array) -> mx.array:
        p = f"layers.{layer}.mlp"
        gate = self.linear(f"{p}.gate_proj", x)
        up = self.linear(f"{p}.up_proj", x)
        return self.linear(f"{p}.down_proj", gate * mx.sigmoid(gate) * up)

    def __call__(self, ids: list[int] | mx.array, cache: KVCache,
                 last_only: bool = False) -> mx.array:
        """Logits (T, vocab) for the next token after each of ``ids``, which
        continue the sequence held in ``cache`` (updated in place); with
        ``last_only``, just those after the last id (1, vocab)."""
        offset = cache.length
        h = self.embed(mx.array(ids, dtype=mx.int32))[None]
        for i in range(self.config.num_layers):
            x = self.rms_norm(f"layers.{i}.input_layernorm.weight", h)
            h = h + self.attention(i, x, cache, offset)
            h = h + self.mlp(i, self.rms_norm(f"layers.{i}.post_attention_layernorm.weight", h))
        h = self.rms_norm("norm.weight", h[:, -1:] if last_only else h)
        head = "embed_tokens" if self.config.tie_embeddings else "lm_head"
        return self.linear(head, h)[0]


@dataclass
class Generation:
    """Generated token ids with timings: prefill (up to the first token) and decode."""

    tokens: list[int]
    prompt_seconds: float
    decode_seconds: float
    decode_tokens: int

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0


def greedy_generate(model: ReferenceModel, prompt: list[int], max_tokens: int,
                    stop_ids: tuple[int, ...] = ()) -> Generation:
    """Greedy decoding: up to ``max_tokens`` new tokens, stopping after a stop id."""
    cache = KVCache.empty(model.config.num_layers)
    start = time.perf_counter()
    token = mx.argmax(model(prompt, cache, last_only=True)[-1]).item()
    prompt_seconds = time.perf_counter() - start
    tokens = [token]
    start = time.perf_counter()
    while len(tokens) < max_tokens and token not in stop_ids:
        token = mx.argmax(model([token], cache, last_only=True)[-1]).item()
        tokens.append(token)
    return Generation(tokens, prompt_seconds, time.perf_counter() - start, len(tokens) - 1)
