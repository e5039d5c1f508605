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

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import mlx.core as mx

from ..arrays import AVal, is_int
from ..errors import ModelError, SettingError
from ..ops.quantized_attention import dequantize_cache, quantize_cache
from .config import ModelConfig

FORMAT = "mlxprog.prompt_cache/1"


#: The code widths and group sizes of a quantized KV cache (``kv_bits``,
#: ``kv_group_size``), and the group size each width takes by default: 4-bit
#: keys round coarsely enough that smaller groups pay (SmolLM2-135M's
#: perplexity: +5.4% with groups of 32, +14.5% with 64, for 20% more bytes;
#: 8 bits: within 0.5% either way).
KV_BITS = (4, 8)
KV_GROUP_SIZES = (32, 64, 128)
DEFAULT_KV_GROUP_SIZES = {4: 32, 8: 64}
#: The first tokens a rotating cache keeps by default (mlx-lm's): the
#: attention sinks a model leans on.
DEFAULT_KEEP = 4
#: The tokens a quantized cache keeps in float by default (``kv_recent``):
#: each query reads the last 16 tokens' keys and values unrounded, which
#: takes SmolLM2-135M's 4-bit cache from +6.2% perplexity to +0.3% of the
#: float cache's (the mean of four texts, each within 1.2%; docs/llm.md, "KV
#: cache"), for a fixed 2 x 16 float rows a layer and KV head.
DEFAULT_KV_RECENT = 16

#: The per-slot arrays of one quantized cache (keys or values): the packed
#: codes, then one scale and one bias per group of features.
QUANTIZED_PARTS = ("values", "scales", "biases")
#: The float window (``kv_recent``): each layer's last tokens' keys and
#: values ``[B, kv_heads, kv_recent, head_dim]`` (float32, in the quantized
#: cache's basis; after its keys' and values' arrays), and the slot each
#: entry holds ``[B, kv_recent]`` (int32, -1: none; one array after all the
#: layers'); see :mod:`mlxprog.ops.quantized_attention`.
RECENT_PARTS = ("keys", "values", "slots")


@dataclass(frozen=True)
class CacheLayout:
    """The shape of a model's KV cache: what a prompt cache must match to be
    used with a model.

    ``kv_bits`` (4 or 8; None: float32 keys and values) quantizes the cached
    keys and values in groups of ``kv_group_size`` features (MLX's affine
    quantization, one float32 scale and bias a group) of their Walsh-Hadamard
    transform (each group's: ``hadamard=True`` of the
    ``quantized_kv_cache_sdpa_update`` op, which spreads the few large
    features of keys over their group and so rounds them much less); each
    layer's keys are then three arrays (:data:`QUANTIZED_PARTS`) and so are
    its values.
    ``kv_recent`` (with ``kv_bits``; 0: none) keeps the last that many
    tokens' keys and values in float too, in a ring beside the cache
    (:data:`RECENT_PARTS`): each query reads
    those unrounded. The ring's entries name their slots, so a host that
    moves slots moves them with :meth:`shifted` (or they go unread); once
    a rotating cache has wrapped, the newest tokens sit in rotated slots and
    are read quantized.
    ``max_kv_size`` (None: no bound) makes the cache rotating: it holds at
    most that many tokens, the first ``keep`` and the most recent ones.
    Values out of range are a :class:`~mlxprog.llm.config.SettingError`
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
    def quantized(self) -> bool:
        """Whether keys and values are stored quantized."""
        return self.kv_bits is not None

    @property
    def rotating(self) -> bool:
        """Whether the cache is bounded (``max_kv_size``) and rotates."""
        return self.max_kv_size is not None

    @property
    def parts(self) -> tuple[str, ...]:
        """The arrays of one layer's keys (or values): ``("",)`` for a float
        cache, :data:`QUANTIZED_PARTS` for a quantized one."""
        return QUANTIZED_PARTS if self.quantized else ("",)

    def part_specs(self) -> list[tuple[int, mx.Dtype]]:
        """The last dim and dtype of each array of one layer's keys (or
        values), in :attr:`parts` order."""
        if not self.quantized:
            return [(self.head_dim, mx.float32)]
        groups = self.head_dim // self.kv_group_size
        return [(self.head_dim * self.kv_bits // 32, mx.uint32), (groups, mx.float32),
                (groups, mx.float32)]

    def layer_names(self, layer: int | str) -> list[str]:
        """The names of one layer's arrays in program order: the keys'
        arrays then the values' (``k.0``, ``v.0`` for a float cache;
        ``k.0.values``, ``k.0.scales``, ``k.0.biases``, ``v.0.values``, ...
        for a quantized one), then its float window's keys and values
        (``recent.0.keys``, ``recent.0.values``)."""
        names = [f"{kind}.{layer}" + (f".{part}" if part else "")
                 for kind in "kv" for part in self.parts]
        return names + ([f"recent.{layer}.{part}" for part in RECENT_PARTS[:2]]
                        if self.kv_recent else [])

    def array_names(self) -> list[str]:
        """The names of every cache array in program order (and in saved
        files): :meth:`layer_names` of each layer, then with a float window
        the slots its entries hold (``recent.slots``), one array for every
        layer: each step writes the same slots in all of them."""
        names = [name for i in range(self.num_layers) for name in self.layer_names(i)]
        return names + (["recent.slots"] if self.kv_recent else [])

    def _roles(self) -> list[str]:
        """What each array is, in program order: "slots" (indexed by slot on
        axis 2), "ring" (the window's keys or values) or "tags" (the
        window's slots)."""
        layer = ["slots"] * (2 * len(self.parts)) + (["ring", "ring"] if self.kv_recent else [])
        return layer * self.num_layers + (["tags"] if self.kv_recent else [])

    def slot_specs(self, slots: int) -> list[tuple[tuple[int, ...], mx.Dtype]]:
        """The shape (one row) and dtype of each array of a cache of
        ``slots`` slots, in program order."""
        layer = [((1, self.num_kv_heads, slots, width), dtype)
                 for width, dtype in self.part_specs() * 2]
        window = []
        if self.kv_recent:
            layer += [((1, self.num_kv_heads, self.kv_recent, self.head_dim), mx.float32)] * 2
            window = [((1, self.kv_recent), mx.int32)]
        return layer * self.num_layers + window

    def empty(self, batch: int, slots: int) -> tuple[mx.array, ...]:
        """Zeroed caches of ``batch`` rows and ``slots`` slots, in program
        order (an empty float window: every slot -1, no entry)."""
        return tuple(mx.full((batch, *shape[1:]), -1 if role == "tags" else 0, dtype=dtype)
                     for (shape, dtype), role in zip(self.slot_specs(slots), self._roles()))

    def slot_arrays(self, caches: Sequence[mx.array]) -> list[mx.array]:
        """The arrays of ``caches`` (program order) indexed by slot: each
        layer's keys' and values', without its float window."""
        return [x for x, role in zip(caches, self._roles()) if role == "slots"]

    def map_slots(self, caches: Sequence[mx.array], slots: Callable[[mx.array], mx.array],
                  ring: Callable[[mx.array], mx.array] | None = None,
                  tags: Callable[[mx.array], mx.array] | None = None) -> tuple[mx.array, ...]:
        """``caches`` (program order) with ``slots`` applied to each array
        indexed by slot (axis 2), ``ring`` to the float window's keys and
        values and ``tags`` to its slots (either default: as they are)."""
        given = {"slots": slots, "ring": ring, "tags": tags}
        return tuple(given[role](x) if given[role] else x for x, role in zip(caches, self._roles()))

    def widened(self, caches: Sequence[mx.array], width: int) -> tuple[mx.array, ...]:
        """``caches`` (program order) with empty slots added after their
        last to make ``width``."""
        return self.map_slots(
            caches, lambda x: mx.pad(x, [(0, 0), (0, 0), (0, width - x.shape[2]), (0, 0)]))

    def shifted(self, caches: Sequence[mx.array], shift: int,
                slots: Callable[[mx.array], mx.array]) -> tuple[mx.array, ...]:
        """``caches`` whose slots ``slots`` moves by ``shift`` (a slot s is
        then s + shift; it drops slots moved below 0), the float window's
        entries moved with them: the entry of slot s belongs at ``s %
        kv_recent``, so the ring turns by ``shift`` (an entry moved below
        slot 0 is dropped)."""
        if not shift:
            return self.map_slots(caches, slots)

        def moved(tags: mx.array) -> mx.array:
            tags = mx.roll(tags, shift, axis=1)
            return mx.where((tags >= 0) & (tags + shift >= 0), tags + shift, -1)
        return self.map_slots(caches, slots, lambda x: mx.roll(x, shift, axis=2), moved)

    def bytes_per_token(self) -> int:
        """Bytes one cached token takes, every layer's keys and values (the
        float window's fixed bytes aside)."""
        per_head = sum(width * dtype.size for width, dtype in self.part_specs())
        return 2 * self.num_layers * self.num_kv_heads * per_head

    def describe(self) -> str:
        """``30 layers x 3 KV heads x 64``, and the quantization and bound
        when set (``, 8-bit keys/values (groups of 64), at most 512 tokens
        keeping the first 4``)."""
        text = f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}"
        if self.quantized:
            text += f", {self.kv_bits}-bit keys/values (groups of {self.kv_group_size})"
            if self.kv_recent:
                text += f", the last {self.kv_recent} in float"
        if self.rotating:
            text += f", at most {self.max_kv_size} tokens keeping the first {self.keep}"
        return text


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
    ``max_length``. Bad values raise :class:`~mlxprog.llm.config.SettingError`
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
    bound included) is a :class:`~mlxprog.llm.config.ModelError`.

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
            _check_caches(self.layout, len(tokens), caches)
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
        n = len(self.layout.parts)
        kinds = self.layout.slot_arrays(self.caches)  # each layer's keys' arrays, its values'
        if self.layout.quantized:
            quant = (self.layout.kv_bits, self.layout.kv_group_size, True)
            kinds = [dequantize_cache(kinds[i:i + n], *quant) for i in range(0, len(kinds), n)]
        if layout.quantized:
            quant = (layout.kv_bits, layout.kv_group_size, True)
            kinds = [part for c in kinds for part in quantize_cache(c, *quant)]
        # The window starts empty: its entries are of another layout's.
        converted = iter(kinds)
        caches = layout.map_slots(layout.empty(1, 0), lambda _: next(converted))
        return PromptCache(layout, self.tokens, caches)

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
        # Another float window reads the same cache: it starts empty.
        return cache if layout is None or saved == layout else cache.converted(layout)


def _check_caches(layout: CacheLayout, n: int, caches: tuple[mx.array, ...]) -> None:
    """Caches that hold ``n`` tokens of a model of ``layout``."""
    names = layout.array_names()
    if len(caches) != len(names):
        raise ModelError(f"a prompt cache of {layout.describe()} needs "
                         f"{len(names)} caches, got {len(caches)}")
    for name, cache, (shape, dtype) in zip(names, caches, layout.slot_specs(n)):
        if tuple(cache.shape) != shape or cache.dtype != dtype:
            raise ModelError(f"prompt cache {name} must be {AVal(shape, dtype)} "
                             f"for {n} tokens, found {AVal.of(cache)}")


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
        _check_caches(self.layout, len(key), tuple(caches))
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
