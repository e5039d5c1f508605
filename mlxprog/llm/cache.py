"""Prompt caches: the KV cache of tokens a model has already processed, kept
so that a later request extending them prefills only what is new.

A :class:`PromptCache` holds one token sequence and its per-layer keys and
values (``[1, kv_heads, n, head_dim]``, the programs' cache layout); it is
what :meth:`~mlxprog.llm.LLM.generate` takes as ``prompt_cache=`` and what a
chat keeps across turns, and it saves to and loads from ``.safetensors``. A
:class:`PromptCachePool` keeps the most recently used few, for a server whose
requests share prefixes (a system prompt, a conversation so far).

Both answer :meth:`lookup` (the cached tokens and caches that share the
longest prefix with a prompt) and :meth:`store` (what a finished sequence
leaves), which is all the generation engine asks of them.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import mlx.core as mx

from ..arrays import AVal, is_int
from ..cache_kinds import (AFFINE_BITS, AFFINE_GROUP_SIZES, SIDES, CacheKind, RecentRing,
                           cache_kind)
from ..errors import ModelError, SettingError
from .config import ModelConfig

FORMAT = "mlxprog.prompt_cache/1"


#: The code widths and group sizes of a quantized KV cache (``kv_bits``,
#: ``kv_group_size``), and the group size each width takes by default: 4-bit
#: keys round coarsely enough that smaller groups pay (SmolLM2-135M's
#: perplexity: +5.4% with groups of 32, +14.5% with 64, for 20% more bytes;
#: 8 bits: within 0.5% either way).
KV_BITS = AFFINE_BITS
KV_GROUP_SIZES = AFFINE_GROUP_SIZES
DEFAULT_KV_GROUP_SIZES = {4: 32, 8: 64}
#: The first tokens a rotating cache keeps by default (mlx-lm's): the
#: attention sinks a model leans on.
DEFAULT_KEEP = 4
#: The tokens a quantized cache's recent ring keeps in float by default
#: (``kv_recent``): each query reads the last 16 tokens' keys and values
#: unrounded, which takes SmolLM2-135M's 4-bit cache from +6.2% perplexity
#: to +0.3% of the float cache's (the mean of four texts, each within 1.2%;
#: docs/llm.md, "KV cache"), for a fixed 2 x 16 float rows a layer and KV
#: head.
DEFAULT_KV_RECENT = 16

LayerCache = tuple[Any, ...]  # one layer's arrays (or builder Values), as the cache ops take them


@dataclass(frozen=True)
class _Entry:
    """One array of a whole cache in program order: its saved name
    (``k.0.values``), the layer it belongs to (None: every layer's), what it
    is indexed by (``"slots"``: the cache's slots on axis 2; ``"ring"``: the
    recent ring's keys or values; ``"tags"``: the ring's slots) and its
    shape's rows and last dims after ``[B]``, with ``S`` for the slots."""

    name: str
    layer: int | None
    role: str
    shape: tuple[int | str, ...]
    dtype: mx.Dtype

    @property
    def program_name(self) -> str:
        """Its name among the programs' inputs and outputs: the saved name
        with ``_cache`` after its first part (``k_cache.0.values``,
        ``recent_cache.0.keys``, ``recent_cache.slots``)."""
        first, _, rest = self.name.partition(".")
        return f"{first}_cache.{rest}"


@dataclass(frozen=True)
class CacheLayout:
    """The shape of a model's KV cache, and the one description of its
    arrays: what a prompt cache must match to be used with a model, how the
    programs name and declare the cache (:meth:`program_names`,
    :meth:`slot_specs`), how a flat tuple of its arrays groups into layers
    and back (:meth:`layers`, :meth:`flatten`), and how a host grows, trims
    and moves its slots (:meth:`map_slots`, :meth:`shifted`).

    ``kv_bits`` (4 or 8; None: float32 keys and values) quantizes the cached
    keys and values in groups of ``kv_group_size`` features (MLX's affine
    quantization, one float32 scale and bias a group) of their Walsh-Hadamard
    transform: the layout's :attr:`kind` is then an
    :class:`~mlxprog.cache_kinds.AffineCache` with ``hadamard`` (which
    spreads the few large features of keys over their group and so rounds
    them much less), each layer's keys three arrays and so its values.
    ``kv_recent`` (with ``kv_bits``; 0: none) keeps the last that many
    tokens' keys and values in float too, in the recent ring beside the
    cache (:attr:`ring`): each query reads those unrounded. The ring's
    entries name their slots, so a host that moves slots moves them with
    :meth:`shifted` (or they go unread); once a rotating cache has wrapped,
    the newest tokens sit in rotated slots and are read quantized.
    ``max_kv_size`` (None: no bound) makes the cache rotating: its capacity
    is that many tokens, the first ``keep`` and the most recent ones, in
    ``max_kv_size + 1`` slots (:meth:`Decoder.forward
    <mlxprog.llm.models.base.Decoder.forward>`).
    Values out of range are a :class:`~mlxprog.errors.SettingError`
    naming the parameter."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_bits: int | None = None
    kv_group_size: int | None = None
    max_kv_size: int | None = None
    keep: int = 0
    kv_recent: int = 0

    def __post_init__(self) -> None:
        if not is_int(self.kv_recent) or self.kv_recent < 0:
            raise SettingError("kv_recent", f"must be an integer >= 0, got {self.kv_recent!r}")
        if self.kv_bits is None:
            if self.kv_group_size is not None:
                raise SettingError("kv_group_size", "is a setting of the quantized cache: "
                                   "give kv_bits too")
            if self.kv_recent:
                raise SettingError("kv_recent", "is a setting of the quantized cache: give "
                                   "kv_bits too")
        else:
            if self.kv_bits not in KV_BITS:
                raise SettingError("kv_bits", f"must be one of {', '.join(map(str, KV_BITS))}, "
                                   f"got {self.kv_bits!r}")
            if self.kv_group_size not in KV_GROUP_SIZES:
                raise SettingError("kv_group_size", "must be one of "
                                   f"{', '.join(map(str, KV_GROUP_SIZES))}, "
                                   f"got {self.kv_group_size!r}")
            if self.head_dim % self.kv_group_size:
                raise SettingError("kv_group_size", f"{self.kv_group_size} does not divide the "
                                   f"model's head dim {self.head_dim}")
        if not is_int(self.keep) or self.keep < 0:
            raise SettingError("keep", f"must be an integer >= 0, got {self.keep!r}")
        if self.max_kv_size is None:
            if self.keep:
                raise SettingError("keep", "is a setting of the rotating cache: give "
                                   "max_kv_size too")
        elif not is_int(self.max_kv_size) or self.max_kv_size < self.keep + 1:
            raise SettingError("max_kv_size", f"must be an integer above keep ({self.keep}), "
                               f"got {self.max_kv_size!r}")

    @classmethod
    def of(cls, config: ModelConfig) -> CacheLayout:
        """The float layout of a model with ``config``."""
        return cls(config.num_layers, config.num_kv_heads, config.head_dim)

    @property
    def kind(self) -> CacheKind:
        """How each layer's keys and values are stored: float, or (with
        ``kv_bits``) quantized from each group's Walsh-Hadamard transform."""
        return cache_kind(self.kv_bits, self.kv_group_size, kv_hadamard=self.quantized)

    @property
    def ring(self) -> RecentRing | None:
        """The recent ring (``kv_recent`` tokens), or None."""
        return RecentRing(self.kv_recent) if self.kv_recent else None

    @property
    def quantized(self) -> bool:
        """Whether keys and values are stored quantized."""
        return self.kv_bits is not None

    @property
    def rotating(self) -> bool:
        """Whether the cache is bounded (``max_kv_size``) and rotates."""
        return self.max_kv_size is not None

    @property
    def _entries(self) -> tuple[_Entry, ...]:
        """Every array in program order (:func:`_entries_of`)."""
        return _entries_of(self)

    def array_names(self) -> list[str]:
        """The names of every cache array in program order, as saved files
        hold them: ``k.0``, ``v.0``, ... for a float cache; ``k.0.values``,
        ``k.0.scales``, ``k.0.biases``, ``v.0.values``, ... for a quantized
        one, each layer's then followed by its ring's keys and values
        (``recent.0.keys``, ``recent.0.values``) and, after the last layer,
        the slots the ring's entries hold (``recent.slots``)."""
        return [e.name for e in self._entries]

    def program_names(self) -> list[str]:
        """The names of every cache array among the programs' inputs and
        outputs, in program order: :meth:`array_names` with ``_cache`` after
        the first part (``k_cache.0``, ``v_cache.0``; ``k_cache.0.values``,
        ...; ``recent_cache.0.keys``, ``recent_cache.slots``)."""
        return [e.program_name for e in self._entries]

    def slot_specs(self, slots: int | str) -> list[tuple[tuple[int | str, ...], mx.Dtype]]:
        """The shape (one row) and dtype of each array of a cache of
        ``slots`` slots (an int, or a program's dim name), in program order."""
        return [((1, *(slots if d == "S" else d for d in e.shape)), e.dtype)
                for e in self._entries]

    def layers(self, caches: Sequence[Any]) -> list[LayerCache]:
        """``caches`` (program order: arrays, or a program's Values) grouped
        by layer, each layer's as the cache ops take them: the kind's arrays
        (``k_cache, v_cache``, or ``k_values, k_scales, ..., v_biases``),
        then with a recent ring its ``k_recent, v_recent, recent_slots``
        (the ring's slots, one array in program order, in every layer's).
        :meth:`flatten` is the inverse."""
        layers: list[list[Any]] = [[] for _ in range(self.num_layers)]
        for entry, x in zip(self._entries, caches):
            if entry.layer is None:
                for layer in layers:
                    layer.append(x)
            else:
                layers[entry.layer].append(x)
        return [tuple(layer) for layer in layers]

    def flatten(self, layers: Sequence[LayerCache]) -> tuple[Any, ...]:
        """Per-layer caches (as :meth:`layers` gives them, or as the cache
        ops return them) in program order; of the ring's slots, which every
        layer's op writes alike, the last layer's stand for all."""
        per_layer = len(layers[-1]) if layers else 0
        flat = [x for layer in layers for x in layer[:per_layer - (self.ring is not None)]]
        return tuple(flat) + ((layers[-1][-1],) if self.ring is not None else ())

    def empty(self, batch: int, slots: int) -> tuple[mx.array, ...]:
        """Zeroed caches of ``batch`` rows and ``slots`` slots, in program
        order (an empty recent ring: every slot -1, no entry)."""
        return tuple(mx.full((batch, *shape[1:]), -1 if e.role == "tags" else 0, dtype=dtype)
                     for (shape, dtype), e in zip(self.slot_specs(slots), self._entries))

    def slot_arrays(self, caches: Sequence[mx.array]) -> list[mx.array]:
        """The arrays of ``caches`` (program order) indexed by slot: each
        layer's keys' and values', without its recent ring."""
        return [x for x, e in zip(caches, self._entries) if e.role == "slots"]

    def map_slots(self, caches: Sequence[Any], slots: Callable[[Any], Any],
                  ring: Callable[[Any], Any] | None = None,
                  tags: Callable[[Any], Any] | None = None) -> tuple[Any, ...]:
        """``caches`` (program order) with ``slots`` applied to each array
        indexed by slot (axis 2), ``ring`` to the recent ring's keys and
        values and ``tags`` to its slots (either default: as they are)."""
        given = {"slots": slots, "ring": ring, "tags": tags}
        return tuple(given[e.role](x) if given[e.role] else x
                     for x, e in zip(caches, self._entries))

    def widened(self, caches: Sequence[mx.array], width: int) -> tuple[mx.array, ...]:
        """``caches`` (program order) with empty slots added after their
        last to make ``width``."""
        return self.map_slots(
            caches, lambda x: mx.pad(x, [(0, 0), (0, 0), (0, width - x.shape[2]), (0, 0)]))

    def shifted(self, caches: Sequence[mx.array], shift: int,
                slots: Callable[[mx.array], mx.array]) -> tuple[mx.array, ...]:
        """``caches`` whose slots ``slots`` moves by ``shift`` (a slot s is
        then s + shift; it drops slots moved below 0), the recent ring's
        entries moved with them: the entry of slot s belongs at ``s %
        kv_recent``, so the ring turns by ``shift`` (an entry moved below
        slot 0 is dropped)."""
        if not shift:
            return self.map_slots(caches, slots)

        def moved(tags: mx.array) -> mx.array:
            tags = mx.roll(tags, shift, axis=1)
            return mx.where((tags >= 0) & (tags + shift >= 0), tags + shift, -1)
        return self.map_slots(caches, slots, lambda x: mx.roll(x, shift, axis=2), moved)

    def keys_values(self, caches: Sequence[mx.array]) -> list[mx.array]:
        """The float32 keys and values ``caches`` hold (program order):
        each layer's keys, then its values (the kind's
        :meth:`~mlxprog.cache_kinds.CacheKind.decode`)."""
        kind, per_side = self.kind, len(self.kind.parts)
        arrays = self.slot_arrays(caches)
        return [kind.decode(arrays[i:i + per_side], SIDES[(i // per_side) % 2])
                for i in range(0, len(arrays), per_side)]

    def holding(self, keys_values: Sequence[mx.array]) -> tuple[mx.array, ...]:
        """A cache in this layout holding ``keys_values`` (each layer's keys,
        then its values, float ``[B, kv_heads, n, head_dim]``: the kind's
        :meth:`~mlxprog.cache_kinds.CacheKind.encode`), its recent ring
        empty."""
        encoded = iter([a for i, x in enumerate(keys_values)
                        for a in self.kind.encode(x, SIDES[i % 2])])
        return self.map_slots(self.empty(keys_values[0].shape[0], 0), lambda _: next(encoded))

    def check(self, caches: Sequence[mx.array], n: int) -> None:
        """That ``caches`` hold ``n`` slots of this layout (one row); a
        :class:`~mlxprog.errors.ModelError` names the array that does
        not."""
        names = self.array_names()
        if len(caches) != len(names):
            raise ModelError(f"a prompt cache of {self.describe()} needs "
                             f"{len(names)} caches, got {len(caches)}")
        for name, cache, (shape, dtype) in zip(names, caches, self.slot_specs(n)):
            if tuple(cache.shape) != shape or cache.dtype != dtype:
                raise ModelError(f"prompt cache {name} must be {AVal(shape, dtype)} "
                                 f"for {n} tokens, found {AVal.of(cache)}")

    def sdpa_op(self) -> tuple[str, dict[str, Any]]:
        """The op that writes a layer's new keys and values into this cache
        and attends over it, with the attributes that give it this layout's
        kind and ring (:meth:`CacheKind.sdpa_op
        <mlxprog.cache_kinds.CacheKind.sdpa_op>`)."""
        return self.kind.sdpa_op(self.ring)

    def block_attributes(self) -> dict[str, Any]:
        """The attributes that give ``kv_cache_attention_block`` and
        ``transformer_layer`` this layout's cache: none for a float cache;
        ``kv_bits``, ``kv_group_size``, ``kv_hadamard`` and with a ring
        ``kv_recent`` for a quantized one."""
        ring = {"kv_recent": self.kv_recent} if self.ring is not None else {}
        return {**self.kind.block_attributes(), **ring}

    def bytes_per_token(self) -> int:
        """Bytes one cached token takes, every layer's keys and values (the
        recent ring's fixed bytes aside)."""
        per_head = sum(a.width * a.dtype.size for a in self.kind.arrays(self.head_dim))
        return self.num_layers * self.num_kv_heads * per_head

    def describe(self) -> str:
        """``30 layers x 3 KV heads x 64``, and the quantization and bound
        when set (``, 8-bit keys/values (groups of 64), the last 16 in
        float, at most 512 tokens keeping the first 4``)."""
        text = f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}"
        if self.quantized:
            text += f", {self.kind.describe()}"
            if self.kv_recent:
                text += f", the last {self.kv_recent} in float"
        if self.rotating:
            text += f", at most {self.max_kv_size} tokens keeping the first {self.keep}"
        return text


@functools.lru_cache(maxsize=64)
def _entries_of(layout: CacheLayout) -> tuple[_Entry, ...]:
    """Every array of a cache of ``layout`` in program order: each layer's
    keys' arrays, its values' (:meth:`CacheKind.arrays
    <mlxprog.cache_kinds.CacheKind.arrays>`) and its recent ring's keys and
    values; then the ring's slots, one array for every layer (each step
    writes the same slots in all of them). Cached: hosts ask for every
    step's names and slot maps."""
    heads, dim, ring = layout.num_kv_heads, layout.head_dim, layout.ring
    # The ring's arrays after a row's batch dim (the slots' count does not matter).
    ring_specs = [] if ring is None else [
        (part, spec.shape[1:], spec.dtype)
        for part, spec in zip(RecentRing.PARTS, ring.specs((1, heads, 0, dim)))]
    entries = []
    for i in range(layout.num_layers):
        for a in layout.kind.arrays(dim):
            entries.append(_Entry(f"{a.side}.{i}" + (f".{a.part}" if a.part else ""), i,
                                  "slots", (heads, "S", a.width), a.dtype))
        entries += [_Entry(f"recent.{i}.{part}", i, "ring", shape, dtype)
                    for part, shape, dtype in ring_specs[:2]]
    entries += [_Entry(f"recent.{part}", None, "tags", shape, dtype)
                for part, shape, dtype in ring_specs[2:]]
    return tuple(entries)


def kv_cache_layout(num_layers: int, num_kv_heads: int, head_dim: int, max_length: int,
                    kv_bits: int | None = None, kv_group_size: int | None = None,
                    max_kv_size: int | None = None, keep: int | None = None,
                    kv_recent: int | None = None) -> CacheLayout:
    """The layout of a model's KV cache from the settings of
    :func:`~mlxprog.llm.load`: ``kv_group_size`` defaults to
    :data:`DEFAULT_KV_GROUP_SIZES` and ``kv_recent`` to
    :data:`DEFAULT_KV_RECENT` with ``kv_bits``, ``keep`` to
    :data:`DEFAULT_KEEP` (at most ``max_kv_size - 1``) with ``max_kv_size``,
    which must leave the spare slot a rotating cache writes to within
    ``max_length``. Bad values raise :class:`~mlxprog.errors.SettingError`
    naming the parameter."""
    if kv_bits is not None and kv_group_size is None:
        # An unknown kv_bits (the layout names it) leaves no default.
        kv_group_size = DEFAULT_KV_GROUP_SIZES[kv_bits] if kv_bits in KV_BITS else None
    if kv_recent is None:
        kv_recent = DEFAULT_KV_RECENT if kv_bits is not None else 0
    if max_kv_size is not None:
        if not is_int(max_kv_size) or max_kv_size < 2:
            raise SettingError("max_kv_size", f"must be an integer >= 2, got {max_kv_size!r}")
        if max_kv_size >= max_length:
            raise SettingError("max_kv_size", f"{max_kv_size} must be below max_length "
                               f"({max_length}): the rotating cache takes max_kv_size + 1 slots")
        if keep is None:
            keep = min(DEFAULT_KEEP, max_kv_size - 1)
    return CacheLayout(num_layers, num_kv_heads, head_dim, kv_bits, kv_group_size, max_kv_size,
                       0 if keep is None else keep, kv_recent)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PromptCache:
    """The KV cache of one token sequence (``tokens``); ``caches`` holds the
    per-layer keys and values in program order (``k.0, v.0, k.1, ...``, each
    ``[1, kv_heads, len(tokens), head_dim]`` float32; with a quantized
    ``layout`` three arrays each, see :meth:`CacheLayout.array_names`), or is
    empty when nothing is cached yet. A saved file records the layout, and
    loading it for a model whose cache has another (another quantization or
    bound included) is a :class:`~mlxprog.errors.ModelError`.

    Make one with :meth:`LLM.prompt_cache <mlxprog.llm.LLM.prompt_cache>` (empty)
    or :meth:`LLM.cache_prompt <mlxprog.llm.LLM.cache_prompt>` (a prefilled
    prompt) and pass it to generation as ``prompt_cache=``: generation reuses
    the longest prefix it shares with the new prompt and leaves the cache
    holding the prompt and the reply. Not safe to share between generations
    running at the same time."""

    def __init__(self, layout: CacheLayout, tokens: Sequence[int] = (),
                 caches: Sequence[mx.array] = ()):
        self.layout = layout
        self.tokens: list[int] = []
        self.caches: tuple[mx.array, ...] = ()
        self.store(tokens, caches)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"PromptCache({len(self)} tokens, {self.layout.describe()})"

    def lookup(self, ids: Sequence[int]) -> tuple[list[int], tuple[mx.array, ...]]:
        """The cached tokens and caches (the whole sequence: callers use the
        prefix it shares with ``ids``)."""
        return self.tokens, self.caches

    def store(self, tokens: Sequence[int], caches: Sequence[mx.array]) -> None:
        """Hold ``tokens`` and their caches (replacing what was held)."""
        tokens, caches = list(tokens), tuple(caches)
        if tokens:
            self.layout.check(caches, len(tokens))
        self.tokens, self.caches = tokens, caches if tokens else ()

    def clear(self) -> None:
        """Forget everything cached."""
        self.tokens, self.caches = [], ()

    def nbytes(self) -> int:
        """Bytes the cached keys and values take."""
        return sum(c.nbytes for c in self.caches)

    def converted(self, layout: CacheLayout) -> PromptCache:
        """The same tokens' cache in another ``layout`` of the same model
        shape: keys and values quantized (or dequantized) as that layout
        stores them, so a cache prefilled once serves models loaded with
        another ``kv_bits``. A rotating layout must hold every token."""
        if (layout.num_layers, layout.num_kv_heads, layout.head_dim) != (
                self.layout.num_layers, self.layout.num_kv_heads, self.layout.head_dim):
            raise ModelError(f"a prompt cache of {self.layout.describe()} cannot become one of "
                             f"{layout.describe()}: another model's")
        if layout.rotating and len(self) > layout.max_kv_size:
            raise ModelError(f"{len(self)} cached tokens do not fit a rotating cache of "
                             f"{layout.max_kv_size}")
        if not self.caches:
            return PromptCache(layout)
        # The recent ring starts empty: its entries are of another layout's.
        return PromptCache(layout, self.tokens,
                           layout.holding(self.layout.keys_values(self.caches)))

    def save(self, path: str | Path) -> None:
        """Write the cache to ``path`` (``.safetensors``): the tokens, the
        caches and the layout, which :meth:`load` checks."""
        arrays = {"tokens": mx.array(self.tokens, dtype=mx.int32)}
        arrays.update(zip(self.layout.array_names(), self.caches))
        metadata = {"format": FORMAT, "layout": json.dumps(vars(self.layout))}
        mx.save_safetensors(str(path), arrays, metadata=metadata)

    @classmethod
    def load(cls, path: str | Path, layout: CacheLayout | None = None) -> PromptCache:
        """Read a cache written by :meth:`save`; with ``layout`` (a model's,
        see :meth:`LLM.load_prompt_cache <mlxprog.llm.LLM.load_prompt_cache>`),
        a cache made by a model of another shape is an error."""
        try:
            arrays, metadata = mx.load(str(path), return_metadata=True)
        except (OSError, RuntimeError, ValueError) as e:
            raise ModelError(f"{path}: cannot read a prompt cache: {e}") from e
        if metadata.get("format") != FORMAT:
            raise ModelError(f"{path}: not a prompt cache (no {FORMAT!r} format tag)")
        try:
            saved = CacheLayout(**json.loads(metadata["layout"]))
        except (KeyError, TypeError, ValueError, ModelError) as e:
            raise ModelError(f"{path}: the prompt cache's layout is unreadable: {e}") from e
        if layout is not None and replace(saved, kv_recent=0) != replace(layout, kv_recent=0):
            raise ModelError(f"{path}: the prompt cache was made by a model of "
                             f"{saved.describe()}; this model has {layout.describe()}")
        tokens = arrays.get("tokens")
        if tokens is None or tokens.ndim != 1:
            raise ModelError(f"{path}: the prompt cache has no 1-D 'tokens' array")
        names = saved.array_names()
        missing = [n for n in names if n not in arrays]
        if tokens.size and missing:
            raise ModelError(f"{path}: the prompt cache lacks {', '.join(missing[:3])}")
        try:
            cache = cls(saved, tokens.tolist(), [arrays[n] for n in names] if tokens.size else ())
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from e
        # Another recent ring reads the same cache: it starts empty.
        return cache if layout is None or saved == layout else cache.converted(layout)


class PromptCachePool:
    """The most recently used prompt caches, at most ``capacity`` of them (a
    server's shared prefixes). Thread-safe: requests look up and store from
    the engine's thread while the pool is inspected from others."""

    def __init__(self, layout: CacheLayout, capacity: int = 8):
        if capacity < 0:
            raise ModelError(f"the prompt cache pool's capacity must be >= 0, got {capacity}")
        self.layout = layout
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], tuple[mx.array, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Tokens the entries hold, all together."""
        with self._lock:
            return sum(len(t) for t in self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[list[int], tuple[mx.array, ...]]:
        """The entry sharing the longest prefix with ``ids`` (marked recently
        used), or nothing."""
        with self._lock:
            best, best_n = None, 0
            for tokens in self._entries:
                n = common_prefix(tokens, ids)
                if n > best_n:
                    best, best_n = tokens, n
            if best is None:
                return [], ()
            self._entries.move_to_end(best)
            return list(best), self._entries[best]

    def store(self, tokens: Sequence[int], caches: Sequence[mx.array]) -> None:
        """Keep ``tokens`` and their caches; entries that are a prefix of them
        are dropped (this one serves their requests too), and the least
        recently used beyond the capacity."""
        key = tuple(tokens)
        if not key or not self.capacity:
            return
        self.layout.check(caches, len(key))
        with self._lock:
            for old in [t for t in self._entries if key[:len(t)] == t]:
                del self._entries[old]
            self._entries[key] = tuple(caches)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._entries.clear()
