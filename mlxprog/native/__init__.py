"""mlxprog's native CPU kernels: MLX primitives of our own, in C++.

MLX's CPU backend runs ``quantized_matmul`` as single-threaded scalar code
and composes ``mx.fast`` RoPE, RMS norm and attention from many small ops.
The kernels here (``src/``) are MLX
``Primitive`` subclasses with AVX2+FMA (and VNNI) or NEON (and dot-product)
inner loops chosen at run time (a portable path is always built) and a small
thread pool, so inside ``mx.compile`` they behave like any MLX op. The
quantized matmul also has int8 numerics (the op's ``numerics`` attribute).

Ops use a kernel only when all of these hold, and MLX's own op otherwise:
the executable runs with native kernels on (``mlxprog.compile(native=...)``,
default from ``MLXPROG_NATIVE``, on unless ``0``; the op is given it as the
:class:`Setting` of its execution context), the default device is the
CPU, the extension is built and loaded, and the kernel covers the operands
(dtype, layout, sizes; see :mod:`mlxprog.native.kernels`). A program file
never chooses whether a kernel runs, only (``numerics``) which result it
wants. The extension is built on first use (:mod:`.build`); when
that fails mlxprog warns once and runs MLX's ops.

Environment: ``MLXPROG_NATIVE=0`` (the executables' default: off; on
otherwise), ``MLXPROG_NATIVE_THREADS`` (threads, the calling one included,
1 to :data:`MAX_THREADS`; default: the usable cores; :func:`set_threads`
sets it from Python), ``MLXPROG_NATIVE_ISA`` (a kernel table the CPU
runs: ``portable`` for no vector code, ``avx2`` for AVX2 without VNNI, ...;
the extension's ``isas()`` lists them), ``MLXPROG_NATIVE_SPIN_US`` (how long
idle workers spin before sleeping, default 50), and for the build ``MLXPROG_CACHE_DIR`` and
``MLXPROG_NATIVE_REBUILD`` (see :mod:`.build`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from types import ModuleType

import mlx.core as mx

from . import build


@dataclass(frozen=True)
class Status:
    """Whether the native kernels can run here: ``available``, and either
    ``reason`` (why not) or the kernels' ``isa`` and ``threads``;
    ``build_seconds`` is how long this process spent building them (None:
    the cache had them, or they are unavailable)."""

    available: bool
    reason: str = ""
    isa: str = ""
    threads: int = 0
    path: str = ""
    build_seconds: float | None = None

    def __str__(self) -> str:
        if not self.available:
            return f"unavailable ({self.reason})"
        return f"{self.isa}, {self.threads} thread(s)"


_lock = threading.Lock()
_status: Status | None = None
_module: ModuleType | None = None

#: The most threads the pool takes (src/threadpool.cpp ignores a larger
#: ``MLXPROG_NATIVE_THREADS``).
MAX_THREADS = 256


def set_threads(threads: int) -> None:
    """Make the native kernels' thread pool ``threads`` threads (the calling
    one included), by setting ``MLXPROG_NATIVE_THREADS``, which the pool
    reads once, when the extension loads (:func:`status`). A count outside
    [1, :data:`MAX_THREADS`] is a :class:`ValueError`. The pool does not
    resize: once it has started with another count, this is a
    :class:`RuntimeError` (the same count is accepted)."""
    if isinstance(threads, bool) or not isinstance(threads, int) \
            or not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be an integer in [1, {MAX_THREADS}], got {threads!r}")
    # Under the lock status() loads the extension with: the pool either has
    # started (and _status says with how many threads) or will read the variable.
    with _lock:
        if _status is not None and _status.available:
            if _status.threads != threads:
                raise RuntimeError(
                    f"the native kernels' thread pool already runs {_status.threads} "
                    f"thread(s) and cannot resize to {threads}; set the count before the "
                    "kernels are first used (before loading a model or compiling a program)")
            return
        os.environ["MLXPROG_NATIVE_THREADS"] = str(threads)


def default_enabled() -> bool:
    """Native kernels' default for executables: on unless ``MLXPROG_NATIVE=0``."""
    return os.environ.get("MLXPROG_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


class _BuildProgress:
    """The build's ``progress``: prints each message on stderr, and times the
    build from its first message (none comes when the cache has the
    extension)."""

    def __init__(self) -> None:
        self.started: float | None = None

    def __call__(self, message: str) -> None:
        if self.started is None:
            self.started = time.monotonic()
        print(message, file=sys.stderr, flush=True)

    def seconds(self) -> float | None:
        """Seconds since the build started (None: no build started)."""
        return None if self.started is None else time.monotonic() - self.started


def module() -> ModuleType | None:
    """The loaded extension (built on first use), or None when it cannot be
    had (the first such call warns, with the reason)."""
    if _status is None:
        status()
    return _module


def status() -> Status:
    """Build and load the extension if not done yet; what came of it."""
    global _status, _module
    if _status is not None:
        return _status
    with _lock:
        if _status is not None:
            return _status
        progress = _BuildProgress()
        try:
            path = build.ensure_built(progress=progress)
            build_seconds = progress.seconds()
            loaded = build.load(path)
            _smoke_test(loaded)
        except Exception as exc:  # any failure means: run MLX's ops
            _status = Status(False, reason=str(exc) or type(exc).__name__)
            # Not tied to a line of the caller's code: the cause is the machine.
            warnings.warn_explicit(
                f"native CPU kernels are unavailable, running MLX's ops: {_status.reason}",
                RuntimeWarning, filename="mlxprog", lineno=0, module="mlxprog.native")
            return _status
        _module = loaded
        _status = Status(True, isa=loaded.isa(), threads=loaded.threads(), path=str(path),
                         build_seconds=build_seconds)
        return _status


def build_seconds() -> float | None:
    """How long this process spent building the native kernels (None: it
    built none: the cache had them, the build failed, or nothing asked for
    them yet). Asks for nothing itself, so it never starts a build."""
    return None if _status is None else _status.build_seconds


def _smoke_test(loaded: ModuleType) -> None:
    """One small call checked against MLX: catches an extension that loads
    but cannot exchange arrays with this MLX (another nanobind ABI)."""
    with mx.stream(mx.cpu):
        w = mx.arange(64 * 32, dtype=mx.float32).reshape(64, 32) / 1000.0
        wq, scales, biases = mx.quantize(w, group_size=32, bits=4)
        x = mx.ones((1, 32))
        try:
            got = loaded.quantized_matmul(x, wq, scales, biases, transpose=True, group_size=32,
                                          bits=4)
        except TypeError as exc:
            raise build.BuildError(
                "the built extension cannot take this MLX's arrays (its nanobind version "
                f"differs from the one MLX {mx.__version__} was built with): {exc}") from None
        want = mx.quantized_matmul(x, wq, scales, biases, group_size=32, bits=4)
        if not mx.allclose(got, want, rtol=1e-4, atol=1e-4).item():
            raise build.BuildError("the native quantized_matmul disagrees with MLX's")


# -- which calls use the kernels -----------------------------------------------------


@dataclass(frozen=True, eq=False)
class Setting:
    """Whether an executable's ops may use the native kernels (``enabled``),
    and the executable's counters they add to: ``counts``, by op, the
    instructions that took a native kernel; ``numerics_fallbacks``, by (op,
    reason), those whose numerics choice no kernel could honour. Ops are
    given it in their :class:`~mlxprog.ops.context.ExecutionContext`."""

    enabled: bool
    counts: dict[str, int] = field(default_factory=dict)
    numerics_fallbacks: dict[tuple[str, str], int] = field(default_factory=dict)


def active(setting: Setting) -> ModuleType | None:
    """The extension when ops running under ``setting`` may use it: native
    kernels enabled, the CPU device, the extension loaded."""
    return None if inactive_reason(setting) else module()


def inactive_reason(setting: Setting) -> str:
    """Why ops running under ``setting`` may not use the extension ("" when they may)."""
    if not setting.enabled:
        return "native kernels are off for this executable (native=False or MLXPROG_NATIVE=0)"
    if mx.default_device() != mx.cpu:
        return f"the default device is {mx.default_device()}; native kernels run on the CPU only"
    if module() is None:
        return f"native kernels are unavailable ({_status.reason if _status else 'not loaded'})"
    return ""


def record(setting: Setting, op: str) -> None:
    """Count one instruction of ``op`` that took a native kernel."""
    setting.counts[op] = setting.counts.get(op, 0) + 1


def record_numerics_fallback(setting: Setting, op: str, reason: str) -> None:
    """Count one instruction of ``op`` that asked for numerics no kernel
    here honours and ran the exact path instead, and why."""
    key = (op, reason)
    setting.numerics_fallbacks[key] = setting.numerics_fallbacks.get(key, 0) + 1
