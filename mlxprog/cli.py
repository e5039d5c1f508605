"""The ``mlxprog`` command line: run, validate and inspect programs (``inspect``
summarises GGUF model files too), list ops, print the JSON Schema, convert
ONNX models (``import-onnx``).

Exit status: 0 on success; 1 when the program, its inputs or its files are
invalid or running it fails (the message is one ``error: ...`` line on stderr);
2 when the command line itself is malformed (an unknown option, an ``--input``
without ``NAME=``, an input literal that is not JSON, a flag value out of its
range; what argparse finds reads ``mlxprog COMMAND: error: ...``, then a line
pointing to ``mlxprog COMMAND --help``, not the usage block); 130 (128 +
SIGINT) when Ctrl-C stops a command (quietly: what it printed stays, and no
traceback follows); 141 (128 + SIGPIPE, what a
shell reports for a command the signal ends) when the reader of stdout goes
away first (``mlxprog schema | head -1``): the output stops quietly.
(``--help`` and ``--version`` are argparse's, which ignores a closed
stdout: they exit with 0.)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NoReturn, Sequence

import mlx.core as mx
import numpy as np

from . import __version__, native
from .arrays import AVal, to_mlx
from .docs import attr_docs, describe_outputs, render_op_reference
from .errors import EvaluationError, ProgramError, UnboundError, UsageError
from .flags import add_command, flag
from .format.program import Instruction, Program
from .format.schema import full_schema
from .llm.cli import add_commands as add_llm_commands
from .ops.registry import all_ops
from .runtime.binding import GGUF_MAGIC, weights_file_problem
from .runtime.executable import compile as compile_program
from .runtime.plan import describe as describe_plan
from .validate import SymbolicProgram, validate

PRINT_THRESHOLD = 64
"""Arrays with more elements than this are printed summarised (``...``)."""

EXIT_BROKEN_PIPE = 141
"""The exit status when the reader of stdout goes away before the output is
written (128 + SIGPIPE)."""

EXIT_INTERRUPTED = 130
"""The exit status when Ctrl-C stops a command (128 + SIGINT)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mlxprog`` command with ``argv`` (default: ``sys.argv[1:]``);
    returns the exit status."""
    try:
        code = _run_command(argv)
        # Output still buffered meets a closed pipe here, not at exit, where
        # Python could only print the error.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:  # commands that stop cleanly on Ctrl-C catch it themselves
        print(file=sys.stderr)
        return EXIT_INTERRUPTED


def _run_command(argv: Sequence[str] | None) -> int:
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
    except BrokenPipeError:  # an OSError, but no error of the command: main stops quietly
        raise
    except (ProgramError, OSError) as exc:
        _error(str(exc))
        return 1


def _discard_stdout() -> None:
    """Point stdout at the null device, as Python's documentation recommends
    after a broken pipe: the flush at exit then writes nowhere instead of
    raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # stdout is no file descriptor (main called in-process): nothing to flush at exit


def _error(message: str) -> None:
    print("error: " + " ".join(message.split()), file=sys.stderr)


def version() -> str:
    """The version of mlxprog: the installed distribution's, else (a source
    tree that is not installed) ``mlxprog.__version__``."""
    try:
        return importlib.metadata.version("mlxprog")
    except importlib.metadata.PackageNotFoundError:
        return __version__


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows every option's default, except the defaults that say
    nothing: None (the help says what happens instead), a flag that is off,
    an empty list."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default = action.default
        if default is None or default is False or (isinstance(default, list) and not default):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser with :class:`HelpFormatter`; subcommand parsers are of
    the parser's class, so every command's help shows its defaults."""

    def __init__(self, *args: Any, formatter_class: type = HelpFormatter, **kwargs: Any):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 after one ``PROG: error: ...`` line and where
        the usage is, instead of argparse's usage block: a long usage (the
        LLM commands' is 8 lines) buries the one line that says what is
        wrong."""
        self.exit(2, f"{self.prog}: error: {message}\n"
                     f"Run '{self.prog} --help' for usage.\n")


PROGRAM = flag("program", help="program file (.json)")
INPUT = flag("-i", "--input", action="append", default=[], metavar="NAME=VALUE",
             help="an input: NAME=FILE.npy or NAME=JSON literal (repeat per input)")
WEIGHTS = flag("-w", "--weights", action="append", default=[], metavar="FILE",
               help="a weights file (.safetensors, .npz, .gguf) binding captures by name "
               "(repeatable)")
CALLBACK = flag("--callback", action="append", default=[], metavar="NAME=MODULE:FUNCTION",
                help="bind the runtime_call callback NAME to FUNCTION of MODULE, a module name "
                "or a .py file (repeatable)")
EAGER = flag("--eager", action="store_true",
             help="run instruction by instruction, without mx.compile")
CHECK_NUMERICS = flag("--check-numerics", action="store_true",
                      help="stop at the first instruction producing NaN/Inf (implies --eager)")
STATS = flag("--stats", action="store_true", help="print execution statistics")
OUTPUTS_FILE = flag("-o", "--out", metavar="FILE.npz",
                    help="also write the outputs to an .npz file (output_0, output_1, ...)")
MARKDOWN = flag("--markdown", action="store_true",
                help="print the Markdown op reference (docs/ops.md)")
ONNX_MODEL = flag("model", help="ONNX model file (.onnx; external data beside it)")
ONNX_OUT = flag("-o", "--out", required=True, metavar="DIR",
                help="directory to write the program and weights into (created if missing)")
PROGRAM_NAME = flag("--name", help="the program's name (default: the graph's)")
FOLD_BATCH_NORM = flag("--fold-batch-norm", action=argparse.BooleanOptionalAction,
                       default=True,
                       help="fold a BatchNormalization (or a per-channel constant Mul/Add) "
                       "after a Conv into the Conv's weight and bias")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mlxprog",
        description="Validate, inspect and run mlxprog tensor programs (format v1) on MLX.",
    )
    parser.add_argument("--version", action="version", version=f"mlxprog {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_command(commands, "run", _cmd_run, "run a program and print its outputs",
                [PROGRAM, INPUT, WEIGHTS, CALLBACK, EAGER, CHECK_NUMERICS, STATS, OUTPUTS_FILE])
    add_command(commands, "validate", _cmd_validate, "validate a program", [PROGRAM])
    add_command(commands, "inspect", _cmd_inspect, "summarise a program or a GGUF model file",
                [PROGRAM.but(help="program file (.json) or GGUF model file")])
    add_command(commands, "ops", _cmd_ops, "list the registered ops", [MARKDOWN])
    add_command(commands, "import-onnx", _cmd_import_onnx,
                "convert an ONNX model into a program and its weights",
                [ONNX_MODEL, ONNX_OUT, PROGRAM_NAME, FOLD_BATCH_NORM])
    add_command(commands, "schema", _cmd_schema, "print the JSON Schema of the format", [])
    add_llm_commands(commands)
    return parser


# -- run ----------------------------------------------------------------------


CLI_REMEDIES = {
    "capture": "pass a --weights FILE that holds it",
    "callback": "pass --callback {name}=MODULE:FUNCTION",
}
"""How to give what an :class:`~mlxprog.UnboundError` names, on this command
line (its message says how in Python)."""


def _cmd_run(args: argparse.Namespace) -> int:
    """Run a program once and print each output. Inputs are given by name:
    NAME=FILE.npy (the array must have the input's dtype and shape) or
    NAME=JSON (a number or nested list, converted to the input's dtype)."""
    inputs = _parse_inputs(args.input)
    callbacks = _load_callbacks(args.callback)
    program = Program.load(args.program)
    for path in args.weights:
        problem = weights_file_problem(path)
        if problem is not None:
            raise ProgramError(f"--weights {path}: {problem}")
    eager = args.eager or args.check_numerics
    try:
        exe = compile_program(program, weights=args.weights or None, callbacks=callbacks,
                              eager=eager, check_numerics=args.check_numerics)
    except UnboundError as exc:
        remedy = CLI_REMEDIES[exc.kind].format(name=exc.name)
        raise ProgramError(f"{exc.problem}: {remedy}") from None
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


def _load_callbacks(items: Sequence[str]) -> dict[str, Callable]:
    """``NAME=MODULE:FUNCTION`` arguments as the callbacks mapping; MODULE is
    a module name (imported as usual) or a ``.py`` file (loaded from its
    path; each once)."""
    callbacks: dict[str, Callable] = {}
    modules: dict[str, ModuleType] = {}
    for item in items:
        name, sep, target = item.partition("=")
        module, colon, attr = target.rpartition(":")
        if not (sep and name and colon and module and attr):
            raise UsageError(f"--callback {item!r}: expected NAME=MODULE:FUNCTION")
        if name in callbacks:
            raise UsageError(f"callback {name!r} is given twice")
        if module not in modules:
            modules[module] = _import(module, item)
        function = getattr(modules[module], attr, None)
        if not callable(function):
            raise ProgramError(f"--callback {item}: {module} has no function {attr!r}")
        callbacks[name] = function
    return callbacks


def _import(module: str, item: str) -> ModuleType:
    """The module a ``--callback`` names (``item``, for the message)."""
    try:
        if module.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module).stem, module)
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            return loaded
        return importlib.import_module(module)
    except Exception as exc:  # the module's own code may raise anything
        raise ProgramError(f"--callback {item}: cannot import {module}: "
                           f"{type(exc).__name__}: {exc}") from None


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
    """Check a program completely without running it."""
    program = Program.load(args.program)
    validate(program)
    n = _count(program.instructions)
    print(f"ok: {n} instruction{'s' if n != 1 else ''}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    """Show a program's inputs, captures, constants, op histogram and
    inferred output shapes; or a GGUF model file's architecture, size,
    tokenizer and tensor types (from its header: no tensor data is read)."""
    if _is_gguf(args.program):
        from .ggml.gguf_file import describe, open_gguf

        with open_gguf(args.program, strict_types=False) as model:
            print(describe(model))
        return 0
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


def _is_gguf(path: str) -> bool:
    """Whether ``path`` is a regular file that starts as GGUF files do
    (whatever its suffix)."""
    if not Path(path).is_file():
        return False  # the program reader says what is wrong with it
    try:
        with open(path, "rb") as file:
            return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


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


# -- import-onnx ----------------------------------------------------------------


def _cmd_import_onnx(args: argparse.Namespace) -> int:
    """Convert an ONNX model into DIR/program.json and
    DIR/weights.safetensors (float64 weights, which MLX's safetensors writer
    cannot hold, go to DIR/weights-float64.npz), for 'mlxprog run
    DIR/program.json --weights ...'. Ops without a converter are all listed
    in one error. Needs the onnx package (pip install 'mlxprog[onnx]')."""
    if importlib.util.find_spec("onnx") is None:
        raise ProgramError("import-onnx needs the onnx package: pip install 'mlxprog[onnx]'")
    from .onnx import import_model

    program, weights = import_model(args.model, name=args.name,
                                    fold_batch_norm=args.fold_batch_norm)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    program_path = out / "program.json"
    program.save(program_path)
    print(f"wrote {program_path} ({_count(program.instructions)} instructions)")
    # MLX's safetensors writer refuses float64; .npz holds it (both load by name).
    # Weights are NumPy arrays, except bfloat16 ones (NumPy has no bfloat16).
    wide = {k: v for k, v in weights.items()
            if isinstance(v, np.ndarray) and v.dtype == np.float64}
    files = {out / "weights.safetensors": {k: v for k, v in weights.items() if k not in wide}}
    if wide:
        files[out / "weights-float64.npz"] = wide
    for path, arrays in files.items():
        if path.suffix == ".npz":
            np.savez(path, **arrays)
        else:
            mx.save_safetensors(str(path), {k: mx.array(v) for k, v in arrays.items()})
        size = sum(v.nbytes for v in arrays.values())
        print(f"wrote {path} ({len(arrays)} array{'s' if len(arrays) != 1 else ''}, "
              f"{_bytes(size)})")
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    """List every registered op with its attributes."""
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
    """Print the JSON Schema (draft 2020-12) of format v1, with the
    attributes of every registered op."""
    print(json.dumps(full_schema(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
