"""The mlxprog command line, through ``main([...])``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mlxprog as mp
from mlxprog.cli import main
from mlxprog.docs import render_op_reference
from mlxprog.format.schema import full_schema

EXAMPLES = Path(__file__).parent.parent / "examples"
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
    assert_one_line_error(err, "capture 'gamma'", "not bound")


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


@pytest.mark.parametrize("argv", [[], ["bogus"], ["run"], ["validate", "a", "b"],
                                  ["run", QUICKSTART, "--nope"]])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and "usage: mlxprog" in err


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
