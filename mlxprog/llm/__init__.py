"""LLM support: model families (:mod:`.models`), loading (GGUF, Hugging Face),
tokenizers, model programs and generation."""

from .adapters import Adapter, apply_adapter, load_adapter
from .cache import CacheLayout, PromptCache, PromptCachePool, kv_cache_layout
from .chat import Chat
from .config import Checkpoint, ModelConfig, ModelError, Quantization, SettingError
from .engine import Engine, Generation, GenerationStats, Piece, Request
from .generate import LLM, EmbeddingInputError, GenerationOptions, export, load, load_exported
from .programs import (
    Picking, Sampling, build_decode, build_decode_loop, build_embed, build_pick, build_prefill,
    build_verify,
)
from .speculative import DraftModel, PromptLookup
from .gguf import load_gguf
from .hf import load_hf
from .model_files import default_model_path, load_checkpoint
from .spec import ModelSpec
from .tokenizer import ChatTemplate, StreamingDecoder, Tokenizer

__all__ = [
    "LLM", "Generation", "GenerationOptions", "GenerationStats", "ModelSpec", "Sampling",
    "Chat", "Picking", "Piece", "Engine", "Request", "PromptCache", "PromptCachePool", "CacheLayout",
    "build_decode", "build_decode_loop", "build_pick", "build_prefill", "export", "load",
    "load_exported", "Adapter", "apply_adapter", "load_adapter",
    "EmbeddingInputError", "build_embed", "build_verify", "DraftModel", "PromptLookup",
    "ChatTemplate", "Checkpoint", "ModelConfig", "ModelError", "Quantization", "SettingError",
    "StreamingDecoder",
    "Tokenizer", "default_model_path", "kv_cache_layout", "load_checkpoint", "load_gguf",
    "load_hf",
]
