"""Choosers: the one source of the generators' random decisions.

A generator never calls ``random`` itself; it asks a :class:`Chooser`. With a
:class:`RandomChooser` (``tools/fuzz.py``) a program is a pure function of a
seed. With a :class:`DataChooser` every decision is a Hypothesis draw, so a
failing program shrinks: each option list is ordered simplest first, and
:meth:`Chooser.chance` is False at the minimum, so shrinking walks towards
the plain case.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")


class Chooser:
    """Random decisions; subclasses provide :meth:`integer`."""

    def integer(self, lo: int, hi: int) -> int:
        """A uniform integer in ``[lo, hi]``."""
        raise NotImplementedError

    def choice(self, options: Sequence[T]) -> T:
        """One of ``options`` (the first is the simplest)."""
        return options[self.integer(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        """True with probability ``p`` (False is the simpler answer)."""
        return self.integer(0, 999) >= 1000 - round(p * 1000)

    def weighted(self, options: Sequence[tuple[int, T]]) -> T:
        """One of ``(weight, value)`` pairs, by integer weight."""
        point = self.integer(0, sum(w for w, _ in options) - 1)
        for weight, value in options:
            if point < weight:
                return value
            point -= weight
        raise AssertionError("unreachable")

    def sample(self, options: Sequence[T], k: int) -> list[T]:
        """``k`` distinct elements of ``options``, in a random order."""
        pool = list(options)
        return [pool.pop(self.integer(0, len(pool) - 1)) for _ in range(min(k, len(pool)))]


class RandomChooser(Chooser):
    """Decisions from ``random.Random(seed)``."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)


class DataChooser(Chooser):
    """Decisions drawn from a Hypothesis ``data`` object (``st.data()``)."""

    def __init__(self, data):
        from hypothesis import strategies as st

        self._data = data
        self._st = st

    def integer(self, lo: int, hi: int) -> int:
        # Hypothesis favours small values; a wide draw folded into the range
        # is close to uniform, and still shrinks to ``lo``.
        return lo + self._data.draw(self._st.integers(0, 2**32 - 1)) % (hi - lo + 1)
