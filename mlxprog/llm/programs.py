"""A model as mlxprog programs: prefill, decode step, decode loop.

The forward pass is the model family's (:mod:`mlxprog.llm.models`); this
module declares the programs around it and builds them.

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
field order is the program order (the ``caches`` field stands for the KV
cache's arrays, which its :class:`~mlxprog.llm.cache.CacheLayout` names and
declares: ``k_cache.i``/``v_cache.i`` per layer for a float cache): the
builders declare the inputs and outputs from them, and
:class:`~mlxprog.llm.LLM` calls the executables by input name and reads
their outputs by field name through them.

Inputs (:class:`PrefillInputs`, :class:`DecodeInputs`, :class:`DecodeLoopInputs`):

- prefill: ``tokens [B, T]`` (T at most S), ``last_index [B]`` (where each
  row's last real token is: the logits after it pick the first new token;
  tokens after it are padding), ``rope_offset [B]``, ``cache_offset []`` (the
  slot of the first token: 0 for a whole prompt, the length of a cached
  prefix otherwise), ``key_mask [B, S]``, ``key [2]``, then the caches
  (:meth:`CacheLayout.program_names <mlxprog.llm.cache.CacheLayout.program_names>`).
- decode: ``tokens [B]``, ``rope_offset [B]``, ``cache_offset []``,
  ``key_mask [B, S]``, ``key [2]``, then the caches (``cache_offset < S``).
- decode loop: as decode plus ``max_new []``; a ``while`` loop runs decode
  steps, streaming each new token to the ``emit`` callback (which returns a
  bool: stop), until it says stop or ``max_new`` tokens were made.

Outputs (:class:`StepOutputs`, :class:`LoopOutputs`): ``next_tokens [B]``
(int32), the next PRNG ``key``, then the new caches; the loop also returns
``made``, the number of tokens it made, last. With ``sampling=None`` the step
programs return ``logits [B, V]`` then the caches (:class:`LogitsOutputs`).

The embedding program (:func:`build_embed`, inputs :class:`EmbedInputs`)
takes no caches: it runs a right-padded batch from empty ones made inside
it and returns each row's pooled final hidden states ``[B, hidden]``.

Tensor parallelism (``world_size > 1``, mlx-lm's scheme): each rank's
program holds a contiguous block of the KV heads with the query heads of
their groups, and a block of the MLP's intermediate dim (:class:`Shard`).
The q/k/v, gate and up projections are split by output rows, the o and down
projections by input columns, each followed by one ``all_sum``; embeddings,
norms and the LM head are replicated, so every rank ends with the whole
logits. The caches hold the rank's KV heads only, and the captures keep the
model file's names with the rank's shapes (:meth:`ModelSpec.captures` slices
them; see :mod:`mlxprog.llm.spec`). With ``world_size`` 1 the programs are
the unsharded ones.

The builders check each instruction as it is added and leave the
whole-program validation to ``mlxprog.compile`` / ``mlxprog.validate``, so a
model's program is validated once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any, Generic, Sequence, TypeVar

from ..arrays import is_int, name_of
from ..builder import ProgramBuilder, Value
from ..errors import ModelError
from ..format.program import Program
from .cache import CacheLayout
from .models import family_of
from .models.base import Decoder, ProgramNumerics
from .spec import ModelSpec

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

CACHES = "caches"  # the field standing for the KV cache's arrays


@functools.cache
def _names(cls: type, layout: CacheLayout | None) -> tuple[str, ...]:
    # Cached: the decode loop on the host names every input of every step.
    names: list[str] = []
    for f in fields(cls):
        names += layout.program_names() if f.name == CACHES else [f.name]
    return tuple(names)


class ProgramValues(Generic[A]):
    """Base of the declarations of the programs' inputs, outputs and loop carry.

    A subclass is a frozen dataclass whose field order is the program order.
    Each field holds one value, except ``caches``: a tuple of the KV cache's
    arrays in program order (:meth:`CacheLayout.program_names
    <mlxprog.llm.cache.CacheLayout.program_names>`: ``k_cache.0, v_cache.0,
    k_cache.1, ...`` for a float cache). The fields hold builder Values
    while a program is built and arrays when it runs.
    """

    @classmethod
    def names_for(cls, layout: CacheLayout) -> tuple[str, ...]:
        """The names of the values in program order, with the caches of
        ``layout``: the programs' input names, for inputs."""
        return _names(cls, layout)

    @classmethod
    def of(cls: type[V], values: Sequence[Any], layout: CacheLayout | None = None) -> V:
        """The declaration holding ``values`` (in program order: an executable's
        outputs, a loop's carry); the caches are the values the other fields
        leave, as many as ``layout`` has arrays where it is given."""
        declared = fields(cls)
        n_caches = len(values) - (len(declared) - 1)
        expected = None if layout is None else len(layout.program_names())
        if n_caches < 0 or expected not in (None, n_caches):
            arrays = "its caches" if layout is None else (
                f"the {expected} arrays of a cache of {layout.describe()}")
            raise ModelError(f"{cls.__name__} takes {len(declared) - 1} values and {arrays}, "
                             f"got {len(values)} values")
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

    def by_name(self, layout: CacheLayout | None = None) -> dict[str, A]:
        """The values by name, the caches named as ``layout`` names them (a
        declaration with caches needs it): an executable's keyword
        arguments, for inputs."""
        caches = getattr(self, CACHES, None)  # a program may take no caches
        if caches is not None and layout is None:
            raise ModelError(f"{type(self).__name__}.by_name needs the cache's layout to name "
                             f"its {len(caches)} cache arrays")
        return dict(zip(_names(type(self), layout), self.values()))


def declare_caches(b: ProgramBuilder, kv: CacheLayout, slots: int | str) -> tuple[Value, ...]:
    """Declare the cache inputs of layout ``kv`` on ``b`` in program order
    (:meth:`CacheLayout.program_names <mlxprog.llm.cache.CacheLayout.program_names>`),
    ``[B, ...]`` of ``slots`` slots each (:meth:`CacheLayout.slot_specs
    <mlxprog.llm.cache.CacheLayout.slot_specs>`: the layout's KV heads, which are
    the rank's in a split model)."""
    return tuple(b.input(name, ["B", *shape[1:]], name_of(dtype))
                 for name, (shape, dtype) in zip(kv.program_names(), kv.slot_specs(slots)))


def _input(shape: Sequence[int | str], dtype: str):
    """A field declaring a program input of this shape and dtype (metadata
    only: the field has no default)."""
    return field(metadata={"shape": tuple(shape), "dtype": dtype})


class ProgramInputs(ProgramValues[A]):
    """Base of the input declarations: each field but ``caches`` is declared
    with its shape and dtype (:func:`_input`); the caches are declared from
    the layout (:func:`declare_caches`)."""

    @classmethod
    def declare(cls: type[V], b: ProgramBuilder, kv: CacheLayout) -> V:
        """Declare the inputs on ``b`` in field order, with the caches of
        layout ``kv`` (the decoder's: its KV heads are the rank's); the
        declaration of the resulting Values."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == CACHES:
                values[f.name] = declare_caches(b, kv, "S")
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
class VerifyInputs(ProgramInputs[A]):
    """A speculative verify step's inputs: each row's T tokens (the token
    picked last, then the drafted ones), the RoPE position of the first, the
    cache slot it is written to (the rest follow it), the key-padding mask,
    the caches."""

    tokens: A = _input(["B", "T"], "int32")
    rope_offset: A = _input(["B"], "int32")
    cache_offset: A = _input([], "int32")
    key_mask: A = _input(["B", "S"], "bool")
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
    logits ``[B, V]`` after the last token (a verify step's: ``[B, T, V]``,
    after each token), the new caches."""

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


def _builder(spec: ModelSpec, name: str, max_length: int, max_batch: int,
             world_size: int, rank: int, numerics: str | ProgramNumerics, prompt: bool = False,
             cache: bool = True, kv: CacheLayout | None = None):
    """A builder with the batch dim ``B``, the prompt length ``T`` (with
    ``prompt``) and the cache length ``S`` (with ``cache``: a program whose
    caches live only inside it has none), declared in that order so that
    the build-time sample binding has ``T <= S``; and the model of rank
    ``rank`` of ``world_size`` whose quantized matmuls use ``numerics``, over
    a KV cache of layout ``kv`` (None: float32, unbounded)."""
    if max_length < 2:
        raise ModelError(f"max_length must be at least 2, got {max_length}")
    shard = spec.shard(world_size, rank)
    # One rank's program declares no world size, so it stays the unsharded one.
    b = ProgramBuilder(name, world_size=world_size if world_size > 1 else None)
    b.dim("B", min=1, max=max_batch)
    if prompt:
        b.dim("T", min=1, max=max_length)
    if cache:
        b.dim("S", min=1, max=max_length)
    return b, family_of(spec.config).decoder(b, spec, shard, numerics, kv)


def build_prefill(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                  max_batch: int = 64, world_size: int = 1, rank: int = 0,
                  numerics: str | ProgramNumerics = "exact",
                  kv: CacheLayout | None = None) -> Program:
    """The prefill program: runs a padded prompt batch [B, T] through the
    model, writing the caches from slot ``cache_offset`` (0, or after a cached
    prefix the tokens attend to), and picks the first new token (or, with
    ``sampling=None``, returns the logits after each row's ``last_index``).
    With ``world_size > 1``, rank ``rank``'s program of the tensor-parallel
    model (see the module docstring). ``numerics`` is the quantized matmuls'
    (``"exact"``: MLX's float numerics; ``"int8"``: 8-bit activations and
    integer dot products, see the ``quantized_matmul`` op), or a
    :class:`~mlxprog.llm.models.base.ProgramNumerics` giving the dense
    projections' and the expert stacks' apart. ``kv`` is the KV
    cache's layout (None: float32, unbounded; see
    :class:`~mlxprog.llm.cache.CacheLayout`): a quantized cache's keys and values
    are three arrays each, a rotating one has ``max_kv_size + 1`` slots (see
    :meth:`Decoder.forward <mlxprog.llm.models.base.Decoder.forward>`)."""
    b, model = _builder(spec, "prefill", max_length, max_batch, world_size, rank, numerics,
                          prompt=True, kv=kv)
    x = PrefillInputs.declare(b, model.kv)
    logits, caches = model.forward(b, x.tokens, "T", x.rope_offset, x.cache_offset,
                                   x.key_mask, x.caches, x.last_index)
    return _build_step(b, model, logits, x.key, caches, sampling)


def build_decode(spec: ModelSpec, max_length: int, sampling: Sampling | None = Sampling(),
                 max_batch: int = 64, world_size: int = 1, rank: int = 0,
                 numerics: str | ProgramNumerics = "exact",
                 kv: CacheLayout | None = None) -> Program:
    """One decode step: the tokens [B] picked last, written at ``cache_offset``;
    picks the next tokens (or returns the logits with ``sampling=None``).
    ``world_size``, ``rank``, ``numerics`` and ``kv`` as in :func:`build_prefill`."""
    b, model = _builder(spec, "decode", max_length, max_batch, world_size, rank, numerics,
                        kv=kv)
    x = DecodeInputs.declare(b, model.kv)
    logits, caches = model.forward(b, b.reshape(x.tokens, shape=["B", 1]), 1, x.rope_offset,
                                   x.cache_offset, x.key_mask, x.caches)
    return _build_step(b, model, logits, x.key, caches, sampling)


def build_verify(spec: ModelSpec, max_length: int, max_batch: int = 64, world_size: int = 1,
                 rank: int = 0, numerics: str | ProgramNumerics = "exact",
                 kv: CacheLayout | None = None) -> Program:
    """The speculative verify step (:class:`VerifyInputs`): T tokens a row
    written from ``cache_offset`` on, as a prefill after a cached prefix
    writes them, returning the logits after every one of them, ``logits [B,
    T, V]``, then the caches (:class:`LogitsOutputs`). It runs the decode
    step's ``numerics``, so that its logits pick the tokens decode steps
    would (see :mod:`~mlxprog.llm.speculative`). ``world_size``, ``rank`` and
    ``kv`` as in :func:`build_prefill`; a rotating cache must not wrap
    within the T tokens (the engine verifies only below ``max_kv_size``)."""
    b, model = _builder(spec, "verify", max_length, max_batch, world_size, rank, numerics,
                        prompt=True, kv=kv)
    x = VerifyInputs.declare(b, model.kv)
    logits, caches = model.forward(b, x.tokens, "T", x.rope_offset, x.cache_offset,
                                   x.key_mask, x.caches, every_position=True)
    return b.build(check=False, outputs=LogitsOutputs(logits=logits, caches=caches).values())


def _build_step(b: ProgramBuilder, model: Decoder, logits: Value, key: Value,
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
                      numerics: str | ProgramNumerics = "exact",
                      kv: CacheLayout | None = None) -> Program:
    """The whole decode loop as one program: a ``while`` loop whose body runs a
    decode step, picks the next tokens and streams them to the ``emit``
    callback, until ``emit`` returns true or ``max_new`` tokens were made.
    ``world_size``, ``rank``, ``numerics`` and ``kv`` as in :func:`build_prefill` (every
    rank picks the same tokens from the same logits and key, so every rank's
    ``emit`` sees the same tokens)."""
    b, model = _builder(spec, "decode_loop", max_length, max_batch, world_size, rank,
                          numerics, kv=kv)
    x = DecodeLoopInputs.declare(b, model.kv)

    def cond(sb, *carry: Value) -> Value:
        now = LoopCarry.of(carry, model.kv)
        return sb.logical_and(sb.logical_not(now.stop), sb.less(now.made, x.max_new))

    def body(sb, *carry: Value) -> list[Value]:
        now = LoopCarry.of(carry, model.kv)
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
    final = LoopCarry.of(b.while_loop(cond, body, start.values()), model.kv)
    outputs = LoopOutputs(next_tokens=final.tokens, key=final.key, caches=final.caches,
                          made=final.made)
    return b.build(check=False, outputs=outputs.values())


#: How :func:`build_embed` pools each row's hidden states: their mean over
#: the row's tokens, or the last token's.
POOLINGS = ("mean", "last")


@dataclass(frozen=True)
class EmbedInputs(ProgramInputs[A]):
    """The embedding program's inputs: a batch of token rows padded on the
    right, and each row's number of real tokens (at least 1). It takes no
    caches: its prefill starts from empty ones, made inside the program."""

    tokens: A = _input(["B", "T"], "int32")
    lengths: A = _input(["B"], "int32")


def build_embed(spec: ModelSpec, max_length: int, pooling: str = "mean",
                normalize: bool = True, max_batch: int = 64, world_size: int = 1,
                rank: int = 0) -> Program:
    """The embedding program: runs a right-padded batch ``tokens [B, T]``
    (:class:`EmbedInputs`) through the model's layers and final norm, as a
    prefill from slot 0 does, and returns ``embeddings [B, hidden]``
    (float32): each row's final hidden states pooled over its ``lengths``
    real tokens by ``pooling`` (``"mean"`` or ``"last"``, see
    :data:`POOLINGS`), divided by their L2 norm with ``normalize``. Causal
    attention keeps the right padding out of every real token's view, so a
    row's embedding does not depend on the others in its batch. The
    quantized matmuls are exact, as most of the prefill's dense ones are
    (see :func:`~mlxprog.llm.compiled.program_numerics`). ``world_size`` and
    ``rank`` as in :func:`build_prefill` (every rank ends with the whole
    hidden states)."""
    if pooling not in POOLINGS:
        raise ModelError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, "
                         f"got {pooling!r}")
    b, model = _builder(spec, "embed", max_length, max_batch, world_size, rank, "exact",
                        prompt=True, cache=False)
    c = spec.config
    x = EmbedInputs.declare(b, model.kv)
    # Empty float caches as long as the rows (attention reads T slots, no
    # more): one zeroed Value for all the arrays of one shape.
    specs = model.kv.slot_specs("T")
    zeros = {spec: b.full(shape=["B", *spec[0][1:]], dtype=name_of(spec[1]), value=0.0)
             for spec in dict.fromkeys(specs)}
    rope_offset = b.full(shape=["B"], dtype="int32", value=0)
    key_mask = b.full(shape=["B", "T"], dtype="bool", value=True)
    h, _ = model.trunk(b, model.embed(b, x.tokens), "T", rope_offset, b.constant(0, "int32"),
                       key_mask, model.kv.layers([zeros[spec] for spec in specs]))
    lengths = b.reshape(x.lengths, shape=["B", 1])
    if pooling == "mean":
        real = b.astype(b.less(b.iota(shape=["B", "T"], axis=1), lengths), dtype="float32")
        pooled = b.sum(h * b.reshape(real, shape=["B", "T", 1]), axes=[1])
        pooled = pooled / b.astype(lengths, dtype="float32")
    else:
        last = b.reshape(lengths - 1, shape=["B", 1, 1])
        pooled = b.reshape(b.take_along_axis(h, last, axis=1), shape=["B", c.hidden_size])
    if normalize:
        # As torch's F.normalize: a norm below 1e-12 counts as 1e-12.
        squares = b.sum(pooled * pooled, axes=[-1], keepdims=True)
        pooled = pooled * b.rsqrt(b.max(squares, 1e-24))
    return b.build(check=False, outputs=[pooled])


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
