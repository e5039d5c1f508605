"""A precompiled header for the fused CPU kernels MLX compiles on first use.

On the CPU, ``mx.compile`` turns each fused elementwise graph into C++ and
builds it with ``g++`` into ``$TMPDIR/mlx/<version>/cpu`` (once per machine:
later runs load the ``.so``). Each kernel's source starts with
``#include "mlx/backend/cpu/compiled_preamble.h"``, about 69,000 lines once
preprocessed, and parsing them is nearly all of the 0.4 s a kernel takes to
build; a cold run of the suite builds about 1,500 kernels. GCC looks for
``<header>.gch`` beside the including file before it searches the include
path, so a header precompiled with MLX's own flags into that folder makes
every build there skip the parse (0.1 s a kernel) and give the same code.
Where the flags or the compiler do not match, GCC ignores the file and
parses the header as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import mlx.core as mx

PREAMBLE = "mlx/backend/cpu/compiled_preamble.h"
"""The header every kernel source includes, relative to MLX's include folder."""

FLAGS = ["-std=c++17", "-O3", "-Wall", "-fPIC"]
"""The compile flags of MLX's kernel builds (those a precompiled header must
share; ``-shared`` and the output are the link's)."""


def include_dir() -> Path:
    """The folder of MLX's installed headers (MLX passes it with ``-I``)."""
    return Path(mx.__file__).parent / "include"


def kernel_dir() -> Path:
    """Where MLX writes and builds its CPU kernels."""
    return Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "cpu"


def _key(compiler: str) -> str:
    """What the precompiled header depends on: the compiler, the flags and
    every installed MLX header (a changed header must not be served stale)."""
    digest = hashlib.sha256()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest.update(f"{version}\n{FLAGS}\n".encode())
    for path in sorted(include_dir().rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(include_dir()).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def prepare() -> Path | None:
    """Precompile MLX's kernel preamble into :func:`kernel_dir` unless a
    current one is there; its path, or None where there is no ``g++`` (MLX
    then compiles nothing either) or the build fails (kernels then build as
    they would without it)."""
    compiler = shutil.which("g++")
    header = include_dir() / PREAMBLE
    if compiler is None or not header.is_file():
        return None
    target = kernel_dir() / (PREAMBLE + ".gch")
    stamp = target.with_name(target.name + ".key")
    key = _key(compiler)
    if target.is_file() and stamp.is_file() and stamp.read_text() == key:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written under a private name and moved into place: other sessions on
    # the machine build kernels in the same folder and may read it meanwhile.
    work = target.with_name(f"{target.name}.{os.getpid()}")
    done = subprocess.run([compiler, *FLAGS, "-I", str(include_dir()), "-x", "c++-header",
                           str(header), "-o", str(work)], capture_output=True, text=True)
    if done.returncode != 0:
        work.unlink(missing_ok=True)
        return None
    os.replace(work, target)
    stamp.write_text(key)
    return target
