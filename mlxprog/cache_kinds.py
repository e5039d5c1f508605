"""How a KV cache stores one layer's keys and values (its *kind*), and the
recent ring a quantized cache may keep beside them.

A cache holds each layer's keys, then its values, in one or more arrays
``[B, kv_heads, S, width]``, the cache's S slots on axis 2 (so a host that
grows, trims or joins caches along that axis treats every kind alike). A
:class:`CacheKind` says which arrays those are (:meth:`CacheKind.arrays`:
their operand names, widths and dtypes), checks given ones
(:meth:`CacheKind.fit`), writes keys or values into its form
(:meth:`CacheKind.encode`) and reads them back (:meth:`CacheKind.decode`),
names the attention op over it and its attributes, and gives the native
kernels its format (:meth:`CacheKind.native_format`). The cache ops
(``quantized_kv_cache_sdpa_update``, ``kv_cache_attention_block``,
``transformer_layer``), the native kernels' entry points and the LLM's
:class:`~mlxprog.llm.CacheLayout` ask the kind; none of them re-derives it.

- :class:`FloatCache`: keys and values as they are (``k_cache``, ``v_cache``).
- :class:`AffineCache`: MLX's affine quantization (``bits`` 4 or 8, one
  float32 scale and bias per ``group_size`` features) of keys and values,
  or with ``hadamard`` of each group's Walsh-Hadamard transform
  (:func:`hadamard_groups`): an orthogonal change of basis (up to a factor)
  that spreads a few large features over their group, so the group's scale
  no longer follows its largest feature alone. Scores and the weighted sum
  of values are the same in either basis (``H H = group_size I``), but the
  rounding is much smaller: 4-bit keys of SmolLM2-135M lose several times
  less (docs/llm.md, "KV cache"). Three arrays a side: ``k_values``
  (uint32 ``[B, H_kv, S, D * bits / 32]``, the packed codes), ``k_scales``
  and ``k_biases`` (float32 ``[B, H_kv, S, D / group_size]``), then the
  values' three.

The **recent ring** (:class:`RecentRing`, what KIVI calls the
full-precision residual) keeps the last R tokens' keys and values of a
quantized cache in float too, so each query reads those unrounded: three
arrays after the cache's, ``k_recent`` and ``v_recent`` ``[B, H_kv, R,
D]`` (float32, in the cache's basis) and ``recent_slots`` ``[B, R]``
(int32), the slot each entry holds (-1: none), the entry of slot ``s`` at
``s % R``. (Not to be confused with sliding-window attention, the ops'
``window``, which limits the keys a query sees.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import mlx.core as mx

from .arrays import AVal

#: The sides of a layer's cache, in operand order: its keys, then its values.
SIDES = ("k", "v")
#: The code widths and group sizes of :class:`AffineCache`.
AFFINE_BITS = (4, 8)
AFFINE_GROUP_SIZES = (32, 64, 128)

Geometry = tuple[int, int, int, int]  # (B, H_kv, S, D): rows, KV heads, slots, head dim


@dataclass(frozen=True)
class CacheArray:
    """One array of a layer's cache: whose it is (``side``: ``"k"`` or
    ``"v"``), its ``part`` among that side's arrays (``""`` where the side
    is one array), and its last dim ``width`` and ``dtype``."""

    side: str
    part: str
    width: int
    dtype: mx.Dtype

    @property
    def operand(self) -> str:
        """Its operand name in the cache ops (:func:`operand_name`)."""
        return operand_name(self.side, self.part)


def operand_name(side: str, part: str) -> str:
    """The cache ops' name for a side's array: ``k_cache``/``v_cache`` for a
    side of one array (``part`` ""), else ``<side>_<part>`` (``k_values``)."""
    return f"{side}_{part or 'cache'}"


class CacheKind:
    """How a cache stores a layer's keys and values (see the module
    docstring). A kind is a frozen dataclass of its settings, so two kinds
    with the same settings are equal."""

    #: The arrays each side is, by name (``("",)``: one array).
    parts: tuple[str, ...]
    #: Whether the stored keys and values are rounded (a recent ring is
    #: then worth keeping).
    quantized: bool

    def arrays(self, head_dim: int) -> list[CacheArray]:
        """A layer's arrays for keys and values of ``head_dim`` features, in
        operand order: the keys' arrays, then the values'."""
        raise NotImplementedError

    def operand_names(self) -> list[str]:
        """The cache ops' names for a layer's arrays, in operand order."""
        return [operand_name(side, part) for side in SIDES for part in self.parts]

    def head_dim(self, width: int) -> int:
        """The head dim of a cache whose first array is ``width`` wide."""
        raise NotImplementedError

    def fit(self, avals: Sequence[AVal]) -> Geometry:
        """``(B, H_kv, S, D)`` of a layer's arrays (operand order) that are
        this kind's cache; a ValueError names the first that is not."""
        names, avals = self.operand_names(), [_aval(a) for a in avals]
        if len(avals) != len(names):
            raise ValueError(f"{self.describe()} is {len(names)} arrays ({', '.join(names)}), "
                             f"found {len(avals)}")
        first = avals[0]
        if len(first.shape) != 4:
            raise ValueError(f"{names[0]} must be [B, kv_heads, S, width], found {first}")
        batch, kv_heads, slots, width = first.shape
        dim = self.head_dim(width)
        for array, aval in zip(self.arrays(dim), avals):
            expected = AVal((batch, kv_heads, slots, array.width), array.dtype)
            if self._differs(aval, expected):
                raise ValueError(f"{array.operand} must be {expected} for {self.describe()} of "
                                 f"head dim {dim}, found {aval}")
        return batch, kv_heads, slots, dim

    def _differs(self, aval: AVal, expected: AVal) -> bool:
        """Whether ``aval`` is not the array ``expected`` (see :meth:`fit`)."""
        return aval != expected

    def encode(self, x: mx.array, side: str) -> list[mx.array]:
        """Keys or values (``side``) ``[..., D]`` as this kind stores them:
        its arrays of that side, in order."""
        raise NotImplementedError

    def decode(self, parts: Sequence[mx.array], side: str) -> mx.array:
        """The float32 keys or values (``side``) that a side's arrays hold
        (the inverse of :meth:`encode`, up to its rounding)."""
        raise NotImplementedError

    def sdpa_op(self, ring: RecentRing | None = None) -> tuple[str, dict[str, Any]]:
        """The op that writes new keys and values into a layer's cache and
        attends over it (q, new_k and new_v ``[B, heads, T, D]``, then the
        cache's arrays, the recent ring's, the offset and the key mask),
        with the attributes that give it this kind and ``ring``."""
        raise NotImplementedError

    def block_attributes(self) -> dict[str, Any]:
        """The attributes that give ``kv_cache_attention_block`` and
        ``transformer_layer`` this kind of cache."""
        raise NotImplementedError

    def native_format(self) -> dict[str, Any] | None:
        """The native kernels' ``CacheFormat`` of this kind (its fields),
        or None where they have no kernel for it."""
        raise NotImplementedError

    def describe(self) -> str:
        """What the kind stores, in words (``float keys/values``, ...)."""
        raise NotImplementedError


@dataclass(frozen=True)
class FloatCache(CacheKind):
    """Keys and values as they are: one array a side, ``k_cache`` and
    ``v_cache`` ``[B, H_kv, S, D]``, float32 in an LLM's cache (the ops take
    any one float dtype for both)."""

    parts = ("",)
    quantized = False

    def arrays(self, head_dim: int) -> list[CacheArray]:
        """``k_cache`` and ``v_cache``, float32 ``[..., head_dim]``."""
        return [CacheArray(side, "", head_dim, mx.float32) for side in SIDES]

    def head_dim(self, width: int) -> int:
        """The width itself."""
        return width

    def _differs(self, aval: AVal, expected: AVal) -> bool:
        # Any float dtype the keys have (checked by the ops against q's).
        return tuple(aval.shape) != expected.shape

    def fit(self, avals: Sequence[AVal]) -> Geometry:
        """As :meth:`CacheKind.fit`, and the two arrays alike."""
        geometry = super().fit(avals)
        if _aval(avals[0]) != _aval(avals[1]):
            raise ValueError(f"k_cache and v_cache must be alike, found {avals[0]} and "
                             f"{avals[1]}")
        return geometry

    def encode(self, x: mx.array, side: str) -> list[mx.array]:
        """``[x]`` as float32."""
        return [x.astype(mx.float32)]

    def decode(self, parts: Sequence[mx.array], side: str) -> mx.array:
        """The one array."""
        return parts[0]

    def sdpa_op(self, ring: RecentRing | None = None) -> tuple[str, dict[str, Any]]:
        """``kv_cache_sdpa_update`` in the ``BHTD`` layout (no ring: the
        keys are not rounded)."""
        if ring is not None:
            raise ValueError("a recent ring is a setting of the quantized cache")
        return "kv_cache_sdpa_update", {"layout": "BHTD"}

    def block_attributes(self) -> dict[str, Any]:
        """None: the ops' default cache is this one."""
        return {}

    def native_format(self) -> dict[str, Any]:
        """Float32 keys and values (``kv_bits`` 0)."""
        return dict(kv_bits=0, kv_group_size=0, hadamard=False)

    def describe(self) -> str:
        """``float keys/values``."""
        return "float keys/values"


@dataclass(frozen=True)
class AffineCache(CacheKind):
    """MLX's affine quantization of keys and values (see the module
    docstring): ``bits``-bit codes, one scale and bias per ``group_size``
    features, of each group's Walsh-Hadamard transform with ``hadamard``."""

    bits: int
    group_size: int
    hadamard: bool = False

    parts = ("values", "scales", "biases")
    quantized = True

    def __post_init__(self) -> None:
        if self.bits not in AFFINE_BITS or self.group_size not in AFFINE_GROUP_SIZES:
            raise ValueError(f"a quantized cache has {' or '.join(map(str, AFFINE_BITS))}-bit "
                             f"codes in groups of {', '.join(map(str, AFFINE_GROUP_SIZES))}, "
                             f"got {self.bits} bits, groups of {self.group_size}")

    def arrays(self, head_dim: int) -> list[CacheArray]:
        """Each side's codes (uint32 ``[..., head_dim * bits / 32]``, the
        side's :meth:`quantization`), scales and biases (float32 ``[...,
        head_dim / group_size]``)."""
        out = []
        for side in SIDES:
            quant = self.quantization(side)
            groups = head_dim // quant["group_size"]
            out += [CacheArray(side, "values", head_dim * quant["bits"] // 32, mx.uint32),
                    CacheArray(side, "scales", groups, mx.float32),
                    CacheArray(side, "biases", groups, mx.float32)]
        return out

    def head_dim(self, width: int) -> int:
        """The features the packed codes of a row of keys hold."""
        return width * 32 // self.quantization("k")["bits"]

    def fit(self, avals: Sequence[AVal]) -> Geometry:
        """As :meth:`CacheKind.fit`, the head dim in whole groups."""
        first = _aval(avals[0]) if len(avals) else None
        if first is not None and len(first.shape) == 4 and first.dtype == mx.uint32:
            dim = self.head_dim(first.shape[3])
            if dim % self.group_size:
                raise ValueError(f"k_values holds {dim} features a head, which do not split "
                                 f"into groups of {self.group_size}")
        return super().fit(avals)

    def encode(self, x: mx.array, side: str) -> list[mx.array]:
        """``[codes, scales, biases]`` of x (float32), or with ``hadamard``
        of its groups' transform."""
        return self.pack(self.basis(x), side)

    def pack(self, rows: mx.array, side: str) -> list[mx.array]:
        """``[codes, scales, biases]`` of rows already in the cache's basis
        (:meth:`basis`)."""
        return list(mx.quantize(rows, **self.quantization(side)))

    def decode(self, parts: Sequence[mx.array], side: str) -> mx.array:
        """The dequantized rows, transformed back with ``hadamard``."""
        x = mx.dequantize(*parts, **self.quantization(side))
        return hadamard_groups(x, self.group_size) * (1 / self.group_size) if self.hadamard \
            else x

    def basis(self, x: mx.array) -> mx.array:
        """Keys or values ``[..., D]`` as float32 in the basis the cache
        (and its recent ring) holds them: with ``hadamard`` each group's
        transform."""
        x = x.astype(mx.float32)
        return hadamard_groups(x, self.group_size) if self.hadamard else x

    def quantization(self, side: str) -> dict[str, int]:
        """MLX's ``bits`` and ``group_size`` of a side's arrays (as
        ``mx.quantize`` and ``mx.quantized_matmul`` take them)."""
        return dict(bits=self.bits, group_size=self.group_size)

    def sdpa_op(self, ring: RecentRing | None = None) -> tuple[str, dict[str, Any]]:
        """``quantized_kv_cache_sdpa_update`` with this quantization (and
        ``recent``: the ring's size)."""
        return "quantized_kv_cache_sdpa_update", dict(
            bits=self.bits, group_size=self.group_size, hadamard=self.hadamard,
            **({"recent": ring.size} if ring is not None else {}))

    def block_attributes(self) -> dict[str, Any]:
        """``kv_bits``, ``kv_group_size`` and ``kv_hadamard``."""
        return dict(kv_bits=self.bits, kv_group_size=self.group_size,
                    kv_hadamard=self.hadamard)

    def native_format(self) -> dict[str, Any]:
        """The quantization, as the native kernels read it."""
        return dict(kv_bits=self.bits, kv_group_size=self.group_size, hadamard=self.hadamard)

    def describe(self) -> str:
        """``8-bit keys/values (groups of 64)``."""
        return f"{self.bits}-bit keys/values (groups of {self.group_size})"


def cache_kind(kv_bits: int | None, kv_group_size: int | None = None,
               kv_hadamard: bool = False) -> CacheKind:
    """The kind of the cache ops' settings: :class:`FloatCache` without
    ``kv_bits``, else :class:`AffineCache` (a ValueError says which setting
    no kind takes)."""
    if kv_bits is None:
        if kv_hadamard:
            raise ValueError("kv_hadamard is a setting of the quantized cache: give kv_bits too")
        return FloatCache()
    return AffineCache(kv_bits, kv_group_size, kv_hadamard)


@dataclass(frozen=True)
class RecentRing:
    """The last ``size`` tokens' keys and values of a quantized cache, kept
    in float too (see the module docstring): three arrays after the cache's
    in the ops (:data:`NAMES`), which read a key ``j`` a query at slot ``p``
    sees with ``p - j < size`` from it rather than from the cache while its
    entry ``j % size`` still holds slot ``j``."""

    size: int

    #: The ring's arrays, in operand order after the cache's.
    NAMES = ("k_recent", "v_recent", "recent_slots")
    #: The ring's arrays by part (the LLM layout's names: ``recent.0.keys``).
    PARTS = ("keys", "values", "slots")

    def specs(self, geometry: Geometry) -> list[AVal]:
        """The ring's arrays beside a cache of ``geometry``: ``k_recent``,
        ``v_recent`` float32 ``[B, H_kv, size, D]``, ``recent_slots`` int32
        ``[B, size]``."""
        batch, kv_heads, _, dim = geometry
        rows = AVal((batch, kv_heads, self.size, dim), mx.float32)
        return [rows, rows, AVal((batch, self.size), mx.int32)]

    def check(self, named: Mapping[str, AVal], geometry: Geometry) -> None:
        """The ring's arrays in ``named`` (by :data:`NAMES`) beside a cache of
        ``geometry``; a ValueError names the one that does not fit."""
        for name, expected in zip(self.NAMES, self.specs(geometry)):
            if _aval(named[name]) != expected:
                raise ValueError(f"{name} must be {expected} for a recent ring of {self.size} "
                                 f"tokens over a cache of {geometry[0]} rows, {geometry[1]} "
                                 f"heads of dim {geometry[3]}, found {named[name]}")

    @staticmethod
    def of(avals: Sequence[AVal], geometry: Geometry | None) -> RecentRing | None:
        """The ring ``avals`` (``k_recent, v_recent, recent_slots``) are
        beside a cache of ``geometry``, or None where they are not one."""
        avals = [_aval(a) for a in avals]
        if geometry is None or len(avals) != 3 or len(avals[0].shape) != 4 \
                or avals[0].shape[2] < 1:
            return None
        ring = RecentRing(avals[0].shape[2])
        return ring if avals == ring.specs(geometry) else None


def _aval(value: Sequence) -> AVal:
    """An abstract value given as an AVal or a ``(shape, dtype)`` pair."""
    return AVal(tuple(value[0]), value[1])


def hadamard_groups(x: mx.array, group_size: int) -> mx.array:
    """The unnormalized Walsh-Hadamard transform of each group of
    ``group_size`` features (a power of two) along x's last axis, in
    Sylvester's order (``H_2n = [[H_n, H_n], [H_n, -H_n]]``, entries +-1):
    butterflies of distance 1, 2, 4, ..., adds and subtracts only, in the
    order the native kernels take, so both give the same bits. Applying it
    twice multiplies by ``group_size``."""
    shape = x.shape
    distance = 1
    while distance < group_size:
        pairs = x.reshape(*shape[:-1], shape[-1] // (2 * distance), 2, distance)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = mx.stack([a + b, a - b], axis=-2).reshape(shape)
        distance *= 2
    return x
