"""The quant kernels (mlxprog/native/src/quants) built alone, without MLX,
into a small shared library the tests call through ctypes (``shim.cpp``'s C
ABI): each table's kernels can be run on exactly the bytes a test chose.

The files and flags follow mlxprog/native/CMakeLists.txt; the library is
cached by the sources' hash under the pytest temp dir of the session.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[2] / "mlxprog" / "native" / "src" / "quants"

_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
#: Table file -> (compiler flags, the define that tells table.cpp it exists).
X86_TABLES = {
    "table_avx2.cpp": (_AVX2, None),
    "table_avxvnni.cpp": (_AVX2 + ["-mavxvnni"], "MLXPROG_HAVE_AVXVNNI"),
    "table_avx512vnni.cpp": (_AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                                      "-mprefer-vector-width=256"], "MLXPROG_HAVE_AVX512VNNI"),
}
ARM_TABLES = {"table_dotprod.cpp": (["-march=armv8.2-a+dotprod"], "MLXPROG_HAVE_DOTPROD")}

#: Kernel table name -> the /proc/cpuinfo flags it needs (x86-64).
X86_ISAS = {"avx2": ("avx2", "fma", "f16c"),
            "avx2+avxvnni": ("avx2", "fma", "f16c", "avx_vnni"),
            "avx2+avx512vnni": ("avx2", "fma", "f16c", "avx512_vnni", "avx512vl", "avx512bw")}


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runnable_isas() -> list[str]:
    """The quant tables this CPU runs: portable always, then the vector ones."""
    isas = ["portable"]
    if platform.machine() in ("x86_64", "AMD64"):
        flags = cpu_flags()
        isas += [name for name, need in X86_ISAS.items() if all(f in flags for f in need)]
    return isas


def compile_commands(compiler: str, out: Path, arch: str = "x86_64") -> list[list[str]]:
    """The commands that build the library (objects, then the link) at ``out``."""
    tables = X86_TABLES if arch == "x86_64" else ARM_TABLES
    defines = [f"-D{define}=1" for _, define in tables.values() if define]
    base = [compiler, "-std=c++17", "-O2", "-fPIC", "-I", str(SRC), "-c"]
    commands, objects = [], []
    for name in ["table.cpp", "table_portable.cpp", "shim.cpp", *tables]:
        flags = tables.get(name, ([], None))[0]
        obj = out.parent / (name + ".o")
        commands.append([*base, *flags, *defines, str(SRC / name), "-o", str(obj)])
        objects.append(str(obj))
    commands.append([compiler, "-shared", *objects, "-o", str(out)])
    return commands


def sources_hash() -> str:
    """A hash of every quant source (the cache key of the built library)."""
    h = hashlib.sha256()
    for path in sorted(SRC.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(SRC).as_posix().encode())
            h.update(path.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def build(directory: Path | None = None) -> Path:
    """Build the library (x86-64 tables where the host is x86-64) and
    return its path; a cached build of the same sources is reused."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) to build the quant kernels")
    directory = directory or Path(tempfile.gettempdir()) / "mlxprog-quants-tests"
    out = directory / sources_hash() / "libquants.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    arch = "x86_64" if platform.machine() in ("x86_64", "AMD64") else "arm64"
    tmp = out.with_suffix(f".{os.getpid()}.so")
    for command in compile_commands(compiler, tmp, arch):
        subprocess.run(command, check=True, capture_output=True, text=True)
    os.replace(tmp, out)
    return out


class Quants:
    """The built library: each method runs one kernel of table ``isa``."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        c = ctypes
        self.lib.mlxprog_quants_dequantize.argtypes = [c.c_char_p, c.c_int, c.c_void_p,
                                                       c.c_void_p, c.c_int64]
        self.lib.mlxprog_quants_quantize.argtypes = [c.c_char_p, c.c_int, c.c_void_p,
                                                     c.c_void_p, c.c_int64]
        self.lib.mlxprog_quants_vec_dot.argtypes = [c.c_char_p, c.c_int, c.c_int64, c.c_void_p,
                                                    c.c_void_p, c.POINTER(c.c_float)]
        self.lib.mlxprog_quants_dot_f32.argtypes = [c.c_char_p, c.c_int64, c.c_void_p,
                                                    c.c_void_p, c.POINTER(c.c_float)]
        self.lib.mlxprog_quants_set_codebook.argtypes = [c.c_char_p, c.c_void_p, c.c_int64]
        self.lib.mlxprog_quants_has.argtypes = [c.c_char_p]

    def has(self, isa: str) -> bool:
        """Whether the library holds table ``isa``."""
        return bool(self.lib.mlxprog_quants_has(isa.encode()))

    def dequantize(self, isa: str, type_id: int, blocks: np.ndarray, n: int) -> np.ndarray:
        """One row of ``n`` elements dequantized from ``blocks`` (uint8)."""
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        out = np.empty(n, np.float32)
        rc = self.lib.mlxprog_quants_dequantize(isa.encode(), type_id, blocks.ctypes.data,
                                                out.ctypes.data, n)
        assert rc == 0, f"no dequantizer for type {type_id} in {isa}"
        return out

    def quantize(self, isa: str, activation: int, x: np.ndarray, block_bytes: int,
                 block: int) -> np.ndarray:
        """``x`` (float32, a whole number of blocks) quantized into
        activation blocks (0: q8_0, 1: q8_1, 2: q8_K), as raw bytes."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros(x.size // block * block_bytes, np.uint8)
        rc = self.lib.mlxprog_quants_quantize(isa.encode(), activation, x.ctypes.data,
                                              out.ctypes.data, x.size)
        assert rc == 0
        return out

    def vec_dot(self, isa: str, type_id: int, n: int, w: np.ndarray, xq: np.ndarray) -> float:
        """The type's dot product of a weight row with quantized activations."""
        w = np.ascontiguousarray(w, dtype=np.uint8)
        xq = np.ascontiguousarray(xq)
        out = ctypes.c_float()
        rc = self.lib.mlxprog_quants_vec_dot(isa.encode(), type_id, n, w.ctypes.data,
                                             xq.ctypes.data, ctypes.byref(out))
        assert rc == 0, f"no vec_dot for type {type_id} in {isa}"
        return out.value

    def dot_f32(self, isa: str, a: np.ndarray, b: np.ndarray) -> float:
        """The table's float32 dot product."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = np.ascontiguousarray(b, dtype=np.float32)
        out = ctypes.c_float()
        assert self.lib.mlxprog_quants_dot_f32(isa.encode(), a.size, a.ctypes.data,
                                               b.ctypes.data, ctypes.byref(out)) == 0
        return out.value

    def set_codebook(self, name: str, data: np.ndarray) -> None:
        """Give the kernels codebook ``name`` (raw bytes of ``data``)."""
        data = np.ascontiguousarray(data)
        self.lib.mlxprog_quants_set_codebook(name.encode(), data.ctypes.data, data.nbytes)
