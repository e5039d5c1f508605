"""Write float32 GGUF files of tiny Hugging Face checkpoints the way llama.cpp's
``convert_hf_to_gguf.py`` does, with the ``gguf`` package from llama.cpp's
repository (a test-only dependency, never imported by mlxprog).

The tensor names come from the package's own maps
(``gguf.get_tensor_name_map``) and the metadata keys from its writer
(``GGUFWriter.add_*``, i.e. ``gguf.Keys``), not from mlxprog's loader tables,
so a family's GGUF test checks the loader against llama.cpp's conventions
rather than against itself. What each architecture's converter class does
(llama.cpp's ``conversion/{base,llama,qwen,gemma,phi}.py``, as vendored in
llama-cpp-python 0.3.36, llama.cpp commit 0c1e570) is followed here:

``llama`` (``model_type`` llama, mistral)
    Q/K rows (and biases) permuted into the interleaved RoPE layout
    (``LlamaModel.permute``); ``vocab_size`` and ``rope.dimension_count``
    written; linear RoPE scaling as ``rope.scaling.type``/``factor``; llama3
    scaling as a ``rope_freqs`` tensor of per-pair divisors.
``qwen2`` / ``qwen3``
    No permutation (NEOX RoPE); q/k/v biases (qwen2) and ``attn_q_norm`` /
    ``attn_k_norm`` (qwen3) mapped by name; ``key_length``/``value_length``
    from ``head_dim``; no ``vocab_size`` nor ``rope.dimension_count`` key.
``gemma2`` / ``gemma3`` (``model_type`` gemma2, gemma3_text, gemma3)
    Every ``*norm.weight`` stored as ``w + 1`` (q/k norms too for gemma3);
    gemma2 drops ``lm_head`` and writes no ``rope.freq_base``; soft-capping
    and ``attention.sliding_window`` written; gemma3 writes
    ``rope.freq_base`` (global layers), ``rope.freq_base_swa`` (from
    ``rope_local_base_freq``) and linear scaling. NOT written by llama.cpp,
    so not here either: ``query_pre_attn_scalar`` (llama.cpp scales queries
    by ``1/sqrt(key_length)``, except for the 27B models where it uses
    ``1/sqrt(embedding_length / head_count)``) and the sliding-window
    pattern (llama.cpp assumes every 2nd layer global for gemma2, every 6th
    for gemma3, unless ``attention.sliding_window_pattern`` says otherwise:
    pass ``sliding_window_pattern=True`` to write that key for a tiny config
    whose pattern is not the default). Default tokenizer: SentencePiece
    (``tokenizer.ggml.model`` "llama", see :func:`spm_tokenizer_metadata`).
``mixtral`` / ``qwen2_moe`` / ``qwen3_moe`` / ``olmoe`` (mixtures of experts)
    Mixtral as ``llama`` (Q/K permuted); ``qwen2moe``, ``qwen3moe``,
    ``olmoe`` as qwen2/qwen3 are (no permutation). ``expert_count`` and
    ``expert_used_count`` (``TextModel``), ``expert_feed_forward_length``
    and, for qwen2moe, ``expert_shared_feed_forward_length``
    (``Qwen2MoeModel``). The experts' tensors merged into one 3-D tensor
    per projection (``modify_tensors``: the per-expert tensors of an
    original checkpoint stacked, mlx-lm's stacked ``switch_mlp`` ones
    renamed), named ``ffn_{gate,up,down}_exps``; the router
    ``ffn_gate_inp``; Qwen2-MoE's shared expert ``ffn_*_shexp`` and its
    gate ``ffn_gate_inp_shexp``.
``phi3``
    Fused ``qkv_proj`` as ``attn_qkv``, ``gate_up_proj`` as ``ffn_up``;
    ``rope.dimension_count`` (``partial_rotary_factor`` applied),
    ``rope.scaling.original_context_length``, ``attention.sliding_window`` (0
    when none); longrope factors as ``rope_factors_long`` /
    ``rope_factors_short`` tensors with ``rope.scaling.attn_factor``. No
    ``key_length`` key.
``gpt_oss`` (``GptOssModel``; from mlx-lm's layout, experts already split)
    The text-model keys with ``expert_count``, ``expert_used_count``,
    ``expert_feed_forward_length``, ``attention.sliding_window`` and YaRN's
    ``rope.scaling.type``/``factor``/``original_context_length``; experts
    as ``ffn_{gate,up,down}_exps`` with their biases, ``self_attn.sinks``
    as ``attn_sinks.weight``; no Q/K permutation (NEOX RoPE).

The tokenizer metadata of the gpt2-style families is the tiny byte-level
BPE of :func:`llm_fixtures.tiny_tokenizer_metadata` (the one the tiny HF
checkpoints carry); ``tokenizer="spm"`` / ``"bpe"`` overrides the default.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from llm_fixtures import tiny_tokenizer_metadata

#: config.json model_type -> llama.cpp architecture.
ARCHITECTURES = {
    "llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
    "gemma2": gguf.MODEL_ARCH.GEMMA2, "gemma3": gguf.MODEL_ARCH.GEMMA3,
    "gemma3_text": gguf.MODEL_ARCH.GEMMA3, "phi3": gguf.MODEL_ARCH.PHI3,
    "mixtral": gguf.MODEL_ARCH.LLAMA, "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE, "olmoe": gguf.MODEL_ARCH.OLMOE,
    "gpt_oss": gguf.MODEL_ARCH.GPT_OSS,
}
_MOE = (gguf.MODEL_ARCH.QWEN2MOE, gguf.MODEL_ARCH.QWEN3MOE, gguf.MODEL_ARCH.OLMOE)
#: Mixtral's names of the experts' projections in Hugging Face files.
_MIXTRAL_EXPERTS = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_SPM_DEFAULT = (gguf.MODEL_ARCH.GEMMA2, gguf.MODEL_ARCH.GEMMA3)

# SentencePiece token types (llama.cpp's SentencePieceTokenTypes).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

#: The pieces of the tiny SentencePiece vocabulary, best score first: single
#: characters, then merges (each the concatenation of two earlier pieces).
SPM_PIECES = ["▁", "t", "h", "e", "a", "n", "d", "o", "l", "w", "r", "i", "s", "\n",
              "he", "▁t", "▁the", "▁a", "an", "nd", "▁and", "ll", "o▁", "lo", "ello",
              "el", "▁w", "or", "orld", "▁world", "hell", "▁hello", "▁▁", "is", "▁is"]


def spm_tokenizer_metadata(vocab_size: int | None = None, bos_id: int = 2, eos_id: int = 1,
                           pad_id: int = 0, unk_id: int = 3, add_bos: bool = True,
                           add_space_prefix: bool | None = False,
                           user_defined: Iterable[str] = (),
                           chat_template: str | None = None) -> dict[str, Any]:
    """GGUF metadata (plain Python values) of a tiny SentencePiece vocabulary
    as llama.cpp's converter writes one (``_set_vocab_sentencepiece``):
    ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>`` at the given ids (Gemma's
    order by default), the 256 byte-fallback tokens ``<0x00>``..``<0xFF>``,
    ``user_defined`` tokens, then :data:`SPM_PIECES` with descending scores.
    ``vocab_size`` (default: all of it) truncates the pieces (then the
    bytes) or pads with ``<unusedN>`` tokens, so that a model's embedding
    rows and the vocabulary agree. ``add_space_prefix`` False is what the
    converter writes for Gemma; None leaves the key out (Llama 2, Phi-3:
    llama.cpp then prefixes a space)."""
    specials = {pad_id: ("<pad>", CONTROL), bos_id: ("<bos>", CONTROL),
                eos_id: ("<eos>", CONTROL), unk_id: ("<unk>", UNKNOWN)}
    rest = ([(f"<0x{b:02X}>", BYTE, 0.0) for b in range(256)]
            + [(t, USER_DEFINED, 0.0) for t in user_defined]
            + [(p, NORMAL, -float(i)) for i, p in enumerate(SPM_PIECES)])
    total = len(specials) + len(rest) if vocab_size is None else vocab_size
    if len(specials) != 4 or max(specials) >= total:
        raise ValueError(f"special ids {sorted(specials)} must be distinct and < {total}")
    tokens, scores, types = [], [], []
    rest_iter = iter(rest)
    for i in range(total):
        if i in specials:
            text, kind, score = *specials[i], 0.0
        else:
            text, kind, score = next(rest_iter, (f"<unused{i}>", UNUSED, 0.0))
        tokens.append(text)
        scores.append(score)
        types.append(kind)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": bos_id,
        "tokenizer.ggml.eos_token_id": eos_id,
        "tokenizer.ggml.unknown_token_id": unk_id,
        "tokenizer.ggml.padding_token_id": pad_id,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_eos_token": False,
    }
    if add_space_prefix is not None:
        meta["tokenizer.ggml.add_space_prefix"] = add_space_prefix
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def bpe_tokenizer_metadata() -> dict[str, Any]:
    """The tiny byte-level BPE tokenizer's GGUF metadata
    (:func:`llm_fixtures.tiny_tokenizer_metadata`) as plain Python."""
    return {k: (v.item() if v.ndim == 0 else v.tolist()) if isinstance(v, mx.array) else v
            for k, v in tiny_tokenizer_metadata().items()}


def add_tokenizer(writer: gguf.GGUFWriter, meta: Mapping[str, Any]) -> None:
    """Tokenizer metadata (``tokenizer.ggml.*`` keys, plain Python) through
    the writer's typed methods, as the converter writes it."""
    g = "tokenizer.ggml."
    writer.add_tokenizer_model(meta[g + "model"])
    if g + "pre" in meta:
        writer.add_tokenizer_pre(meta[g + "pre"])
    writer.add_token_list(meta[g + "tokens"])
    if g + "scores" in meta:
        writer.add_token_scores(meta[g + "scores"])
    writer.add_token_types(meta[g + "token_type"])
    if g + "merges" in meta:
        writer.add_token_merges(meta[g + "merges"])
    for key, add in (("bos_token_id", writer.add_bos_token_id),
                     ("eos_token_id", writer.add_eos_token_id),
                     ("unknown_token_id", writer.add_unk_token_id),
                     ("padding_token_id", writer.add_pad_token_id),
                     ("add_bos_token", writer.add_add_bos_token),
                     ("add_eos_token", writer.add_add_eos_token),
                     ("add_space_prefix", writer.add_add_space_prefix)):
        if meta.get(g + key) is not None:
            add(meta[g + key])
    if meta.get("tokenizer.chat_template") is not None:
        writer.add_chat_template(meta["tokenizer.chat_template"])


# -- the converter's per-architecture steps -----------------------------------

def _permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: half-split RoPE rows -> interleaved."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _rope_parameters(hp: Mapping[str, Any]) -> dict[str, Any]:
    """``TextModel.__init__``'s ``rope_parameters``: ``rope_parameters`` or
    ``rope_scaling``, with the top-level RoPE fields mirrored in."""
    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})

    def find(*keys):
        return next((hp[k] for k in keys if k in hp), None)

    theta = find("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta",
                 "rotary_emb_base")
    local_theta = find("local_rope_theta", "rope_local_theta", "rope_theta_local",
                       "swa_rope_theta", "rope_local_base_freq")
    partial = find("partial_rotary_factor", "rope_pct", "rope_percent")
    original = find("original_max_position_embeddings")
    if "full_attention" not in rope and "sliding_attention" not in rope:
        if local_theta is not None:
            rope["sliding_attention"] = {"rope_theta": local_theta}
        if "rope_theta" not in rope and theta is not None:
            rope["rope_theta"] = theta
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        if "partial_rotary_factor" not in rope and partial is not None:
            rope["partial_rotary_factor"] = partial
        if "original_max_position_embeddings" not in rope and original is not None:
            rope["original_max_position_embeddings"] = original
    return rope


def _text_model_parameters(w: gguf.GGUFWriter, hp: Mapping[str, Any], n_blocks: int,
                           rope: Mapping[str, Any]) -> None:
    """``TextModel.set_gguf_parameters`` (the keys a dense decoder uses)."""
    w.add_block_count(n_blocks)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    if "num_key_value_heads" in hp:
        w.add_head_count_kv(hp["num_key_value_heads"])
    params = rope.get("full_attention", rope)
    kind, factor = params.get("rope_type"), params.get("factor")
    if kind == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(params["original_max_position_embeddings"])
    elif kind in ("su", "longrope"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    if params.get("rope_theta") is not None:
        w.add_rope_freq_base(params["rope_theta"])
    if rope.get("sliding_attention", {}).get("rope_theta") is not None:
        w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if hp.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    experts = hp.get("num_local_experts", hp.get("num_experts"))
    if experts is not None:
        w.add_expert_count(experts)
    if hp.get("num_experts_per_tok") is not None:
        w.add_expert_used_count(hp["num_experts_per_tok"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def _llama3_rope_factors(hp: Mapping[str, Any], rope: Mapping[str, Any]) -> np.ndarray | None:
    """``LlamaModel.generate_extra_tensors``: llama3 scaling's ``rope_freqs``."""
    params = rope.get("full_attention", rope)
    if str(params.get("rope_type", "")).lower() != "llama3":
        return None
    base = params.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old = params.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _gemma_parameters(w: gguf.GGUFWriter, hp: Mapping[str, Any], arch, n_blocks: int,
                      rope: Mapping[str, Any]) -> None:
    """``Gemma2Model`` / ``Gemma3Model.set_gguf_parameters``."""
    if arch == gguf.MODEL_ARCH.GEMMA3:
        _text_model_parameters(w, hp, n_blocks, rope)
        # Gemma3Model's defaults for fields a config may leave out.
        if hp.get("head_dim") is None:
            w.add_key_length(256)
            w.add_value_length(256)
        if "num_key_value_heads" not in hp:
            w.add_head_count_kv(4)
        if hp.get("rms_norm_eps") is None:
            w.add_layer_norm_rms_eps(1e-6)
        if rope.get("full_attention", rope).get("rope_theta") is None:
            w.add_rope_freq_base(1_000_000.0)  # Gemma3Model's default (global layers)
        if hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
        if hp.get("sliding_window_pattern") != 1:
            w.add_sliding_window(hp["sliding_window"])
        return
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_head_count_kv(hp.get("num_key_value_heads", hp["num_attention_heads"]))
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if hp.get("attn_logit_softcapping") is not None:
        w.add_attn_logit_softcapping(hp["attn_logit_softcapping"])
    if hp.get("final_logit_softcapping") is not None:
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_sliding_window(hp["sliding_window"])


def _sliding_window_pattern(hp: Mapping[str, Any], n_blocks: int) -> int | list[bool] | None:
    """The HF config's sliding-window pattern as llama.cpp's
    ``attention.sliding_window_pattern`` reads it: ``layer_types`` as one
    bool per layer (True: sliding), else ``sliding_window_pattern`` (every
    n-th layer global)."""
    if hp.get("layer_types"):
        return [t == "sliding_attention" for t in hp["layer_types"][:n_blocks]]
    if hp.get("sliding_window_pattern") is not None:
        return int(hp["sliding_window_pattern"])
    return None


def _phi3_parameters(w: gguf.GGUFWriter, hp: Mapping[str, Any], n_blocks: int,
                     rope: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``Phi3MiniModel.set_gguf_parameters`` and ``generate_extra_tensors``
    (the longrope factor tensors, returned)."""
    n_embd, n_head = hp["hidden_size"], hp["num_attention_heads"]
    max_pos = hp["max_position_embeddings"]
    orig = rope.get("original_max_position_embeddings", max_pos)
    rope_dims = int(rope.get("partial_rotary_factor", 1.0) * n_embd) // n_head
    w.add_context_length(max_pos)
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_block_count(n_blocks)
    w.add_head_count(n_head)
    w.add_head_count_kv(hp.get("num_key_value_heads", n_head))
    w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rope.get("full_attention", rope).get("rope_theta", 10000.0))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(hp.get("sliding_window") or 0)
    long_factors, short_factors = rope.get("long_factor"), rope.get("short_factor")
    if not long_factors:
        return {}
    scale = max_pos / orig
    kind = str(rope.get("rope_type", "")).lower()
    if kind in ("su", "longrope"):
        attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        attn_factor = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise NotImplementedError(f"phi3 rope scaling type {kind!r}")
    w.add_rope_scaling_attn_factors(attn_factor)
    if len(long_factors) != len(short_factors) or len(long_factors) != rope_dims / 2:
        raise ValueError(f"rope long/short factors must have {rope_dims // 2} entries")
    name = gguf.TENSOR_NAMES
    return {name[gguf.MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight":
            np.array(long_factors, dtype=np.float32),
            name[gguf.MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight":
            np.array(short_factors, dtype=np.float32)}


def _read_checkpoint(hf_dir: Path) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{hf_dir}: no *.safetensors")
    for f in files:
        for name, value in mx.load(str(f)).items():
            if name.endswith((".scales", ".biases")):
                raise ValueError(f"{hf_dir}: {name}: quantized checkpoints are not converted")
            tensors[name] = np.array(value.astype(mx.float32))
    return tensors


def _merged_experts(tensors: dict[str, np.ndarray], model_type: str
                    ) -> dict[str, np.ndarray]:
    """The converter's merge of a mixture's experts: each projection's
    experts as one ``[experts, out, in]`` tensor named
    ``<block>.experts.<projection>.weight``, stacked from an original
    checkpoint's ``<block>.experts.<e>.<projection>.weight`` or renamed
    from mlx-lm's stacked ``<block>.switch_mlp.<projection>.weight``
    (Mixtral's projections under their Hugging Face names ``w1``, ``w3``,
    ``w2``)."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, data in tensors.items():
        parts = name.split(".")
        if "switch_mlp" in parts:
            at = parts.index("switch_mlp")
            projection = parts[at + 1]
            if model_type == "mixtral":
                projection = _MIXTRAL_EXPERTS[projection]
            out[".".join(parts[:at] + ["experts", projection] + parts[at + 2:])] = data
        elif "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            at = parts.index("experts")
            merged = ".".join(parts[:at + 1] + parts[at + 2:])
            experts.setdefault(merged, {})[int(parts[at + 1])] = data
        else:
            out[name] = data
    for merged, by_index in experts.items():
        out[merged] = np.stack([by_index[e] for e in range(len(by_index))])
    return out


def write_gguf_from_hf(hf_dir: Path, out_path: Path, *, tokenizer: str | None = None,
                       tokenizer_metadata: Mapping[str, Any] | None = None,
                       sliding_window_pattern: bool = False,
                       stored: Callable[[str, np.ndarray], tuple[np.ndarray, Any]] | None = None
                       ) -> Path:
    """A float32 GGUF file at ``out_path`` of the tiny Hugging Face
    checkpoint in ``hf_dir`` (``config.json`` and ``*.safetensors``),
    converted as llama.cpp's ``convert_hf_to_gguf.py`` would (see the module
    docstring for what each architecture gets). ``tokenizer``: ``"bpe"``
    (the tiny byte-level BPE, default but for gemma), ``"spm"`` (the tiny
    SentencePiece vocabulary of :func:`spm_tokenizer_metadata`, sized to
    ``vocab_size`` with the config's BOS/EOS ids; default for gemma2/3);
    ``tokenizer_metadata`` replaces either. ``sliding_window_pattern``
    writes ``attention.sliding_window_pattern`` (which llama.cpp reads but
    its converter does not write for gemma2/3). ``stored(gguf_name, data)``,
    when given, returns what to store for each converted tensor: (raw
    bytes, their GGMLQuantizationType) to write another type (llama.cpp's
    quantizer's role), or (float32 data, None). Returns ``out_path``."""
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    hp = json.loads((hf_dir / "config.json").read_text())
    if "text_config" in hp:
        hp = {**hp, **hp["text_config"]}
    model_type = hp["model_type"]
    if model_type not in ARCHITECTURES:
        raise ValueError(f"write_gguf_from_hf: model_type {model_type!r} not covered "
                         f"({', '.join(sorted(ARCHITECTURES))})")
    arch = ARCHITECTURES[model_type]
    n_blocks = hp["num_hidden_layers"]
    rope = _rope_parameters(hp)
    tensor_map = gguf.get_tensor_name_map(arch, n_blocks)
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(hf_dir.name)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)

    extra: dict[str, np.ndarray] = {}
    if arch == gguf.MODEL_ARCH.LLAMA:
        _text_model_parameters(writer, hp, n_blocks, rope)
        writer.add_vocab_size(hp["vocab_size"])
        writer.add_rope_dimension_count(hp.get("head_dim")
                                        or hp["hidden_size"] // hp["num_attention_heads"])
        factors = _llama3_rope_factors(hp, rope)
        if factors is not None:
            extra[gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight"] = factors
    elif arch in (gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.QWEN3):
        _text_model_parameters(writer, hp, n_blocks, rope)
    elif arch in _MOE:
        _text_model_parameters(writer, hp, n_blocks, rope)
        if hp.get("moe_intermediate_size") is not None:
            writer.add_expert_feed_forward_length(hp["moe_intermediate_size"])
        if hp.get("shared_expert_intermediate_size") is not None:
            writer.add_expert_shared_feed_forward_length(hp["shared_expert_intermediate_size"])
    elif arch in _SPM_DEFAULT:
        _gemma_parameters(writer, hp, arch, n_blocks, rope)
        if sliding_window_pattern:
            pattern = _sliding_window_pattern(hp, n_blocks)
            if pattern is not None:
                writer.add_sliding_window_pattern(pattern)
    elif arch == gguf.MODEL_ARCH.PHI3:
        extra.update(_phi3_parameters(writer, hp, n_blocks, rope))
    elif arch == gguf.MODEL_ARCH.GPT_OSS:
        _text_model_parameters(writer, hp, n_blocks, rope)  # the expert counts too
        writer.add_expert_feed_forward_length(hp["intermediate_size"])
        writer.add_sliding_window(hp["sliding_window"])

    kind = tokenizer or ("spm" if arch in _SPM_DEFAULT else "bpe")
    if tokenizer_metadata is None:
        if kind == "bpe":
            tokenizer_metadata = bpe_tokenizer_metadata()
        elif kind == "spm":
            eos = hp.get("eos_token_id", 1)
            eos = eos[0] if isinstance(eos, list) else eos
            bos = hp.get("bos_token_id", 2)
            free = [i for i in range(4) if i not in (bos, eos)]
            tokenizer_metadata = spm_tokenizer_metadata(
                hp["vocab_size"], bos_id=bos, eos_id=eos, pad_id=free[0], unk_id=free[1],
                # Gemma2Model/Gemma3Model write add_space_prefix False; the
                # llama and phi3 converters leave it to llama.cpp (True).
                add_space_prefix=False if arch in _SPM_DEFAULT else None)
        else:
            raise ValueError(f"tokenizer must be 'bpe' or 'spm', got {tokenizer!r}")
    add_tokenizer(writer, tokenizer_metadata)
    n_vocab = len(tokenizer_metadata["tokenizer.ggml.tokens"])

    n_head = hp["num_attention_heads"]
    n_kv_head = hp.get("num_key_value_heads", n_head)
    for name, data in _merged_experts(_read_checkpoint(hf_dir), model_type).items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if arch == gguf.MODEL_ARCH.GEMMA2 and name == "lm_head.weight":
            continue  # Gemma2Model.filter_tensors: llama.cpp uses the embeddings
        if arch == gguf.MODEL_ARCH.LLAMA:
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                data = _permute(data, n_head, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):
                data = _permute(data, n_head, n_kv_head)
        if arch in _SPM_DEFAULT:
            if arch == gguf.MODEL_ARCH.GEMMA3 and "embed_tokens.weight" in name:
                data = data[:n_vocab]  # Gemma3Model drops out-of-vocabulary rows
            if name.endswith("norm.weight"):
                data = data + 1
        new_name = tensor_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            raise ValueError(f"{hf_dir}: cannot map tensor {name!r} for "
                             f"{gguf.MODEL_ARCH_NAMES[arch]}")
        if arch == gguf.MODEL_ARCH.GPT_OSS and name.endswith(".sinks"):
            new_name += ".weight"  # GptOssModel.modify_tensors
        data = np.ascontiguousarray(data, dtype=np.float32)
        raw_type = None
        if stored is not None:
            data, raw_type = stored(new_name, data)
        writer.add_tensor(new_name, data, raw_dtype=raw_type)
    for name, data in extra.items():
        writer.add_tensor(name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path
