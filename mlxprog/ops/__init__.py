"""Built-in op families. Importing this package registers every op."""

from . import (  # noqa: F401
    contract,
    conv,
    creation,
    elementwise,
    fft,
    index,
    linalg,
    nn,
    quant,
    random,
    reduce,
    shape,
    window,
)
