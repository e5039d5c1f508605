import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import mlx_kernel_cache
import pytest
from requirements_check import missing_requirements


def pytest_configure(config):
    # A missing test dependency fails the run rather than letting the tests
    # that need it skip (or fail one by one for a reason hard to see).
    problems = missing_requirements()
    if problems:
        raise pytest.UsageError(
            "the test dependencies are not all installed; run "
            "`python -m pip install -e '.[test]'` (the README's test command):\n  "
            + "\n  ".join(problems))
    # The suite's first run on a machine builds about 1,500 fused MLX kernels;
    # with the preamble precompiled each takes a quarter of the time.
    mlx_kernel_cache.prepare()


@pytest.fixture(params=["native", "mlx-ops"])
def native_and_mlx_ops(request, monkeypatch):
    """Run a test twice: with native CPU kernels on (the default) and with
    MLX's own ops (MLXPROG_NATIVE=0), so both paths are checked."""
    monkeypatch.setenv("MLXPROG_NATIVE", "1" if request.param == "native" else "0")
    return request.param
