"""The importer's basics on a two-node model."""

import numpy as np
from onnx_cases import check_node


def test_relu_graph_input_and_initializer():
    check_node("Relu", {"x": np.array([[1.0, -1.0, 2.0]], np.float32)})
