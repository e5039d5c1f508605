"""The ``mlxprog`` command line: run, validate and inspect programs, list ops,
print the JSON Schema.

Exit status: 0 on success; 1 when the program, its inputs or its files are
invalid or running it fails (the message is one ``error: ...`` line on stderr);
2 when the command line itself is malformed (an unknown option, an ``--input``
without ``NAME=``, an input literal that is not JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from . import native
from .arrays import AVal, to_mlx
from .docs import attr_docs, describe_outputs, render_op_reference
from .errors import EvaluationError, ProgramError
from .format.program import Instruction, Program
from .format.schema import full_schema
from .llm.cli import add_commands as add_llm_commands
from .ops.registry import all_ops
from .runtime.executable import compile as compile_program
from .runtime.plan import describe as describe_plan
from .validate import SymbolicProgram, validate

PRINT_THRESHOLD = 64
"""Arrays with more elements than this are printed summarised (``...``)."""


class UsageError(Exception):
    """The command line is malformed (exit status 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mlxprog`` command with ``argv`` (default: ``sys.argv[1:]``);
    returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage or help
        return int(exc.code or 0)
    try:
        return args.handler(args)
    except UsageError as exc:
        _error(str(exc))
        return 2
    except (ProgramError, OSError) as exc:
        _error(str(exc))
        return 1


def _error(message: str) -> None:
    print("error: " + " ".join(message.split()), file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxprog",
        description="Validate, inspect and run mlxprog tensor programs (format v1) on MLX.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run a program and print its outputs",
        description="Run a program once and print each output. Inputs are given by name: "
        "NAME=FILE.npy (the array must have the input's dtype and shape) or "
        "NAME=JSON (a number or nested list, converted to the input's dtype).",
    )
    run.add_argument("program", help="program file (.json)")
    run.add_argument("-i", "--input", action="append", default=[], metavar="NAME=VALUE",
                     help="an input: NAME=FILE.npy or NAME=JSON literal (repeat per input)")
    run.add_argument("-w", "--weights", action="append", default=[], metavar="FILE",
                     help="a weights file (.safetensors, .npz, .gguf) binding captures by "
                     "name (repeatable)")
    run.add_argument("--eager", action="store_true",
                     help="run instruction by instruction, without mx.compile")
    run.add_argument("--check-numerics", action="store_true",
                     help="stop at the first instruction producing NaN/Inf (implies --eager)")
    run.add_argument("--stats", action="store_true", help="print execution statistics")
    run.add_argument("-o", "--out", metavar="FILE.npz",
                     help="also write the outputs to an .npz file (output_0, output_1, ...)")
    run.set_defaults(handler=_cmd_run)

    check = commands.add_parser("validate", help="validate a program",
                                description="Check a program completely without running it.")
    check.add_argument("program", help="program file (.json)")
    check.set_defaults(handler=_cmd_validate)

    inspect = commands.add_parser(
        "inspect", help="summarise a program",
        description="Show a program's inputs, captures, constants, op histogram and "
        "inferred output shapes.",
    )
    inspect.add_argument("program", help="program file (.json)")
    inspect.set_defaults(handler=_cmd_inspect)

    ops = commands.add_parser("ops", help="list the registered ops",
                              description="List every registered op with its attributes.")
    ops.add_argument("--markdown", action="store_true",
                     help="print the Markdown op reference (docs/ops.md)")
    ops.set_defaults(handler=_cmd_ops)

    schema = commands.add_parser("schema", help="print the JSON Schema of the format",
                                 description="Print the JSON Schema (draft 2020-12) of "
                                 "format v1, with the attributes of every registered op.")
    schema.set_defaults(handler=_cmd_schema)
    add_llm_commands(commands)
    return parser


# -- run ----------------------------------------------------------------------


def _cmd_run(args: argparse.Namespace) -> int:
    inputs = _parse_inputs(args.input)
    program = Program.load(args.program)
    eager = args.eager or args.check_numerics
    exe = compile_program(program, weights=args.weights or None, eager=eager,
                          check_numerics=args.check_numerics)
    outputs = exe(**inputs)
    try:
        mx.eval(outputs)
    except (RuntimeError, ValueError) as exc:  # MLX's error for values it cannot compute
        raise EvaluationError(f"computing the outputs failed: {exc} (run with --eager to "
                              "find the instruction)") from exc
    arrays = [_to_numpy(out) for out in outputs]
    for i, (out, array) in enumerate(zip(outputs, arrays)):
        print(f"output {i}: {AVal.of(out)}")
        print(_format_array(array))
    if args.out:
        np.savez(args.out, **{f"output_{i}": a for i, a in enumerate(arrays)})
    if args.stats:
        print("stats:")
        for key, value in exe.stats.as_dict().items():
            print(f"  {key}: {value}")
    return 0


def _parse_inputs(items: Sequence[str]) -> dict[str, Any]:
    """``NAME=FILE.npy`` / ``NAME=JSON`` arguments as a dict of input values
    (numpy arrays or JSON data; the executable checks and converts them)."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--input {item!r}: expected NAME=FILE.npy or NAME=JSON")
        if name in values:
            raise UsageError(f"input {name!r} is given twice")
        values[name] = _read_input(name, text)
    return values


def _read_input(name: str, text: str) -> Any:
    if text.endswith(".npy"):
        try:
            return np.load(text, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ProgramError(f"cannot read input {name!r} from {text!r}: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"input {name!r}: {text!r} is not a JSON literal ({exc})") from None
    if not isinstance(value, (int, float, list)):
        raise UsageError(f"input {name!r}: expected a number or a nested list, found {text!r}")
    return value


def _to_numpy(array: mx.array) -> np.ndarray:
    """An output as numpy (bfloat16, which numpy lacks, as float32)."""
    if array.dtype == mx.bfloat16:
        array = array.astype(mx.float32)
    return np.array(array)


def _format_array(array: np.ndarray) -> str:
    return np.array2string(array, threshold=PRINT_THRESHOLD, edgeitems=3, separator=" ")


# -- validate / inspect -------------------------------------------------------


def _cmd_validate(args: argparse.Namespace) -> int:
    program = Program.load(args.program)
    validate(program)
    n = _count(program.instructions)
    print(f"ok: {n} instruction{'s' if n != 1 else ''}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    program = Program.load(args.program)
    validated = validate(program)
    print(f"program: {program.name or '(unnamed)'}")
    if program.dims:
        print(f"dims: {len(program.dims)}")
        for name, spec in program.dims.items():
            print(f"  {name}: {spec.describe()}")
    print(f"inputs: {len(program.inputs)}")
    for spec in program.inputs:
        filled = f" (filled with the value of {spec.value_of})" if spec.value_of else ""
        print(f"  {spec.name}: {spec.dtype}{_shape(spec.shape)}{filled}")
    print(f"captures: {len(program.captures)}")
    total = 0
    for spec in program.captures:  # capture shapes are always concrete
        size = to_mlx(spec.dtype).size * int(np.prod(spec.shape, dtype=np.int64))
        total += size
        print(f"  {spec.name}: {spec.dtype}{_shape(spec.shape)} ({_bytes(size)})")
    if program.captures:
        print(f"  total: {_bytes(total)}")
    print(f"constants: {len(program.constants)}")
    histogram = Counter(_op_names(program.instructions))
    print(f"instructions: {sum(histogram.values())} ({len(program.instructions)} top-level)")
    width = max((len(op) for op in histogram), default=0)
    for op, count in sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {op:<{width}}  {count}")
    outputs = (validated.describe_outputs() if isinstance(validated, SymbolicProgram)
               else [str(aval) for aval in validated.out_avals])
    print(f"outputs: {len(outputs)}")
    for i, text in enumerate(outputs):
        print(f"  output {i}: {text}")
    symbolic = isinstance(validated, SymbolicProgram)
    static = validated.sample if symbolic else validated
    plan = describe_plan(static.block, len(static.input_avals),
                         validated.dim_dependent if symbolic else None)
    print(f"plan: {sum(line.lstrip().startswith('segment') for line in plan)} segment(s)")
    for line in plan:
        print(f"  {line}")
    block = static.block
    coverage = _native_coverage(block, {})
    if coverage:
        print(f"native CPU kernels: {native.status()}")
        for op, (covered, total) in sorted(coverage.items()):
            print(f"  {op}: {covered} of {total} instruction(s)")
    return 0


def _native_coverage(block, counts: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """(covered, total) instructions per op that has a native kernel, over a
    block and its subprograms (symbolic programs: at the sample binding)."""
    for step in block.steps:
        covers = step.spec.native_coverage
        if covers is not None:
            done, total = counts.get(step.spec.name, (0, 0))
            avals = [block.avals[a] for a in step.args]
            counts[step.spec.name] = (done + bool(covers(avals, step.attrs)), total + 1)
        for sub in step.blocks.values():
            _native_coverage(sub, counts)
    return counts


def _op_names(instructions: Sequence[Instruction]) -> list[str]:
    """The op of every instruction, subprograms included."""
    names = []
    for inst in instructions:
        names.append(inst.op)
        for sub in inst.subprograms.values():
            names.extend(_op_names(sub.instructions))
    return names


def _count(instructions: Sequence[Instruction]) -> int:
    return len(_op_names(instructions))


def _shape(shape: Sequence[int | str]) -> str:
    """A declared shape, symbolic dims unquoted: ``[1, T, 576]``."""
    return "[" + ", ".join(map(str, shape)) + "]"


def _bytes(n: int) -> str:
    text = f"{n:,} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{text}, {n / scale:.1f} {unit}"
    return text


# -- ops / schema -------------------------------------------------------------


def _cmd_ops(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(render_op_reference())
        return 0
    rows = [("family", "op", "operands", "results", "attributes")]
    for name, spec in all_ops().items():
        attrs = ", ".join(
            f"{a.name}: {a.type}" + ("" if a.default is None else f" = {a.default}")
            for a in attr_docs(spec)
        )
        rows.append((spec.family, name, spec.describe_arity(), describe_outputs(spec),
                     attrs or "-"))
    widths = [max(len(row[k]) for row in rows) for k in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(full_schema(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
