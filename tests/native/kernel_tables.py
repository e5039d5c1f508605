"""The kernel tables (mlxprog/native/src/kernels_*.cpp) compiled without MLX,
each with its own flags as CMakeLists.txt compiles them, for the self-tests
that link them (native_selftest.cpp, int_matmul_selftest.cpp)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mlxprog.native import build

SRC = build.SOURCE_DIR / "src"

AVX2_FLAGS = ["-mavx2", "-mfma", "-mf16c"]
"""The AVX2 table's flags (x86-64; the table file is empty elsewhere)."""


def compile_tables(compiler: str, out: Path, avx2_flags: list[str],
                   extra_tables: dict[str, tuple[str, list[str], str]] | None = None
                   ) -> list[str]:
    """Compile the portable and AVX2 tables, the thread pool, ``extra_tables``
    (name -> (file, flags on top of ``avx2_flags``, the MLXPROG_HAVE_ define
    kernels.cpp takes)) and kernels.cpp into ``out``; the object files."""
    sources = [("kernels_avx2.cpp", avx2_flags), ("kernels_portable.cpp", []),
               ("threadpool.cpp", [])]
    defines = []
    for file, flags, define in (extra_tables or {}).values():
        sources.append((file, [*avx2_flags, *flags]))
        defines.append(f"-D{define}=1")
    sources.append(("kernels.cpp", defines))
    objects = []
    for name, flags in sources:
        obj = out / f"{name}.o"
        subprocess.run([compiler, "-O2", "-std=c++17", f"-I{SRC}", "-c", *flags,
                        str(SRC / name), "-o", str(obj)], check=True, timeout=600)
        objects.append(str(obj))
    return objects
