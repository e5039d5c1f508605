import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest


@pytest.fixture(params=["native", "mlx-ops"])
def native_and_mlx_ops(request, monkeypatch):
    """Run a test twice: with native CPU kernels on (the default) and with
    MLX's own ops (MLXPROG_NATIVE=0), so both paths are checked."""
    monkeypatch.setenv("MLXPROG_NATIVE", "1" if request.param == "native" else "0")
    return request.param
