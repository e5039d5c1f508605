"""Hostile JSON values: what an emitter with a bug (or an attacker) might put
where a well-formed value belongs."""

from __future__ import annotations

from typing import Any

from .choice import Chooser


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


HOSTILE_INTS = [2**31, 2**31 - 1, -1, -(2**31), 2**32 + 1, 2**63, 2**63 - 1, -(2**63) - 1,
                2**64, 2**64 - 1, 10**9, 10**30, 10**400, -(10**30)]
HOSTILE_OTHERS = [None, True, False, "", "1", "0", "x", "nan", "inf", "-inf", 1e308, -1e308,
                  1e-320, 0.5, -0.0, 1.5, [], [[]], {}, {"a": 1}, [None], ["1"], [True],
                  _nested(40), [0] * 1000]
HOSTILE = HOSTILE_INTS + HOSTILE_OTHERS
"""Values tried in place of an attribute, a shape entry, an index..."""

HUGE_SIZES = [2**31 - 1, 2**31, 2**32, 10**5, 10**6, 10**9, 10**12, 2**62, 2**63 - 1]
"""Sizes for attributes that set a result's size."""


def hostile(c: Chooser) -> Any:
    """A hostile value: an int beyond some range half the time, else any type."""
    return c.choice(HOSTILE_INTS) if c.chance(0.5) else c.choice(HOSTILE_OTHERS)
