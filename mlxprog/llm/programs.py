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

Each program's inputs and outputs are declared once, as dataclasses whose
field order is the program order (the ``caches`` field stands for the
per-layer ``k_cache.i``/``v_cache.i``): the builders declare the inputs and
outputs from them, and :class:`~mlxprog.llm.LLM` calls the executables by
input name and reads their outputs by field name through them.

Inputs (:class:`PrefillInputs`, :class:`DecodeInputs`, :class:`DecodeLoopInputs`):

- prefill: ``tokens [B, T]`` (T at most S), ``last_index [B]`` (where each
  row's last real token is: the logits after it pick the first new token;
  tokens after it are padding), ``rope_offset [B]``, ``cache_offset []`` (the
  slot of the first token: 0 for a whole prompt, the length of a cached
  prefix otherwise), ``key_mask [B, S]``, ``key [2]``, then
  ``k_cache.i``/``v_cache.i`` per layer.
- decode: ``tokens [B]``, ``rope_offset [B]``, ``cache_offset []``,
  ``key_mask [B, S]``, ``key [2]``, then the caches (``cache_offset < S``).
- decode loop: as decode plus ``max_new []``; a ``while`` loop runs decode
  steps, streaming each new token to the ``emit`` callback (which returns a
  bool: stop), until it says stop or ``max_new`` tokens were made.

Outputs (:class:`StepOutputs`, :class:`LoopOutputs`): ``next_tokens [B]``
(int32), the next PRNG ``key``, then the new caches; the loop also returns
``made``, the number of tokens it made, last. With ``sampling=None`` the step
programs return ``logits [B, V]`` then the caches (:class:`LogitsOutputs`).

Tensor parallelism (``world_size > 1``, mlx-lm's scheme): each rank's
program holds a contiguous block of the KV heads with the query heads of
their groups, and a block of the MLP's intermediate dim (:class:`Shard`).
The q/k/v, gate and up projections are split by output rows, the o and down
projections by input columns, each followed by one ``all_sum``; embeddings,
norms and the LM head are replicated, so every rank ends with the whole
logits. The caches hold the rank's KV heads only, and the captures keep the
model file's names with the rank's shapes (:meth:`ModelSpec.captures` slices
them). With ``world_size`` 1 the programs are the unsharded ones.

The builders check each instruction as it is added and leave the
whole-program validation to ``mlxprog.compile`` / ``mlxprog.validate``, so a
model's program is validated once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any, Generic, Sequence, TypeVar

import mlx.core as mx

from ..arrays import name_of
from ..builder import ProgramBuilder, Value
from ..format.program import Program
from .config import Checkpoint, ModelConfig, ModelError, Quantization, is_int

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
        if self.top_k is not None and (not is_int(self.top_k) or self.top_k < 1):
            raise ModelError(f"top_k must be a positive integer, got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ModelError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ModelError(f"min_p must be in [0, 1), got {self.min_p}")


A = TypeVar("A")  # what a declaration's fields hold: builder Values or arrays
V = TypeVar("V", bound="ProgramValues")

CACHES = "caches"  # the field standing for the per-layer KV caches


def cache_names(num_layers: int) -> list[str]:
    """The per-layer cache names in program order: ``k_cache.0``, ``v_cache.0``,
    ``k_cache.1``, ..."""
    return [f"{kind}_cache.{i}" for i in range(num_layers) for kind in ("k", "v")]


@functools.cache
def _names(cls: type, num_layers: int) -> tuple[str, ...]:
    # Cached: the decode loop on the host names every input of every step.
    names: list[str] = []
    for f in fields(cls):
        names += cache_names(num_layers) if f.name == CACHES else [f.name]
    return tuple(names)


class ProgramValues(Generic[A]):
    """Base of the declarations of the programs' inputs, outputs and loop carry.

    A subclass is a frozen dataclass whose field order is the program order.
    Each field holds one value, except ``caches``: a tuple of the per-layer KV
    caches (``k_cache.0, v_cache.0, k_cache.1, ...``), as many as the model has
    layers. The fields hold builder Values while a program is built and
    arrays when it runs.
    """

    @classmethod
    def names_for(cls, num_layers: int) -> tuple[str, ...]:
        """The names of the values in program order, for a model of
        ``num_layers`` layers (the programs' input names, for inputs)."""
        return _names(cls, num_layers)

    @classmethod
    def of(cls: type[V], values: Sequence[Any]) -> V:
        """The declaration holding ``values`` (in program order: an executable's
        outputs, a loop's carry); the caches are the values the other fields
        leave."""
        declared = fields(cls)
        n_caches = len(values) - (len(declared) - 1)
        if n_caches < 0 or n_caches % 2:
            raise ModelError(f"{cls.__name__} takes {len(declared) - 1} values and a k and v "
                             f"cache per layer, got {len(values)} values")
        given = iter(values)
        return cls(**{f.name: tuple(islice(given, n_caches)) if f.name == CACHES else next(given)
                      for f in declared})

    def values(self) -> list[A]:
        """The values in program order (the caches expanded)."""
        out: list[A] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == CACHES:
                out.extend(value)
            else:
                out.append(value)
        return out

    def by_name(self) -> dict[str, A]:
        """The values by name: an executable's keyword arguments, for inputs."""
        num_layers = len(getattr(self, CACHES)) // 2
        return dict(zip(self.names_for(num_layers), self.values()))


def _input(shape: Sequence[int | str], dtype: str):
    """A field declaring a program input of this shape and dtype (metadata
    only: the field has no default)."""
    return field(metadata={"shape": tuple(shape), "dtype": dtype})


class ProgramInputs(ProgramValues[A]):
    """Base of the input declarations: each field but ``caches`` is declared
    with its shape and dtype (:func:`_input`); the caches are
    ``[B, kv_heads, S, head_dim]`` float32."""

    @classmethod
    def declare(cls: type[V], b: ProgramBuilder, config: ModelConfig, num_kv_heads: int) -> V:
        """Declare the inputs on ``b`` in field order, with caches of
        ``num_kv_heads`` heads (the rank's); the declaration of the resulting
        Values."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == CACHES:
                shape = ["B", num_kv_heads, "S", config.head_dim]
                values[f.name] = tuple(b.input(name, shape, CACHE_DTYPE)
                                       for name in cache_names(config.num_layers))
            else:
                values[f.name] = b.input(f.name, list(f.metadata["shape"]), f.metadata["dtype"])
        return cls(**values)


@dataclass(frozen=True)
class PrefillInputs(ProgramInputs[A]):
    """The prefill's inputs: a prompt batch (left-padded rows, or padded on
    the right after ``last_index``: causal attention keeps those pads out of
    every real token's view, and later steps overwrite their cache slots),
    each row's RoPE start (minus its left padding), the cache slot of the
    first token, the key-padding mask, the PRNG key, and the caches (holding
    the cached prefix before ``cache_offset``, if any)."""

    tokens: A = _input(["B", "T"], "int32")
    last_index: A = _input(["B"], "int32")
    rope_offset: A = _input(["B"], "int32")
    cache_offset: A = _input([], "int32")
    key_mask: A = _input(["B", "S"], "bool")
    key: A = _input([2], "uint32")
    caches: tuple[A, ...]


@dataclass(frozen=True)
class DecodeInputs(ProgramInputs[A]):
    """A decode step's inputs: the tokens picked last, each row's RoPE
    position, the cache slot they are written to, the key-padding mask, the
    PRNG key, the caches."""

    tokens: A = _input(["B"], "int32")
    rope_offset: A = _input(["B"], "int32")
    cache_offset: A = _input([], "int32")
    key_mask: A = _input(["B", "S"], "bool")
    key: A = _input([2], "uint32")
    caches: tuple[A, ...]


@dataclass(frozen=True)
class DecodeLoopInputs(DecodeInputs[A]):
    """The decode loop's inputs: a decode step's, then the most tokens to make."""

    max_new: A = _input([], "int32")


@dataclass(frozen=True)
class StepOutputs(ProgramValues[A]):
    """The outputs of a sampling prefill or decode step: the picked tokens
    ``[B]`` (int32), the next PRNG key, the new caches."""

    next_tokens: A
    key: A
    caches: tuple[A, ...]


@dataclass(frozen=True)
class LogitsOutputs(ProgramValues[A]):
    """The outputs of a prefill or decode step built with ``sampling=None``: the
    logits ``[B, V]`` after the last token, the new caches."""

    logits: A
    caches: tuple[A, ...]


@dataclass(frozen=True)
class LoopOutputs(ProgramValues[A]):
    """The decode loop's outputs: a step's, then how many tokens it made."""

    next_tokens: A
    key: A
    caches: tuple[A, ...]
    made: A


@dataclass(frozen=True)
class LoopCarry(ProgramValues[A]):
    """The decode loop's ``while`` carry: the last tokens and their positions,
    the PRNG key, the tokens made so far, whether ``emit`` said stop, the
    caches."""

    tokens: A
    rope_offset: A
    cache_offset: A
    key: A
    made: A
    stop: A
    caches: tuple[A, ...]


@dataclass(frozen=True)
class ModelSpec:
    """What the program builders need to know about a model: its config, the
    quantization of each quantized layer, each weight's shape/dtype, and the
    file's name for each weight."""

    config: ModelConfig
    quantization: dict[str, Quantization]
    weights: dict[str, tuple[tuple[int, ...], str]]
    source_names: dict[str, str]
    #: Fused projections: a layer name (``layers.0.self_attn.qkv_proj``) to
    #: the layers whose output rows it stacks, in order (see :func:`_fuse`).
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> ModelSpec:
        """The spec of a loaded checkpoint, with its q/k/v and gate/up
        projections fused where they are packed alike."""
        spec = cls(
            config=checkpoint.config,
            quantization=dict(checkpoint.quantization),
            weights={n: (tuple(w.shape), name_of(w.dtype))
                     for n, w in checkpoint.weights.items()},
            source_names={n: checkpoint.source_names.get(n, n) for n in checkpoint.weights},
        )
        for i in range(spec.config.num_layers):
            for fused, parts in _FUSIONS:
                _fuse(spec, f"layers.{i}.{fused}", [f"layers.{i}.{p}" for p in parts])
        return spec

    def shard(self, world_size: int = 1, rank: int = 0) -> Shard:
        """Rank ``rank``'s part of the model split over ``world_size`` ranks
        (see :class:`Shard`); a split the model's heads or quantization groups
        do not allow is a :class:`ModelError` naming ``world_size``."""
        return _shard(self.config, self.quantization, world_size, rank)

    def local_shape(self, name: str, shard: Shard) -> tuple[int, ...]:
        """The shape of weight ``name`` on the rank of ``shard`` (of a fused
        layer: its parts' rows stacked)."""
        layer, part = name.rsplit(".", 1)
        if layer in self.fused:
            shapes = [self.local_shape(f"{p}.{part}", shard) for p in self.fused[layer]]
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        shape = list(self.weights[name][0])
        cut = self._slice(name, shard)
        if cut is not None:
            axis, start, end = cut
            shape[axis] = end - start
        return tuple(shape)

    def captures(self, checkpoint: Checkpoint, world_size: int = 1,
                 rank: int = 0) -> dict[str, mx.array]:
        """The checkpoint's weights under the programs' capture names, sliced
        to rank ``rank``'s part when ``world_size > 1``: rows of the
        q/k/v/gate/up projections (quantized weights with their scales and
        biases), whole quantization groups of the o/down projections' columns.
        A fused layer's arrays are its parts' (rank's) rows stacked, under the
        joined names that :func:`mlxprog.compile` also resolves from the
        model file itself (``blk.0.attn_q.weight+blk.0.attn_k.weight+...``)."""
        shard = self.shard(world_size, rank)
        out = {}
        for name, w in checkpoint.weights.items():
            cut = self._slice(name, shard)
            if cut is not None:
                axis, start, end = cut
                # A copy: a column slice is a strided view, and a copy gives the
                # kernels the dense row-major layout a weight read from a file has.
                w = mx.contiguous(w[start:end] if axis == 0 else w[:, start:end])
            out[self.source_names[name]] = w
        for layer, parts in self.fused.items():
            for part in _PARTS:
                if f"{parts[0]}.{part}" in self.weights:
                    out[self.source_names[f"{layer}.{part}"]] = mx.concatenate(
                        [out[self.source_names[f"{p}.{part}"]] for p in parts], axis=0)
        # Computed here: a lazy array belongs to this thread's stream, and
        # the executables may be compiled in another (the server's).
        mx.eval(list(out.values()))
        return out

    def _slice(self, name: str, shard: Shard) -> tuple[int, int, int] | None:
        """``(axis, start, end)`` of weight ``name``'s stored array that the
        rank of ``shard`` holds, or None: the whole array (replicated, or one
        rank)."""
        if shard.world_size == 1:
            return None
        layer, part = name.rsplit(".", 1)
        kind = layer.rsplit(".", 1)[-1]
        if kind in _ROW_SPLIT:
            start, end = shard.features(_ROW_SPLIT[kind], self.config.head_dim)
            return 0, start, end
        if kind not in _COLUMN_SPLIT or part == "bias":
            # A column split's bias is of its outputs: every rank holds it all
            # and adds it once, after the sum (see _Model.linear).
            return None
        start, end = shard.features(_COLUMN_SPLIT[kind], self.config.head_dim)
        quant = self.quantization.get(layer)
        if quant is not None:
            # Packed weights hold bits/32 words per column, scales and biases
            # one column per group; the split keeps whole groups (see _shard).
            if part == "weight":
                start, end = start * quant.bits // 32, end * quant.bits // 32
            else:
                start, end = start // quant.group_size, end // quant.group_size
        return 1, start, end


# The projections fused into one matmul (they read the same input), by the
# name of the fused layer under ``layers.<i>.``.
_FUSIONS = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj",
                                    "self_attn.v_proj")),
            ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))
_PARTS = ("weight", "scales", "biases", "bias")  # a layer's arrays


def _fuse(spec: ModelSpec, layer: str, parts: list[str]) -> None:
    """Declare ``layer`` in ``spec`` as the projections ``parts`` stacked by
    output rows, when they are all there and packed alike (the same
    quantization, or none; the same dtypes and input width; biases on all or
    none): one matmul then computes all their outputs, each row exactly as
    its own projection would. Its arrays are named by joining the parts'
    file names with ``+``."""
    arrays = [[spec.weights.get(f"{p}.{part}") for part in _PARTS] for p in parts]
    if any(a[0] is None for a in arrays):
        return
    if len({spec.quantization.get(p) for p in parts}) != 1:
        return
    weights = {}
    for i, part in enumerate(_PARTS):
        found = [a[i] for a in arrays]
        if found.count(None) == len(found):
            continue
        if None in found or len({(f[0][1:], f[1]) for f in found}) != 1:
            return
        weights[f"{layer}.{part}"] = ((sum(f[0][0] for f in found), *found[0][0][1:]),
                                      found[0][1])
    spec.weights.update(weights)
    spec.source_names.update({name: "+".join(spec.source_names[f"{p}.{name.rsplit('.', 1)[1]}"]
                                             for p in parts) for name in weights})
    if parts[0] in spec.quantization:
        spec.quantization[layer] = spec.quantization[parts[0]]
    spec.fused[layer] = tuple(parts)


# Which block of a Shard each projection's rows (outputs) or columns (inputs)
# follow.
_ROW_SPLIT = {"q_proj": "heads", "k_proj": "kv_heads", "v_proj": "kv_heads",
              "gate_proj": "intermediate", "up_proj": "intermediate"}
_COLUMN_SPLIT = {"o_proj": "heads", "down_proj": "intermediate"}


@dataclass(frozen=True)
class Shard:
    """One rank's part of a model split over ``world_size`` ranks (tensor
    parallelism): the half-open ranges of the KV heads, the query heads (those
    of its KV heads' groups) and the MLP intermediate dim it holds."""

    world_size: int
    rank: int
    kv_heads: tuple[int, int]
    heads: tuple[int, int]
    intermediate: tuple[int, int]

    @property
    def num_kv_heads(self) -> int:
        """The KV heads the rank holds (its caches' head count)."""
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def num_heads(self) -> int:
        """The query heads the rank holds."""
        return self.heads[1] - self.heads[0]

    def features(self, block: str, head_dim: int) -> tuple[int, int]:
        """The range of features ``block`` (``"heads"``, ``"kv_heads"`` or
        ``"intermediate"``) covers: heads count ``head_dim`` features each."""
        start, end = getattr(self, block)
        return (start, end) if block == "intermediate" else (start * head_dim, end * head_dim)


def _blocks(units: int, world_size: int) -> list[tuple[int, int]]:
    """``units`` split into ``world_size`` contiguous blocks, the first ones
    one larger when they do not divide evenly (3 over 2: 2 and 1)."""
    base, extra = divmod(units, world_size)
    bounds = [0]
    for r in range(world_size):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(zip(bounds, bounds[1:]))


def _shard(config: ModelConfig, quantization: dict[str, Quantization], world_size: int,
           rank: int) -> Shard:
    """Rank ``rank``'s :class:`Shard`: KV heads in contiguous blocks (with
    their query heads), the intermediate dim in blocks of whole quantization
    groups of the down projection's columns; every rank's split is checked,
    so all ranks agree on whether the model can be split."""
    if not is_int(world_size) or world_size < 1:
        raise ModelError(f"world_size must be a positive integer, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ModelError(f"rank {rank!r} is not in [0, world_size {world_size})")
    c = config
    if world_size > c.num_kv_heads:
        raise ModelError(f"world_size {world_size}: the model has {c.num_kv_heads} KV heads "
                         f"and tensor parallelism gives each rank at least one; use a "
                         f"world_size of at most {c.num_kv_heads}")
    group = c.num_heads // c.num_kv_heads
    kv = _blocks(c.num_kv_heads, world_size)
    heads = [(start * group, end * group) for start, end in kv]

    def group_size(kind: str) -> int:
        # One split serves every layer: blocks of whole groups of each layer's
        # quantization of this projection.
        return math.lcm(*(q.group_size for n, q in quantization.items() if n.endswith(kind)))

    o_group = group_size(".self_attn.o_proj")
    for start, _ in heads:
        if start * c.head_dim % o_group:
            raise ModelError(
                f"world_size {world_size}: a rank's query heads would start at column "
                f"{start * c.head_dim} of o_proj, inside a quantization group of "
                f"{o_group} columns; choose a world_size whose head blocks fall on group "
                "boundaries")
    down_group = group_size(".mlp.down_proj")
    units = c.intermediate_size // down_group
    if units < world_size:
        raise ModelError(
            f"world_size {world_size}: the MLP's intermediate size {c.intermediate_size} is "
            f"{units} quantization groups of {down_group} (down_proj's columns), fewer than "
            f"the ranks; use a world_size of at most {units}")
    intermediate = [(start * down_group, end * down_group)
                    for start, end in _blocks(units, world_size)]
    return Shard(world_size, rank, kv[rank], heads[rank], intermediate[rank])


class _Model:
    """Emits the model's instructions into a builder scope."""

    def __init__(self, root: ProgramBuilder, spec: ModelSpec, shard: Shard,
                 numerics: str = "exact"):
        self.root = root
        self.spec = spec
        self.shard = shard
        self.numerics = numerics
        self.c = spec.config
        self._captures: dict[str, Value] = {}

    def weight(self, name: str) -> Value:
        if name not in self._captures:
            dtype = self.spec.weights[name][1]
            self._captures[name] = self.root.capture(
                self.spec.source_names[name], self.spec.local_shape(name, self.shard), dtype)
        return self._captures[name]

    def linear(self, sb, name: str, x: Value, reduce: bool = False) -> Value:
        """``x`` through projection ``name``. With ``reduce`` (the o and down
        projections, split by input columns), the ranks' partial products are
        summed before the bias is added, so the bias counts once."""
        quant = self.spec.quantization.get(name)
        if quant is not None:
            # "exact" is the op's default: such programs stay as they were.
            numerics = {} if self.numerics == "exact" else {"numerics": self.numerics}
            y = sb.quantized_matmul(x, self.weight(f"{name}.weight"),
                                    self.weight(f"{name}.scales"),
                                    self.weight(f"{name}.biases"), transpose=True,
                                    group_size=quant.group_size, bits=quant.bits, **numerics)
        else:
            w = self.weight(f"{name}.weight")
            y = sb.matmul(x, sb.transpose(sb.astype(w, dtype="float32")))
        if reduce and self.shard.world_size > 1:
            y = sb.all_sum(y)
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
        """[B, T, n*D] -> [B, n, T, D]; one token needs no transpose (the
        layouts hold the same order), which saves a graph node."""
        if T == 1:
            return sb.reshape(x, shape=["B", n, 1, self.c.head_dim])
        x = sb.reshape(x, shape=["B", T, n, self.c.head_dim])
        return sb.transpose(x, axes=[0, 2, 1, 3])

    def merge_heads(self, sb, x: Value, n: int, T: int | str) -> Value:
        """[B, n, T, D] -> [B, T, n*D], the inverse of :meth:`heads`."""
        if T == 1:
            return sb.reshape(x, shape=["B", 1, n * self.c.head_dim])
        return sb.reshape(sb.transpose(x, axes=[0, 2, 1, 3]), shape=["B", T, n * self.c.head_dim])

    def qkv(self, sb, i: int, x: Value, T, rope_offset) -> tuple[Value, Value, Value]:
        """Layer ``i``'s queries, keys and values of the normed ``x``, in
        the ``[B, heads, T, D]`` layout, q and k rotated. With the fused
        projection (see :class:`ModelSpec`), one matmul, one RoPE over the
        q and k heads together, and two splits."""
        p = f"layers.{i}.self_attn"
        heads, kv_heads = self.shard.num_heads, self.shard.num_kv_heads
        if f"{p}.qkv_proj" in self.spec.fused:
            y = self.heads(sb, self.linear(sb, f"{p}.qkv_proj", x), heads + 2 * kv_heads, T)
            qk, v = sb.split(y, indices_or_sections=[heads + kv_heads], axis=1)
            q, k = sb.split(self.rope(sb, qk, rope_offset), indices_or_sections=[heads], axis=1)
            return q, k, v
        q = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.q_proj", x), heads, T),
                      rope_offset)
        k = self.rope(sb, self.heads(sb, self.linear(sb, f"{p}.k_proj", x), kv_heads, T),
                      rope_offset)
        v = self.heads(sb, self.linear(sb, f"{p}.v_proj", x), kv_heads, T)
        return q, k, v

    def attention_block(self, sb, qkv: Value, rope_offset, cache_offset, key_mask,
                        k_cache: Value, v_cache: Value) -> tuple[Value, Value, Value]:
        """Attention from the fused projection's output ``qkv`` [B, T,
        (heads + 2 kv_heads) D]: one ``kv_cache_attention_block`` (heads,
        RoPE, cache writes and attention in one node on the CPU) giving
        [B, T, heads * D] and the new caches."""
        c = self.c
        freqs = ([sb.constant(list(c.rope_freqs), "float32")]
                 if c.rope_freqs is not None else [])
        return sb.kv_cache_attention_block(
            qkv, k_cache, v_cache, cache_offset, rope_offset, *freqs, key_mask,
            heads=self.shard.num_heads, kv_heads=self.shard.num_kv_heads, rope_dims=c.head_dim,
            traditional=c.rope_traditional, base=c.rope_theta, rope_scale=c.rope_scale,
            freqs=bool(freqs))

    def mlp(self, sb, i: int, x: Value) -> Value:
        """Layer ``i``'s SwiGLU MLP of the normed ``x`` (before the ranks'
        partial sums are added: the down projection reduces); with the fused
        gate/up projection, one matmul whose halves go to one SwiGLU."""
        p = f"layers.{i}.mlp"
        if f"{p}.gate_up_proj" in self.spec.fused:
            gate_rows = self.spec.local_shape(f"{p}.gate_proj.weight", self.shard)[0]
            fused = self.linear(sb, f"{p}.gate_up_proj", x)
            if 2 * gate_rows == self.spec.local_shape(f"{p}.gate_up_proj.weight",
                                                      self.shard)[0]:
                # Gate and up are the halves: one SwiGLU node, no split.
                return self.linear(sb, f"{p}.down_proj", sb.fast_swiglu(fused), reduce=True)
            gate, up = sb.split(fused, indices_or_sections=[gate_rows], axis=-1)
        else:
            gate = self.linear(sb, f"{p}.gate_proj", x)
            up = self.linear(sb, f"{p}.up_proj", x)
        return self.linear(sb, f"{p}.down_proj", sb.fast_swiglu(gate, up), reduce=True)

    def add_norm(self, sb, name: str, h: Value, y: Value) -> tuple[Value, Value]:
        """The residual ``h + y`` and its norm by weight ``name``, in one op
        (one graph node on the CPU)."""
        weight = sb.astype(self.weight(name), dtype="float32")
        return sb.fast_add_rms_norm(h, y, weight, eps=self.c.norm_eps)

    def layer(self, sb, i: int, h: Value, x: Value, T, rope_offset, cache_offset, key_mask,
              k_cache: Value, v_cache: Value) -> tuple[Value, Value, Value, Value]:
        """Transformer layer ``i`` on the hidden states ``h`` [B, T, hidden]
        and ``x``, their norm by the layer's input norm: ``h`` plus the
        attention, the MLP's output (left for the caller to add with the
        next norm, see :meth:`trunk`) and the layer's new caches."""
        p = f"layers.{i}"
        if f"{p}.self_attn.qkv_proj" in self.spec.fused:
            attn, k_cache, v_cache = self.attention_block(
                sb, self.linear(sb, f"{p}.self_attn.qkv_proj", x), rope_offset, cache_offset,
                key_mask, k_cache, v_cache)
        else:
            q, k, v = self.qkv(sb, i, x, T, rope_offset)
            attn, k_cache, v_cache = sb.kv_cache_sdpa_update(
                q, k, v, k_cache, v_cache, cache_offset, key_mask, layout="BHTD")
            attn = self.merge_heads(sb, attn, self.shard.num_heads, T)
        h, x = self.add_norm(sb, f"{p}.post_attention_layernorm.weight", h,
                             self.linear(sb, f"{p}.self_attn.o_proj", attn, reduce=True))
        return h, self.mlp(sb, i, x), k_cache, v_cache

    def whole_layer(self, i: int) -> Quantization | None:
        """The projections' one quantization where layer ``i`` can be one
        ``transformer_layer`` op (fused q/k/v and gate/up halves, no
        projection biases, one rank), else None."""
        p = f"layers.{i}"
        names = [f"{p}.self_attn.qkv_proj", f"{p}.self_attn.o_proj", f"{p}.mlp.gate_up_proj",
                 f"{p}.mlp.down_proj"]
        quant = {self.spec.quantization.get(name) for name in names}
        if (self.shard.world_size > 1 or len(quant) != 1 or None in quant
                or any(name not in self.spec.fused for name in names[::2])
                or any(f"{name}.bias" in self.spec.weights for name in names)):
            return None
        gate_rows = self.spec.local_shape(f"{p}.mlp.gate_proj.weight", self.shard)[0]
        if 2 * gate_rows != self.spec.local_shape(f"{p}.mlp.gate_up_proj.weight", self.shard)[0]:
            return None
        return quant.pop()

    def transformer_layer(self, sb, i: int, quant: Quantization, h: Value, rope_offset,
                          cache_offset, key_mask, k_cache: Value,
                          v_cache: Value) -> tuple[Value, Value, Value]:
        """Layer ``i`` as one ``transformer_layer`` op (see
        :meth:`whole_layer`): the layer's hidden states and new caches."""
        p, c = f"layers.{i}", self.c
        projections = [self.weight(f"{p}.{name}.{part}")
                       for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                    "mlp.down_proj")
                       for part in ("weight", "scales", "biases")]
        freqs = ([sb.constant(list(c.rope_freqs), "float32")]
                 if c.rope_freqs is not None else [])
        return sb.transformer_layer(
            h, self.weight(f"{p}.input_layernorm.weight"), *projections[:6],
            self.weight(f"{p}.post_attention_layernorm.weight"), *projections[6:], k_cache,
            v_cache, cache_offset, rope_offset, *freqs, key_mask, heads=self.shard.num_heads,
            kv_heads=self.shard.num_kv_heads, rope_dims=c.head_dim,
            traditional=c.rope_traditional, base=c.rope_theta, rope_scale=c.rope_scale,
            freqs=bool(freqs), eps=c.norm_eps, group_size=quant.group_size, bits=quant.bits,
            **({} if self.numerics == "exact" else {"numerics": self.numerics}))

    def trunk(self, sb, h: Value, T, rope_offset, cache_offset, key_mask,
              caches: Sequence[Value]) -> tuple[Value, tuple[Value, ...]]:
        """Every layer on the embedded tokens ``h`` [B, T, hidden], then the
        final norm: the normed hidden states and the new caches. A layer is
        one ``transformer_layer`` op where it can be (:meth:`whole_layer`);
        between the others each residual add is done with the norm after it
        (:meth:`add_norm`: a layer's MLP output is added there)."""
        pending: Value | None = None  # the last layer's MLP output, not yet added to h

        def normed(name: str) -> Value:
            nonlocal h, pending
            if pending is None:
                return self.norm(sb, name, h)
            h, x = self.add_norm(sb, name, h, pending)
            pending = None
            return x

        new_caches: list[Value] = []
        for i in range(self.c.num_layers):
            k_cache, v_cache = caches[2 * i], caches[2 * i + 1]
            quant = self.whole_layer(i)
            if quant is not None:
                if pending is not None:
                    h, pending = sb.add(h, pending), None
                h, k_cache, v_cache = self.transformer_layer(
                    sb, i, quant, h, rope_offset, cache_offset, key_mask, k_cache, v_cache)
            else:
                x = normed(f"layers.{i}.input_layernorm.weight")
                h, pending, k_cache, v_cache = self.layer(
                    sb, i, h, x, T, rope_offset, cache_offset, key_mask, k_cache, v_cache)
            new_caches += [k_cache, v_cache]
        return normed("norm.weight"), tuple(new_caches)

    def forward(self, sb, tokens: Value, T, rope_offset, cache_offset, key_mask,
                caches: Sequence[Value], last_index: Value | None = None
                ) -> tuple[Value, tuple[Value, ...]]:
        """Logits [B, V] after token ``last_index`` (per row) of the T tokens
        (None: the one token), and the new caches."""
        h, new_caches = self.trunk(sb, self.embed(sb, tokens), T, rope_offset, cache_offset,
                                   key_mask, caches)
        if last_index is not None:
            h = sb.take_along_axis(h, sb.reshape(last_index, shape=["B", 1, 1]), axis=1)
        h = sb.reshape(h, shape=["B", self.c.hidden_size])
        head = "embed_tokens" if self.c.tie_embeddings else "lm_head"
        return self.linear(sb, head, h), new_caches

    def pick(self, sb, logits: Value, key: Value, sampling: Sampling):
        if sampling.temperature == 0:
            return sb.sample_greedy(logits), key
        return sb.sample(logits, key, temperature=sampling.temperature, top_k=sampling.top_k,
                         top_p=sampling.top_p, min_p=sampling.min_p)


def _builder(spec: ModelSpec, name: str, max_length: int, max_batch: int,
             world_size: int, rank: int, numerics: str, prompt: bool = False):
    """A builder with the batch dim ``B``, the prompt length ``T`` (with
    ``prompt``) and the cache length ``S``, declared in that order so that
    the build-time sample binding has ``T <= S``; and the model of rank
    ``rank`` of ``world_size`` whose quantized matmuls use ``numerics``."""
    if max_length < 2:
        raise ModelError(f"max_length must be at least 2, got {max_length}")
    shard = spec.shard(world_size, rank)
    # One rank's program declares no world size, so it stays the unsharded one.
    b = ProgramBuilder(name, world_size=world_size if world_size > 1 else None)
    b.dim("B", min=1, max=max_batch)
    if prompt:
        b.dim("T", min=1, max=max_length)
    b.dim("S", min=1, max=max_length)
    return b, _Model(b, spec, shard, numerics)


def build_prefill(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                  max_batch: int = 64, world_size: int = 1, rank: int = 0,
                  numerics: str = "exact") -> Program:
    """The prefill program: runs a padded prompt batch [B, T] through the
    model, writing the caches from slot ``cache_offset`` (0, or after a cached
    prefix the tokens attend to), and picks the first new token (or, with
    ``sampling=None``, returns the logits after each row's ``last_index``).
    With ``world_size > 1``, rank ``rank``'s program of the tensor-parallel
    model (see the module docstring). ``numerics`` is the quantized matmuls'
    (``"exact"``: MLX's float numerics; ``"int8"``: 8-bit activations and
    integer dot products, see the ``quantized_matmul`` op)."""
    b, model = _builder(spec, "prefill", max_length, max_batch, world_size, rank, numerics,
                          prompt=True)
    x = PrefillInputs.declare(b, spec.config, model.shard.num_kv_heads)
    logits, caches = model.forward(b, x.tokens, "T", x.rope_offset, x.cache_offset,
                                   x.key_mask, x.caches, x.last_index)
    return _build_step(b, model, logits, x.key, caches, sampling)


def build_decode(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                 max_batch: int = 64, world_size: int = 1, rank: int = 0,
                 numerics: str = "exact") -> Program:
    """One decode step: the tokens [B] picked last, written at ``cache_offset``;
    picks the next tokens (or returns the logits with ``sampling=None``).
    ``world_size``, ``rank`` and ``numerics`` as in :func:`build_prefill`."""
    b, model = _builder(spec, "decode", max_length, max_batch, world_size, rank, numerics)
    x = DecodeInputs.declare(b, spec.config, model.shard.num_kv_heads)
    logits, caches = model.forward(b, b.reshape(x.tokens, shape=["B", 1]), 1, x.rope_offset,
                                   x.cache_offset, x.key_mask, x.caches)
    return _build_step(b, model, logits, x.key, caches, sampling)


def _build_step(b: ProgramBuilder, model: _Model, logits: Value, key: Value,
                caches: tuple[Value, ...], sampling: Sampling | None) -> Program:
    """Finish a prefill or decode step: :class:`StepOutputs`, or with
    ``sampling=None`` :class:`LogitsOutputs`."""
    if sampling is None:
        outputs: ProgramValues[Value] = LogitsOutputs(logits=logits, caches=caches)
    else:
        next_tokens, next_key = model.pick(b, logits, key, sampling)
        outputs = StepOutputs(next_tokens=next_tokens, key=next_key, caches=caches)
    return b.build(check=False, outputs=outputs.values())


def build_decode_loop(spec: ModelSpec, max_length: int, sampling: Sampling = Sampling(),
                      max_batch: int = 64, world_size: int = 1, rank: int = 0,
                  numerics: str = "exact") -> Program:
    """The whole decode loop as one program: a ``while`` loop whose body runs a
    decode step, picks the next tokens and streams them to the ``emit``
    callback, until ``emit`` returns true or ``max_new`` tokens were made.
    ``world_size``, ``rank`` and ``numerics`` as in :func:`build_prefill` (every rank picks
    the same tokens from the same logits and key, so every rank's ``emit``
    sees the same tokens)."""
    b, model = _builder(spec, "decode_loop", max_length, max_batch, world_size, rank,
                          numerics)
    x = DecodeLoopInputs.declare(b, spec.config, model.shard.num_kv_heads)

    def cond(sb, *carry: Value) -> Value:
        now = LoopCarry.of(carry)
        return sb.logical_and(sb.logical_not(now.stop), sb.less(now.made, x.max_new))

    def body(sb, *carry: Value) -> list[Value]:
        now = LoopCarry.of(carry)
        logits, caches = model.forward(sb, sb.reshape(now.tokens, shape=["B", 1]), 1,
                                       now.rope_offset, now.cache_offset, x.key_mask, now.caches)
        next_tokens, next_key = model.pick(sb, logits, now.key, sampling)
        (stop,) = sb.runtime_call("emit", [next_tokens], [((), "bool")])
        return LoopCarry(tokens=next_tokens, rope_offset=now.rope_offset + 1,
                         cache_offset=now.cache_offset + 1, key=next_key, made=now.made + 1,
                         stop=stop, caches=caches).values()

    start = LoopCarry(tokens=x.tokens, rope_offset=x.rope_offset, cache_offset=x.cache_offset,
                      key=x.key, made=b.constant(0, "int32"), stop=b.constant(False, "bool"),
                      caches=x.caches)
    final = LoopCarry.of(b.while_loop(cond, body, start.values()))
    outputs = LoopOutputs(next_tokens=final.tokens, key=final.key, caches=final.caches,
                          made=final.made)
    return b.build(check=False, outputs=outputs.values())


@dataclass(frozen=True)
class Picking:
    """How one sequence picks its next token from the logits a step program
    returns: the :class:`Sampling`, a repetition penalty over its last
    ``repetition_context_size`` tokens (None: none), whether to report the
    token's log-probability (``logprobs``; on the CPU, MLX's ``exp`` over a
    large vocabulary costs about a millisecond per token, so only when asked)
    and how many of the most likely tokens' (``top_logprobs``)."""

    sampling: Sampling = Sampling()
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    logprobs: bool = False
    top_logprobs: int = 0


def build_pick(vocab_size: int, picking: Picking) -> Program:
    """The token picker, run on the logits of one sequence: inputs ``logits
    [1, V]``, its PRNG ``key`` and ``history [1, N]`` (its last tokens, -1 for
    none; N is ``repetition_context_size``); outputs the picked ``token [1]``
    (int32) and the next key; with ``logprobs``, the token's ``logprob [1]``
    under the model's distribution (after the repetition penalty, before
    temperature and filters) and, with ``top_logprobs`` k > 0, the k most
    likely tokens ``[1, k]`` (int32) and their log-probabilities. A given key
    always picks the same token, as the step programs' own sampling does."""
    b = ProgramBuilder("pick")
    logits = b.input("logits", [1, vocab_size], "float32")
    key = b.input("key", [2], "uint32")
    history = b.input("history", [1, picking.repetition_context_size], "int32")
    if picking.repetition_penalty is not None:
        logits = b.repetition_penalty(logits, history, penalty=picking.repetition_penalty)
    s = picking.sampling
    token, next_key = b.sample(logits, key, temperature=s.temperature, top_k=s.top_k,
                               top_p=s.top_p, min_p=s.min_p)
    outputs = [token, next_key]
    if not (picking.logprobs or picking.top_logprobs):
        return b.build(outputs)
    logprobs = logits - b.logsumexp(logits, axes=[-1], keepdims=True)
    outputs.append(b.reshape(
        b.take_along_axis(logprobs, b.reshape(token, shape=[1, 1]), axis=-1), shape=[1]))
    if picking.top_logprobs:
        top_values, top_ids = b.top_k(logprobs, k=picking.top_logprobs)
        outputs += [b.astype(top_ids, dtype="int32"), top_values]
    return b.build(outputs)
