"""Fixtures of the native-kernel tests."""

from __future__ import annotations

import pytest

from mlxprog import native


@pytest.fixture(scope="module")
def ext():
    """The loaded extension: CI builds it, so its absence is a failure."""
    state = native.status()
    assert state.available, f"native kernels did not build: {state.reason}"
    return native.module()


@pytest.fixture(params=["best", "portable"])
def isa(request, ext):
    """Run a test on the best kernel table this CPU runs (VNNI or AVX2 on
    x86-64) and on the portable one."""
    ext.set_isa(request.param)
    yield request.param
    ext.set_isa("best")
