"""The converters, one module per ONNX op family; importing the package
registers every module's converters (each module here is found by name)."""

import importlib
import pkgutil

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
