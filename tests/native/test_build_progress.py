"""What a first-use build of the native kernels tells the user while it runs,
and how long it took, without running a real build (``_run_build`` is
replaced by one that waits and writes an empty module)."""

from __future__ import annotations

import importlib.machinery
import time

import pytest

from mlxprog import native
from mlxprog.native import build


@pytest.fixture
def slow_build(tmp_path, monkeypatch):
    """A fresh cache whose build takes 0.35 s, with a progress line every 0.1 s."""
    monkeypatch.setenv("MLXPROG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "PROGRESS_INTERVAL_S", 0.1)

    def run_build(tools, work, log):
        time.sleep(0.35)
        module = work / f"{build.MODULE}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
        module.write_bytes(b"")
        return module

    monkeypatch.setattr(build, "_run_build", run_build)


def test_a_build_says_how_long_builds_take_and_that_it_still_runs(slow_build):
    messages: list[str] = []
    build.ensure_built(progress=messages.append)
    first, *middle, last = messages
    assert first.startswith("mlxprog: building native CPU kernels for MLX ")
    assert "(first use; usually 30 s to 2 minutes) into " in first
    assert len(middle) >= 2, messages
    assert all(line == "mlxprog: still building the native kernels (0 s)" for line in middle)
    assert last == "mlxprog: native kernels built in 0 s"
    time.sleep(0.2)
    assert len(messages) == len(middle) + 2  # the reports stop with the build


def test_a_cached_build_says_nothing(slow_build):
    build.ensure_built()
    messages: list[str] = []
    build.ensure_built(progress=messages.append)
    assert messages == []


def test_status_records_how_long_this_process_built(monkeypatch, capsys):
    monkeypatch.setattr(native, "_status", None)
    monkeypatch.setattr(native, "_module", None)

    class Loaded:
        isa = staticmethod(lambda: "portable")
        threads = staticmethod(lambda: 1)

    def built(progress=None):
        progress("mlxprog: building ...")
        time.sleep(0.2)
        progress("mlxprog: native kernels built in 0 s")
        return "ext.so"

    monkeypatch.setattr(build, "ensure_built", built)
    monkeypatch.setattr(build, "load", lambda path: Loaded())
    monkeypatch.setattr(native, "_smoke_test", lambda loaded: None)
    assert native.build_seconds() is None  # asks nothing, builds nothing
    assert 0.2 <= native.status().build_seconds < 5
    assert native.build_seconds() == native.status().build_seconds
    assert capsys.readouterr().err.splitlines() == [
        "mlxprog: building ...", "mlxprog: native kernels built in 0 s"]

    monkeypatch.setattr(native, "_status", None)
    monkeypatch.setattr(build, "ensure_built", lambda progress=None: "ext.so")  # cached
    assert native.status().build_seconds is None
