"""Names that moved: a package keeps serving the names it no longer exports,
from the module each moved to, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Mapping


def moved_names(package: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name in ``moved`` (name ->
    the module it lives in now) is imported from there, with a
    DeprecationWarning that names the module to import it from; any other
    name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(f"{package}.{name} is deprecated: import it from {moved[name]}",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__
