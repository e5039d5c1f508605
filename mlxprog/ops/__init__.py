"""Ops: the registry (:mod:`.registry`), attribute types (:mod:`.attrs`), the
host-op interface (:mod:`.host`) and the built-in op families, one module
each (control flow in :mod:`.control`). Importing this package registers
every built-in op."""

from . import (  # noqa: F401
    contract,
    control,
    conv,
    creation,
    distributed,
    elementwise,
    fft,
    index,
    linalg,
    nn,
    quant,
    random,
    reduce,
    shape,
    transformer,
    window,
)
