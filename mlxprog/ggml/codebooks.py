"""The IQ types' codebooks (their grids), built at run time from the ``gguf``
package (llama.cpp's gguf-py) rather than written into mlxprog: the native
kernels receive them through ``quants::set_codebook(name, bytes)`` before any
kernel of an IQ type runs.

Each grid is a C-contiguous ``[entries, width]`` array; row ``r`` holds the
``width`` values the grid index ``r`` stands for, one byte each (so row ``r``
is llama.cpp's uint64 / uint32 grid entry ``r`` read as little-endian bytes).
The names, shapes and value sets (``native/src/quants/portable/iquants.h``
documents the same):

===============  ===========  =====  ==========================  ===============
name             shape        dtype  values                      types
===============  ===========  =====  ==========================  ===============
``iq2xxs_grid``  256 x 8      uint8  8, 25, 43                   IQ2_XXS
``iq2xs_grid``   512 x 8      uint8  8, 25, 43                   IQ2_XS
``iq2s_grid``    1024 x 8     uint8  8, 25, 43                   IQ2_S
``iq3xxs_grid``  256 x 4      uint8  4, 12, 20, ..., 52, 62      IQ3_XXS
``iq3s_grid``    512 x 4      uint8  1, 3, 5, ..., 15            IQ3_S
``iq1s_grid``    2048 x 8     int8   -1, 0, 1                    IQ1_S, IQ1_M
===============  ===========  =====  ==========================  ===============

The sign patterns of the 7-bit sign indices (llama.cpp's ``ksigns_iq2xs``)
follow a rule (the eighth sign bit is the parity of the other seven) and are
computed by the kernels, so they are not among the codebooks.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Codebook name -> (the gguf.quants class whose grid it is, shape, dtype).
CODEBOOKS: dict[str, tuple[str, tuple[int, int], type[np.integer]]] = {
    "iq2xxs_grid": ("IQ2_XXS", (256, 8), np.uint8),
    "iq2xs_grid": ("IQ2_XS", (512, 8), np.uint8),
    "iq2s_grid": ("IQ2_S", (1024, 8), np.uint8),
    "iq3xxs_grid": ("IQ3_XXS", (256, 4), np.uint8),
    "iq3s_grid": ("IQ3_S", (512, 4), np.uint8),
    "iq1s_grid": ("IQ1_S", (2048, 8), np.int8),
}


@lru_cache(maxsize=None)
def _build() -> dict[str, np.ndarray]:
    """Every codebook, from gguf's float grids (exact small integers)."""
    try:
        from gguf import quants
    except ImportError as e:  # gguf is what defines these types' grids
        raise ImportError("the IQ types' codebooks come from the gguf package "
                          "(pip install gguf)") from e
    books = {}
    for name, (class_name, shape, dtype) in CODEBOOKS.items():
        quant = getattr(quants, class_name)
        quant.init_grid()
        values = np.asarray(quant.grid, dtype=np.float32).reshape(shape)
        grid = np.ascontiguousarray(values.astype(dtype))
        if not np.array_equal(grid.astype(np.float32), values):
            raise ValueError(f"gguf's {class_name} grid is not {np.dtype(dtype).name} values")
        grid.setflags(write=False)
        books[name] = grid
    return books


def codebooks() -> dict[str, np.ndarray]:
    """Codebook name -> its ``[entries, width]`` array (read-only), for
    ``set_codebook``; built once from the gguf package."""
    return dict(_build())


#: The codebook each IQ type's grid indices point into.
TYPE_CODEBOOKS = {"IQ2_XXS": "iq2xxs_grid", "IQ2_XS": "iq2xs_grid", "IQ2_S": "iq2s_grid",
                  "IQ3_XXS": "iq3xxs_grid", "IQ3_S": "iq3s_grid", "IQ1_S": "iq1s_grid",
                  "IQ1_M": "iq1s_grid"}


def grid_of(type_name: str) -> np.ndarray:
    """The codebook IQ type ``type_name`` reads (see :data:`TYPE_CODEBOOKS`)."""
    return _build()[TYPE_CODEBOOKS[type_name]]
