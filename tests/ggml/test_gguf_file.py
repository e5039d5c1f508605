"""mlxprog's GGUF reader (:mod:`mlxprog.ggml.gguf_file`): valid files read as
the ``gguf`` package (llama.cpp's own Python reader and writer, the test
oracle) reads them; every kind of damage is a ModelError naming the file
and the place; random damage never gets past it unnoticed."""

from __future__ import annotations

import math
import struct

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_fixtures import smollm_path

from mlxprog.errors import ModelError
from mlxprog.ggml.gguf_file import TensorInfo, metadata_value, open_gguf
from mlxprog.ggml.types import BY_NAME

# -- building files byte by byte --------------------------------------------------


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def string(text: str | bytes) -> bytes:
    """A GGUF string: its byte length, then the bytes."""
    data = text.encode() if isinstance(text, str) else text
    return u64(len(data)) + data


def entry(key: str | bytes, type_id: int, payload: bytes) -> bytes:
    """A metadata entry: key, value type, value bytes."""
    return string(key) + u32(type_id) + payload


def tensor_info(name: str | bytes, ne: list[int], type_id: int, offset: int) -> bytes:
    """A tensor info: ``ne`` in GGUF's order (row length first), ``offset``
    relative to the data section."""
    return string(name) + u32(len(ne)) + b"".join(map(u64, ne)) + u32(type_id) + u64(offset)


ARCH = entry("general.architecture", V.STRING, string("llama"))


def build(entries=(ARCH,), infos=(), data=b"", *, version=3, alignment=32,
          tensor_count=None, kv_count=None) -> bytes:
    """A GGUF file: header, entries, tensor infos, padding to ``alignment``,
    ``data``; the counts are the lists' unless given."""
    head = (b"GGUF" + u32(version)
            + u64(len(infos) if tensor_count is None else tensor_count)
            + u64(len(entries) if kv_count is None else kv_count)
            + b"".join(entries) + b"".join(infos))
    return head + bytes(-len(head) % alignment) + data


#: One F32 tensor "w", shape (2, 4): the smallest file with data.
W_DATA = np.arange(8, dtype=np.float32).tobytes()
W_INFO = tensor_info("w", [4, 2], Q.F32, 0)


def test_the_byte_builder_writes_what_gguf_writer_writes(tmp_path):
    path = tmp_path / "w.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_uint32("n", 7)
    writer.add_tensor("w", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert path.read_bytes() == build([ARCH, entry("n", V.UINT32, u32(7))], [W_INFO],
                                      W_DATA + bytes(32 - len(W_DATA)))


# -- valid files ------------------------------------------------------------------------


def f32(x: float) -> float:
    """``x`` as a float32 stores it."""
    return float(np.float32(x))


#: Metadata of every value type as the reader must return it, with the
#: writer call that stores it (name, value, value type, element type).
SCALARS = [
    ("t.u8", 200, V.UINT8), ("t.i8", -100, V.INT8), ("t.u16", 60000, V.UINT16),
    ("t.i16", -30000, V.INT16), ("t.u32", 4_000_000_000, V.UINT32),
    ("t.i32", -2_000_000_000, V.INT32), ("t.f32", f32(0.1), V.FLOAT32), ("t.bool", True, V.BOOL),
    ("t.false", False, V.BOOL), ("t.str", "héllo ✓", V.STRING), ("t.empty", "", V.STRING),
    ("t.u64", 2**64 - 1, V.UINT64), ("t.i64", -(2**63), V.INT64), ("t.f64", 0.1, V.FLOAT64),
]
ARRAYS = [
    ("a.u8", [0, 255, 7], V.UINT8), ("a.i16", [-1, 2, -3], V.INT16),
    ("a.u32", [1, 2, 4_000_000_000], V.UINT32), ("a.i32", [-5, 6], V.INT32),
    ("a.i64", [-(2**62), 1], V.INT64), ("a.u64", [2**63], V.UINT64),
    ("a.f32", [f32(1.5), f32(-0.3)], V.FLOAT32), ("a.f64", [0.25, -1e300], V.FLOAT64),
    ("a.bool", [True, False, True], V.BOOL), ("a.str", ["a", "", "ü b", "<|im_end|>"], V.STRING),
    ("a.nested", [[1, 2], [3], [-4, 5, 6]], V.ARRAY),
    ("a.nested_str", [["x", "yz"], ["w"]], V.ARRAY),
]
#: The tensors of the valid file: name, stored array, GGML type when raw.
RNG = np.random.default_rng(0)
TENSORS = [
    ("f32.weight", RNG.standard_normal((3, 4, 8)).astype(np.float32), None),
    ("f16.weight", RNG.standard_normal((5, 16)).astype(np.float16), None),
    ("bias", RNG.standard_normal(7).astype(np.float32), None),
    ("bf16.weight", RNG.integers(0, 2**16, (2, 8), dtype=np.uint16), Q.BF16),
    ("q8_0.weight", RNG.integers(0, 256, (3, 2 * 34), dtype=np.uint8), Q.Q8_0),
    ("q4_1.weight", RNG.integers(0, 256, (2, 20), dtype=np.uint8), Q.Q4_1),
    ("q4_k.weight", RNG.integers(0, 256, (2, 3, 2 * 144), dtype=np.uint8), Q.Q4_K),
]
#: The shape (numpy's order) each tensor has in the file.
SHAPES = {"f32.weight": (3, 4, 8), "f16.weight": (5, 16), "bias": (7,), "bf16.weight": (2, 8),
          "q8_0.weight": (3, 64), "q4_1.weight": (2, 32), "q4_k.weight": (2, 3, 512)}


def write_valid(path, alignment: int | None = None) -> None:
    """A file with :data:`SCALARS`, :data:`ARRAYS` and :data:`TENSORS`."""
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value, value_type in SCALARS:
        writer.add_key_value(key, value, value_type)
    for key, value, item_type in ARRAYS:
        writer.add_key_value(key, value, V.ARRAY, sub_type=item_type)
    for name, array, raw_type in TENSORS:
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "valid.gguf"
    write_valid(path)
    return path


def same_value(a, b) -> bool:
    """Equal metadata values, of the same Python types, NaN equal to NaN."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_value, a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def is_nested(value) -> bool:
    return isinstance(value, list) and any(isinstance(v, list) for v in value)


def assert_reads_as_gguf_reader(path, model) -> None:
    """``model`` holds what ``gguf.GGUFReader`` reads from ``path``: the same
    keys and values (nested arrays, which it flattens, excepted) and the same
    tensors at the same offsets with the same bytes."""
    reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(model.metadata) == list(fields)
    for key, value in model.metadata.items():
        if not is_nested(value):
            assert same_value(value, fields[key].contents()), key
    assert [t.name for t in reader.tensors] == list(model.tensors)
    for expected in reader.tensors:
        info = model.tensors[expected.name]
        assert info.type.id == expected.tensor_type
        assert info.shape == tuple(reversed(expected.shape.tolist()))
        assert (info.offset, info.nbytes) == (expected.data_offset, expected.n_bytes)
        data = model.read(expected.name)
        assert data.tobytes() == expected.data.tobytes(), expected.name
    del reader


def test_metadata_of_every_value_type(valid_file):
    with open_gguf(valid_file) as model:
        expected = {"general.architecture": "llama"}
        expected |= {key: value for key, value, _ in SCALARS}
        expected |= {key: value for key, value, _ in ARRAYS}
        assert list(model.metadata) == list(expected)
        for key, value in expected.items():
            assert same_value(model.metadata[key], value), key
        assert (model.version, model.alignment, model.path) == (3, 32, valid_file)


def test_tensors_read_as_stored(valid_file):
    with open_gguf(valid_file) as model:
        assert list(model.tensors) == [name for name, _, _ in TENSORS]
        for name, array, _ in TENSORS:
            info = model.tensors[name]
            assert info.shape == SHAPES[name]
            assert info.nbytes == array.nbytes and info.offset % 32 == 0
            data = model.read(name)
            assert data.flags.owndata or data.base.flags.owndata
            assert data.tobytes() == array.tobytes()
        assert model.read("f32.weight").dtype == np.float32
        assert model.read("f32.weight").shape == (3, 4, 8)
        assert model.read("f16.weight").dtype == np.float16
        assert model.read("bf16.weight").dtype == np.uint16
        assert model.read("bf16.weight").shape == (2, 8)
        assert model.read("q8_0.weight").dtype == np.uint8
        assert model.read("q8_0.weight").shape == (3, 68)
        assert model.read("q4_k.weight").shape == (2, 3, 288)
        assert model.tensors["q4_k.weight"].type is BY_NAME["Q4_K"]


def test_reads_as_gguf_reader_does(valid_file):
    with open_gguf(valid_file) as model:
        assert_reads_as_gguf_reader(valid_file, model)


def test_an_alignment_of_its_own_and_version_2(tmp_path):
    path = tmp_path / "aligned.gguf"
    write_valid(path, alignment=64)
    with open_gguf(path) as model:
        assert model.alignment == 64 and model.metadata["general.alignment"] == 64
        assert all(t.offset % 64 == 0 for t in model.tensors.values())
        assert_reads_as_gguf_reader(path, model)
    data = bytearray(path.read_bytes())
    data[4:8] = u32(2)  # version 2 has version 3's layout
    path.write_bytes(bytes(data))
    with open_gguf(path) as model:
        assert model.version == 2


def test_a_file_without_tensors_and_an_empty_array(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(build([ARCH, entry("e", V.ARRAY, u32(V.INT32) + u64(0))]))
    with open_gguf(path) as model:
        assert model.tensors == {} and model.metadata["e"] == []


def test_read_returns_fresh_arrays_and_close_ends_reading(valid_file):
    model = open_gguf(valid_file)
    first = model.read("bias")
    first[:] = 0
    assert model.read("bias").any()
    model.close()
    model.close()
    with pytest.raises(ModelError, match=f"{valid_file}.*tensor 'bias': the file has been "
                       "closed"):
        model.read("bias")


def test_read_of_a_missing_tensor(valid_file):
    with open_gguf(valid_file) as model:
        with pytest.raises(ModelError, match=f"{valid_file}: tensor 'nope' does not exist"):
            model.read("nope")


def test_a_file_cut_short_after_it_was_opened(tmp_path):
    path = tmp_path / "shrinks.gguf"
    path.write_bytes(build(infos=[W_INFO], data=W_DATA))
    with open_gguf(path) as model:
        with open(path, "r+b") as file:
            file.truncate(path.stat().st_size - 4)
        with pytest.raises(ModelError, match=f"{path}: tensor 'w': the file ends at byte"):
            model.read("w")


def test_the_smollm2_model_reads_as_gguf_reader_and_mx_load_read_it():
    path = smollm_path()
    # Parsing SmolLM2's header (49,152 tokens, 48,900 merges) takes about
    # 0.05 s on one core; GGUFReader takes about 2 s.
    with open_gguf(path) as model:
        assert_reads_as_gguf_reader(path, model)
        assert len(model.metadata["tokenizer.ggml.tokens"]) == 49152
        assert len(model.metadata["tokenizer.ggml.merges"]) == 48900
        assert model.metadata["llama.context_length"] == 8192
        # What the tokenizer and the families read: the values mx.load's
        # metadata had, once metadata_value made them plain Python.
        _, mx_metadata = mx.load(str(path), return_metadata=True)
        assert {k: metadata_value(v) for k, v in mx_metadata.items()} == model.metadata


# -- damaged files: one test per kind of damage --------------------------------------


def refused(tmp_path, data: bytes, *fragments: str, strict_types: bool = True) -> str:
    """Write ``data`` and check ``open_gguf`` refuses it with a ModelError
    naming the file and holding every fragment; returns the message."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ModelError) as caught:
        open_gguf(path, strict_types=strict_types)
    message = str(caught.value)
    assert message.startswith(f"cannot read GGUF file {path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_not_a_gguf_file(tmp_path):
    refused(tmp_path, b"GGML" + bytes(40), "not a GGUF file (it starts with b'GGML', not b'GGUF')")
    refused(tmp_path, b"GG", "not a GGUF file (it starts with b'GG'")


def test_an_empty_file(tmp_path):
    refused(tmp_path, b"", "an empty file")


def test_missing_file_and_a_directory(tmp_path):
    with pytest.raises(ModelError, match=f"cannot read GGUF file {tmp_path / 'no.gguf'}: no such"):
        open_gguf(tmp_path / "no.gguf")
    with pytest.raises(ModelError, match=f"cannot read GGUF file {tmp_path}: not a regular"):
        open_gguf(tmp_path)


def test_version_1_and_unknown_versions(tmp_path):
    refused(tmp_path, build(version=1), "header field 'version' is 1",
            "GGUF version 1 is not supported (only 2 and 3)")
    refused(tmp_path, build(version=4), "header field 'version' is 4")


def test_a_big_endian_file(tmp_path):
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("w", np.ones(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    refused(tmp_path, path.read_bytes(), "big-endian GGUF file (version 3, byte-swapped)")


def test_truncated_header(tmp_path):
    refused(tmp_path, build()[:6], "truncated in header field 'version'")
    refused(tmp_path, build()[:14], "truncated in header field 'tensor_count'")
    refused(tmp_path, build()[:20], "truncated in header field 'metadata_kv_count'")


def test_counts_larger_than_the_file_holds(tmp_path):
    refused(tmp_path, build(kv_count=2**64 - 1), "header field 'metadata_kv_count' is "
            f"{2**64 - 1}", "bytes, but only")
    refused(tmp_path, build(tensor_count=10**15), f"header field 'tensor_count' is {10**15}")
    # Two entries' worth of bytes follow, but not two entries.
    refused(tmp_path, build(kv_count=2, alignment=1), "truncated in the key of metadata entry 1 "
            "of 2 (its length)")


def test_truncated_key(tmp_path):
    data = build([ARCH], kv_count=2, alignment=1) + u64(20) + b"general.na"
    refused(tmp_path, data, "the key of metadata entry 1 of 2: a string of 20 bytes")


def test_a_huge_string_length_allocates_nothing(tmp_path):
    data = build([entry("k", V.STRING, u64(2**63) + b"abc")], alignment=1)
    refused(tmp_path, data, f"metadata key 'k': a string of {2**63} bytes")


def test_truncated_string_value(tmp_path):
    data = build([ARCH, entry("general.name", V.STRING, string("SmolLM2"))], alignment=1)
    refused(tmp_path, data[:-3], "metadata key 'general.name': a string of 7 bytes")


def test_truncated_scalar_value(tmp_path):
    data = build([ARCH, entry("n", V.UINT64, u64(5))], alignment=1)
    refused(tmp_path, data[:-2], "truncated in metadata key 'n': 8 bytes needed")


def test_truncated_or_overlong_numeric_array(tmp_path):
    values = u32(V.INT32) + u64(100) + bytes(4 * 100)
    data = build([ARCH, entry("tokenizer.ggml.token_type", V.ARRAY, values)], alignment=1)
    refused(tmp_path, data[:-1], "metadata key 'tokenizer.ggml.token_type': an array of 100 "
            "int32 values needs at least 400 bytes, but only 399 are left")
    huge = u32(V.FLOAT64) + u64(2**61) + bytes(16)
    refused(tmp_path, build([entry("s", V.ARRAY, huge)]), f"metadata key 's': an array of {2**61}"
            " float64 values")


def test_truncated_string_array(tmp_path):
    # Three strings of 28 bytes each (length and 20 bytes): cut inside the
    # second's bytes, then inside its length.
    values = u32(V.STRING) + u64(3) + string("a" * 20) + string("b" * 20) + string("c" * 20)
    data = build([entry("tokenizer.ggml.tokens", V.ARRAY, values)], alignment=1)
    refused(tmp_path, data[:-30], "metadata key 'tokenizer.ggml.tokens'[1]: a string of 20 bytes")
    refused(tmp_path, data[:-52], "truncated in metadata key 'tokenizer.ggml.tokens'[1] "
            "(its length)")
    many = u32(V.STRING) + u64(2**60) + string("ab")
    refused(tmp_path, build([entry("t", V.ARRAY, many)]), f"metadata key 't': an array of "
            f"{2**60} string values needs at least")


def test_truncated_nested_array(tmp_path):
    values = u32(V.ARRAY) + u64(2) + u32(V.UINT8) + u64(1) + b"\x01" + u32(V.UINT8) + u64(3)
    data = build([entry("n", V.ARRAY, values)], alignment=1) + b"\x01"
    refused(tmp_path, data, "metadata key 'n'[1]: an array of 3 uint8 values needs at least 3 "
            "bytes, but only 1 are left")


def test_arrays_nested_too_deep(tmp_path):
    deep = (u32(V.ARRAY) + u64(1)) * 9 + u32(V.UINT8) + u64(0)
    refused(tmp_path, build([entry("deep", V.ARRAY, deep)]), "metadata key "
            "'deep'[0][0][0][0][0][0][0][0]: arrays nested deeper than 8 levels")


def test_unknown_value_types(tmp_path):
    refused(tmp_path, build([ARCH, entry("x", 13, u32(0))]), "metadata key 'x': unknown value "
            "type id 13")
    refused(tmp_path, build([entry("y", V.ARRAY, u32(99) + u64(1) + u32(0))]),
            "metadata key 'y': an array of unknown value type id 99")


def test_invalid_utf8(tmp_path):
    refused(tmp_path, build([entry("k", V.STRING, string(b"ab\xff"))]),
            "metadata key 'k' is not valid UTF-8 (invalid start byte at byte 2")
    tokens = u32(V.STRING) + u64(3) + string("a") + string("b") + string(b"\xed\xa0\x80")
    refused(tmp_path, build([entry("tokenizer.ggml.tokens", V.ARRAY, tokens)]),
            "metadata key 'tokenizer.ggml.tokens'[2] is not valid UTF-8")
    refused(tmp_path, build([ARCH, entry(b"bad\xc3", V.UINT8, b"\x01")]),
            "the key of metadata entry 1 of 2 is not valid UTF-8")
    refused(tmp_path, build(infos=[tensor_info(b"w\x80", [4], Q.F32, 0)], data=bytes(16)),
            "the name of tensor info 0 of 1 is not valid UTF-8")


def test_duplicate_metadata_key(tmp_path):
    refused(tmp_path, build([ARCH, entry("n", V.UINT8, b"\x01"), entry("n", V.UINT8, b"\x02")]),
            "metadata key 'n' appears twice")


def test_alignment_not_a_power_of_two_or_not_an_integer(tmp_path):
    for value in (48, 0):
        refused(tmp_path, build([entry("general.alignment", V.UINT32, u32(value))]),
                "metadata key 'general.alignment' must be a positive power of two, got "
                f"{value}")
    refused(tmp_path, build([entry("general.alignment", V.FLOAT32, struct.pack("<f", 32))]),
            "metadata key 'general.alignment' must be an integer (a uint32), got a float32: 32.0")
    refused(tmp_path, build([entry("general.alignment", V.STRING, string("32"))]),
            "metadata key 'general.alignment' must be an integer (a uint32), got a string")


def test_truncated_tensor_infos(tmp_path):
    data = build(infos=[W_INFO], data=W_DATA)
    start = data.index(W_INFO)
    # W_INFO: name (9 bytes), dimension count (4), ne (16), type (4), offset (8).
    for keep, where in ((5, "the name of tensor info 0 of 1 (its length)"),
                        (11, "tensor 'w' (its number of dimensions)"),
                        (20, "tensor 'w' (its dimensions)"),
                        (31, "tensor 'w' (its type)"),
                        (38, "tensor 'w' (its data offset)")):
        refused(tmp_path, data[:start + keep], f"truncated in {where}")


def test_unknown_and_retired_tensor_types(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("w", [32], 99, 0)], data=bytes(64)),
            "tensor 'w' has type unknown id 99 (GGML type id 99), which mlxprog does not read")
    refused(tmp_path, build(infos=[tensor_info("old", [32], 4, 0)], data=bytes(64)),
            "tensor 'old' has type Q4_2 (retired) (GGML type id 4)")
    refused(tmp_path, build(infos=[tensor_info("x", [32], 28, 0)], data=bytes(256)),
            "tensor 'x' has type F64 (GGML type id 28)")


def test_unsupported_types_kept_apart_when_not_strict(tmp_path):
    path = tmp_path / "mixed.gguf"
    path.write_bytes(build(infos=[W_INFO, tensor_info("old", [32, 2], 4, 32)],
                           data=W_DATA + bytes(64)))
    with open_gguf(path, strict_types=False) as model:
        assert list(model.tensors) == ["w"]
        old = model.unsupported["old"]
        assert (old.type_id, old.type_name, old.shape, old.elements) == (
            4, "Q4_2 (retired)", (2, 32), 64)
        with pytest.raises(ModelError, match="tensor 'old' has an unsupported type, Q4_2"):
            model.read("old")


def test_row_length_not_a_multiple_of_the_block(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("blk.0.attn_q.weight", [100, 2], Q.Q8_0, 0)],
                            data=bytes(1024)),
            "tensor 'blk.0.attn_q.weight': row length 100 (ne[0]) is not a multiple of Q8_0's "
            "block of 32 elements")
    refused(tmp_path, build(infos=[tensor_info("k", [128], Q.Q4_K, 0)], data=bytes(1024)),
            "tensor 'k': row length 128 (ne[0]) is not a multiple of Q4_K's block of 256")


def test_dimension_counts(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("w", [1, 1, 1, 1, 4], Q.F32, 0)], data=bytes(32)),
            "tensor 'w' has 5 dimensions (1 to 4 allowed)")
    refused(tmp_path, build(infos=[tensor_info("s", [], Q.F32, 0)], data=bytes(32)),
            "tensor 's' has 0 dimensions (1 to 4 allowed)")
    # A 4-d tensor is fine.
    path = tmp_path / "4d.gguf"
    path.write_bytes(build(infos=[tensor_info("w", [2, 1, 2, 2], Q.F32, 0)], data=bytes(32)))
    with open_gguf(path) as model:
        assert model.read("w").shape == (2, 2, 1, 2)


def test_zero_and_negative_dimensions(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("w", [4, 0], Q.F32, 0)], data=bytes(32)),
            "tensor 'w': ne[1] is 0; every dimension must be positive")
    refused(tmp_path, build(infos=[tensor_info("w", [2**64 - 4, 1], Q.F32, 0)], data=bytes(32)),
            f"tensor 'w': ne[0] is {2**64 - 4} (-4 as int64); every dimension must be positive")


def test_element_count_overflow(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("w", [2**40, 2**30], Q.F32, 0)], data=bytes(32)),
            "tensor 'w': its dimensions [1099511627776, 1073741824] hold "
            f"{2**70} elements, more than a 64-bit count holds")


def test_tensor_data_past_the_end(tmp_path):
    data = build(infos=[W_INFO], data=W_DATA)
    refused(tmp_path, data[:-1], "tensor 'w': its data (bytes", "F32 [2, 4]) runs past the end")
    refused(tmp_path, build(infos=[tensor_info("w", [4, 2], Q.F32, 2**64 - 32)], data=W_DATA),
            "tensor 'w': its data (bytes")
    refused(tmp_path, build(infos=[tensor_info("w", [2**31, 2**31], Q.F32, 0)], data=W_DATA),
            "tensor 'w': its data (bytes")


def test_overlapping_tensors(tmp_path):
    infos = [W_INFO, tensor_info("v", [8], Q.F16, 0), tensor_info("u", [8], Q.F32, 32)]
    refused(tmp_path, build(infos=infos, data=W_DATA + W_DATA),
            "tensors 'w' (bytes", "and 'v' (bytes", "overlap")


def test_offset_not_a_multiple_of_the_alignment(tmp_path):
    refused(tmp_path, build(infos=[tensor_info("w", [4, 2], Q.F32, 8)], data=W_DATA * 2),
            "tensor 'w': data offset 8 is not a multiple of the alignment 32")


def test_duplicate_tensor_names(tmp_path):
    infos = [W_INFO, tensor_info("w", [4, 2], Q.F32, 32)]
    refused(tmp_path, build(infos=infos, data=W_DATA * 4), "tensor 'w' is listed twice")


# -- random damage -------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    """A small valid file with string, numeric and nested arrays and three
    tensor types, and the folder the damaged copies go to."""
    folder = tmp_path_factory.mktemp("gguf_fuzz")
    writer = gguf.GGUFWriter(folder / "base.gguf", "llama")
    writer.add_uint32("llama.context_length", 64)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "ab", "<s>"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.5, 0.5])
    writer.add_key_value("nested", [[1, 2], [3]], V.ARRAY, sub_type=V.ARRAY)
    writer.add_tensor("f32", RNG.standard_normal((2, 4)).astype(np.float32))
    writer.add_tensor("q8", RNG.integers(0, 256, (2, 34), dtype=np.uint8), raw_dtype=Q.Q8_0)
    writer.add_tensor("f16", RNG.standard_normal(8).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder, (folder / "base.gguf").read_bytes()


@settings(max_examples=800, deadline=None, derandomize=True)
@given(st.data())
def test_damaged_files_are_refused_or_read_as_gguf_reader_reads_them(fuzz_base, data):
    folder, base = fuzz_base
    damaged = bytearray(base)
    # A few bytes overwritten (mostly in the header, where a byte changes
    # what the rest means), then maybe the file cut short.
    header = base.index(b"f16") + 40
    anywhere = st.integers(0, len(base) - 1)
    positions = st.one_of(st.integers(0, header), anywhere)
    for position, value in data.draw(st.lists(st.tuples(positions, st.integers(0, 255)),
                                              max_size=4)):
        damaged[position] = value
    damaged = bytes(damaged[:data.draw(st.one_of(st.none(), st.integers(0, len(base))))])
    # A new file each time: GGUFReader's maps of the last one stay valid.
    path = folder / "damaged.gguf"
    path.unlink(missing_ok=True)
    path.write_bytes(damaged)
    try:
        model = open_gguf(path)
    except ModelError as e:
        assert str(e).startswith(f"cannot read GGUF file {path}: ")
        return
    with model:
        assert_reads_as_gguf_reader(path, model)


def test_tensor_info_counts_elements():
    assert TensorInfo("w", BY_NAME["Q4_0"], (3, 64), 32, 3 * 36).elements == 192


def test_read_into_fills_a_given_array_and_checks_its_size(tmp_path):
    """read_into writes a tensor's bytes into the caller's array (the
    loader's MLX arrays: one copy of the file), and refuses an array of
    another size."""
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    data = np.arange(24, dtype=np.float32).reshape(4, 6)
    writer.add_tensor("t", data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open_gguf(path) as model:
        out = np.zeros((4, 6), np.float32)
        model.read_into("t", out)
        np.testing.assert_array_equal(out, data)
        with pytest.raises(ValueError, match="96 bytes"):
            model.read_into("t", np.zeros((3, 6), np.float32))
