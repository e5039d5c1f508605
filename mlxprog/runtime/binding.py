"""Values in and out of a program: one converter for call inputs, captures
and callback results, plus weight files.

Every value that crosses into a program is checked against what the program
declares (shape and dtype) by :func:`to_array`; nothing is silently cast. The
callers word the error for their role (an input, a capture, a callback's
output).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import mlx.core as mx
import numpy as np

from ..arrays import AVal, exact_array, from_numpy, name_of, numpy_fits
from ..errors import BindingError, ModelError, UnboundError
from ..ggml.tensors import load_gguf_tensors


@dataclass(frozen=True)
class Mismatch(Exception):
    """A value does not fit its declaration: ``found`` and ``expected`` as
    text (``float32[2, 3]``), or ``reason`` when it is not an array at all."""

    found: str = ""
    expected: str = ""
    reason: str = ""


def to_array(value: Any, dtype: mx.Dtype, shape: tuple[int, ...] | None) -> mx.array:
    """``value`` as an array of ``dtype`` and ``shape`` (None: any shape),
    converting numpy arrays and Python scalars or lists exactly; raises
    :class:`Mismatch` when it does not fit. A numpy array must have the
    dtype's numpy counterpart (for bfloat16: float32, rounded, or ml_dtypes'
    bfloat16, kept bit for bit)."""
    if isinstance(value, mx.array):
        found_dtype, found_shape = value.dtype, tuple(value.shape)
        array = value
    elif isinstance(value, np.ndarray):
        if not numpy_fits(value.dtype, dtype):
            raise Mismatch(f"{value.dtype}{list(value.shape)}", _text(dtype, shape))
        found_dtype, found_shape = dtype, tuple(value.shape)
        array = None
    else:
        try:
            array = exact_array(value, dtype)
        except (ValueError, TypeError) as exc:
            raise Mismatch(reason=str(exc)) from None
        found_dtype, found_shape = dtype, tuple(array.shape)
    if found_dtype != dtype or (shape is not None and found_shape != shape):
        raise Mismatch(_text(found_dtype, found_shape), _text(dtype, shape))
    if found_shape and 0 in found_shape:
        # An empty array converted from numpy misbehaves in MLX 0.32 (summing
        # it after a compiled reduction can hang; products and `all` of it
        # give 0 and False); an empty array MLX makes itself is safe, and
        # there is no data to lose.
        return mx.zeros(found_shape, dtype)
    return array if array is not None else from_numpy(value, dtype)


def _text(dtype: mx.Dtype, shape: Sequence[int] | None) -> str:
    return name_of(dtype) + ("" if shape is None else str(list(shape)))


def bind_input(name: str, value: Any, dtype: mx.Dtype, shape: tuple[int, ...] | None) -> mx.array:
    """A call input as an array, or a :class:`BindingError` naming it."""
    try:
        return to_array(value, dtype, shape)
    except Mismatch as bad:
        if bad.reason:
            raise BindingError(f"input {name!r}: {bad.reason}") from None
        raise BindingError(f"input {name!r} expects {bad.expected}, got {bad.found}") from None


def bind_captures(specs: Sequence[Any], avals: Sequence[AVal], captures: Mapping[str, Any] | None,
                  weights: str | Path | Sequence[str | Path] | None) -> list[mx.array]:
    """The capture arrays in declaration order (``specs`` are the program's
    capture declarations), from ``captures`` and ``weights`` files (captures
    win), each checked against its declaration. A name that is not bound
    but joins bound names with ``+`` (``"a+b"``) is their concatenation
    along axis 0 (see :func:`joined_capture`)."""
    available: dict[str, Any] = {}
    if weights is not None:
        available.update(load_weights(weights))
    if captures:
        available.update(captures)
    values = []
    for spec, aval in zip(specs, avals):
        joined = None if spec.name in available else joined_capture(spec.name, available)
        if joined is not None:
            available[spec.name] = joined
        if spec.name not in available:
            raise UnboundError("capture", spec.name,
                               f"capture {spec.name!r} ({aval}) is not bound",
                               "pass it in captures= or a weights= file")
        try:
            values.append(to_array(available[spec.name], aval.dtype, aval.shape))
        except Mismatch as bad:
            found = bad.found or bad.reason
            raise BindingError(f"capture {spec.name!r} expects {aval}, got {found}") from None
    return values


def joined_capture(name: str, available: Mapping[str, Any]) -> mx.array | None:
    """The capture ``name`` = ``"a+b+..."`` as the arrays ``a``, ``b``, ...
    of ``available`` stacked along axis 0 (a fused projection's weights from
    a model file that holds each projection's), or None when ``name`` joins
    no names or one of them is not available."""
    parts = name.split("+")
    if len(parts) < 2 or not all(p in available for p in parts):
        return None
    try:
        return mx.concatenate([mx.array(available[p]) for p in parts], axis=0)
    except ValueError as exc:
        raise BindingError(f"capture {name!r}: its parts cannot be joined along axis 0: "
                           f"{exc}") from None


GGUF_MAGIC = b"GGUF"
"""The first four bytes of every GGUF file."""

NPY_MAGIC = b"\x93NUMPY"
"""The first six bytes of every ``.npy`` file."""

WEIGHTS_SUFFIXES = (".safetensors", ".npz", ".gguf")
"""The weights files ``mx.load`` reads arrays by name from."""


def weights_file_problem(path: str | Path) -> str | None:
    """What keeps ``mx.load`` from reading the weights file at ``path``, in a
    few words to follow its name (``"no such file"``, ``"not a GGUF file
    (...)"``), or None when it exists and starts as its suffix's format does
    (it may still be damaged further in). It is looked at before MLX reads
    it because MLX's messages name neither the file nor the problem
    (``[load_gguf] gguf_init failed`` for a text file). ``.npy`` is checked
    too: ``mx.load`` reads it, as one array."""
    path = Path(path)
    if not path.exists():
        return "no such file"
    if path.is_dir():
        return "a directory, not a file"
    suffix = path.suffix.lower()
    if suffix not in (*WEIGHTS_SUFFIXES, ".npy"):
        return (f"an unknown weights format {suffix or '(no suffix)'!r} (expected "
                f"{', '.join(WEIGHTS_SUFFIXES)})")
    try:
        with open(path, "rb") as file:
            head = file.read(9)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not head:
        return "an empty file"
    if suffix == ".gguf" and head[:4] != GGUF_MAGIC:
        return f"not a GGUF file (it starts with {head[:4]!r}, not {GGUF_MAGIC!r})"
    if suffix == ".npz" and not zipfile.is_zipfile(path):
        return "not an .npz (zip) file"
    if suffix == ".npy" and head[:6] != NPY_MAGIC:
        return f"not an .npy file (it starts with {head[:6]!r}, not {NPY_MAGIC!r})"
    # safetensors: the header's length as 8 little-endian bytes, then the JSON header.
    header_end = 8 + int.from_bytes(head[:8], "little")
    if suffix == ".safetensors" and (head[8:9] != b"{" or header_end > path.stat().st_size):
        return "not a safetensors file (it does not start with the length of a JSON header)"
    return None


def load_weights(paths: str | Path | Sequence[str | Path]) -> dict[str, mx.array]:
    """Read arrays by name from ``.safetensors``, ``.npz`` or ``.gguf`` files;
    a file that is missing or not of its suffix's format is a
    :class:`BindingError` naming it and saying so (see
    :func:`weights_file_problem`)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    weights: dict[str, mx.array] = {}
    for path in paths:
        problem = weights_file_problem(path)
        if problem is not None:
            raise BindingError(f"cannot read weights file {str(path)!r}: {problem}")
        if Path(path).suffix.lower() == ".gguf":
            # mlxprog's own reader: it keeps every GGML type as the model
            # loader does (mx.load expands or refuses most of them).
            try:
                weights.update(load_gguf_tensors(path)[0])
            except ModelError as exc:
                raise BindingError(str(exc)) from None
            continue
        try:
            loaded = mx.load(str(path))
        except Exception as exc:  # MLX raises bare RuntimeError/ValueError for bad files
            raise BindingError(f"cannot read weights file {str(path)!r}: {exc}") from None
        if isinstance(loaded, tuple):
            loaded = loaded[0]
        if not isinstance(loaded, dict):
            raise BindingError(f"weights file {str(path)!r} holds one array, not named arrays")
        weights.update(loaded)
    return weights
