"""A llama-family model as mlxprog programs: prefill, decode step, decode loop.

The programs are built with :class:`~mlxprog.ProgramBuilder`; weights are
captures named as in the model file (``blk.0.attn_q.weight`` for GGUF), so
``mlxprog.compile(program, weights=model_file)`` binds them directly. Quantized
layers stay quantized (three captures each).

Every program works on a KV cache in the ``[B, kv_heads, S, D]`` layout,
passed in and returned: each step writes its keys and values at a dynamic
``cache_offset`` (an int32 scalar input, never an attribute), so the decode
step has one shape for every token of a given cache length. The cache length
``S`` is a symbolic dim (at most ``max_length``): attention reads all ``S``
slots (those after the current position are masked), and on the CPU its cost
grows with ``S``, so the host grows the caches in chunks as the sequence
grows (one trace per chunk; see :class:`~mlxprog.llm.LLM`). Passing caches of
``max_length`` slots gives one trace for the whole sequence. Batches are
left-padded: ``rope_offset`` (one start position per row) and ``key_mask``
(``[B, S]``, false on padding) describe the padding.

Inputs, in order:

- prefill: ``tokens [B, T]`` (T at most S), ``rope_offset [B]``,
  ``key_mask [B, S]``, ``key [2]``, then ``k_cache.i``/``v_cache.i`` per layer.
- decode: ``tokens [B]``, ``rope_offset [B]``, ``cache_offset []``,
  ``key_mask [B, S]``, ``key [2]``, then the caches (``cache_offset < S``).
- decode loop: as decode plus ``max_new []``; a ``while`` loop runs decode
  steps, streaming each new token to the ``emit`` callback (which returns a
  bool: stop), until it says stop or ``max_new`` tokens were made.

The builders check each instruction as it is added and leave the
whole-program validation to ``mlxprog.compile`` / ``mlxprog.validate``, so a
model's program is validated once.

Outputs: ``next_tokens [B]`` (int32), the next PRNG ``key``, then the new
caches (the loop also returns the number of tokens it made). With
``logits=True`` the step programs return ``logits [B, V]`` instead of sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
import mlx.core as mx

from ..builder import ProgramBuilder, Value
from ..dtypes import name_of
from ..program import Program
from .config import Checkpoint, ModelConfig, ModelError, Quantization

CACHE_DTYPE = "float32"


@dataclass(frozen=True)
class Sampling:
    """How the next token is picked: ``temperature`` 0 is greedy; otherwise
    top-k, top-p and min-p filters apply to the tempered distribution."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ModelError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int)
                                       or isinstance(self.top_k, bool) or self.top_k < 1):
            raise ModelError(f"top_k must be a positive integer, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ModelError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ModelError(f"min_p must be in [0, 1), got {self.min_p}")


@dataclass(frozen=True)
class ModelSpec:
    """What the program builders need to know about a model: its config, the
    quantization of each quantized layer, each weight's shape/dtype, and the
    file's name for each weight."""

    config: ModelConfig
    quantization: dict[str, Quantization]
    weights: dict[str, tuple[tuple[int, ...], str]]
    source_names: dict[str, str]

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> ModelSpec:
        """The spec of a loaded checkpoint."""
        return cls(
            config=checkpoint.config,
            quantization=dict(checkpoint.quantization),
            weights={n: (tuple(w.shape), name_of(w.dtype))
                     for n, w in checkpoint.weights.items()},
            source_names={n: checkpoint.source_names.get(n, n) for n in checkpoint.weights},
        )

    def captures(self, checkpoint: Checkpoint) -> dict[str, mx.array]:
        """The checkpoint's weights under the programs' capture names."""
        return {self.source_names[n]: w for n, w in checkpoint.weights.items()}


class _Model:
    """Emits the model's instructions into a builder scope."""

    def __init__(self, root: ProgramBuilder, spec: ModelSpec):
        self.root = root
        self.spec = spec
        self.c = spec.config
        self._captures: dict[str, Value] = {}

    def weight(self, name: str) -> Value:
        if name not in self._captures:
            shape, dtype = self.spec.weights[name]
            self._captures[name] = self.root.capture(self.spec.source_names[name], shape, dtype)
        return self._captures[name]

    def linear(self, sb, name: str, x: Value) -> Value:
        quant = self.spec.quantization.get(name)
        if quant is not None:
            y = sb.quantized_matmul(x, self.weight(f"{name}.weight"),
                                    self.weight(f"{name}.scales"),
                                    self.weight(f"{name}.biases"), transpose=True,
                                    group_size=quant.group_size, bits=quant.bits)
        else:
            w = self.weight(f"{name}.weight")
            y = sb.matmul(x, sb.transpose(sb.astype(w, dtype="float32")))
        if f"{name}.bias" in self.spec.weights:
            y = y + sb.astype(self.weight(f"{name}.bias"), dtype="float32")
        return y

    def embed(self, sb, tokens: Value) -> Value:
        quant = self.spec.quantization.get("embed_tokens")
        if quant is None:
            rows = sb.take(self.weight("embed_tokens.weight"), tokens, axis=0)
        else:
            parts = [sb.take(self.weight(f"embed_tokens.{p}"), tokens, axis=0)
                     for p in ("weight", "scales", "biases")]
            rows = sb.dequantize(*parts, group_size=quant.group_size, bits=quant.bits)
        return sb.astype(rows, dtype="float32")

    def norm(self, sb, name: str, x: Value) -> Value:
        weight = sb.astype(self.weight(name), dtype="float32")
        return sb.fast_rms_norm(x, weight, eps=self.c.norm_eps)

    def rope(self, sb, x: Value, rope_offset: Value) -> Value:
        c = self.c
        if c.rope_freqs is not None:
            freqs = sb.constant(list(c.rope_freqs), "float32")
            return sb.fast_rope_with_freqs(x, freqs, rope_offset, dims=c.head_dim,
                                           traditional=c.rope_traditional, scale=c.rope_scale)
        return sb.fast_rope(x, rope_offset, dims=c.head_dim, traditional=c.rope_traditional,
                            base=c.rope_theta, scale=c.rope_scale)

    def heads(self, sb, x: Value, n: int, T: int | str) -> Value:
        """[B, T, n*D] -> [B, n, T, D]."""
        x = sb.reshape(x, shape=["B", T, n, self.c.head_dim])
        return sb.transpose(x, axes=[0, 2, 1, 3])

    def layer(self, sb, i: int, h: Value, T, rope_offset, cache_offset, key_mask,
              k_cache: Value, v_cache: Value):
        c, p = self.c, f"layers.{i}"
        x = self.norm(sb, f"{p}.input_layernorm.weight", h)
        q = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.self_attn.q_proj", x),
                                     c.num_heads, T), rope_offset)
        k = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.self_attn.k_proj", x),
                                     c.num_kv_heads, T), rope_offset)
        v = self.heads(sb, self.linear(sb, f"{p}.self_attn.v_proj", x), c.num_kv_heads, T)
        attn, k_cache, v_cache = sb.kv_cache_sdpa_update(
            q, k, v, k_cache, v_cache, cache_offset, key_mask, layout="BHTD")
        attn = sb.reshape(sb.transpose(attn, axes=[0, 2, 1, 3]),
                          shape=["B", T, c.num_heads * c.head_dim])
        h = h + self.linear(sb, f"{p}.self_attn.o_proj", attn)
        x = self.norm(sb, f"{p}.post_attention_layernorm.weight", h)
        gate = self.linear(sb, f"{p}.mlp.gate_proj", x)
        up = self.linear(sb, f"{p}.mlp.up_proj", x)
        h = h + self.linear(sb, f"{p}.mlp.down_proj", sb.fast_swiglu(gate, up))
        return h, k_cache, v_cache

    def forward(self, sb, tokens: Value, T, rope_offset, cache_offset, key_mask,
                caches: list[Value]):
        """Logits [B, V] after the last of the T tokens, and the new caches."""
        h = self.embed(sb, tokens)
        new_caches = []
        for i in range(self.c.num_layers):
            h, k_cache, v_cache = self.layer(sb, i, h, T, rope_offset, cache_offset, key_mask,
                                             caches[2 * i], caches[2 * i + 1])
            new_caches += [k_cache, v_cache]
        if T != 1:
            # A static slice at T - 1 (prompts are left-padded): a dynamic one
            # would clamp its start with T - 1 as a constant, compiling a new
            # fused CPU kernel for every prompt length.
            h = sb.slice(h, starts=[0, f"{T}-1", 0], lengths=["B", 1, self.c.hidden_size])
        h = sb.reshape(h, shape=["B", self.c.hidden_size])
        h = self.norm(sb, "norm.weight", h)
        head = "embed_tokens" if self.c.tie_embeddings else "lm_head"
        return self.linear(sb, head, h), new_caches

    def cache_inputs(self, b: ProgramBuilder) -> list[Value]:
        c = self.c
        shape = ["B", c.num_kv_heads, "S", c.head_dim]
        return [b.input(f"{kind}_cache.{i}", shape, CACHE_DTYPE)
                for i in range(c.num_layers) for kind in ("k", "v")]

    def pick(self, sb, logits: Value, key: Value, sampling: Sampling):
        if sampling.temperature == 0:
            return sb.sample_greedy(logits), key
        return sb.sample(logits, key, temperature=sampling.temperature, top_k=sampling.top_k,
                         top_p=sampling.top_p, min_p=sampling.min_p)


def _builder(spec: ModelSpec, name: str, max_length: int, max_batch: int,
             prompt: bool = False):
    """A builder with the batch dim ``B``, the prompt length ``T`` (with
    ``prompt``) and the cache length ``S``, declared in that order so that
    the build-time sample binding has ``T <= S``."""
    if max_length < 2:
        raise ModelError(f"max_length must be at least 2, got {max_length}")
    b = ProgramBuilder(name)
    b.dim("B", min=1, max=max_batch)
    if prompt:
        b.dim("T", min=1, max=max_length)
    b.dim("S", min=1, max=max_length)
    return b, _Model(b, spec)


def build_prefill(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                  max_batch: int = 64) -> Program:
    """The prefill program: runs a left-padded prompt batch [B, T] through the
    model, writing the caches from position 0, and picks the first new token
    (or, with ``sampling=None``, returns the logits after the last token)."""
    b, model = _builder(spec, "prefill", max_length, max_batch, prompt=True)
    tokens = b.input("tokens", ["B", "T"], "int32")
    rope_offset = b.input("rope_offset", ["B"], "int32")
    key_mask = b.input("key_mask", ["B", "S"], "bool")
    key = b.input("key", [2], "uint32")
    caches = model.cache_inputs(b)
    logits, new_caches = model.forward(b, tokens, "T", rope_offset, b.constant(0, "int32"),
                                       key_mask, caches)
    if sampling is None:
        return b.build(check=False, outputs=[logits, *new_caches])
    ids, next_key = model.pick(b, logits, key, sampling)
    return b.build(check=False, outputs=[ids, next_key, *new_caches])


def build_decode(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                 max_batch: int = 64) -> Program:
    """One decode step: the tokens [B] picked last, written at ``cache_offset``;
    picks the next tokens (or returns the logits with ``sampling=None``)."""
    b, model = _builder(spec, "decode", max_length, max_batch)
    tokens, rope_offset, cache_offset, key_mask, key, caches = _decode_inputs(b, model)
    logits, new_caches = model.forward(b, b.reshape(tokens, shape=["B", 1]), 1, rope_offset,
                                       cache_offset, key_mask, caches)
    if sampling is None:
        return b.build(check=False, outputs=[logits, *new_caches])
    ids, next_key = model.pick(b, logits, key, sampling)
    return b.build(check=False, outputs=[ids, next_key, *new_caches])


def build_decode_loop(spec: ModelSpec, max_length: int, sampling: Sampling = Sampling(),
                      max_batch: int = 64) -> Program:
    """The whole decode loop as one program: a ``while`` loop whose body runs a
    decode step, picks the next tokens and streams them to the ``emit``
    callback, until ``emit`` returns true or ``max_new`` tokens were made."""
    b, model = _builder(spec, "decode_loop", max_length, max_batch)
    tokens, rope_offset, cache_offset, key_mask, key, caches = _decode_inputs(b, model)
    max_new = b.input("max_new", [], "int32")

    def cond(sb, tokens, rope_offset, cache_offset, key, made, stop, *caches):
        return sb.logical_and(sb.logical_not(stop), sb.less(made, max_new))

    def body(sb, tokens, rope_offset, cache_offset, key, made, stop, *caches):
        logits, new_caches = model.forward(sb, sb.reshape(tokens, shape=["B", 1]), 1,
                                           rope_offset, cache_offset, key_mask, list(caches))
        ids, next_key = model.pick(sb, logits, key, sampling)
        (stop,) = sb.runtime_call("emit", [ids], [((), "bool")])
        return (ids, rope_offset + 1, cache_offset + 1, next_key, made + 1, stop, *new_caches)

    start = [tokens, rope_offset, cache_offset, key, b.constant(0, "int32"),
             b.constant(False, "bool"), *caches]
    final = b.while_loop(cond, body, start)
    return b.build(check=False, outputs=[final[0], final[3], *final[6:], final[4]])


def _decode_inputs(b: ProgramBuilder, model: _Model):
    tokens = b.input("tokens", ["B"], "int32")
    rope_offset = b.input("rope_offset", ["B"], "int32")
    cache_offset = b.input("cache_offset", [], "int32")
    key_mask = b.input("key_mask", ["B", "S"], "bool")
    key = b.input("key", [2], "uint32")
    return tokens, rope_offset, cache_offset, key_mask, key, model.cache_inputs(b)

