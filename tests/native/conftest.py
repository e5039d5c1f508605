"""Fixtures of the native-kernel tests."""

from __future__ import annotations

import pytest

import quants_lib

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


@pytest.fixture(scope="module")
def machines():
    """The GGML quant kernels built without MLX (tests/native/quants_lib.py)
    on the host and, under qemu, arm64; each started on first use."""
    machines = quants_lib.Machines()
    yield machines
    machines.close()


@pytest.fixture
def quants(machines, table):
    """The quant kernels of the machine of the test's ``table``."""
    return machines[table.machine]
