"""The kernel tables (mlxprog/native/src/kernels_*.cpp) compiled without MLX,
each with its own flags as CMakeLists.txt compiles them, for the self-tests
that link them (native_selftest.cpp, int_matmul_selftest.cpp).

Each object and each self-test binary is built once per test session (the
host's three ISA runs share one binary, the two self-tests share their
objects), and the objects of one build compile side by side."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from mlxprog.native import build

SRC = build.SOURCE_DIR / "src"

AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c"]
"""The AVX2 table's flags (x86-64; the table file is empty elsewhere)."""

_BUILDS = tempfile.TemporaryDirectory(prefix="mlxprog-selftests-")
"""Where this session's objects and binaries go (removed when it ends)."""

_built: dict[tuple, Path] = {}


def _compile(jobs: dict[tuple, list[str]]) -> None:
    """Run the compile commands of ``jobs`` (key -> command, whose last
    argument is the output) side by side, and record each output under its
    key; a failed command raises with its messages."""
    running = {key: subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True) for key, command in jobs.items()}
    for key, process in running.items():
        output, _ = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(jobs[key])}\n{output}")
        _built[key] = Path(jobs[key][-1])


def compile_tables(compiler: str, avx2_flags: list[str],
                   extra_tables: dict[str, tuple[str, list[str], str]] | None = None
                   ) -> list[str]:
    """The object files of the portable and AVX2 tables, the thread pool,
    ``extra_tables`` (name -> (file, flags on top of ``avx2_flags``, the
    MLXPROG_HAVE_ define kernels.cpp takes)) and kernels.cpp, compiled
    unless this session already has them."""
    sources = [("kernels_avx2.cpp", avx2_flags), ("kernels_portable.cpp", []),
               ("threadpool.cpp", [])]
    defines = []
    for file, flags, define in (extra_tables or {}).values():
        sources.append((file, [*avx2_flags, *flags]))
        defines.append(f"-D{define}=1")
    sources.append(("kernels.cpp", defines))
    keys = [(compiler, name, tuple(flags)) for name, flags in sources]
    folder = Path(tempfile.mkdtemp(dir=_BUILDS.name))
    _compile({key: [compiler, "-O2", "-std=c++17", f"-I{SRC}", "-c", *flags, str(SRC / name),
                    "-o", str(folder / f"{name}.o")]
              for key, (name, flags) in zip(keys, sources) if key not in _built})
    return [str(_built[key]) for key in keys]


def selftest(compiler: str, driver: Path, avx2_flags: list[str], link_flags: list[str],
             extra_tables: dict[str, tuple[str, list[str], str]] | None = None) -> Path:
    """The self-test program ``driver`` linked with the tables of
    :func:`compile_tables`, built unless this session already has it."""
    tables = tuple((name, file, tuple(flags), define)
                   for name, (file, flags, define) in (extra_tables or {}).items())
    key = (compiler, str(driver), tuple(avx2_flags), tuple(link_flags), tables)
    if key not in _built:
        objects = compile_tables(compiler, avx2_flags, extra_tables)
        binary = Path(tempfile.mkdtemp(dir=_BUILDS.name)) / driver.stem
        _compile({key: [compiler, "-O2", "-std=c++17", f"-I{SRC}", str(driver), *objects,
                        *link_flags, "-lpthread", "-o", str(binary)]})
    return _built[key]
