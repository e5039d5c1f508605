"""The K-quants (Q2_K .. Q6_K) and IQ4_XS kernels of every runnable table:
row dequantization bit for bit against gguf's numpy reference, and the q8_K
dot products against a float64 reference on the same quantized activations.
The arm64 tables (portable and neon+dotprod) run the same checks under qemu
where a cross compiler and qemu-aarch64 are installed.

The q8_K activation blocks are built here from random codes (not by the
library's quantizer), so these tests pin the dot products alone.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

import quants_lib

QK = 256

#: Type -> the byte offsets of its fp16 fields in a block, and whether the
#: quantizer only writes non-negative values there (d and dmin of the types
#: with mins).
FP16_FIELDS = {
    "Q2_K": ((80, 82), True),
    "Q3_K": ((108,), False),
    "Q4_K": ((0, 2), True),
    "Q5_K": ((0, 2), True),
    "Q6_K": ((208,), False),
    "IQ4_XS": ((0,), False),
}
TYPES = list(FP16_FIELDS)
ISAS = quants_lib.runnable_isas()

#: llama.cpp's block_q8_K: float d, int8 qs[256], int16 bsums[16].
Q8K = np.dtype([("d", "<f4"), ("qs", "i1", QK), ("bsums", "<i2", QK // 16)])
assert Q8K.itemsize == 292 and Q8K.fields["qs"][1] == 4 and Q8K.fields["bsums"][1] == 260


@pytest.fixture(scope="module")
def quants():
    return quants_lib.Quants(quants_lib.build())


def type_id(name: str) -> int:
    return int(GGMLQuantizationType[name])


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks random blocks of `name` (uint8 [n_blocks, bytes]): random bytes
    for every code and scale field, random finite fp16 values for d (and dmin)."""
    size = GGML_QUANT_SIZES[GGMLQuantizationType[name]][1]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    offsets, non_negative = FP16_FIELDS[name]
    for offset in offsets:
        low = 0.0 if non_negative else -1.0
        values = rng.uniform(low, 1.0, n_blocks).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def fill_codes(name: str, blocks: np.ndarray, fill: int) -> None:
    """Sets every byte of `blocks` [n_blocks, bytes] but the fp16 fields
    (codes and packed scales) to `fill`."""
    code_bytes = np.ones(blocks.shape[1], bool)
    for offset in FP16_FIELDS[name][0]:
        code_bytes[offset:offset + 2] = False
    blocks[:, code_bytes] = fill


def q8k_blocks(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """q8_K blocks (raw bytes) of int8 codes [n] and one positive float per 256."""
    blocks = np.zeros(codes.size // QK, Q8K)
    blocks["d"] = scales
    blocks["qs"] = codes.reshape(-1, QK)
    blocks["bsums"] = codes.reshape(-1, QK // 16, 16).astype(np.int32).sum(-1)
    return blocks.view(np.uint8)


def random_q8k(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random q8_K activations of n elements: their bytes and their values
    d * qs in float64."""
    codes = rng.integers(-127, 128, n).astype(np.int8)
    scales = rng.uniform(1e-3, 1e-1, n // QK).astype(np.float32)
    values = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), QK)
    return q8k_blocks(codes, scales), values


def check_dot(quants, isa: str, name: str, blocks: np.ndarray, xq: np.ndarray,
              x: np.ndarray) -> None:
    """vec_dot of one row within float rounding of the float64 dot of gguf's
    dequantized weights with the activations' values, and (a vector table)
    of the portable table's result."""
    n = x.size
    w = dequantize(blocks.reshape(1, -1), GGMLQuantizationType[name]).astype(np.float64).ravel()
    got = quants.vec_dot(isa, type_id(name), n, blocks, xq)
    bound = 1e-5 * float(np.abs(w) @ np.abs(x)) + 1e-6
    assert abs(got - float(w @ x)) <= bound, (isa, name, n, got, float(w @ x), bound)
    if isa != "portable":
        portable = quants.vec_dot("portable", type_id(name), n, blocks, xq)
        assert abs(got - portable) <= bound, (isa, name, n, got, portable, bound)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_dequantize_matches_gguf(quants, isa, name):
    """Rows of random blocks to float32, bit for bit as gguf's numpy."""
    rng = np.random.default_rng(1)
    rows, n = 6, 1536
    blocks = random_blocks(name, rows * n // QK, rng).reshape(rows, -1)
    want = dequantize(blocks, GGMLQuantizationType[name]).reshape(rows, n)
    for r in range(rows):
        got = quants.dequantize(isa, type_id(name), blocks[r], n)
        np.testing.assert_array_equal(got.view(np.uint32), want[r].view(np.uint32),
                                      err_msg=f"{isa} {name} row {r}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [QK, 3 * QK, 2048])
def test_vec_dot_matches_float64(quants, isa, name, n):
    """One block, three, and a realistic row of random blocks and codes."""
    rng = np.random.default_rng(n)
    for _ in range(4):
        blocks = random_blocks(name, n // QK, rng)
        xq, x = random_q8k(n, rng)
        check_dot(quants, isa, name, blocks, xq, x)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_vec_dot_extreme_codes(quants, isa, name):
    """The largest codes and scales against +-127 activations: the int16
    pair sums and int32 block sums of the vector tables must not overflow."""
    rng = np.random.default_rng(7)
    n = 1024
    for fill in (0x00, 0xFF, 0xAA, 0x55):
        blocks = random_blocks(name, n // QK, rng)
        fill_codes(name, blocks, fill)
        for sign in (1, -1):
            codes = np.full(n, 127 * sign, np.int8)
            codes[rng.integers(0, n, n // 4)] *= -1
            xq = q8k_blocks(codes, np.full(n // QK, 0.01, np.float32))
            x = codes.astype(np.float64) * 0.01
            check_dot(quants, isa, name, blocks, xq, x)


#: Runs the kernels of the arm64 tables on rows read from files (built with
#: the quant sources and shim.cpp, run under qemu): argv type n rows
#: weights activations out; writes per table (portable, then neon+dotprod)
#: and per row the n dequantized floats and the vec_dot float.
ARM_DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
extern "C" int mlxprog_quants_dequantize(const char*, int, const uint8_t*, float*, int64_t);
extern "C" int mlxprog_quants_vec_dot(const char*, int, int64_t, const uint8_t*, const void*, float*);
static std::vector<uint8_t> read_file(const char* path) {
  std::vector<uint8_t> data;
  FILE* f = std::fopen(path, "rb");
  for (int c; f && (c = std::fgetc(f)) != EOF;) data.push_back(static_cast<uint8_t>(c));
  if (f) std::fclose(f);
  return data;
}
int main(int argc, char** argv) {
  if (argc != 7) return 2;
  const int type = std::atoi(argv[1]), rows = std::atoi(argv[3]);
  const int64_t n = std::atoll(argv[2]);
  const std::vector<uint8_t> w = read_file(argv[4]), x = read_file(argv[5]);
  const size_t w_row = w.size() / rows, x_row = x.size() / rows;
  std::vector<float> values(n);
  FILE* out = std::fopen(argv[6], "wb");
  for (const char* isa : {"portable", "neon+dotprod"})
    for (int r = 0; r < rows; ++r) {
      float dot = 0.0f;
      if (mlxprog_quants_dequantize(isa, type, w.data() + r * w_row, values.data(), n) != 0 ||
          mlxprog_quants_vec_dot(isa, type, n, w.data() + r * w_row, x.data() + r * x_row, &dot) != 0)
        return 3;
      std::fwrite(values.data(), 4, n, out);
      std::fwrite(&dot, 4, 1, out);
    }
  std::fclose(out);
  return 0;
}
"""


@pytest.fixture(scope="module")
def arm_driver(tmp_path_factory):
    """The arm64 driver executable and the command prefix that runs it."""
    compiler, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if compiler is None or qemu is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (Debian: g++-aarch64-linux-gnu, "
                    "qemu-user)")
    out = tmp_path_factory.mktemp("kquants-arm64")
    commands = quants_lib.compile_commands(compiler, out / "unused.so", arch="arm64")
    for command in commands[:-1]:  # the objects (the last command links a shared library)
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    objects = [c[c.index("-o") + 1] for c in commands[:-1]]
    (out / "driver.cpp").write_text(ARM_DRIVER)
    exe = out / "driver"
    subprocess.run([compiler, "-std=c++17", "-O2", "-static", str(out / "driver.cpp"), *objects,
                    "-o", str(exe)], check=True, capture_output=True, text=True, timeout=600)
    return [qemu, str(exe)]


@pytest.mark.parametrize("name", TYPES)
def test_arm64_tables_under_qemu(arm_driver, tmp_path, name):
    """portable and neon+dotprod on arm64: dequantization bit for bit as
    gguf, vec_dot within float rounding of float64 (random and extreme rows)."""
    rng = np.random.default_rng(3)
    n, rows = 1536, 6
    blocks = random_blocks(name, rows * n // QK, rng).reshape(rows, -1)
    for row, fill in ((4, 0xFF), (5, 0x00)):
        fill_codes(name, blocks[row].reshape(n // QK, -1), fill)
    xqs, xs = zip(*(random_q8k(n, rng) for _ in range(rows)))
    (tmp_path / "w").write_bytes(blocks.tobytes())
    (tmp_path / "x").write_bytes(b"".join(xq.tobytes() for xq in xqs))
    done = subprocess.run([*arm_driver, str(type_id(name)), str(n), str(rows), str(tmp_path / "w"),
                           str(tmp_path / "x"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    got = np.fromfile(tmp_path / "out", np.float32).reshape(2, rows, n + 1)
    want = dequantize(blocks, GGMLQuantizationType[name]).reshape(rows, n)
    for t, isa in enumerate(("portable", "neon+dotprod")):
        for r in range(rows):
            np.testing.assert_array_equal(got[t, r, :n].view(np.uint32), want[r].view(np.uint32),
                                          err_msg=f"arm64 {isa} {name} row {r}")
            w, x = want[r].astype(np.float64), xs[r]
            bound = 1e-5 * float(np.abs(w) @ np.abs(x)) + 1e-6
            assert abs(float(got[t, r, n]) - float(w @ x)) <= bound, (isa, name, r)
