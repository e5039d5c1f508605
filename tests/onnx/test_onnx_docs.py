"""The op table of docs/onnx.md as :mod:`mlxprog.onnx.docs` writes it (the
test that the committed table is current is in test_backend_nodes.py)."""

import pytest

pytest.importorskip("onnx", reason="onnx (test dependency) is not installed")

from mlxprog.onnx import registry  # noqa: E402
from mlxprog.onnx.docs import BEGIN, END, op_table, opset_versions, with_table  # noqa: E402


def test_rows_come_from_the_registry_and_the_schemas():
    table = op_table({("Relu", "ai.onnx"): {"pass": 3},
                      ("Constant", "ai.onnx"): {"pass": 1},
                      ("Bernoulli", "ai.onnx"): {"random": 6},
                      ("LabelEncoder", "ai.onnx.ml"): {"strings": 3, "xfail": 1},
                      ("Add", "ai.onnx"): {"pass": 7, "dtype": 1}}).splitlines()
    assert table[2:] == [
        "| Add | ai.onnx | 13, 14 | yes | 7/8 | dtype 1 |",
        "| Bernoulli | ai.onnx | 15, 22 | no | 0/6 | random 6 |",
        "| Constant | ai.onnx | 13, 19, 21, 23, 24, 25 | import | 1/1 |  |",
        "| Relu | ai.onnx | 13, 14 | yes | 3/3 |  |",
        "| LabelEncoder | ai.onnx.ml | 1, 2, 4 | no | 0/4 | strings 3, xfail 1 |"]


def test_the_converter_column_follows_the_registry(monkeypatch):
    row = "| Relu | ai.onnx | 13, 14 | {} | 1/1 |  |"
    assert row.format("yes") in op_table({("Relu", "ai.onnx"): {"pass": 1}})
    monkeypatch.delitem(registry.CONVERTERS, ("", "Relu"))
    assert row.format("no") in op_table({("Relu", "ai.onnx"): {"pass": 1}})


def test_versions_before_the_importers_opset_count_only_when_no_later_one_exists():
    assert opset_versions("And", "ai.onnx") == [7]  # 1 and 7: the newest
    assert opset_versions("AveragePool", "ai.onnx") == [19, 22]  # 1 ... 11 converted first


def test_the_table_replaces_what_stands_between_the_markers():
    text = f"intro\n{BEGIN}\n| old |\n{END}\nrest\n"
    assert with_table(text, "| new |") == f"intro\n{BEGIN}\n| new |\n{END}\nrest\n"
    with pytest.raises(ValueError):
        with_table("no markers", "| new |")
