"""The specialisation cache: what a symbolic Executable keeps per binding.

Each binding of a program's dims gets its own specialised plan (a runner);
the cache keeps the most recently used ``capacity`` of them and counts hits,
misses and evictions for ``Executable.stats``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Iterator, Mapping, TypeVar

T = TypeVar("T")

BindingKey = tuple  # sorted (dim, value) pairs


class SpecializationCache(Generic[T]):
    """An LRU cache from dim bindings to what was built for them."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: OrderedDict[BindingKey, T] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, bindings: Mapping[str, int], build: Callable[[], T]) -> T:
        """The entry for ``bindings``, built on a miss (evicting the least
        recently used entry when the cache is full)."""
        key = tuple(sorted(bindings.items()))
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry
        self.misses += 1
        entry = self._entries[key] = build()
        if len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
            self.evictions += 1
        return entry

    def bindings(self) -> list[dict[str, int]]:
        """The cached bindings, least recently used first."""
        return [dict(k) for k in self._entries]

    def values(self) -> Iterator[T]:
        """The cached entries."""
        return iter(self._entries.values())
