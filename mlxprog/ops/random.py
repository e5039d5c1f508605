"""Random numbers with explicit keys, as ``mx.random`` with ``key=``. A key is
a ``uint32[2]`` array made by ``random_key`` or ``random_split``. Every
sampling op takes its key as operand 0, so a program is deterministic and
replayable: the same key gives the same values on every call, compiled or
eager. Split a key for independent streams; do not reuse one for two samples
that should be independent.
"""

from __future__ import annotations

from typing import Annotated

import mlx.core as mx
from pydantic import Field, model_validator

from ..arrays import AVal, to_mlx
from .attrs import Attrs, AxisOf, DType, Float, PositiveSize, Size
from .registry import register_op

Shape = tuple[Size, ...]


class SeedAttrs(Attrs):
    """The attributes of ``random_key``."""

    seed: Annotated[int, Field(ge=0, lt=2**64)]


@register_op("random_key", attrs=SeedAttrs, operands=0)
def random_key(operands, attrs):
    """A ``uint32[2]`` key from the 64-bit ``seed``."""
    return mx.random.key(attrs.seed)


def _check_key(avals: list[AVal], attrs) -> None:
    """Operand 0 of every sampling op is a key."""
    key = avals[0]
    if key.shape != (2,) or key.dtype != mx.uint32:
        raise ValueError(
            "operand 0 must be a uint32[2] key (from random_key or random_split); "
            f"found {key}"
        )


class SplitAttrs(Attrs):
    """The attributes of ``random_split``."""

    num: PositiveSize = 2


@register_op("random_split", attrs=SplitAttrs, outputs=lambda attrs, n: attrs.num,
             check=_check_key)
def random_split(operands, attrs):
    """Split a key into ``num`` new independent keys, one result each."""
    keys = mx.random.split(operands[0], num=attrs.num)
    return tuple(keys[i] for i in range(attrs.num))


class _SamplesAttrs(Attrs):
    """The samples' ``shape`` and floating ``dtype``, first among the
    attributes of ``random_uniform`` and ``random_normal``."""

    shape: Shape = ()
    dtype: DType = "float32"


class UniformAttrs(_SamplesAttrs):
    """The attributes of ``random_uniform``."""

    low: Float = 0.0
    high: Float = 1.0


@register_op("random_uniform", attrs=UniformAttrs, check=_check_key)
def random_uniform(operands, attrs):
    """Uniform samples in ``[low, high)`` of ``shape`` and floating ``dtype``."""
    return mx.random.uniform(attrs.low, attrs.high, attrs.shape, to_mlx(attrs.dtype),
                             key=operands[0])


class NormalAttrs(_SamplesAttrs):
    """The attributes of ``random_normal``."""

    loc: Float = 0.0
    scale: Float = 1.0


@register_op("random_normal", attrs=NormalAttrs, check=_check_key)
def random_normal(operands, attrs):
    """Normal samples with mean ``loc`` and standard deviation ``scale``, of
    ``shape`` and floating ``dtype``."""
    return mx.random.normal(attrs.shape, to_mlx(attrs.dtype), loc=attrs.loc,
                            scale=attrs.scale, key=operands[0])


class CategoricalAttrs(Attrs):
    """The attributes of ``random_categorical``."""

    axis: Annotated[int, AxisOf(operand=1)] = -1  # the category axis of the logits (operand 1)
    num_samples: PositiveSize | None = None
    shape: Shape | None = None

    @model_validator(mode="after")
    def _one_size(self):
        if self.num_samples is not None and self.shape is not None:
            raise ValueError(
                f"give at most one of num_samples and shape; found num_samples="
                f"{self.num_samples}, shape={list(self.shape)}"
            )
        return self


@register_op("random_categorical", attrs=CategoricalAttrs, operands=2, check=_check_key)
def random_categorical(operands, attrs):
    """Sample category indices (``uint32``) from unnormalized log-probabilities.
    Operands: key, logits. The result has the logits' shape without ``axis``;
    ``num_samples`` appends an axis of that many samples, ``shape`` sets the
    whole result shape (broadcast-compatible with the logits' other axes)."""
    key, logits = operands
    return mx.random.categorical(logits, axis=attrs.axis, shape=attrs.shape,
                                 num_samples=attrs.num_samples, key=key)


class BernoulliAttrs(Attrs):
    """The attributes of ``random_bernoulli``."""

    p: Annotated[float, Field(ge=0, le=1)] = 0.5  # used without a p operand
    shape: Shape | None = None


def _check_bernoulli(avals: list[AVal], attrs: BernoulliAttrs) -> None:
    """A key, and ``p`` as operand 1 or as the attribute, not both."""
    _check_key(avals, attrs)
    if len(avals) == 2 and "p" in attrs.model_fields_set:
        raise ValueError("p is given both as operand 1 and as an attribute; give one")


@register_op("random_bernoulli", attrs=BernoulliAttrs, operands=(1, 2), check=_check_bernoulli)
def random_bernoulli(operands, attrs):
    """Boolean samples, true with probability ``p``. Operands: key and an
    optional array ``p`` (else attribute ``p``). The result has ``shape``
    (default: the shape of ``p``)."""
    key, *p = operands
    return mx.random.bernoulli(p[0] if p else attrs.p, attrs.shape, key=key)
