"""The importer's basics on a two-node model."""

import numpy as np
import pytest

pytest.importorskip("onnx", reason="onnx (test dependency) is not installed")

from onnx_cases import check_node  # noqa: E402


def test_relu_graph_input_and_initializer():
    check_node("Relu", {"x": np.array([[1.0, -1.0, 2.0]], np.float32)})
