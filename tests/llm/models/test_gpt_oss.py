"""The gpt_oss family against mlx-lm, from tiny checkpoints mlx-lm writes and
loads itself (sliding and full layers, sinks, YaRN, the router's top-k
softmax, experts with biases and the clamped SwiGLU): logits, greedy
tokens, batches and prompt caches, quantized KV caches; mxfp4 experts as
mlx-lm quantizes them; OpenAI's original layout (MXFP4 ``_blocks`` /
``_scales``, fused and interleaved ``gate_up_proj``, or bfloat16); GGUF
files as llama.cpp's converter writes them, with float and MXFP4 experts;
the chat template a checkpoint carries; configs and files it refuses."""

from __future__ import annotations

import json

import gguf
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from family_checks import (MlxLmParity, PROMPT_IDS, TINY_CONFIG, load_tiny, mlx_lm_logits,
                           mlx_lm_model, program_logits, write_checkpoint)
from mlx.utils import tree_flatten

from mlxprog.llm import ModelError
from mlxprog.llm.hf import config_from_hf

#: 4 experts, 2 active; a window of 8 (shorter than the prompt) on layers 0
#: and 2; YaRN stretching a 128-token context 4 times (truncated bounds, as
#: mlx-lm computes them whatever the config says).
GPT_OSS = dict(TINY_CONFIG, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2,
               sliding_window=8,
               layer_types=["sliding_attention", "full_attention", "sliding_attention"],
               rope_theta=150000.0, swiglu_limit=7.0, attention_bias=True,
               rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "original_max_position_embeddings": 128})
CONTINUATION = [5, 60, 7, 81]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("gpt-oss"), GPT_OSS)


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm."""


def test_config(checkpoint):
    c = load_tiny(checkpoint).config
    assert (c.family, c.num_experts, c.experts_per_token, c.sliding_window) == (
        "gpt_oss", 4, 2, 8)
    assert c.sliding_layers == (True, False, True)
    assert c.rope_attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    # No layer_types: even layers slide, as mlx-lm's and Hugging Face's default.
    c = config_from_hf({k: v for k, v in GPT_OSS.items() if k != "layer_types"})
    assert c.sliding_layers == (True, False, True)


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """A checkpoint of head dim 32 (the quantized caches' groups are 32 or
    more features)."""
    return write_checkpoint(tmp_path_factory.mktemp("gpt-oss-32"), dict(GPT_OSS, head_dim=32))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("native", [True, False])
def test_quantized_kv_caches_keep_the_sinks(tmp_path, wide_heads, bits, native):
    """The quantized caches' attention reads the sinks, on the native
    kernels and on MLX's ops: with a recent ring as long as the cache every
    key and value is read unrounded, so the logits are the float cache's;
    without sinks they are not (by far)."""
    import dataclasses
    import shutil

    from family_checks import MAX_LENGTH
    from mlxprog.llm.cache import CacheLayout

    llm = load_tiny(wide_heads, native=native)
    layout = dataclasses.replace(CacheLayout.of(llm.config), kv_bits=bits, kv_group_size=32,
                                 kv_recent=MAX_LENGTH)
    want = program_logits(llm, PROMPT_IDS, CONTINUATION)
    got = program_logits(llm, PROMPT_IDS, CONTINUATION, kv=layout)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    unsunk = shutil.copytree(wide_heads, tmp_path / "unsunk")
    weights = dict(mx.load(str(unsunk / "model.safetensors")))
    for name in weights:
        if name.endswith(".sinks"):
            weights[name] = mx.full(weights[name].shape, -1e4)  # no probability mass
    mx.save_safetensors(str(unsunk / "model.safetensors"), weights)
    assert np.abs(program_logits(load_tiny(unsunk), PROMPT_IDS, CONTINUATION) - want).max() > 0.05


def test_every_layers_quantized_attention_takes_its_sinks(wide_heads):
    import dataclasses

    from mlxprog.llm.cache import CacheLayout
    from mlxprog.llm.programs import build_decode

    llm = load_tiny(wide_heads)
    layout = dataclasses.replace(CacheLayout.of(llm.config), kv_bits=4, kv_group_size=32)
    program = build_decode(llm.spec, 64, sampling=None, kv=layout)
    attention = [i for i in program.instructions if i.op == "quantized_kv_cache_sdpa_update"]
    assert len(attention) == 3 and all(i.attrs["sinks"] for i in attention)
    assert [i.attrs.get("window") for i in attention] == [8, None, 8]


def _quantized_experts(directory, rest: str | None):
    """mlx-lm's model of ``directory`` with its experts in mxfp4 and
    everything else (its ``to_quantized`` layers: embeddings, projections,
    router, head) left float (``rest`` None), 8-bit affine (``"affine"``,
    mlx-community's gpt-oss) or mxfp4 too (``"mxfp4"``); saved back with its
    config's ``quantization``."""
    model = mlx_lm_model(directory)
    mxfp4 = {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    others = {None: None, "mxfp4": mxfp4,
              "affine": {"group_size": 64, "bits": 8, "mode": "affine"}}[rest]
    layers = {}

    def predicate(path, module):
        if not hasattr(module, "to_quantized"):
            return False
        settings = mxfp4 if ".experts." in path else others
        if settings is None:
            return False
        layers[path] = settings
        return settings

    nn.quantize(model, class_predicate=predicate)
    mx.save_safetensors(str(directory / "model.safetensors"),
                        dict(tree_flatten(model.parameters())))
    (directory / "config.json").write_text(json.dumps(
        dict(GPT_OSS, quantization={**(others or mxfp4), **layers})))
    return directory


@pytest.mark.parametrize("rest", [None, "affine", "mxfp4"])
def test_mxfp4_experts_match_mlx_lm(tmp_path, rest):
    directory = _quantized_experts(write_checkpoint(tmp_path, GPT_OSS), rest)
    llm = load_tiny(directory, numerics="exact")
    quant = llm.checkpoint.quantization
    assert quant["layers.0.mlp.experts.gate_proj"].mode == "mxfp4"
    assert getattr(quant.get("layers.0.mlp.router"), "mode", None) == rest
    assert getattr(quant.get("embed_tokens"), "mode", None) == rest
    expected = mlx_lm_logits(mlx_lm_model(directory), PROMPT_IDS)[-1:]
    np.testing.assert_allclose(program_logits(llm, PROMPT_IDS), expected, rtol=1e-4, atol=1e-4)


def _interleaved(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Gate and up rows (axis 1) interleaved as OpenAI's ``gate_up_proj``."""
    out = np.empty((gate.shape[0], 2 * gate.shape[1], *gate.shape[2:]), gate.dtype)
    out[:, 0::2], out[:, 1::2] = gate, up
    return out


def _openai_layout(directory, blocks: bool) -> None:
    """Rewrite ``directory``'s mlx-lm layout as OpenAI's original one: each
    layer's experts as ``gate_up_proj`` (rows interleaved) and
    ``down_proj``, in MXFP4 ``_blocks``/``_scales`` (``blocks``: from the
    mxfp4 experts) or as float ``[E, in, out]``, biases ``*_proj_bias``."""
    weights = {k: np.array(v) for k, v in mx.load(str(directory / "model.safetensors")).items()}
    out = {k: v for k, v in weights.items() if ".experts." not in k}
    for i in range(GPT_OSS["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts"
        part = {name: {kind: weights.get(f"{p}.{name}.{kind}") for kind in
                       ("weight", "scales", "bias")}
                for name in ("gate_proj", "up_proj", "down_proj")}
        out[f"{p}.gate_up_proj_bias"] = _interleaved(part["gate_proj"]["bias"],
                                                     part["up_proj"]["bias"])
        out[f"{p}.down_proj_bias"] = part["down_proj"]["bias"]
        if blocks:
            for name, key in (("gate_up_proj", None), ("down_proj", "down_proj")):
                w = (_interleaved(part["gate_proj"]["weight"], part["up_proj"]["weight"])
                     if key is None else part[key]["weight"])
                s = (_interleaved(part["gate_proj"]["scales"], part["up_proj"]["scales"])
                     if key is None else part[key]["scales"])
                out[f"{p}.{name}_blocks"] = w.view(np.uint8).reshape(*w.shape[:2], -1, 16)
                out[f"{p}.{name}_scales"] = s
        else:
            out[f"{p}.gate_up_proj"] = _interleaved(
                part["gate_proj"]["weight"], part["up_proj"]["weight"]).swapaxes(1, 2)
            out[f"{p}.down_proj"] = part["down_proj"]["weight"].swapaxes(1, 2)
    mx.save_safetensors(str(directory / "model.safetensors"),
                        {k: mx.array(v) for k, v in out.items()})
    config = json.loads((directory / "config.json").read_text())
    config.pop("quantization", None)
    if blocks:
        config["quantization_config"] = {"quant_method": "mxfp4",
                                          "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (directory / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("blocks", [True, False])
def test_openai_layout_gives_mlx_lms_layouts_logits(tmp_path, blocks):
    """OpenAI's checkpoint layout is re-laid at load into exactly the
    arrays of mlx-lm's: the same logits, bit for bit."""
    mlx_lm_layout = write_checkpoint(tmp_path / "mlx-lm", GPT_OSS)
    if blocks:
        _quantized_experts(mlx_lm_layout, rest=None)
    openai = write_checkpoint(tmp_path / "openai", GPT_OSS)
    (openai / "model.safetensors").write_bytes((mlx_lm_layout / "model.safetensors").read_bytes())
    (openai / "config.json").write_text((mlx_lm_layout / "config.json").read_text())
    _openai_layout(openai, blocks)
    ours, theirs = load_tiny(openai, numerics="exact"), load_tiny(mlx_lm_layout, numerics="exact")
    # Each re-laid weight names the file's tensor and rows it came from.
    stem = "model.layers.1.mlp.experts"
    assert ours.checkpoint.source_names["layers.1.mlp.experts.up_proj.weight"] == (
        f"{stem}.gate_up_proj_blocks[:, 1::2]" if blocks
        else f"{stem}.gate_up_proj[..., 1::2]:transposed")
    for name, w in theirs.checkpoint.weights.items():
        assert mx.array_equal(ours.checkpoint.weights[name], w), name
    np.testing.assert_array_equal(program_logits(ours, PROMPT_IDS, CONTINUATION),
                                  program_logits(theirs, PROMPT_IDS, CONTINUATION))


def _mxfp4_experts(name: str, data: np.ndarray):
    """The GGUF writer's ``stored``: expert matrices as MXFP4 blocks
    (llama.cpp's quantizer's role), everything else float32."""
    if name.endswith("_exps.weight"):
        blocks = gguf.quants.quantize(data.reshape(-1, data.shape[-1]),
                                      gguf.GGMLQuantizationType.MXFP4)
        return blocks.reshape(*data.shape[:-1], -1), gguf.GGMLQuantizationType.MXFP4
    return data, None


def test_gguf_gives_the_checkpoints_logits(tmp_path):
    """The GGUF file llama.cpp's converter would write (experts as
    ``ffn_*_exps`` with biases, router ``ffn_gate_inp``, ``attn_sinks``,
    YaRN keys) gives the directory's logits."""
    from gguf_writer import write_gguf_from_hf

    checkpoint = write_checkpoint(tmp_path / "hf", GPT_OSS)
    model = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf"))
    hf = load_tiny(checkpoint)
    assert model.config.sliding_layers == hf.config.sliding_layers
    assert model.config.rope_freqs == pytest.approx(hf.config.rope_freqs)
    np.testing.assert_allclose(program_logits(model, PROMPT_IDS, CONTINUATION),
                               program_logits(hf, PROMPT_IDS, CONTINUATION),
                               rtol=1e-4, atol=1e-4)


def test_gguf_logits_are_llama_cpps(tmp_path):
    """llama.cpp itself (llama-cpp-python) on the float GGUF file: its
    logits after the prompt are ours within its float16 KV cache's rounding
    (sinks, sliding windows, YaRN with rounded bounds, router and clamped
    SwiGLU as llama.cpp computes them)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from gguf_writer import write_gguf_from_hf

    path = write_gguf_from_hf(write_checkpoint(tmp_path / "hf", GPT_OSS),
                              tmp_path / "model.gguf")
    model = llama_cpp.Llama(str(path), logits_all=True, n_ctx=128, n_threads=2, verbose=False)
    model.eval(PROMPT_IDS)
    theirs = np.array(model.scores[len(PROMPT_IDS) - 1])
    ours = program_logits(load_tiny(path), PROMPT_IDS)[0]
    assert np.abs(ours).max() > 1
    np.testing.assert_allclose(ours, theirs, atol=2e-2)


def test_gguf_mxfp4_experts_are_the_float_values_they_hold(tmp_path):
    """MXFP4 experts in GGUF blocks (``ggml_gather_matmul``, exact numerics)
    give the logits of a float checkpoint holding their numpy-dequantized
    values."""
    from gguf_writer import write_gguf_from_hf

    checkpoint = write_checkpoint(tmp_path / "hf", GPT_OSS)
    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf", stored=_mxfp4_experts)
    # The float checkpoint of the values the blocks hold.
    weights = dict(mx.load(str(checkpoint / "model.safetensors")))
    for name, w in weights.items():
        if ".experts." in name and name.endswith(".weight"):
            data = np.array(w).reshape(-1, w.shape[-1])
            blocks = gguf.quants.quantize(data, gguf.GGMLQuantizationType.MXFP4)
            held = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.MXFP4)
            weights[name] = mx.array(held.reshape(w.shape).astype(np.float32))
    mx.save_safetensors(str(checkpoint / "model.safetensors"), weights)
    model = load_tiny(path, numerics="exact")
    assert model.checkpoint.quantization["layers.0.mlp.experts.down_proj"].type == "MXFP4"
    np.testing.assert_allclose(program_logits(model, PROMPT_IDS, CONTINUATION),
                               program_logits(load_tiny(checkpoint), PROMPT_IDS, CONTINUATION),
                               rtol=1e-4, atol=1e-4)


def test_gguf_mxfp4_experts_in_int8_stay_close(tmp_path):
    """The same MXFP4 experts in int8 numerics (the CPU's default): the
    prefill's experts run the integer kernels too (the 40-token prompt gives
    each of the 4 experts about 20 rows: the int8 GEMM, and dot products
    for an expert below 16), as do the decode steps; the logits stay near
    exact numerics'."""
    from family_checks import program_logits
    from gguf_writer import write_gguf_from_hf

    from mlxprog import native

    if mx.default_device() != mx.cpu or not native.default_enabled():
        pytest.skip("int8 numerics run on the CPU's native kernels (elsewhere: exact)")
    checkpoint = write_checkpoint(tmp_path / "hf", GPT_OSS)
    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf", stored=_mxfp4_experts)
    want = program_logits(load_tiny(path, numerics="exact"), PROMPT_IDS, CONTINUATION)
    got = program_logits(load_tiny(path, numerics="int8"), PROMPT_IDS, CONTINUATION)
    assert np.abs(got - want).mean() <= 0.05 * np.abs(want).mean()
    assert not np.array_equal(got[0], want[0])  # the prefill's experts ran int8


def test_gguf_names_are_llama_cpps():
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, 1)
    from mlxprog.llm.models import family_for_gguf

    family = family_for_gguf("gpt-oss")
    for w in family.weights(config_from_hf(GPT_OSS)):
        mapped = names.get_name(w.hf.format(i=0))
        # llama.cpp's converter stores the sinks with a .weight suffix.
        assert mapped == w.gguf.format(i=0), w.name


#: A chat template in the harmony format's style, using what gpt-oss's own
#: template uses: macros, namespaces, strftime_now, tojson, raise_exception.
HARMONY_TEMPLATE = (
    "{%- macro system() -%}You are a model.\nCurrent date: {{ strftime_now('%Y') }}\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}{%- endmacro -%}"
    "<|start|>system<|message|>{{ system() }}<|end|>"
    "{%- set last = namespace(name=none) -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' and '<|channel|>' in message.content -%}"
    "{{ raise_exception('channel tags in content') }}{%- endif -%}"
    "{%- if message.role == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>"
    "{%- elif message.role == 'tool' -%}"
    "<|start|>functions.x to=assistant<|channel|>commentary<|message|>"
    "{{ message.content | tojson }}<|end|>"
    "{%- else -%}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}")


def test_checkpoint_chat_templates_render(tmp_path):
    """The template of ``tokenizer_config.json`` and of the GGUF file's
    ``tokenizer.chat_template`` render a conversation."""
    from gguf_writer import bpe_tokenizer_metadata, write_gguf_from_hf

    checkpoint = write_checkpoint(tmp_path / "hf", GPT_OSS)
    config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps(
        dict(config, chat_template=HARMONY_TEMPLATE)))
    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf", tokenizer_metadata=dict(
        bpe_tokenizer_metadata(), **{"tokenizer.chat_template": HARMONY_TEMPLATE}))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                {"role": "user", "content": "again"}]
    for model in (checkpoint, path):
        text = load_tiny(model).tokenizer.apply_chat_template(messages)
        assert text.startswith("<|start|>system<|message|>You are a model.")
        assert text.endswith("<|start|>user<|message|>again<|end|><|start|>assistant")


#: gpt-oss-20b's published config.json (the fields a loader reads).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                                                      "model.layers.*.mlp.router",
                                                      "model.embed_tokens", "lm_head"],
                            "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "router_aux_loss_coef": 0.9,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088}


def test_published_config():
    from mlxprog.llm.models.llama import yarn

    c = config_from_hf(GPT_OSS_20B)
    assert (c.num_experts, c.experts_per_token, c.expert_intermediate_size) == (32, 4, 2880)
    assert (c.sliding_window, c.sliding_layers[:3], c.router) == (
        128, (True, False, True), "topk_softmax")
    assert c.rope_freqs == yarn(150000.0, 64, 32.0, 4096, 32.0, 1.0, truncate=False).freqs
    assert c.rope_attention_factor == pytest.approx(0.1 * np.log(32) + 1)
    assert (c.eos_token_ids, c.tie_embeddings, c.attention_bias) == ((200002,), False, True)


def gguf_metadata(**keys):
    """gpt-oss-20b's GGUF metadata as llama.cpp's converter writes it,
    plus ``keys`` (under the ``gpt-oss.`` prefix)."""
    from types import SimpleNamespace

    from mlxprog.llm.models.base import GGUFMetadata

    metadata = {"general.architecture": "gpt-oss", "gpt-oss.block_count": 24,
                "gpt-oss.context_length": 131072, "gpt-oss.embedding_length": 2880,
                "gpt-oss.feed_forward_length": 2880, "gpt-oss.attention.head_count": 64,
                "gpt-oss.attention.head_count_kv": 8, "gpt-oss.rope.freq_base": 150000.0,
                "gpt-oss.attention.layer_norm_rms_epsilon": 1e-5, "gpt-oss.expert_count": 32,
                "gpt-oss.expert_used_count": 4, "gpt-oss.attention.key_length": 64,
                "gpt-oss.attention.value_length": 64, "gpt-oss.attention.sliding_window": 128,
                "gpt-oss.expert_feed_forward_length": 2880, "gpt-oss.rope.scaling.type": "yarn",
                "gpt-oss.rope.scaling.factor": 32.0,
                "gpt-oss.rope.scaling.original_context_length": 4096}
    metadata.update({f"gpt-oss.{k}": v for k, v in keys.items()})
    tokenizer = SimpleNamespace(vocab_size=201088, bos_token_id=199998, eos_token_ids=(200002,))
    layers = range(metadata["gpt-oss.block_count"])
    tensors = {"token_embd.weight", "output.weight", *(f"blk.{i}.attn_q.weight" for i in layers)}
    return GGUFMetadata(metadata, tensors, tokenizer)


def test_gguf_config_is_llama_cpps():
    from mlxprog.llm.models import family_for_gguf
    from mlxprog.llm.models.llama import yarn

    family = family_for_gguf("gpt-oss")
    c = family.config_from_gguf(gguf_metadata())
    assert (c.family, c.num_experts, c.experts_per_token, c.sliding_window) == (
        "gpt_oss", 32, 4, 128)
    assert c.sliding_layers == tuple(i % 2 == 0 for i in range(24))
    # llama.cpp rounds YaRN's bounds outward (its beta defaults 32 and 1).
    assert c.rope_freqs == yarn(150000.0, 64, 32.0, 4096, truncate=True).freqs
    assert (c.rope_traditional, c.tie_embeddings) == (False, False)
    with pytest.raises(ModelError, match=r"gpt-oss\.rope\.scaling\.yarn_ext_factor is not "
                                         "supported"):
        family.config_from_gguf(gguf_metadata(**{"rope.scaling.yarn_ext_factor": 0.5}))
    with pytest.raises(ModelError, match="expert_used_count 40 is more than the 32 experts"):
        family.config_from_gguf(gguf_metadata(expert_used_count=40))


@pytest.mark.parametrize("changes, match", [
    (dict(num_experts_per_tok=5), "num_experts_per_tok 5 is more than the 4 experts of "
                                  "config.json: num_local_experts"),
    (dict(num_local_experts=0), "num_local_experts must be a positive integer"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "rope_scaling type 'llama3' is not supported by the gpt_oss family"),
    (dict(layer_types=["sliding_attention"]), "layer_types"),
    (dict(quantization_config={"quant_method": "fp8"}), r"quantized checkpoints \(fp8\)"),
])
def test_bad_configs_name_the_key(changes, match):
    with pytest.raises(ModelError, match=match):
        config_from_hf(dict(GPT_OSS, **changes))


def test_expert_tensors_of_the_wrong_shape_are_named(tmp_path):
    checkpoint = write_checkpoint(tmp_path, GPT_OSS)
    weights = dict(mx.load(str(checkpoint / "model.safetensors")))
    name = "model.layers.1.mlp.experts.up_proj.weight"
    weights[name] = weights[name][:3]
    mx.save_safetensors(str(checkpoint / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=r"model\.layers\.1\.mlp\.experts\.up_proj\.weight has "
                                         r"shape \(3, 128, 64\), expected \(4, 128, 64\)"):
        load_tiny(checkpoint)


def test_malformed_mxfp4_blocks_are_named(tmp_path):
    openai = _quantized_experts(write_checkpoint(tmp_path, GPT_OSS), rest=None)
    _openai_layout(openai, blocks=True)
    weights = dict(mx.load(str(openai / "model.safetensors")))
    name = "model.layers.0.mlp.experts.down_proj_blocks"
    weights[name] = weights[name].reshape(*weights[name].shape[:2], -1)
    mx.save_safetensors(str(openai / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=rf"{tmp_path}: {name} is uint8 \(4, 64, 64\), "
                                         r"expected MXFP4 blocks"):
        load_tiny(openai)


def test_a_missing_sinks_tensor_is_named(tmp_path):
    checkpoint = write_checkpoint(tmp_path, GPT_OSS)
    weights = dict(mx.load(str(checkpoint / "model.safetensors")))
    del weights["model.layers.2.self_attn.sinks"]
    mx.save_safetensors(str(checkpoint / "model.safetensors"), weights)
    with pytest.raises(ModelError, match=r"missing weight\(s\) model\.layers\.2\.self_attn\."
                                         r"sinks that the gpt_oss config needs"):
        load_tiny(checkpoint)


def test_gguf_expert_count_disagreeing_with_the_tensors_is_named(tmp_path):
    from gguf_writer import write_gguf_from_hf

    checkpoint = write_checkpoint(tmp_path / "hf", GPT_OSS)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(dict(config, num_local_experts=3)))
    path = write_gguf_from_hf(checkpoint, tmp_path / "model.gguf")
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_gate_exps\.weight has shape \(4, 128, "
                                         r"64\), expected \(3, 128, 64\)"):
        load_tiny(path)


def test_two_ranks_split_heads_sinks_and_experts(tmp_path):
    """Tensor parallelism: each rank holds its query heads' sinks and a
    block of every expert's intermediate features (mxfp4 stacks in whole
    groups); the down projections' biases are added once, after the ranks'
    sum. Two ranks generate as one process."""
    from family_checks import check_two_ranks_generate_as_one_process
    from mlxprog.llm.models import model_spec

    path = write_checkpoint(tmp_path / "float", GPT_OSS)
    spec = model_spec(load_tiny(path).checkpoint)
    rank1 = spec.shard(2, 1)
    assert spec.local_shape("layers.0.self_attn.sinks.weight", rank1) == (2,)
    assert spec.local_shape("layers.0.mlp.experts.down_proj.weight", rank1) == (4, 64, 64)
    assert spec.local_shape("layers.0.mlp.experts.gate_proj.bias", rank1) == (4, 64)
    assert spec.local_shape("layers.0.mlp.experts.down_proj.bias", rank1) == (4, 64)
    check_two_ranks_generate_as_one_process(path)
    mxfp4 = _quantized_experts(write_checkpoint(tmp_path / "mxfp4", GPT_OSS), rest=None)
    check_two_ranks_generate_as_one_process(mxfp4)
