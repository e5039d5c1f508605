"""Test helpers: one-op programs and comparisons; the commands README.md gives."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.arrays import name_of

ROOT = Path(__file__).parent.parent
"""The repository root (README.md's commands run from here)."""


def as_mx(value: Any) -> mx.array:
    """An mx.array from a numpy array, mx.array or scalar."""
    return value if isinstance(value, mx.array) else mx.array(value)


def one_op_program(op: str, *operands: Any, **attrs: Any) -> mp.Program:
    """A program with one input per operand (same shape and dtype) applying ``op``."""
    b = mp.ProgramBuilder(f"test_{op}")
    values = []
    for i, operand in enumerate(operands):
        arr = as_mx(operand)
        values.append(b.input(f"x{i}", arr.shape, name_of(arr.dtype)))
    out = b.op(op, *values, **attrs)
    return b.build(list(out) if isinstance(out, tuple) else [out])


def assert_invalid(message: str, op: str, *operands: Any, **attrs: Any) -> None:
    """Building the one-op program fails with a ValidationError naming
    instruction 0, the op, and containing ``message``."""
    with pytest.raises(mp.ValidationError, match="instruction 0") as info:
        one_op_program(op, *operands, **attrs)
    text = str(info.value)
    assert f"({op})" in text, text
    assert message in text, text


def run_op(op: str, *operands: Any, eager: bool = False, **attrs: Any):
    """Run ``op`` in a compiled (or, with ``eager=True``, eager) one-op program;
    returns one array, or a list for multi-output ops."""
    prog = one_op_program(op, *operands, **attrs)
    arrays = [as_mx(o) for o in operands]
    outs = mp.run(prog, *arrays, eager=eager)
    mx.eval(outs)
    single = mp.lookup(op).outputs == 1
    return outs[0] if single else outs


def assert_close(actual: mx.array, expected: Any, rtol: float = 1e-5, atol: float = 1e-6,
                 dtype: Any = None) -> None:
    """Values, shape (and dtype when given) of an mx result against numpy."""
    expected = np.asarray(expected)
    got = np.array(actual.astype(mx.float32) if actual.dtype == mx.bfloat16 else actual)
    assert got.shape == expected.shape, f"shape {got.shape} != {expected.shape}"
    if dtype is not None:
        assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
    if got.dtype.kind in "biu" and expected.dtype.kind in "biu":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)


def run_isolated(code: str, timeout: float = 120) -> str:
    """Run ``code`` (with numpy as np, mlx.core as mx, mlxprog as mp and these
    helpers imported) in a fresh interpreter, so that a crash or a hang fails
    the test instead of ending the suite; returns its stdout."""
    prelude = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
               "import numpy as np, mlx.core as mx, mlxprog as mp\n"
               "from helpers import one_op_program, run_op\n")
    try:
        done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"did not finish in {timeout} s:\n{code}")
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


def readme_commands() -> list[list[str]]:
    """The ``mlxprog`` commands in README.md's ``sh`` blocks, as the argument
    lists a shell passes (without ``mlxprog``): quotes and comments removed,
    ``\\`` line continuations joined, the command after an ``&&`` included."""
    commands = []
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("&& ")[-1].strip()
            if command.startswith("mlxprog "):
                commands.append(shlex.split(command, comments=True)[1:])
    return commands


def prefill_like(order: str = "BTS") -> mp.Program:
    """The shape of the LLM prefill program: tokens [B, T] written into a
    cache [B, 3, S, 64] (valid only for T <= S); outputs [B] and the cache.
    The builder declares T before S (its own sample sizes grow in
    declaration order); ``order`` is the order of the dims in the program."""
    b = mp.ProgramBuilder("prefill_like")
    b.dim("B", min=1, max=64)
    b.dim("T", min=1, max=32)
    b.dim("S", min=1, max=32)
    tokens = b.input("tokens", ["B", "T"], "int32")
    cache = b.input("cache", ["B", 3, "S", 64], "float32")
    rows = b.reshape(b.astype(tokens, dtype="float32"), shape=["B", 1, "T", 1])
    written = b.put_slice(cache, b.broadcast_to(rows, shape=["B", 3, "T", 64]))
    program = b.build([b.sum(tokens, axes=[1]), written], check=False)
    return program.model_copy(update={"dims": {d: program.dims[d] for d in order}})
