"""ONNX models as mlxprog programs: :func:`import_model`.

The importer (:mod:`.importer`) converts a graph node by node through the
converters of :mod:`.convert` (one module per op family, registered in
:mod:`.registry`); what a converter sees is a :class:`~.context.Context`.
Shape computations on symbolic dims are evaluated at import by the shape
rules the converters declare (:mod:`.shape_rules`, on :mod:`.symbolic`);
``docs/onnx.md`` describes the whole mapping.
Requires the ``onnx`` package (``pip install 'mlxprog[onnx]'``).
"""

from .context import ChannelsLast, Context, OnnxImportError
from .importer import UnsupportedOpsError, import_model
from . import convert  # noqa: F401  (registers the converters)

__all__ = ["ChannelsLast", "Context", "OnnxImportError", "UnsupportedOpsError", "import_model"]
