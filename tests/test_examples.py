"""Every program in examples/ loads, validates, round-trips through JSON, runs
compiled and eager with the same results, and runs with the command README.md
gives for it."""

from __future__ import annotations


import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from mlxprog.arrays import AVal, is_floating, is_integer, name_of, to_mlx
from mlxprog.cli import main

from helpers import ROOT, readme_commands

EXAMPLES = sorted((ROOT / "examples").glob("*.json"))


def generate(aval: AVal, rng: np.random.Generator) -> mx.array:
    """A random array for an input or capture: floats in [0.5, 2) (inside the
    domain of log, sqrt, divide), small integers, or random booleans."""
    if aval.dtype == mx.bool_:
        data = rng.random(aval.shape) < 0.5
    elif is_integer(aval.dtype):
        data = rng.integers(0, 8, size=aval.shape)
    elif is_floating(aval.dtype):
        data = rng.uniform(0.5, 2.0, size=aval.shape)
    else:
        raise AssertionError(f"no generator for {name_of(aval.dtype)}")
    return mx.array(data).astype(aval.dtype)


def stub_callbacks(instructions) -> dict:
    """For each ``runtime_call`` (subprograms included), a callback returning
    ones of the declared output shapes and dtypes."""
    callbacks = {}
    for inst in instructions:
        if inst.op == "runtime_call":
            declared = [(tuple(o["shape"]), to_mlx(o["dtype"]))
                        for o in inst.attrs.get("outputs", [])]
            callbacks[inst.attrs["callback"]] = (
                lambda *operands, declared=declared: [mx.ones(s, d) for s, d in declared]
            )
        for sub in inst.subprograms.values():
            callbacks.update(stub_callbacks(sub.instructions))
    return callbacks


def test_examples_exist():
    names = {path.name for path in EXAMPLES}
    assert "quickstart.json" in names
    assert len(names) >= 3


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_loads_validates_and_round_trips(path):
    program = mp.Program.load(path)
    validated = mp.validate(program)
    assert validated.out_avals, "an example has outputs"
    assert mp.Program.loads(program.to_json()) == program
    assert mp.Program.loads(program.to_json(indent=2)) == program


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_compiled_and_eager_alike(path):
    program = mp.Program.load(path)
    validated = mp.validate(program)
    rng = np.random.default_rng(0)
    inputs = [generate(a, rng) for a in validated.input_avals]
    captures = {
        spec.name: generate(aval, rng)
        for spec, aval in zip(program.captures, validated.capture_avals)
    }
    callbacks = stub_callbacks(program.instructions)
    compiled = mp.compile(program, captures=captures, callbacks=callbacks)
    outs = compiled(*inputs)
    again = compiled(*inputs)
    eager = mp.run(program, *inputs, captures=captures, callbacks=callbacks, eager=True)
    assert compiled.stats.calls == 2
    assert len(outs) == len(eager) == len(validated.out_avals)
    for out, second, ref, aval in zip(outs, again, eager, validated.out_avals):
        assert (tuple(out.shape), out.dtype) == tuple(aval)
        assert (tuple(ref.shape), ref.dtype) == tuple(aval)
        got, want = _numpy(out), _numpy(ref)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        np.testing.assert_array_equal(_numpy(second), got)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_with_the_readme_command(path, capsys, monkeypatch):
    """A new example needs a command in README.md's Examples section, with
    whatever inputs, weights and callbacks it needs shipped in examples/."""
    program = f"examples/{path.name}"
    commands = [argv for argv in readme_commands() if argv[:2] == ["run", program]]
    assert commands, f"README.md gives no `mlxprog run {program} ...` command"
    expected = [f"output {i}: {aval}"
                for i, aval in enumerate(mp.validate(mp.Program.load(path)).out_avals)]
    monkeypatch.chdir(ROOT)
    for argv in commands:
        code = main(argv)
        out, err = capsys.readouterr()
        assert (code, "error:" in err) == (0, False), (argv, err)
        assert [line for line in out.splitlines() if line.startswith("output ")] == expected


def _numpy(array: mx.array) -> np.ndarray:
    if array.dtype == mx.bfloat16:
        array = array.astype(mx.float32)
    return np.array(array)
