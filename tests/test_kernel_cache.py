"""The suite's precompiled MLX kernel preamble (``mlx_kernel_cache``, made by
``conftest.py``) is the one GCC uses when MLX builds a kernel: MLX's own
build command has the flags it was made with, and a kernel built in a fresh
temp folder reads it instead of the header."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import pytest

import mlx_kernel_cache

TESTS = Path(__file__).parent


@pytest.mark.skipif(shutil.which("g++") is None, reason="MLX compiles no CPU kernel without g++")
def test_mlx_builds_its_kernels_with_the_precompiled_preamble(tmp_path):
    # A g++ in front of the real one: it logs MLX's command and what the
    # build includes (-H: "! <file>.gch" for a precompiled header used).
    wrapper = tmp_path / "bin" / "g++"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/commands\n'
                       f'exec {shutil.which("g++")} -H "$@" 2>> {tmp_path}/includes\n')
    wrapper.chmod(0o755)
    temp = tmp_path / "temp"
    temp.mkdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        import mlx.core as mx
        import mlx_kernel_cache
        print(mlx_kernel_cache.prepare())
        fused = mx.compile(lambda x: mx.exp(x) * 0.5 + 1.25)
        mx.eval(fused(mx.ones(8)))
    """)
    env = {**os.environ, "TMPDIR": str(temp),
           "PATH": f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    pch = Path(done.stdout.strip())
    assert pch == temp / "mlx" / mx.__version__ / "cpu" / (mlx_kernel_cache.PREAMBLE + ".gch")
    builds = [line.split() for line in (tmp_path / "commands").read_text().splitlines()
              if "-shared" in line.split()]
    assert builds, "MLX built no kernel"
    for words in builds:
        flags = [w for w in words if w.startswith("-") and w not in ("-shared", "-I", "-o")]
        assert flags == mlx_kernel_cache.FLAGS, words
        assert words[words.index("-I") + 1] == str(mlx_kernel_cache.include_dir())
    used = [line for line in (tmp_path / "includes").read_text().splitlines()
            if line.startswith("! ")]
    assert used == [f"! {pch}"] * len(builds)
