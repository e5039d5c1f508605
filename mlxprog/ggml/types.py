"""The GGML tensor types a GGUF file may hold: one table, asked everywhere.

Each :class:`GGMLType` says how a row of the type is laid out (elements and
bytes per block), the id GGUF stores, how mlxprog keeps it in memory
(``storage``) and, for the quantized ones, which 8-bit activation blocks the
int8 numerics quantize ``x`` into (llama.cpp's choice for the type). The
native kernels have the same facts in ``native/src/quants/quants.h``;
``tests/native/test_quants.py`` checks that both agree.

``storage``:

* ``"float"``: a plain MLX array of the type's dtype (F32, F16, BF16);
* ``"affine"``: re-laid at load as MLX's affine quantization (packed
  ``uint32`` codes, per-32 scales and biases), which holds these types
  exactly, so the existing ``quantized_matmul`` kernels run them;
* ``"blocks"``: the file's own blocks, a ``uint8 [rows, row_bytes]`` array
  that the ``ggml_matmul`` / ``ggml_dequantize`` ops read.

IQ1_M's scale is spread over the top nibbles of its four scale words, and
MXFP4's is an E8M0 exponent byte (255 is NaN): :mod:`.checks` reads them.

Retired ids (Q4_2, Q4_3, ...) and types no GGUF writer emits for weights
are absent: a file naming them is refused by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Storage = Literal["float", "affine", "blocks"]
#: The 8-bit activation blocks of the int8 numerics: Q8_0 (32 values, one
#: scale), Q8_1 (32 values, a scale and scale * sum), Q8_K (256 values, one
#: float scale, sums of each 16).
Activation = Literal["q8_0", "q8_1", "q8_K"]


@dataclass(frozen=True)
class GGMLType:
    """One GGML tensor type: ``name`` as llama.cpp spells it, GGUF's ``id``,
    ``block`` elements stored in ``block_bytes`` bytes, how mlxprog keeps it
    (``storage``), and the activation blocks of its int8 dot products."""

    name: str
    id: int
    block: int
    block_bytes: int
    storage: Storage
    activation: Activation | None = None
    #: Byte offsets in a block of its fp16 scale fields (a NaN or infinite
    #: one makes the block's values so; the loader refuses such blocks).
    fp16_scales: tuple[int, ...] = ()

    def row_bytes(self, elements: int) -> int:
        """The bytes of a row of ``elements`` values (a multiple of
        :attr:`block`)."""
        return elements // self.block * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per element (scales included)."""
        return 8 * self.block_bytes / self.block


_TYPES = (
    GGMLType("F32", 0, 1, 4, "float"),
    GGMLType("F16", 1, 1, 2, "float"),
    GGMLType("BF16", 30, 1, 2, "float"),
    GGMLType("Q4_0", 2, 32, 18, "affine", "q8_0", (0,)),
    GGMLType("Q4_1", 3, 32, 20, "affine", "q8_1", (0, 2)),
    GGMLType("Q5_0", 6, 32, 22, "blocks", "q8_0", (0,)),
    GGMLType("Q5_1", 7, 32, 24, "blocks", "q8_1", (0, 2)),
    GGMLType("Q8_0", 8, 32, 34, "affine", "q8_0", (0,)),
    GGMLType("Q2_K", 10, 256, 84, "blocks", "q8_K", (80, 82)),
    GGMLType("Q3_K", 11, 256, 110, "blocks", "q8_K", (108,)),
    GGMLType("Q4_K", 12, 256, 144, "blocks", "q8_K", (0, 2)),
    GGMLType("Q5_K", 13, 256, 176, "blocks", "q8_K", (0, 2)),
    GGMLType("Q6_K", 14, 256, 210, "blocks", "q8_K", (208,)),
    GGMLType("IQ2_XXS", 16, 256, 66, "blocks", "q8_K", (0,)),
    GGMLType("IQ2_XS", 17, 256, 74, "blocks", "q8_K", (0,)),
    GGMLType("IQ3_XXS", 18, 256, 98, "blocks", "q8_K", (0,)),
    GGMLType("IQ1_S", 19, 256, 50, "blocks", "q8_K", (0,)),
    GGMLType("IQ4_NL", 20, 32, 18, "blocks", "q8_0", (0,)),
    GGMLType("IQ3_S", 21, 256, 110, "blocks", "q8_K", (0,)),
    GGMLType("IQ2_S", 22, 256, 82, "blocks", "q8_K", (0,)),
    GGMLType("IQ4_XS", 23, 256, 136, "blocks", "q8_K", (0,)),
    GGMLType("IQ1_M", 29, 256, 56, "blocks", "q8_K"),
    GGMLType("TQ1_0", 34, 256, 54, "blocks", "q8_K", (52,)),
    GGMLType("TQ2_0", 35, 256, 66, "blocks", "q8_K", (64,)),
    GGMLType("MXFP4", 39, 32, 17, "blocks", "q8_0"),
)

#: Every supported type by name.
BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TYPES}
#: Every supported type by GGUF id.
BY_ID: dict[int, GGMLType] = {t.id: t for t in _TYPES}
#: The names of the block-quantized types (the ops' ``type`` attribute):
#: every type but the float ones (the ``"affine"`` ones are blocks too in
#: a file that mixes them with block types).
BLOCK_TYPES: tuple[str, ...] = tuple(t.name for t in _TYPES if t.storage != "float")

#: Ids GGUF once used or uses for things that are not weight types, with
#: what they were: named in the reader's error.
RETIRED: dict[int, str] = {4: "Q4_2 (retired)", 5: "Q4_3 (retired)", 9: "Q8_1 (activations only)",
                           15: "Q8_K (activations only)", 24: "I8", 25: "I16", 26: "I32",
                           27: "I64", 28: "F64", 31: "Q4_0_4_4 (retired)",
                           32: "Q4_0_4_8 (retired)", 33: "Q4_0_8_8 (retired)",
                           36: "IQ4_NL_4_4 (retired)", 37: "IQ4_NL_4_8 (retired)",
                           38: "IQ4_NL_8_8 (retired)"}


def by_name(name: str) -> GGMLType:
    """The type called ``name``; a :class:`KeyError` naming the supported
    ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown GGML type {name!r} (supported: {', '.join(BY_NAME)})") from None
