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
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mlx.core as mx

from .config import ModelConfig, ModelError

FORMAT = "mlxprog.prompt_cache/1"


@dataclass(frozen=True)
class CacheLayout:
    """The shape of a model's KV cache: what a prompt cache must match to be
    used with a model."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: ModelConfig) -> CacheLayout:
        """The layout of a model with ``config``."""
        return cls(config.num_layers, config.num_kv_heads, config.head_dim)

    def describe(self) -> str:
        """``30 layers x 3 KV heads x 64``."""
        return f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}"


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
    per-layer keys and values in program order (``k.0, v.0, k.1, ...``), each
    ``[1, kv_heads, len(tokens), head_dim]`` float32, or is empty when nothing
    is cached yet.

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

    def save(self, path: str | Path) -> None:
        """Write the cache to ``path`` (``.safetensors``): the tokens, the
        caches and the layout, which :meth:`load` checks."""
        arrays = {"tokens": mx.array(self.tokens, dtype=mx.int32)}
        for i, cache in enumerate(self.caches):
            arrays[f"{'kv'[i % 2]}.{i // 2}"] = cache
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
        except (KeyError, TypeError, ValueError) as e:
            raise ModelError(f"{path}: the prompt cache's layout is unreadable: {e}") from e
        if layout is not None and saved != layout:
            raise ModelError(f"{path}: the prompt cache was made by a model of "
                             f"{saved.describe()}; this model has {layout.describe()}")
        tokens = arrays.get("tokens")
        if tokens is None or tokens.ndim != 1:
            raise ModelError(f"{path}: the prompt cache has no 1-D 'tokens' array")
        names = [f"{kind}.{i}" for i in range(saved.num_layers) for kind in "kv"]
        missing = [n for n in names if n not in arrays]
        if tokens.size and missing:
            raise ModelError(f"{path}: the prompt cache lacks {', '.join(missing[:3])}")
        try:
            return cls(saved, tokens.tolist(), [arrays[n] for n in names] if tokens.size else ())
        except ModelError as e:
            raise ModelError(f"{path}: {e}") from e


def _check_caches(layout: CacheLayout, n: int, caches: tuple[mx.array, ...]) -> None:
    """Caches that hold ``n`` tokens of a model of ``layout``."""
    if len(caches) != 2 * layout.num_layers:
        raise ModelError(f"a prompt cache of {layout.describe()} needs "
                         f"{2 * layout.num_layers} caches, got {len(caches)}")
    shape = (1, layout.num_kv_heads, n, layout.head_dim)
    for i, cache in enumerate(caches):
        if tuple(cache.shape) != shape or cache.dtype != mx.float32:
            raise ModelError(f"prompt cache {'kv'[i % 2]}.{i // 2} must be float32{list(shape)} "
                             f"for {n} tokens, found {cache.dtype}{list(cache.shape)}")


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
