"""Activations: Relu, ..."""

from __future__ import annotations

from ..context import Context
from ..registry import converter


@converter("Relu")
def relu(ctx: Context) -> list:
    """``max(x, 0)``."""
    x = ctx.input(0)
    return [ctx.b.max(x, ctx.scalar(0, x))]
