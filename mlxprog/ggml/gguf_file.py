"""mlxprog's own reader of GGUF files (llama.cpp's model format), which trusts
nothing in them.

:func:`open_gguf` parses a file's header, metadata and tensor infos (no
tensor data) and checks all of them: every count and length is held against
the bytes the file has left before anything is allocated for it, every
tensor's type, shape, offset and extent against the type table
(:mod:`mlxprog.ggml.types`), the alignment and the file's size, and no two
tensors may share bytes. Any problem is a :class:`~mlxprog.errors.ModelError`
naming the file, the header field, metadata key or tensor, and what is
wrong. :meth:`GGUFFile.read` then hands out one tensor's bytes as they are
stored (quantized blocks stay blocks).

The format (versions 2 and 3, little-endian): the magic ``GGUF``, a
``uint32`` version, ``uint64`` tensor and metadata counts; the metadata as
(key, ``uint32`` value type, value) entries; one info per tensor (name,
``uint32`` dimension count, ``uint64`` dimensions from the row length
``ne[0]`` up, ``uint32`` GGML type, ``uint64`` offset); then, at the next
multiple of ``general.alignment`` (default 32), the data section, where
each tensor's offset (a multiple of the alignment) points. Strings are a
``uint64`` byte length and UTF-8 bytes; an array is a ``uint32`` element
type, a ``uint64`` count and the elements.
"""

from __future__ import annotations

import math
import mmap
import os
import reprlib
import struct
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import mlx.core as mx
import numpy as np

from ..arrays import is_int
from ..errors import ModelError
from .types import BY_ID, RETIRED, GGMLType

MAGIC = b"GGUF"
#: The versions read; version 1 (32-bit counts) is long gone from the wild.
VERSIONS = (2, 3)
#: The data alignment of a file without ``general.alignment``.
DEFAULT_ALIGNMENT = 32
#: GGML's most dimensions of a tensor.
MAX_DIMS = 4
#: The deepest nesting of metadata arrays read (real files nest at most
#: once); it bounds the reader's recursion on a hostile file.
MAX_ARRAY_DEPTH = 8

_INT64_MAX = 2**63 - 1
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ALIGNMENT_KEY = "general.alignment"


@dataclass(frozen=True)
class _ValueType:
    """A GGUF metadata value type: its name, and for the fixed-size ones the
    struct format of one value (standard sizes, little-endian)."""

    name: str
    format: str | None = None

    @cached_property
    def scalar(self) -> struct.Struct:
        """How one value of a fixed-size type is unpacked."""
        return struct.Struct(self.format)

    @cached_property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype of an array of a fixed-size type."""
        return None if self.format is None else np.dtype(self.format)

    @property
    def min_bytes(self) -> int:
        """The fewest bytes a value of the type takes in the file: the size of
        a number, a string's length field, an array's type and count."""
        if self.dtype is not None:
            return self.dtype.itemsize
        return 8 if self.name == "string" else 12


_STRING, _ARRAY, _BOOL = 8, 9, 7
_VALUE_TYPES = {
    0: _ValueType("uint8", "<B"), 1: _ValueType("int8", "<b"), 2: _ValueType("uint16", "<H"),
    3: _ValueType("int16", "<h"), 4: _ValueType("uint32", "<I"), 5: _ValueType("int32", "<i"),
    6: _ValueType("float32", "<f"), _BOOL: _ValueType("bool", "<B"),
    _STRING: _ValueType("string"), _ARRAY: _ValueType("array"), 10: _ValueType("uint64", "<Q"),
    11: _ValueType("int64", "<q"), 12: _ValueType("float64", "<d"),
}
_UINT32 = 4
# A key is at least its length field, a value type and a one-byte value; a
# tensor info at least its name's length, one dimension, a type and an offset.
_MIN_ENTRY_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8

#: How :meth:`GGUFFile.read` returns each float type: F32 and F16 as numpy's
#: own, BF16 (which numpy lacks) as its raw 16 bits; every other type as
#: bytes.
_FLOAT_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor of a GGUF file is: ``shape`` in numpy's row-major
    order (GGUF's ``ne`` reversed, so ``shape[-1]`` is the row length), the
    absolute ``offset`` of its data in the file and its size in bytes."""

    name: str
    type: GGMLType
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def elements(self) -> int:
        """The number of values the tensor holds."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class UnsupportedTensor:
    """A tensor whose GGML type mlxprog does not read (kept only by
    ``open_gguf(..., strict_types=False)``): GGUF's ``type_id``, what the type
    is (``"Q4_2 (retired)"``, ``"unknown id 99"``), its shape and the
    absolute offset of its data. Its size is unknown: the type's block is."""

    name: str
    type_id: int
    type_name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def elements(self) -> int:
        """The number of values the tensor holds."""
        return math.prod(self.shape)


@dataclass
class GGUFFile:
    """An open GGUF file whose header, metadata and tensor infos have been
    read and checked: metadata values as plain Python (numbers, bools,
    strings, lists of them), tensors in file order. :meth:`read` reads one
    tensor's data; :meth:`close` (or leaving a ``with`` block) closes the
    file."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    #: Tensors of types mlxprog does not read (only with ``strict_types=False``).
    unsupported: dict[str, UnsupportedTensor] = field(default_factory=dict)
    _file: BinaryIO | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def read(self, name: str) -> np.ndarray:
        """The data of tensor ``name`` in a new array (no view of the file):
        F32 as ``float32`` and F16 as ``float16`` of the tensor's shape, BF16
        as ``uint16`` bit patterns of its shape, every other type as the
        stored blocks, ``uint8`` of shape ``(*shape[:-1], row_bytes)``."""
        info = self._info(name)
        data = np.empty(info.nbytes, np.uint8)
        self._read_into(info, memoryview(data))
        dtype = _FLOAT_DTYPES.get(info.type.name)
        if dtype is not None:
            return data.view(dtype).reshape(info.shape)
        return data.reshape(*info.shape[:-1], info.type.row_bytes(info.shape[-1]))

    def read_into(self, name: str, out: np.ndarray) -> None:
        """Read the data of tensor ``name`` into ``out``, a C-contiguous
        writable array of exactly its bytes (e.g. a view of an MLX array's
        memory: the file's bytes are then copied once, into their final
        place)."""
        info = self._info(name)
        if not out.flags.c_contiguous or not out.flags.writeable or out.nbytes != info.nbytes:
            raise ValueError(f"tensor {name!r}: read_into needs a writable C-contiguous array "
                             f"of {info.nbytes} bytes, got {out.nbytes} bytes")
        self._read_into(info, memoryview(out.reshape(-1).view(np.uint8)))

    def _info(self, name: str) -> TensorInfo:
        """Tensor ``name``'s info; a :class:`ModelError` if it has none."""
        info = self.tensors.get(name)
        if info is None:
            if name in self.unsupported:
                problem = f"has an unsupported type, {self.unsupported[name].type_name}"
            else:
                problem = "does not exist"
            raise _error(self.path, f"tensor {name!r} {problem}")
        return info

    def _read_into(self, info: TensorInfo, buffer: memoryview) -> None:
        # One handle serves every reader: the seek and the reads must not
        # interleave with another thread's, nor the file close under them.
        with self._lock:
            if self._file is None:
                raise _error(self.path, f"tensor {info.name!r}: the file has been closed")
            try:
                self._file.seek(info.offset)
                done = 0
                while done < info.nbytes:
                    # A raw read may return less than asked (Linux caps one
                    # read at about 2 GiB); 0 is the end of the file.
                    count = self._file.readinto(buffer[done:])
                    if not count:
                        raise _error(self.path, f"tensor {info.name!r}: the file ends at byte "
                                     f"{info.offset + done}, inside the tensor's data (bytes "
                                     f"{info.offset} to {info.offset + info.nbytes}); was it "
                                     "cut short after it was opened?")
                    done += count
            except OSError as e:
                raise _error(self.path, f"tensor {info.name!r}: cannot read its data: "
                             f"{e.strerror or e}") from e

    def close(self) -> None:
        """Close the file (after a read in progress in another thread);
        :meth:`read` fails afterwards. Closing twice is fine."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_gguf(path: str | Path, *, strict_types: bool = True) -> GGUFFile:
    """Open the GGUF file at ``path``: read and check its header, metadata and
    tensor infos (not the tensor data). A tensor of a type mlxprog does not
    read (retired, activation-only or unknown ids) is a :class:`ModelError`;
    with ``strict_types=False`` it goes into :attr:`GGUFFile.unsupported`
    instead (what ``mlxprog inspect`` lists). Every other problem is a
    :class:`ModelError` naming the file and what is wrong where."""
    path = Path(path)
    if not path.exists():
        raise _error(path, "no such file")
    if not path.is_file():  # a FIFO or device would block or never end
        raise _error(path, "not a regular file")
    try:
        file = open(path, "rb", buffering=0)  # the GGUFFile returned owns it
    except OSError as e:
        raise _error(path, e.strerror or str(e)) from e
    try:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise _error(path, "an empty file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            parsed = _Parser(path, view, size, strict_types).parse()
    except OSError as e:
        file.close()
        raise _error(path, e.strerror or str(e)) from e
    except BaseException:
        file.close()
        raise
    parsed._file = file
    return parsed


def metadata_value(value: Any) -> Any:
    """A GGUF metadata value as plain Python: ``mx.load`` returns numbers as 0-d
    arrays and numeric lists as 1-d arrays (:func:`open_gguf` returns plain
    Python already); everything else passes through."""
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


#: What :func:`metadata_field` checks each kind of value against: a test
#: and the words an error gives for it.
_FIELD_KINDS: dict[str, tuple[Any, str]] = {
    "integer": (is_int, "an integer"),
    "number": (_is_number, "a finite number"),
    "string": (lambda v: isinstance(v, str), "a string"),
    "flag": (lambda v: isinstance(v, bool) or (is_int(v) and v in (0, 1)), "a boolean"),
    "strings": (lambda v: isinstance(v, list) and set(map(type, v)) <= {str},
                "an array of strings"),
    "integers": (lambda v: isinstance(v, list) and set(map(type, v)) <= {int},
                 "an array of integers"),
    "numbers": (lambda v: isinstance(v, list) and all(map(_is_number, v)),
                "an array of finite numbers"),
}
_REQUIRED: Any = object()


def metadata_field(metadata: Mapping[str, Any], key: str, kind: str,
                   default: Any = _REQUIRED) -> Any:
    """Metadata value ``key`` as plain Python (:func:`metadata_value`),
    checked to be of ``kind`` (a key of :data:`_FIELD_KINDS`: "integer",
    "number", "string", "flag", "strings", "integers", "numbers"); ``default``
    when the key is absent. A missing key without a default, or a value of
    another kind, is a :class:`ModelError` naming the key: a file's metadata
    is as hostile as its tensors."""
    value = metadata_value(metadata.get(key))
    if value is None:
        if default is _REQUIRED:
            raise ModelError(f"GGUF metadata lacks {key}")
        return default
    test, words = _FIELD_KINDS[kind]
    if not test(value):
        raise ModelError(f"GGUF metadata key {key} must be {words}, got {reprlib.repr(value)}")
    return bool(value) if kind == "flag" else value


def _error(path: Path, problem: str) -> ModelError:
    return ModelError(f"cannot read GGUF file {path}: {problem}")


class _Parser:
    """One pass over a GGUF file's header, metadata and tensor infos in a
    read-only map of the file; ``pos`` is where the next field starts."""

    def __init__(self, path: Path, view: mmap.mmap, size: int, strict_types: bool):
        self.path = path
        self.view = view
        self.size = size
        self.strict_types = strict_types
        self.pos = 0
        #: The value type id of every metadata key read.
        self.value_types: dict[str, int] = {}

    def fail(self, problem: str) -> ModelError:
        return _error(self.path, problem)

    def left(self) -> int:
        return self.size - self.pos

    # -- fields -------------------------------------------------------------

    def truncated(self, count: int, start: int, what: str) -> ModelError:
        return self.fail(f"truncated in {what}: {count} bytes needed at offset {start}, "
                         f"but the file ends at {self.size}")

    def need(self, count: int, what: str) -> int:
        """Claim the next ``count`` bytes for ``what``; returns where they
        start, or fails when the file ends first."""
        start = self.pos
        if count > self.size - start:
            raise self.truncated(count, start, what)
        self.pos = start + count
        return start

    def u32(self, what: str) -> int:
        return _U32.unpack_from(self.view, self.need(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64.unpack_from(self.view, self.need(8, what))[0]

    def string(self, what: str) -> str:
        length = self.u64(f"{what} (its length)")
        if length > self.left():
            raise self.fail(f"{what}: a string of {length} bytes at offset {self.pos}, but the "
                            f"file ends at {self.size}")
        start = self.need(length, what)
        try:
            return str(self.view[start:start + length], "utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start} of the "
                            "string)") from None

    # -- the file -------------------------------------------------------------

    def parse(self) -> GGUFFile:
        magic = self.view[:4]
        if magic != MAGIC:
            raise self.fail(f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
        self.pos = 4
        version = self.version()
        tensor_count = self.u64("header field 'tensor_count'")
        kv_count = self.u64("header field 'metadata_kv_count'")
        # Both counts are checked against the bytes left before any loop
        # runs: each entry takes a known least number of bytes.
        if kv_count * _MIN_ENTRY_BYTES > self.left():
            raise self.fail(f"header field 'metadata_kv_count' is {kv_count}: that many "
                            f"metadata entries need at least {kv_count * _MIN_ENTRY_BYTES} "
                            f"bytes, but only {self.left()} follow the header")
        room = self.left() - kv_count * _MIN_ENTRY_BYTES
        if tensor_count * _MIN_TENSOR_INFO_BYTES > room:
            raise self.fail(f"header field 'tensor_count' is {tensor_count}: that many tensor "
                            f"infos need at least {tensor_count * _MIN_TENSOR_INFO_BYTES} bytes, "
                            f"but only {room} are left for them")
        metadata = self.metadata(kv_count)
        alignment = self.alignment(metadata)
        infos = [self.tensor_info(i, tensor_count) for i in range(tensor_count)]
        data_start = -(-self.pos // alignment) * alignment
        tensors: dict[str, TensorInfo] = {}
        unsupported: dict[str, UnsupportedTensor] = {}
        for name, shape, type_id, offset in infos:
            if name in tensors or name in unsupported:
                raise self.fail(f"tensor {name!r} is listed twice")
            if offset % alignment:
                raise self.fail(f"tensor {name!r}: data offset {offset} is not a multiple of "
                                f"the alignment {alignment}")
            start = data_start + offset
            ggml_type = BY_ID.get(type_id)
            if ggml_type is None:
                type_name = RETIRED.get(type_id, f"unknown id {type_id}")
                if self.strict_types:
                    raise self.fail(f"tensor {name!r} has type {type_name} (GGML type id "
                                    f"{type_id}), which mlxprog does not read")
                if start > self.size:
                    raise self.fail(f"tensor {name!r}: data offset {start} is past the end of "
                                    f"the file ({self.size} bytes)")
                unsupported[name] = UnsupportedTensor(name, type_id, type_name, shape, start)
                continue
            tensors[name] = self.tensor(name, shape, ggml_type, start)
        self.check_overlaps(tensors)
        return GGUFFile(self.path, version, metadata, tensors, alignment, unsupported)

    def version(self) -> int:
        version = self.u32("header field 'version'")
        if version in VERSIONS:
            return version
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in VERSIONS:
            raise self.fail(f"a big-endian GGUF file (version {swapped}, byte-swapped); only "
                            "little-endian files are supported")
        raise self.fail(f"header field 'version' is {version}: GGUF version {version} is not "
                        f"supported (only {' and '.join(map(str, VERSIONS))})")

    # -- metadata -------------------------------------------------------------

    def metadata(self, count: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {}
        for index in range(count):
            key = self.string(f"the key of metadata entry {index} of {count}")
            where = f"metadata key {key!r}"
            if key in metadata:
                raise self.fail(f"{where} appears twice")
            self.value_types[key] = self.u32(f"{where} (its value type)")
            metadata[key] = self.value(self.value_types[key], where, 0)
        return metadata

    def value(self, type_id: int, where: str, depth: int) -> Any:
        """The value of type ``type_id`` at ``pos``, as plain Python."""
        value_type = _VALUE_TYPES.get(type_id)
        if value_type is None:
            raise self.fail(f"{where}: unknown value type id {type_id}")
        if value_type.dtype is not None:
            start = self.need(value_type.dtype.itemsize, where)
            (value,) = value_type.scalar.unpack_from(self.view, start)
            return value != 0 if type_id == _BOOL else value
        if type_id == _STRING:
            return self.string(where)
        if depth == MAX_ARRAY_DEPTH:
            raise self.fail(f"{where}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
        item_type_id = self.u32(f"{where} (its array's element type)")
        item_type = _VALUE_TYPES.get(item_type_id)
        if item_type is None:
            raise self.fail(f"{where}: an array of unknown value type id {item_type_id}")
        count = self.u64(f"{where} (its array's length)")
        if count * item_type.min_bytes > self.left():
            raise self.fail(f"{where}: an array of {count} {item_type.name} values needs at "
                            f"least {count * item_type.min_bytes} bytes, but only "
                            f"{self.left()} are left in the file")
        if item_type.dtype is not None:
            start = self.need(count * item_type.dtype.itemsize, where)
            # From a copy of the bytes, not the map: no view of it may
            # outlive the parse (the map is closed after it).
            items = np.frombuffer(self.view[start:self.pos], item_type.dtype)
            return (items != 0).tolist() if item_type_id == _BOOL else items.tolist()
        if item_type_id == _STRING:
            return self.strings(count, where)
        return [self.value(_ARRAY, f"{where}[{i}]", depth + 1) for i in range(count)]

    def strings(self, count: int, where: str) -> list[str]:
        """``count`` strings from ``pos``: the loop of a tokenizer's vocabulary
        and merges (tens of thousands each), so kept to an unpack and a slice
        per string, every check after the loop; a string array that fails
        one is walked again by :meth:`checked_strings`, which names the
        string at fault."""
        view, pos = self.view, self.pos
        unpack = _U64.unpack_from
        raw: list[bytes] = []
        append = raw.append
        try:
            for _ in range(count):
                (length,) = unpack(view, pos)
                pos += 8 + length
                # A slice of the map past its end is cut short, not an
                # error: the end is checked once, below.
                append(view[pos - length:pos])
            if pos > self.size:
                return self.checked_strings(count, where)
            strings = list(map(bytes.decode, raw))
        except (struct.error, OverflowError, UnicodeDecodeError):
            # Past the end (struct.error; OverflowError: an offset beyond
            # any index), or bytes that are not UTF-8.
            return self.checked_strings(count, where)
        self.pos = pos
        return strings

    def checked_strings(self, count: int, where: str) -> list[str]:
        """:meth:`strings` one string at a time, each checked as it is read:
        the first one that runs past the file's end or is not UTF-8 is a
        :class:`ModelError` naming its index."""
        return [self.string(f"{where}[{index}]") for index in range(count)]

    def alignment(self, metadata: dict[str, Any]) -> int:
        if _ALIGNMENT_KEY not in metadata:
            return DEFAULT_ALIGNMENT
        alignment = metadata[_ALIGNMENT_KEY]
        # GGUF stores it as a uint32; llama.cpp reads nothing else.
        type_id = self.value_types[_ALIGNMENT_KEY]
        if type_id != _UINT32:
            shown = _shown(alignment)
            raise self.fail(f"metadata key {_ALIGNMENT_KEY!r} must be an integer (a uint32), "
                            f"got a {_VALUE_TYPES[type_id].name}: {shown}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise self.fail(f"metadata key {_ALIGNMENT_KEY!r} must be a positive power of two, "
                            f"got {alignment}")
        return alignment

    # -- tensors -------------------------------------------------------------

    def tensor_info(self, index: int, count: int) -> tuple[str, tuple[int, ...], int, int]:
        """Tensor info ``index``: name, shape (row-major), type id and offset
        in the data section, the shape checked."""
        name = self.string(f"the name of tensor info {index} of {count}")
        where = f"tensor {name!r}"
        n_dims = self.u32(f"{where} (its number of dimensions)")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"{where} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        start = self.need(8 * n_dims, f"{where} (its dimensions)")
        ne = struct.unpack_from(f"<{n_dims}Q", self.view, start)
        for axis, extent in enumerate(ne):
            if extent == 0 or extent > _INT64_MAX:
                shown = extent if extent == 0 else f"{extent} ({extent - 2**64} as int64)"
                raise self.fail(f"{where}: ne[{axis}] is {shown}; every dimension must be "
                                "positive")
        elements = math.prod(ne)
        if elements > _INT64_MAX:
            raise self.fail(f"{where}: its dimensions {list(ne)} hold {elements} elements, "
                            "more than a 64-bit count holds")
        type_id = self.u32(f"{where} (its type)")
        offset = self.u64(f"{where} (its data offset)")
        return name, tuple(reversed(ne)), type_id, offset

    def tensor(self, name: str, shape: tuple[int, ...], ggml_type: GGMLType,
               start: int) -> TensorInfo:
        """The info of a tensor of a supported type whose data starts at
        ``start``, checked against the type's block and the file's end."""
        where = f"tensor {name!r}"
        row = shape[-1]
        if row % ggml_type.block:
            raise self.fail(f"{where}: row length {row} (ne[0]) is not a multiple of "
                            f"{ggml_type.name}'s block of {ggml_type.block} elements")
        rows = math.prod(shape[:-1])
        nbytes = rows * ggml_type.row_bytes(row)
        if start + nbytes > self.size:
            raise self.fail(f"{where}: its data (bytes {start} to {start + nbytes}, "
                            f"{ggml_type.name} {list(shape)}) runs past the end of the file "
                            f"({self.size} bytes)")
        return TensorInfo(name, ggml_type, shape, start, nbytes)

    def check_overlaps(self, tensors: dict[str, TensorInfo]) -> None:
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for before, after in zip(ordered, ordered[1:]):
            if before.offset + before.nbytes > after.offset:
                raise self.fail(f"tensors {before.name!r} (bytes {before.offset} to "
                                f"{before.offset + before.nbytes}) and {after.name!r} (bytes "
                                f"{after.offset} to {after.offset + after.nbytes}) overlap")


# -- describe -------------------------------------------------------------------


def describe(model: GGUFFile) -> str:
    """A summary of an open GGUF file from its metadata and tensor infos (no
    tensor data is read): architecture, model name, parameter count, context
    length, chat template, tokenizer, then tensor counts and bytes per GGML
    type and whether mlxprog reads every type (``mlxprog inspect``)."""
    meta = model.metadata
    architecture = meta.get("general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = (len(tokens) if isinstance(tokens, list)
             else meta.get(f"{architecture}.vocab_size"))
    vocab = "(not set)" if vocab is None else f"{_shown(vocab)} tokens"
    tensors = [*model.tensors.values(), *model.unsupported.values()]
    parameters = sum(t.elements for t in tensors)
    lines = [
        f"GGUF file: {model.path} (version {model.version})",
        f"architecture: {_shown(architecture)}",
        f"name: {_shown(meta.get('general.name'))}",
        f"parameters: {parameters:,}{_scaled(parameters)}",
        *_experts_line(meta, architecture, tensors, parameters),
        f"context length: {_shown(meta.get(f'{architecture}.context_length'))}",
        f"chat template: {'yes' if meta.get('tokenizer.chat_template') else 'no'}",
        f"tokenizer: {_shown(meta.get('tokenizer.ggml.model'))}, vocabulary {vocab}",
        f"metadata: {len(meta)} keys",
        f"tensors: {len(tensors)}",
    ]
    counts = Counter(t.type.name for t in model.tensors.values())
    sizes: Counter[str] = Counter()
    for t in model.tensors.values():
        sizes[t.type.name] += t.nbytes
    unknown = Counter(t.type_name for t in model.unsupported.values())
    rows = [("type", "tensors", "bytes")]
    rows += [(name, f"{counts[name]:,}", _bytes(sizes[name])) for name in sorted(counts)]
    rows += [(name, f"{unknown[name]:,}", "?") for name in sorted(unknown)]
    rows.append(("total", f"{len(tensors):,}", _bytes(sum(sizes.values()))))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines += [f"  {row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}"
              for row in rows]
    if model.unsupported:
        count = len(model.unsupported)
        lines.append(f"unsupported types: {', '.join(sorted(unknown))} ({count} "
                     f"tensor{'s' if count != 1 else ''}); mlxprog cannot load this file")
    else:
        lines.append("every tensor type is supported")
    return "\n".join(lines)


def _experts_line(meta: dict[str, Any], architecture: Any, tensors: list,
                  parameters: int) -> list[str]:
    """A mixture of experts' line: its experts per layer, how many each token
    uses and the parameters a token reads (the expert stacks, ``*_exps``
    tensors, counted at that share); none for a dense file."""
    count = meta.get(f"{architecture}.expert_count")
    if not is_int(count) or count <= 0:
        return []
    used = meta.get(f"{architecture}.expert_used_count")
    if not is_int(used) or not 0 < used <= count:
        return [f"experts: {count:,} per layer, experts used per token {_shown(used)}"]
    stacked = sum(t.elements for t in tensors if "_exps." in t.name)
    active = parameters - stacked + stacked * used // count
    return [f"experts: {count:,} per layer, {used:,} used per token "
            f"(active parameters {active:,}{_scaled(active)})"]


def _shown(value: Any) -> str:
    """A metadata value in a summary line: absent ones say so, integers get
    thousands separators, long ones are cut short."""
    if value is None:
        return "(not set)"
    text = f"{value:,}" if is_int(value) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _scaled(count: int) -> str:
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f" ({count / scale:.1f}{unit})"
    return ""


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n:,} ({n / scale:.1f} {unit})"
    return f"{n:,}"
