"""LLM support: llama-family model loading (GGUF, Hugging Face) and tokenizers."""

from .config import Checkpoint, ModelConfig, ModelError, Quantization
from .gguf import load_gguf
from .hf import load_hf
from .model_files import default_model_path, load_checkpoint
from .tokenizer import StreamingDecoder, Tokenizer

__all__ = [
    "Checkpoint", "ModelConfig", "ModelError", "Quantization", "StreamingDecoder",
    "Tokenizer", "default_model_path", "load_checkpoint", "load_gguf", "load_hf",
]
