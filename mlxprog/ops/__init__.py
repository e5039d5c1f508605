"""Ops: the registry (:mod:`.registry`), attribute types (:mod:`.attrs`), the
host-op interface (:mod:`.host`) and the built-in op families, one module
each (control flow in :mod:`.control`; the offset and position operands the
attention and RoPE families share in :mod:`.positions`). Importing this
package registers every built-in op."""

from . import (  # noqa: F401
    activations,
    attention,
    attention_block,
    contract,
    control,
    conv,
    creation,
    distributed,
    elementwise,
    experts,
    fft,
    ggml,
    index,
    linalg,
    norms,
    quant,
    quantized_attention,
    random,
    reduce,
    rope,
    sampling,
    shape,
    transformer,
    window,
)
