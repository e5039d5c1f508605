"""Checks the control-flow ops share: a subprogram's outputs against the
avals they must have."""

from __future__ import annotations

import mlx.core as mx

from ...arrays import AVal
from ..attrs import CheckError


def check_predicate(outs: list[AVal], subprogram: str) -> None:
    """Subprogram ``subprogram`` must output one bool scalar."""
    if len(outs) != 1 or outs[0].shape != () or outs[0].dtype != mx.bool_:
        found = ", ".join(str(a) for a in outs) or "no outputs"
        raise CheckError(f"must output one bool scalar, found {found}", subprogram=subprogram)


def check_same(found: list[AVal], expected: list[AVal], subprogram: str, what: str) -> None:
    """Subprogram ``subprogram``'s outputs must match ``expected`` (``what`` names it)."""
    if len(found) != len(expected):
        raise CheckError(f"outputs {len(found)} value(s), but {what} has {len(expected)}",
                         subprogram=subprogram)
    for k, (f, e) in enumerate(zip(found, expected)):
        if f != e:
            raise CheckError(f"output {k} is {f}, but {what} has {e} there",
                             subprogram=subprogram)
