"""Building the native extension on first use, into a cache.

MLX's C++ ABI changes between releases, so the extension is compiled on this
machine against the MLX that is installed, like MLX's own fused CPU kernels.
The build goes into ``<cache>/native/<key>/``, where the key hashes what the
binary depends on: the MLX version and library, the nanobind version, the
Python ABI, the C++ compiler and the sources. A later process with the same
key loads the cached build; a changed MLX (or compiler, or source) builds
anew. A failed build leaves a ``failed.log`` under its key, so a machine
without a compiler does not retry in every process (delete it, or set
``MLXPROG_NATIVE_REBUILD=1``, to try again).

The cache lives in ``$MLXPROG_CACHE_DIR``, else ``$XDG_CACHE_HOME/mlxprog``,
else ``~/.cache/mlxprog``. ``python -m mlxprog.native`` builds (or reports)
ahead of time.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

MODULE = "_mlxprog_native"
SOURCE_DIR = Path(__file__).parent
SOURCE_PATTERNS = ("CMakeLists.txt", "src/*.h", "src/*.cpp", "src/kernels/*/*.h",
                   "src/primitives/*.h", "src/primitives/*.cpp", "src/quants/*.h",
                   "src/quants/*.cpp", "src/quants/*/*.h")
"""The files the binary is built from (pyproject.toml's package data lists the
same): all of them key the build, so a new kernel file is never left out."""


def sources() -> list[Path]:
    """The build's source files, in a fixed order."""
    return sorted(p for pattern in SOURCE_PATTERNS for p in SOURCE_DIR.glob(pattern))


BUILD_ESTIMATE = "usually 30 s to 2 minutes"
"""How long a build takes, as the first-use message says (docs/benchmarks.md,
"Building the native kernels", has the measurements)."""

PROGRESS_INTERVAL_S = 15.0
"""How often a running build says it still runs."""


class BuildError(RuntimeError):
    """The extension could not be built or loaded; the message says why."""


@dataclass(frozen=True)
class Toolchain:
    """What a build needs: cmake, a C++ compiler, and the MLX and nanobind
    CMake packages of this Python environment."""

    cmake: str
    compiler: str
    compiler_version: str
    mlx_dir: Path
    mlx_version: str
    nanobind_dir: str
    nanobind_version: str


def cache_root() -> Path:
    """The folder that holds mlxprog's caches."""
    configured = os.environ.get("MLXPROG_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mlxprog"


def find_toolchain() -> Toolchain:
    """The build tools, or :class:`BuildError` naming the one that is missing."""
    import mlx.core as mx

    cmake = _find_cmake()
    if cmake is None:
        raise BuildError("cmake was not found (pip install cmake)")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") \
        or shutil.which("clang++")
    if compiler is None:
        raise BuildError("no C++ compiler was found (set CXX, or install g++ or clang++)")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"the C++ compiler {compiler!r} does not run: {exc}") from None
    try:
        import nanobind
    except ImportError:
        raise BuildError("nanobind is not installed (pip install nanobind)") from None
    mlx_dir = Path(mx.__file__).parent  # mlx is a namespace package: ask mlx.core
    if not (mlx_dir / "share" / "cmake" / "MLX" / "MLXConfig.cmake").exists():
        raise BuildError(f"the MLX installation at {mlx_dir} has no CMake package "
                         "(share/cmake/MLX), so extensions cannot be built against it")
    return Toolchain(cmake, compiler, version[0] if version else "", mlx_dir, mx.__version__,
                     nanobind.cmake_dir(), nanobind.__version__)


def _find_cmake() -> str | None:
    """cmake on PATH, else the one pip installed beside this interpreter
    (a virtual environment used without activating it)."""
    found = shutil.which("cmake")
    if found:
        return found
    beside = Path(sys.executable).parent / "cmake"
    if beside.exists():
        return str(beside)
    try:
        import cmake  # the PyPI package

        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except (ImportError, AttributeError):
        return None


def build_key(tools: Toolchain) -> str:
    """The hash naming a build: everything the binary depends on."""
    digest = hashlib.sha256()
    library = next((tools.mlx_dir / "lib").glob("libmlx*"), None)
    parts = [tools.mlx_version, str(tools.mlx_dir), tools.nanobind_version,
             tools.compiler, tools.compiler_version, sys.version,
             sysconfig.get_config_var("EXT_SUFFIX") or "", sysconfig.get_platform()]
    if library is not None:
        stat = library.stat()
        parts += [str(library), str(stat.st_size), str(int(stat.st_mtime))]
    for part in parts:
        digest.update(part.encode() + b"\0")
    for path in sources():
        digest.update(path.relative_to(SOURCE_DIR).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _extension_path(folder: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = folder / f"{MODULE}{suffix}"
        if candidate.exists():
            return candidate
    return None


def _run_build(tools: Toolchain, work: Path, log: Path) -> Path:
    """Configure and compile in ``work``; the built module's path."""
    prefix = f"{tools.mlx_dir};{tools.nanobind_dir}"
    jobs = str(max(1, min(os.cpu_count() or 1, 8)))
    # Ninja where it is installed; otherwise CMake's default generator (make).
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    steps = [
        [tools.cmake, "-S", str(SOURCE_DIR), "-B", str(work), *generator,
         "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DPython_EXECUTABLE={sys.executable}", f"-DCMAKE_CXX_COMPILER={tools.compiler}"],
        [tools.cmake, "--build", str(work), "-j", jobs],
    ]
    with open(log, "w") as out:
        for step in steps:
            out.write("$ " + " ".join(step) + "\n")
            out.flush()
            done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
            if done.returncode != 0:
                raise BuildError(f"the native build failed (exit {done.returncode}); "
                                 f"its log is {log}")
    built = _extension_path(work)
    if built is None:
        raise BuildError(f"the native build produced no {MODULE} module; its log is {log}")
    return built


def ensure_built(progress: Callable[[str], None] | None = None) -> Path:
    """The path of a built extension for this environment, building it first
    if needed. ``progress(message)`` is told when a build starts (with how
    long builds take), every :data:`PROGRESS_INTERVAL_S` seconds while it
    runs, and when it ends. Raises :class:`BuildError`."""
    tools = find_toolchain()
    folder = cache_root() / "native" / build_key(tools)
    built = _extension_path(folder)
    if built is not None:
        return built
    failed = folder / "failed.log"
    if failed.exists() and not os.environ.get("MLXPROG_NATIVE_REBUILD"):
        raise BuildError(f"an earlier native build for this MLX failed; its log is {failed} "
                         "(set MLXPROG_NATIVE_REBUILD=1 to retry)")
    folder.mkdir(parents=True, exist_ok=True)
    with _FileLock(folder / "build.lock"):
        built = _extension_path(folder)  # built by another process meanwhile
        if built is not None:
            return built
        if progress:
            progress(f"mlxprog: building native CPU kernels for MLX {tools.mlx_version} "
                     f"(first use; {BUILD_ESTIMATE}) into {folder}")
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=folder, prefix="build-") as work:
            log = Path(work) / "build.log"
            try:
                with _still_building(progress, start):
                    module = _run_build(tools, Path(work), log)
            except (BuildError, OSError, subprocess.SubprocessError) as exc:
                # Keep the log where the next process finds it (the work
                # folder goes away).
                if log.exists():
                    shutil.copyfile(log, failed)
                else:
                    failed.write_text(f"{exc}\n")
                raise BuildError(str(exc).replace(str(log), str(failed))) from None
            target = folder / module.name
            shutil.copyfile(module, target.with_suffix(".partial"))
            os.replace(target.with_suffix(".partial"), target)
        failed.unlink(missing_ok=True)
        if progress:
            progress(f"mlxprog: native kernels built in {time.monotonic() - start:.0f} s")
        return target


@contextmanager
def _still_building(progress: Callable[[str], None] | None, start: float) -> Iterator[None]:
    """Tell ``progress`` every :data:`PROGRESS_INTERVAL_S` seconds, until the
    block ends, that the build (started at monotonic time ``start``) still
    runs: the compiler's output goes to the log, and a silent minute looks
    like a hang."""
    if progress is None:
        yield
        return
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_INTERVAL_S):
            progress(f"mlxprog: still building the native kernels "
                     f"({time.monotonic() - start:.0f} s)")

    reporter = threading.Thread(target=report, name="mlxprog-native-build", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()


def load(path: Path) -> ModuleType:
    """Import the built extension from ``path``."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _FileLock:
    """An exclusive lock on a file, so that concurrent processes build once."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None

    def __enter__(self) -> _FileLock:
        self._file = open(self.path, "w")
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process lock
            return self
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()
