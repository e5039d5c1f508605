"""The importer's error: :class:`OnnxImportError`."""

from __future__ import annotations

from ..errors import ProgramError


class OnnxImportError(ProgramError):
    """An ONNX model cannot be imported: an unsupported op or attribute, an
    input the importer needs at import time that is not constant, or a
    malformed graph. The message names the node (index, name, op type, and
    the subgraph it is in)."""
