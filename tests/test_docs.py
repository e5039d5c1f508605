"""Generated docs are current, and the code and programs in README.md and
docs/format.md work."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal

import numpy as np
import pytest
from pydantic import BaseModel, Field, create_model

import mlxprog as mp
from mlxprog.docs import (REGENERATE, GithubAnchors, attr_docs, builtin_ops, render_op_reference,
                          type_name)
from mlxprog.format.program import Instruction
from mlxprog.format.schema import full_schema
from mlxprog.ops.attrs import (Axes, Axis, DType, Float, InsertAxis, PositiveInt, Size,
                               attribute_docs)

from helpers import readme_commands

ROOT = Path(__file__).parent.parent


def code_blocks(path: Path, language: str) -> list[str]:
    """The fenced code blocks of one language in a Markdown file."""
    return re.findall(rf"^```{language}\n(.*?)^```", path.read_text(), re.S | re.M)


def test_ops_md_is_current():
    current = render_op_reference()
    assert (ROOT / "docs" / "ops.md").read_text() == current, (
        f"docs/ops.md is stale; regenerate it with `{REGENERATE}`"
    )


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (outside
    code blocks)."""
    anchors, found, in_code = GithubAnchors(), set(), False
    for line in path.read_text().split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"#{1,6} (.*)", line)):
            found.add(anchors(heading.group(1).strip()))
    return found


def test_links_to_a_heading_reach_one():
    # docs/benchmarks.md is reordered by topic and opens with a table of
    # links into its sections; other pages link into it and each other.
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            linked = page.parent / target if target else page
            if linked.suffix == ".md" and anchor not in heading_anchors(linked):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert not broken, broken


def test_reference_covers_every_builtin_op():
    text = render_op_reference()
    for name, spec in builtin_ops().items():
        assert f"### `{name}`" in text
        assert f"## {spec.family}" in text


class _Shape(BaseModel):
    shape: list[Size]
    dtype: DType


class _UserAttrs(mp.Attrs):
    axis: Axis = -1
    axes: Axes | None = None
    eps: Float = float("inf")
    dtype: DType
    k: PositiveInt = 1
    mode: Literal["a", "b"] = "a"
    outputs: list[_Shape] = []


@pytest.fixture
def user_op():
    @mp.register_op("test_docs_user_op", attrs=_UserAttrs, operands=(1, 3), outputs=2,
                    family="userfamily")
    def impl(operands, attrs):
        """Does *user* things, documented here."""
        return operands[0], operands[0]

    yield mp.lookup("test_docs_user_op")
    mp.unregister_op("test_docs_user_op")


def test_user_ops_are_not_builtin(user_op):
    assert user_op.name not in builtin_ops()
    assert user_op.name in mp.all_ops()


def test_render_op_entry(user_op):
    text = render_op_reference({user_op.name: user_op})
    assert "1 ops in 1 families" in text
    assert "## userfamily" in text
    assert "### `test_docs_user_op`\n\n*operands: 1 to 3; results: 2*" in text
    assert "| `axis` | `axis` | `-1` |" in text
    assert "| `axes` | `axes \\| null` | `null` |" in text
    assert "| `eps` | `float` | `\"inf\"` |" in text
    assert "| `dtype` | `dtype` | required |" in text
    assert "| `mode` | `\"a\" \\| \"b\"` | `\"a\"` |" in text
    assert "Does *user* things, documented here." in text


def test_links_follow_github_anchors(user_op):
    same_name = dataclasses.replace(user_op, family=user_op.name)
    text = render_op_reference({user_op.name: same_name})
    assert f"- [{user_op.name}](#{user_op.name}) (1)" in text
    assert f"[`{user_op.name}`](#{user_op.name}-1)" in text


class _DescribedBase(mp.Attrs):
    size: Size = 1
    """How many.

    Two lines."""
    tolerance: Float = 0.0
    """Replaced below."""


class _Described(_DescribedBase):
    tolerance: Float = 0.5
    """How far off a result may be."""
    label: str = Field("x", description="Set explicitly.")
    plain: int = 0
    kind: ClassVar[str] = "described"
    """A class variable's, not a field's."""


def test_attribute_docs_read_the_source_on_demand():
    # Docstrings under fields (inherited, overridden), explicit descriptions,
    # and nothing for a field without either or a model without source.
    assert attribute_docs(_Described) == {"size": "How many.\n\nTwo lines.",
                                          "tolerance": "How far off a result may be.",
                                          "label": "Set explicitly."}
    made = create_model("Made", __base__=mp.Attrs, n=(int, 1),
                        m=(int, Field(1, description="An m.")))
    assert attribute_docs(made) == {"m": "An m."}
    # pydantic itself no longer reads the source when the class is made.
    assert _Described.model_fields["tolerance"].description is None


def test_op_reference_and_schema_describe_attributes():
    @mp.register_op("test_docs_described_op", attrs=_Described, family="userfamily")
    def impl(operands, attrs):
        """Described."""
        return operands[0]

    try:
        spec = mp.lookup("test_docs_described_op")
        assert {a.name: a.description for a in attr_docs(spec)}["size"] == "How many.\n\nTwo lines."
        text = render_op_reference({spec.name: spec})
        assert "How far off a result may be." in text
        properties = full_schema({spec.name: spec})["$defs"]["_Described"]["properties"]
        assert properties["tolerance"]["description"] == "How far off a result may be."
        assert properties["label"]["description"] == "Set explicitly."
        assert "description" not in properties["plain"]
    finally:
        mp.unregister_op("test_docs_described_op")


def test_attr_docs(user_op):
    docs = {a.name: a for a in attr_docs(user_op)}
    assert list(docs) == list(_UserAttrs.model_fields)
    assert docs["dtype"].default is None
    assert docs["k"].type == "int >= 1" and docs["k"].default == "1"
    assert docs["outputs"].type == "list[{shape: list[size], dtype: dtype}]"


@pytest.mark.parametrize(
    "annotation, expected",
    [
        (Axis, "axis"), (InsertAxis, "axis"), (Axes, "axes"), (Float, "float"),
        (DType, "dtype"), (Size, "size"), (int, "int"), (float, "number"),
        (bool, "bool"), (str, "string"), (Axes | None, "axes | null"),
        (list[tuple[int, int]], "list[list[int]]"), (tuple[int, ...], "list[int]"),
        (dict[str, float], "{string: number}"), (Literal["x", 1], '"x" | 1'),
    ],
)
def test_type_name(annotation, expected):
    assert type_name(annotation) == expected


def test_bounds_render_as_intervals():
    assert type_name(Annotated[float, Field(gt=0, le=1)]) == "number in (0, 1]"
    assert type_name(Annotated[int, Field(lt=4)]) == "int < 4"


# -- README -------------------------------------------------------------------


def test_readme_opens_with_the_two_commands():
    blocks = code_blocks(ROOT / "README.md", "sh")
    assert blocks[0].strip() == (
        "python -m pip install -e . && "
        'mlxprog generate --prompt "What is the capital of France?"'
    )
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert blocks[1].strip() == ci, "README's test command must be exactly what .ci/run runs"


def test_readme_commands_work(capsys, monkeypatch):
    from mlxprog.cli import main

    monkeypatch.chdir(ROOT)
    for argv in readme_commands():
        assert main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "output 0" in out
    assert out.startswith("The capital of France is Paris.")


def test_readme_python_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for block in code_blocks(ROOT / "README.md", "python"):
        exec(compile(block, "README.md", "exec"), {})
    assert mp.Program.load(tmp_path / "affine.json").name == "affine"


# -- docs/format.md -----------------------------------------------------------

FORMAT_MD = ROOT / "docs" / "format.md"


def test_format_md_json_blocks():
    """Whole programs validate; fragments (the inside of an object) validate in
    a program with one float32[4] input."""
    blocks = code_blocks(FORMAT_MD, "json")
    programs = 0
    for block in blocks:
        try:
            data = json.loads(block)
        except json.JSONDecodeError:
            data = json.loads("{" + block + "}")
            skeleton = {"format": "mlxprog", "version": 1,
                        "inputs": [{"name": "x", "shape": [4], "dtype": "float32"}]}
            mp.validate(mp.Program.from_dict({**skeleton, **data}))
            continue
        if "format" in data:
            mp.validate(mp.Program.from_dict(data))
            programs += 1
        else:
            Instruction.model_validate(data)
    assert programs >= 1


def test_format_md_worked_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    worked = next(b for b in code_blocks(FORMAT_MD, "json") if '"gated_projection"' in b)
    (tmp_path / "gated_projection.json").write_text(worked)
    shell = code_blocks(FORMAT_MD, "sh")[-1].strip().splitlines()
    setup = re.fullmatch(r'python -c "(.*)"', shell[0]).group(1)
    exec(setup, {})
    (python,) = [b for b in code_blocks(FORMAT_MD, "python") if "gated_projection" in b]
    namespace: dict = {}
    exec(compile(python, "format.md", "exec"), namespace)
    x = np.ones((2, 4), np.float32)
    h = np.split(x @ np.full((4, 6), 0.25, np.float32), 2, axis=-1)
    h = h[0] / (1 + np.exp(-h[1]))
    for _ in range(3):
        h = np.tanh(h) * 0.5
    np.testing.assert_allclose(np.array(namespace["h"]), h, rtol=1e-5)
    np.testing.assert_allclose(np.array(namespace["row_sums"]), h.sum(-1), rtol=1e-5)

    from mlxprog.cli import main

    argv = [a.strip("'") for a in re.findall(r"'[^']*'|\S+", shell[1])][1:]
    assert main(argv) == 0
