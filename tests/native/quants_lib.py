"""The quant kernels (mlxprog/native/src/quants) built alone, without MLX,
for the tests to run each table's kernels on exactly the bytes a test chose,
on two machines:

- the host: a small shared library called through ctypes (``shim.cpp``'s C
  ABI), with the host's tables (x86-64's where the host is x86-64);
- arm64: the same sources and ``quants_arm64_driver.cpp`` cross-compiled
  into a static aarch64 program that serves the C ABI over a pipe, run
  under qemu-aarch64 (tables "portable" and "neon+dotprod").

The files and flags follow mlxprog/native/CMakeLists.txt; each build is
cached by the sources' hash under the system temp dir.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest

from mlxprog.ggml.codebooks import codebooks

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "mlxprog" / "native" / "src" / "quants"
DRIVER = ROOT / "tests" / "native" / "quants_arm64_driver.cpp"
CACHE = Path(tempfile.gettempdir()) / "mlxprog-quants-tests"

_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
#: Table file -> (compiler flags, the define that tells table.cpp it exists).
X86_TABLES = {
    "table_avx2.cpp": (_AVX2, None),
    "table_avxvnni.cpp": (_AVX2 + ["-mavxvnni"], "MLXPROG_HAVE_AVXVNNI"),
    "table_avx512vnni.cpp": (_AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                                      "-mprefer-vector-width=256"], "MLXPROG_HAVE_AVX512VNNI"),
}
ARM_TABLES = {"table_dotprod.cpp": (["-march=armv8.2-a+dotprod"], "MLXPROG_HAVE_DOTPROD")}

#: The activation blocks (quants.h's BlockQ8_0, BlockQ8_1, BlockQ8_K) as
#: numpy record dtypes, and each kind's id in the C ABI and elements a block.
Q8_0 = np.dtype([("d", "<f4"), ("qs", "i1", 32)])
Q8_1 = np.dtype([("d", "<f4"), ("s", "<f4"), ("qs", "i1", 32)])
Q8_K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])
assert Q8_K.itemsize == 292 and Q8_K.fields["qs"][1] == 4 and Q8_K.fields["bsums"][1] == 260
ACTIVATIONS = {"q8_0": (0, Q8_0, 32), "q8_1": (1, Q8_1, 32), "q8_K": (2, Q8_K, 256)}

#: The types whose four-row dot product (vec_dot_4) every x86-64 vector
#: table has. The portable and arm64 tables, and the types whose rows two
#: threads already read near the memory's speed (Q8_0, the K-quants, ...),
#: go one row a call.
X86_FOUR_ROW_TYPES = {"Q4_0", "Q5_0", "IQ4_NL", "MXFP4"}

#: Kernel table name -> the /proc/cpuinfo flags it needs (x86-64).
X86_ISAS = {"avx2": ("avx2", "fma", "f16c"),
            "avx2+avxvnni": ("avx2", "fma", "f16c", "avx_vnni"),
            "avx2+avx512vnni": ("avx2", "fma", "f16c", "avx512_vnni", "avx512vl", "avx512bw")}
#: The arm64 tables run under the emulator (its default CPU has dotprod).
ARM64_ISAS = ["portable", "neon+dotprod"]
#: The cross compiler and the emulator the arm64 tables need.
CROSS_TOOLS = ("aarch64-linux-gnu-g++", "qemu-aarch64")


def host_arch() -> str:
    """The host's architecture as the table files name it: x86_64 or arm64."""
    return "x86_64" if platform.machine() in ("x86_64", "AMD64") else "arm64"


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
    """The host's quant tables this CPU runs: portable always, then the
    vector ones."""
    isas = ["portable"]
    if host_arch() == "x86_64":
        flags = cpu_flags()
        isas += [name for name, need in X86_ISAS.items() if all(f in flags for f in need)]
    return isas


class Table(NamedTuple):
    """One kernel table (``isa``) on one machine: "host" or "arm64"."""

    machine: str
    isa: str

    def __str__(self) -> str:
        return self.isa if self.machine == "host" else f"{self.machine}-{self.isa}"


def tables() -> list[Table]:
    """Every table the tests check: the host's runnable ones, then arm64's."""
    return [Table("host", isa) for isa in runnable_isas()] + [Table("arm64", isa)
                                                              for isa in ARM64_ISAS]


def cross_tools() -> tuple[str, str]:
    """The paths of the aarch64 cross compiler and qemu-aarch64. Where one is
    missing this skips the calling test, or fails it when the environment
    variable CI is set (non-empty): CI installs them (.ci/run), so a failed
    install must not pass as skipped arm64 tests."""
    paths = [shutil.which(tool) for tool in CROSS_TOOLS]
    missing = [tool for tool, path in zip(CROSS_TOOLS, paths) if path is None]
    if missing:
        message = (f"the arm64 kernel tests need {' and '.join(missing)} on PATH "
                   "(Debian: g++-aarch64-linux-gnu, qemu-user)")
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {message}; .ci/run installs them", pytrace=False)
        pytest.skip(message)
    return paths[0], paths[1]


def object_commands(compiler: str, directory: Path, arch: str) -> tuple[list[list[str]],
                                                                          list[str]]:
    """The commands that compile the shim and ``arch``'s tables into objects
    in ``directory``, and those objects."""
    tables = X86_TABLES if arch == "x86_64" else ARM_TABLES
    defines = [f"-D{define}=1" for _, define in tables.values() if define]
    base = [compiler, "-std=c++17", "-O2", "-fPIC", "-I", str(SRC), "-c"]
    commands, objects = [], []
    for name in ["table.cpp", "table_portable.cpp", "shim.cpp", *tables]:
        flags = tables.get(name, ([], None))[0]
        obj = str(directory / (name + ".o"))
        commands.append([*base, *flags, *defines, str(SRC / name), "-o", obj])
        objects.append(obj)
    return commands, objects


def sources_hash() -> str:
    """A hash of every quant source, the driver and this file (the cache key
    of the builds)."""
    files = [(path.relative_to(SRC).as_posix(), path) for path in sorted(SRC.rglob("*"))
             if path.is_file()]
    h = hashlib.sha256()
    for name, path in [*files, (DRIVER.name, DRIVER), (Path(__file__).name, Path(__file__))]:
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _build_cached(name: str, directory: Path | None,
                  commands: Callable[[Path, Path], tuple[list[list[str]], list[str]]]) -> Path:
    """The file ``name`` of the cache directory, built unless a build of the
    same sources is there: ``commands(objects_dir, out)`` gives the compile
    commands (run in parallel) and the link command."""
    out = (directory or CACHE) / sources_hash() / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # A private folder and output name: concurrent sessions may build at once.
    with tempfile.TemporaryDirectory(dir=out.parent) as work:
        tmp = Path(work) / name
        compiles, link = commands(Path(work), tmp)

        def run(command: list[str]) -> None:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)}\n{done.stdout}{done.stderr}")

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            list(pool.map(run, compiles))
        run(link)
        os.replace(tmp, out)
    return out


def build(directory: Path | None = None) -> Path:
    """Build the host's library (x86-64 tables where the host is x86-64) and
    return its path; a cached build of the same sources is reused."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) to build the quant kernels")

    def commands(work: Path, out: Path):
        compiles, objects = object_commands(compiler, work, host_arch())
        return compiles, [compiler, "-shared", *objects, "-o", str(out)]

    return _build_cached("libquants.so", directory, commands)


def build_arm64(compiler: str, directory: Path | None = None) -> Path:
    """Cross-compile the arm64 tables and the driver with ``compiler`` into a
    static aarch64 program and return its path (cached as ``build``)."""
    def commands(work: Path, out: Path):
        compiles, objects = object_commands(compiler, work, "arm64")
        return compiles, [compiler, "-std=c++17", "-O2", "-static", str(DRIVER), *objects,
                          "-o", str(out)]

    return _build_cached("quants-arm64", directory, commands)


#: The operations of the C ABI, numbered as the arm64 driver reads them.
OPS = {"has": 0, "dequantize": 1, "quantize": 2, "vec_dot": 3, "dot_f32": 4, "set_codebook": 5,
       "int8_gemm": 6, "vec_dot_4": 7, "unpack": 8}


class Kernels:
    """One machine's kernels: each method runs one kernel of table ``isa``
    (the subclasses carry the calls to the machine)."""

    def call(self, op: str, name: str, code: int, n: int, a: np.ndarray, b: np.ndarray,
             out_bytes: int) -> tuple[int, np.ndarray]:
        """The C ABI's function ``op`` on contiguous inputs: its return code
        and its ``out_bytes`` bytes of output (uint8)."""
        raise NotImplementedError

    def _run(self, op: str, name: str, code: int, n: int, a=(), b=(),
             out_bytes: int = 0) -> np.ndarray:
        """``call``'s output, asserting that the function ran (return code 0)."""
        rc, out = self.call(op, name, code, n, np.ascontiguousarray(a),
                            np.ascontiguousarray(b), out_bytes)
        assert rc == 0, f"{op} refused id {code} or table {name!r}"
        return out

    def has(self, isa: str) -> bool:
        """Whether the kernels hold table ``isa``."""
        return bool(self.call("has", isa, 0, 0, np.empty(0), np.empty(0), 0)[0])

    def dequantize(self, isa: str, type_id: int, blocks: np.ndarray, n: int) -> np.ndarray:
        """One row of ``n`` elements dequantized from ``blocks`` (uint8)."""
        blocks = np.asarray(blocks, dtype=np.uint8)
        return self._run("dequantize", isa, type_id, n, blocks, out_bytes=4 * n).view(np.float32)

    def quantize(self, isa: str, activation: int, x: np.ndarray, block_bytes: int,
                 block: int) -> np.ndarray:
        """``x`` (float32, a whole number of blocks) quantized into
        activation blocks (0: q8_0, 1: q8_1, 2: q8_K), as raw bytes."""
        x = np.asarray(x, dtype=np.float32)
        return self._run("quantize", isa, activation, x.size, x,
                         out_bytes=x.size // block * block_bytes)

    def vec_dot(self, isa: str, type_id: int, n: int, w: np.ndarray, xq: np.ndarray) -> float:
        """The type's dot product of a weight row with quantized activations."""
        w = np.asarray(w, dtype=np.uint8)
        out = self._run("vec_dot", isa, type_id, n, w, xq, out_bytes=4)
        return float(out.view(np.float32)[0])

    def vec_dot_4(self, isa: str, type_id: int, n: int, w: np.ndarray,
                  xq: np.ndarray) -> np.ndarray | None:
        """The type's four-row dot product of weight rows ``w`` (uint8, four
        rows) with quantized activations: four float32, or None where the
        table has no such kernel for the type."""
        w = np.asarray(w, dtype=np.uint8)
        assert len(w) == 4
        rc, out = self.call("vec_dot_4", isa, type_id, n, np.ascontiguousarray(w),
                            np.ascontiguousarray(xq), 16)
        assert rc in (0, 1), f"vec_dot_4 refused id {type_id} or table {isa!r}"
        return out.view(np.float32).copy() if rc == 0 else None

    def unpack(self, isa: str, type_id: int, n: int, w: np.ndarray,
               out_bytes: int) -> np.ndarray:
        """One row of ``n`` elements (its blocks, uint8) in the int8 GEMM's
        form, as the table's unpack_row writes it (``out_bytes`` bytes)."""
        w = np.asarray(w, dtype=np.uint8)
        return self._run("unpack", isa, type_id, n, w, out_bytes=out_bytes)

    def dot_f32(self, isa: str, a: np.ndarray, b: np.ndarray) -> float:
        """The table's float32 dot product."""
        a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
        return float(self._run("dot_f32", isa, 0, a.size, a, b, out_bytes=4).view(np.float32)[0])

    def int8_gemm(self, isa: str, type_id: int, k: int, w: np.ndarray, xq: np.ndarray,
                  rows_w: int, rows_x: int) -> np.ndarray:
        """The table's int8 GEMM: ``rows_w`` weight rows of ``k`` elements
        (their blocks, uint8) unpacked, times ``rows_x`` rows of activation
        blocks ``xq``, as float32 ``[rows_x, rows_w]``."""
        w = np.asarray(w, dtype=np.uint8)
        out = self._run("int8_gemm", isa, type_id, k, w, xq, out_bytes=4 * rows_w * rows_x)
        return out.view(np.float32).reshape(rows_x, rows_w)

    def set_codebook(self, name: str, data: np.ndarray) -> None:
        """Give the kernels codebook ``name`` (raw bytes of ``data``)."""
        self._run("set_codebook", name, 0, 0, data)

    def close(self) -> None:
        """Release the machine's resources."""


def check_vec_dot_4(quants: Kernels, table: Table, name: str, type_id: int, n: int,
                    rows: np.ndarray, xq: np.ndarray) -> None:
    """The table's four-row dot product of ``rows`` (uint8, four rows of
    ``n`` elements of type ``name``) with activation blocks ``xq`` is there
    exactly where X86_FOUR_ROW_TYPES says, and equals each row's vec_dot bit
    for bit (a decode step's logits must not depend on which rows share a
    call)."""
    expected = (table.machine == "host" and host_arch() == "x86_64"
                and table.isa != "portable" and name in X86_FOUR_ROW_TYPES)
    got = quants.vec_dot_4(table.isa, type_id, n, rows, xq)
    assert (got is not None) == expected, (str(table), name)
    if got is not None:
        want = np.array([quants.vec_dot(table.isa, type_id, n, row, xq) for row in rows],
                        np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                      err_msg=f"{table} {name} n={n}")


class Quants(Kernels):
    """The host's library (``build()``), called through ctypes."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path))
        c, p = ctypes, ctypes.c_void_p
        self.lib.mlxprog_quants_has.argtypes = [c.c_char_p]
        self.lib.mlxprog_quants_dequantize.argtypes = [c.c_char_p, c.c_int, p, p, c.c_int64]
        self.lib.mlxprog_quants_quantize.argtypes = [c.c_char_p, c.c_int, p, p, c.c_int64]
        self.lib.mlxprog_quants_vec_dot.argtypes = [c.c_char_p, c.c_int, c.c_int64, p, p, p]
        self.lib.mlxprog_quants_vec_dot_4.argtypes = [c.c_char_p, c.c_int, c.c_int64, p,
                                                      c.c_int64, p, p]
        self.lib.mlxprog_quants_dot_f32.argtypes = [c.c_char_p, c.c_int64, p, p, p]
        self.lib.mlxprog_quants_unpack.argtypes = [c.c_char_p, c.c_int, c.c_int64, p, p,
                                                   c.c_int64]
        self.lib.mlxprog_quants_set_codebook.argtypes = [c.c_char_p, p, c.c_int64]
        self.lib.mlxprog_quants_int8_gemm.argtypes = [c.c_char_p, c.c_int, c.c_int64, p,
                                                      c.c_int64, p, c.c_int64, p]

    def call(self, op, name, code, n, a, b, out_bytes):
        out = np.zeros(out_bytes, np.uint8)
        lib, key = self.lib, name.encode()
        a_, b_, o = a.ctypes.data, b.ctypes.data, out.ctypes.data
        calls = {
            "has": lambda: lib.mlxprog_quants_has(key),
            "dequantize": lambda: lib.mlxprog_quants_dequantize(key, code, a_, o, n),
            "quantize": lambda: lib.mlxprog_quants_quantize(key, code, a_, o, n),
            "vec_dot": lambda: lib.mlxprog_quants_vec_dot(key, code, n, a_, b_, o),
            "vec_dot_4": lambda: lib.mlxprog_quants_vec_dot_4(key, code, n, a_, a.nbytes, b_, o),
            "dot_f32": lambda: lib.mlxprog_quants_dot_f32(key, n, a_, b_, o),
            "unpack": lambda: lib.mlxprog_quants_unpack(key, code, n, a_, o, out_bytes),
            "set_codebook": lambda: lib.mlxprog_quants_set_codebook(key, a_, a.nbytes),
            "int8_gemm": lambda: lib.mlxprog_quants_int8_gemm(key, code, n, a_, a.nbytes, b_,
                                                              b.nbytes, o),
        }
        return calls[op](), out


class Arm64Quants(Kernels):
    """The arm64 driver (``build_arm64()``) running under ``qemu``: one
    emulator process serves every call until ``close()``."""

    def __init__(self, qemu: str, driver: Path):
        self.process = subprocess.Popen([qemu, str(driver)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def call(self, op, name, code, n, a, b, out_bytes):
        key = name.encode()
        header = np.array([OPS[op], code, n, len(key), a.nbytes, b.nbytes, out_bytes], "<i8")
        try:
            self.process.stdin.write(header.tobytes() + key + a.tobytes() + b.tobytes())
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the driver has exited: the short answer below says how
        answer = self.process.stdout.read(8 + out_bytes)
        if len(answer) != 8 + out_bytes:
            self.process.kill()
            error = self.process.stderr.read().decode(errors="replace")
            raise RuntimeError(f"the arm64 driver died in {op} (exit {self.process.wait()}): "
                               f"{error}")
        return int(np.frombuffer(answer[:8], "<i8")[0]), np.frombuffer(answer[8:], np.uint8)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
        self.process.stdout.close()
        self.process.stderr.close()


def set_codebooks(kernels: Kernels) -> None:
    """Give ``kernels`` every IQ codebook (a Machines ``setup``: the IQ
    types' kernels read them)."""
    for name, grid in codebooks().items():
        kernels.set_codebook(name, grid)


class Machines:
    """Each machine's kernels, started on first use (``machines["arm64"]``)
    and released by ``close()``: the host's library, and arm64's driver under
    qemu (after ``cross_tools()``, which skips or fails the test asking where
    a tool is missing). ``setup(kernels)`` runs on each once started (the IQ
    tests give them their codebooks)."""

    def __init__(self, setup: Callable[[Kernels], None] | None = None):
        self.setup = setup
        self.started: dict[str, Kernels] = {}
        # A machine whose build failed fails every later test without
        # building again (cross_tools()'s skips and failures are cheap to
        # repeat, and are pytest outcomes rather than errors).
        self.errors: dict[str, Exception] = {}

    def __getitem__(self, machine: str) -> Kernels:
        if machine in self.errors:
            # A new exception each time: re-raising the first would grow its
            # traceback by every test that asks.
            raise RuntimeError(f"the {machine} kernels did not start (the first test asking "
                               f"shows why): {self.errors[machine]}")
        if machine not in self.started:
            try:
                if machine == "host":
                    kernels: Kernels = Quants(build())
                else:
                    compiler, qemu = cross_tools()
                    kernels = Arm64Quants(qemu, build_arm64(compiler))
            except Exception as e:
                self.errors[machine] = e
                raise
            if self.setup:
                self.setup(kernels)
            self.started[machine] = kernels
        return self.started[machine]

    def close(self) -> None:
        for kernels in self.started.values():
            kernels.close()
        self.started.clear()
