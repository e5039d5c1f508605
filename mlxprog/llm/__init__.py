"""LLM support: load a model and generate, chat, embed, export its programs.

The public API (docs/api.md): :func:`load` an :class:`LLM` (under
:class:`ModelOptions`), generate with it (under :class:`GenerationOptions`;
results are :class:`Generation` and :class:`Piece`), keep a :class:`Chat`
or a :class:`PromptCache`, :func:`export` its programs and
:func:`load_exported` them; build programs of your own from a
:class:`Checkpoint` (:func:`load_checkpoint`) with :class:`ModelSpec` and
:func:`build_prefill`, :func:`build_decode`, :func:`build_decode_loop`.
Everything else lives in its module: model families (:mod:`.models`),
loaders (:mod:`.gguf`, :mod:`.hf`), the engine (:mod:`.engine`), the
programs (:mod:`.programs`), the KV cache (:mod:`.cache`), the server
(:mod:`.server`).
"""

from ..deprecation import moved_names
from ..errors import ModelError, SettingError
from .cache import PromptCache
from .chat import Chat
from .checkpoint import Checkpoint
from .engine import Generation, Piece
from .exported import export, load_exported
from .generate import LLM, EmbeddingInputError
from .loading import load
from .model_files import load_checkpoint
from .options import GenerationOptions, ModelOptions
from .programs import Sampling, build_decode, build_decode_loop, build_prefill
from .spec import ModelSpec
from .tokenizer import Tokenizer

__all__ = [
    "load", "LLM", "ModelOptions", "GenerationOptions", "Generation", "Piece", "Chat",
    "PromptCache", "export", "load_exported", "Sampling", "ModelError", "SettingError",
    "EmbeddingInputError", "Checkpoint", "load_checkpoint", "ModelSpec", "build_prefill",
    "build_decode", "build_decode_loop", "Tokenizer",
]

#: Names this package exported before the public API was narrowed, and the
#: module each lives in now: importing one from here still works, with a
#: DeprecationWarning naming the module (see :mod:`mlxprog.deprecation`).
MOVED = {
    "Adapter": "mlxprog.llm.adapters", "apply_adapter": "mlxprog.llm.adapters",
    "load_adapter": "mlxprog.llm.adapters",
    "CacheLayout": "mlxprog.llm.cache", "PromptCachePool": "mlxprog.llm.cache",
    "kv_cache_layout": "mlxprog.llm.cache",
    "ModelConfig": "mlxprog.llm.config", "Quantization": "mlxprog.llm.checkpoint",
    "Engine": "mlxprog.llm.engine", "GenerationStats": "mlxprog.llm.engine",
    "Request": "mlxprog.llm.engine",
    "load_gguf": "mlxprog.llm.gguf", "load_hf": "mlxprog.llm.hf",
    "default_model_path": "mlxprog.llm.model_files",
    "Picking": "mlxprog.llm.programs", "build_embed": "mlxprog.llm.programs",
    "build_pick": "mlxprog.llm.programs", "build_verify": "mlxprog.llm.programs",
    "DraftModel": "mlxprog.llm.speculative", "PromptLookup": "mlxprog.llm.speculative",
    "ChatTemplate": "mlxprog.llm.tokenizer", "StreamingDecoder": "mlxprog.llm.tokenizer",
}


__getattr__ = moved_names(__name__, MOVED)
