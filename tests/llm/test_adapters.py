"""LoRA adapters (mlxprog.llm.adapters): mlx-lm's and PEFT's formats fused
into HF and GGUF bases, against mlx-lm's own LoRA layers on a tiny random
llama and a tiny random adapter; the requantization of a Q4_1 base against
a float reference computed in numpy; bad adapters."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import mlx.core as mx
import mlx.nn as nn
import mlx_lm.tuner.utils as tuner
import mlx_lm.utils as mlx_lm_loading
import numpy as np
import pytest
from family_checks import PROMPT_IDS, TINY_CONFIG, load_tiny, program_logits, write_checkpoint
from gguf_writer import _permute, write_gguf_from_hf
from mlx.utils import tree_flatten

from mlxprog import native
from mlxprog.cli import main
from mlxprog.ggml.affine import to_affine
from mlxprog.ggml.dequantize import dequantize as dequantize_blocks
from mlxprog.llm import LLM, SettingError, export, load, load_checkpoint
from mlxprog.llm.adapters import ADAPTED, load_adapter
from mlxprog.llm.checkpoint import GGMLQuantization, Quantization

CONFIG = dict(TINY_CONFIG, model_type="llama", rope_theta=5000.0)
RANK, SCALE, NUM_LAYERS = 4, 2.0, 2
CONTINUATION = [5, 77, 200, 9, 31, 150]
#: The bound on requantizing's logit error, relative to the Q4_1 base's own
#: (docs/llm.md, "LoRA adapters": measured 0.67 here).
Q4_ERROR_RATIO = 1.0


def mlx_lm_with_adapter(base: Path, adapter: Path | None):
    """mlx-lm's model of ``base``, with its LoRA layers loaded from
    ``adapter`` by mlx-lm's own loader."""
    model, _ = mlx_lm_loading.load_model(base)
    if adapter is not None:
        tuner.load_adapters(model, str(adapter))
    return model


def mlx_lm_logits(model, continuation=CONTINUATION) -> np.ndarray:
    """mlx-lm's logits after the prompt and after each continuation token."""
    tokens = PROMPT_IDS + continuation
    return np.array(model(mx.array([tokens]))[0, len(PROMPT_IDS) - 1:].astype(mx.float32))


def write_mlx_lm_adapter(directory: Path, base: Path, seed: int = 1,
                         keys: list[str] | None = None) -> Path:
    """A random LoRA adapter of ``base``'s last NUM_LAYERS layers, every
    linear layer in them (q/k/v/o, gate/up/down) or the modules ``keys``
    names, as mlx-lm's trainer saves one: mlx-lm's own LoRA layers,
    ``lora_b`` made random (mlx-lm starts it at zero), the trainable
    parameters in ``adapters.safetensors``."""
    model = mlx_lm_with_adapter(base, None)
    model.freeze()
    parameters = {"rank": RANK, "scale": SCALE, "dropout": 0.0}
    if keys is not None:
        parameters["keys"] = keys
    tuner.linear_to_lora_layers(model, NUM_LAYERS, parameters)
    key = mx.random.key(seed)
    weights = {}
    for name, value in tree_flatten(model.trainable_parameters()):
        key, sub = mx.random.split(key)
        weights[name] = 0.2 * mx.random.normal(value.shape, key=sub)
    assert weights and all(n.endswith(("lora_a", "lora_b")) for n in weights)
    directory.mkdir(parents=True)
    mx.save_safetensors(str(directory / "adapters.safetensors"), weights)
    (directory / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": NUM_LAYERS, "lora_parameters": parameters,
        "model": str(base)}))
    return directory


def write_peft_adapter(directory: Path, mlx_adapter: Path, rslora: bool = False) -> Path:
    """The mlx-lm adapter ``mlx_adapter`` converted to PEFT's format: A =
    lora_a^T, B = lora_b^T, and lora_alpha for the same scale."""
    directory.mkdir(parents=True)
    weights = {}
    for name, value in mx.load(str(mlx_adapter / "adapters.safetensors")).items():
        module, part = name.rsplit(".", 1)
        peft_part = {"lora_a": "lora_A", "lora_b": "lora_B"}[part]
        weights[f"base_model.model.{module}.{peft_part}.weight"] = value.T
    mx.save_safetensors(str(directory / "adapter_model.safetensors"), weights)
    alpha = SCALE * (RANK ** 0.5 if rslora else RANK)
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": RANK, "lora_alpha": alpha, "use_rslora": rslora,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"], "bias": "none", "fan_in_fan_out": False,
        "base_model_name_or_path": "tiny-llama"}))
    return directory


def write_q4_1_gguf(hf: Path, path: Path) -> Path:
    """The float GGUF of ``hf`` (llama.cpp's converter, see gguf_writer) with
    every layer's projection stored as Q4_1, as llama-quantize would."""
    add_tensor = gguf.GGUFWriter.add_tensor

    def quantizing(self, name, tensor, raw_shape=None, raw_dtype=None, **kwargs):
        if name.startswith("blk.") and tensor.ndim == 2:
            quantized = gguf.quants.quantize(tensor.astype(np.float32),
                                             gguf.GGMLQuantizationType.Q4_1)
            return add_tensor(self, name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
        return add_tensor(self, name, tensor, raw_shape, raw_dtype, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf.GGUFWriter, "add_tensor", quantizing)
        return write_gguf_from_hf(hf, path)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    hf = write_checkpoint(root / "hf", CONFIG)
    mlx_adapter = write_mlx_lm_adapter(root / "mlx-lm-adapter", hf)
    return {"hf": hf, "mlx-lm": mlx_adapter,
            "peft": write_peft_adapter(root / "peft-adapter", mlx_adapter),
            "peft-rslora": write_peft_adapter(root / "peft-rslora", mlx_adapter, rslora=True),
            "gguf": write_gguf_from_hf(hf, root / "tiny.gguf"),
            "q4_1": write_q4_1_gguf(hf, root / "tiny-q4_1.gguf")}


@pytest.fixture(scope="module")
def expected(files) -> np.ndarray:
    """mlx-lm's logits with the adapter, checked to differ from the base's."""
    adapted = mlx_lm_logits(mlx_lm_with_adapter(files["hf"], files["mlx-lm"]))
    base = mlx_lm_logits(mlx_lm_with_adapter(files["hf"], None))
    assert np.abs(adapted - base).max() > 1  # the adapter changes the model
    return adapted


# -- against mlx-lm ----------------------------------------------------------------

@pytest.mark.parametrize("base", ["hf", "gguf"])
@pytest.mark.parametrize("adapter", ["mlx-lm", "peft"])
def test_logits_match_mlx_lms_lora_layers(files, expected, base, adapter):
    """Prefill and decode logits of the fused model are mlx-lm's with its
    LoRA layers: on the HF base, and on the GGUF llama.cpp's converter
    writes of it, whose q/k rows are permuted (the update's are too)."""
    llm = load_tiny(files[base], adapter_path=files[adapter])
    ours = program_logits(llm, PROMPT_IDS, CONTINUATION)
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_the_formats_fuse_the_same_weights(files):
    """mlx-lm's adapter and its PEFT conversion (also with rsLoRA's scale)
    give the same weights; the adapted ones, and only they, are renamed."""
    mlx = load_checkpoint(files["hf"], files["mlx-lm"])
    base = load_checkpoint(files["hf"])
    adapted = {n for n in mlx.weights
               if not np.array_equal(np.array(mlx.weights[n]), np.array(base.weights[n]))}
    assert adapted == {f"layers.{i}.{p}.weight" for i in (1, 2)
                       for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                 "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                 "mlp.down_proj")}
    assert {n for n, s in mlx.source_names.items() if s.endswith(ADAPTED)} == adapted
    assert mlx.adapter_path == files["mlx-lm"]
    for kind in ("peft", "peft-rslora"):
        other = load_checkpoint(files["hf"], files[kind])
        for name in adapted:
            np.testing.assert_allclose(np.array(other.weights[name]),
                                       np.array(mlx.weights[name]), rtol=1e-6, atol=1e-6)


def test_generation_and_export_use_the_adapter(files, expected, tmp_path):
    """Greedy generation follows the adapted logits, and exported programs
    run with the adapter their manifest names."""
    llm = load_tiny(files["hf"], adapter_path=files["mlx-lm"])
    first = llm.generate(PROMPT_IDS, max_tokens=1, chat=False).tokens
    assert first == [int(np.argmax(expected[0]))]
    export(llm, tmp_path / "exported")
    manifest = json.loads((tmp_path / "exported" / "manifest.json").read_text())
    assert manifest["adapter"] == str(files["mlx-lm"])
    again = load(tmp_path / "exported")
    assert again.generate(PROMPT_IDS, max_tokens=4, chat=False).tokens == \
        llm.generate(PROMPT_IDS, max_tokens=4, chat=False).tokens
    with pytest.raises(SettingError, match="adapter_path: .*exported programs"):
        load(tmp_path / "exported", adapter_path=files["peft"])


def test_fused_projections_and_the_head_get_their_rows(tmp_path):
    """Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj,
    which mlx-lm adapts whole: each of mlxprog's projections gets its rows
    of the update. An untied lm_head is adapted too."""
    phi3 = write_checkpoint(tmp_path / "phi3", dict(
        TINY_CONFIG, model_type="phi3", rope_theta=10000.0, hidden_act="silu",
        original_max_position_embeddings=128))
    llama = write_checkpoint(tmp_path / "llama", CONFIG)
    cases = [(phi3, write_mlx_lm_adapter(tmp_path / "phi3-adapter", phi3)),
             (llama, write_mlx_lm_adapter(tmp_path / "head-adapter", llama,
                                          keys=["lm_head", "mlp.down_proj"]))]
    for base, adapter in cases:
        expected = mlx_lm_logits(mlx_lm_with_adapter(base, adapter))
        assert np.abs(expected - mlx_lm_logits(mlx_lm_with_adapter(base, None))).max() > 1
        ours = program_logits(load_tiny(base, adapter_path=adapter), PROMPT_IDS, CONTINUATION)
        np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)
    assert "lm_head.lora_a" in mx.load(str(cases[1][1] / "adapters.safetensors"))


# -- a quantized base ----------------------------------------------------------------

def reference_fused(files) -> dict[str, np.ndarray]:
    """The adapted projections of the Q4_1 GGUF in float32, computed here:
    the file's weights dequantized plus ``scale * B @ A`` of the adapter
    file, its q/k rows permuted as llama.cpp's converter permutes them."""
    base = load_checkpoint(files["q4_1"])
    c = base.config
    gguf_names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                  "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                  "mlp.down_proj": "ffn_down"}
    adapter = {k: np.array(v) for k, v in
               mx.load(str(files["mlx-lm"] / "adapters.safetensors")).items()}
    out = {}
    for i in (1, 2):
        for module, stored in gguf_names.items():
            name = f"layers.{i}.{module}"
            assert base.source_names[f"{name}.weight"] == f"blk.{i}.{stored}.weight"
            dense = np.array(dequantized(base, name))
            delta = SCALE * (adapter[f"model.{name}.lora_a"] @ adapter[f"model.{name}.lora_b"]).T
            if module == "self_attn.q_proj":
                delta = _permute(delta, c.num_heads, c.num_heads)
            elif module == "self_attn.k_proj":
                delta = _permute(delta, c.num_heads, c.num_kv_heads)
            out[name] = dense + delta
    return out


def test_a_zero_update_leaves_a_q4_1_base_as_it_was(files, tmp_path):
    """Requantizing keeps each group's grid where its values fit: an
    adapter whose update is zero gives back the file's packed weights,
    scales and biases bit for bit (an adapted layer the file keeps as GGML
    blocks, as it is where the native kernels run, comes back as those
    blocks re-laid as MLX's affine form; the others are untouched)."""
    zero = {k: (mx.zeros_like(v) if k.endswith("lora_b") else v)
            for k, v in mlx_weights(files).items()}
    fused = load_checkpoint(files["q4_1"], edited(tmp_path, files["mlx-lm"], weights=zero))
    base = load_checkpoint(files["q4_1"])
    relaid = 0
    for name, value in base.weights.items():
        stem = name.removesuffix(".weight")
        if fused.weights[name].dtype != value.dtype:
            assert isinstance(base.quantization[stem], GGMLQuantization), name
            assert fused.quantization[stem] == Quantization(4, 32), name
            want = to_affine("Q4_1", np.array(value))[:3]
            got = [np.array(fused.weights[f"{stem}.{p}"]) for p in ("weight", "scales", "biases")]
            for part, g, w in zip(("weight", "scales", "biases"), got, want):
                np.testing.assert_array_equal(g, w, f"{stem}.{part}")
            relaid += 1
            continue
        np.testing.assert_array_equal(np.array(fused.weights[name]), np.array(value), name)
    assert relaid == (len(reference_fused(files)) if native.default_enabled() else 0)


def test_a_q4_1_base_is_requantized_within_half_a_step(files):
    """Each adapted Q4_1 projection is the float fused weight rounded to
    4-bit groups of 32: every element within half its group's step (a new
    step's float16 rounding aside)."""
    fused = load_checkpoint(files["q4_1"], files["mlx-lm"])
    for name, reference in reference_fused(files).items():
        q = fused.quantization[name]
        assert (q.bits, q.group_size) == (4, 32)
        ours = np.array(dequantized(fused, name))
        step = np.repeat(np.abs(np.array(fused.weights[f"{name}.scales"], np.float32)), 32,
                         axis=1)
        assert np.all(np.abs(ours - reference) <= step * 0.51 + 1e-6), name


def test_requantizing_costs_no_more_than_the_bases_own_quantization(files):
    """The requantized model's logits move from those of the same model with
    the float fused weights (exact numerics, both) by no more than the Q4_1
    base's own logits move from the float base's: the second rounding costs
    what the first did (docs/llm.md, "LoRA adapters"; measured 0.40 against
    0.59 mean absolute logit error here, random weights having no slack)."""
    fused = load_checkpoint(files["q4_1"], files["mlx-lm"])
    weights, quantization = dict(fused.weights), dict(fused.quantization)
    for name, reference in reference_fused(files).items():
        del weights[f"{name}.scales"], weights[f"{name}.biases"], quantization[name]
        weights[f"{name}.weight"] = mx.array(reference)
    float_fused = dataclasses.replace(fused, weights=weights, quantization=quantization)

    def logits(checkpoint) -> np.ndarray:
        llm = LLM(checkpoint, max_length=96, numerics="exact")
        return program_logits(llm, PROMPT_IDS, CONTINUATION)

    reference = logits(float_fused)
    assert np.abs(reference).max() > 1  # not trivially small
    requantizing = np.abs(logits(fused) - reference).mean()
    quantizing = np.abs(logits(load_checkpoint(files["q4_1"]))
                        - logits(load_checkpoint(files["gguf"]))).mean()
    assert requantizing < Q4_ERROR_RATIO * quantizing


@pytest.mark.parametrize("bits, group_size", [(8, 64), (2, 32), (3, 32), (6, 64)])
def test_an_mlx_quantized_base_is_requantized_with_its_own_packing(files, tmp_path, bits,
                                                                  group_size):
    """An MLX-quantized HF base (mlx-lm's nn.quantize) at other bits and
    group sizes, those whose fields straddle uint32 words (3, 6) too: a zero
    update gives its arrays back bit for bit, a real one lands within half a
    step of the float fused weight."""
    model = mlx_lm_with_adapter(files["hf"], None)
    nn.quantize(model, group_size=group_size, bits=bits)
    base_dir = tmp_path / "quantized"
    base_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (base_dir / name).write_text((files["hf"] / name).read_text())
    mx.save_safetensors(str(base_dir / "model.safetensors"),
                        dict(tree_flatten(model.parameters())))
    (base_dir / "config.json").write_text(json.dumps(
        dict(CONFIG, quantization={"group_size": group_size, "bits": bits})))
    base = load_checkpoint(base_dir)
    zero = {k: (mx.zeros_like(v) if k.endswith("lora_b") else v)
            for k, v in mlx_weights(files).items()}
    unchanged = load_checkpoint(base_dir, edited(tmp_path, files["mlx-lm"], weights=zero))
    for name, value in base.weights.items():
        np.testing.assert_array_equal(np.array(unchanged.weights[name]), np.array(value), name)
    fused = load_checkpoint(base_dir, files["mlx-lm"])
    for key, lora_a in mlx_weights(files).items():
        if not key.endswith("lora_a"):
            continue
        name = key.removeprefix("model.").removesuffix(".lora_a")
        lora_b = mlx_weights(files)[key.replace("lora_a", "lora_b")]
        reference = np.array(dequantized(base, name) + SCALE * (lora_a @ lora_b).T)
        step = np.repeat(np.abs(np.array(fused.weights[f"{name}.scales"], np.float32)),
                         group_size, axis=1)
        error = np.abs(np.array(dequantized(fused, name)) - reference)
        assert np.all(error <= step * 0.51 + 1e-6), name


def dequantized(checkpoint, name: str) -> mx.array:
    """Quantized layer ``name`` of ``checkpoint`` (MLX-quantized, or GGML
    blocks) in float32."""
    q = checkpoint.quantization[name]
    if isinstance(q, GGMLQuantization):
        return dequantize_blocks(q.type, checkpoint.weights[f"{name}.weight"])
    return mx.dequantize(*(checkpoint.weights[f"{name}.{p}"] for p in ("weight", "scales",
                                                                      "biases")),
                         group_size=q.group_size, bits=q.bits).astype(mx.float32)


# -- bad adapters --------------------------------------------------------------------

def edited(tmp_path: Path, source: Path, config: dict | None = None,
           weights: dict | None = None, name: str = "adapter",
           dropped: tuple[str, ...] = ()) -> Path:
    """A copy of adapter ``source`` with its config updated by ``config``
    (json.dumps writes a float NaN as NaN, which Python's JSON reader
    takes), its ``dropped`` keys removed, and its weights file replaced by
    ``weights``."""
    directory = tmp_path / name
    directory.mkdir()
    config_file = json.loads((source / "adapter_config.json").read_text())
    config_file = {k: v for k, v in config_file.items() if k not in dropped}
    (directory / "adapter_config.json").write_text(json.dumps({**config_file, **(config or {})}))
    weights_name = next(p.name for p in source.glob("*.safetensors"))
    tensors = mx.load(str(source / weights_name)) if weights is None else weights
    mx.save_safetensors(str(directory / weights_name), tensors)
    return directory


def mlx_weights(files) -> dict[str, mx.array]:
    return mx.load(str(files["mlx-lm"] / "adapters.safetensors"))


Q = "model.layers.2.self_attn.q_proj"


def bad_adapters(files, tmp_path) -> dict[str, tuple[Path, str]]:
    """Each bad adapter and the message its error must give."""
    w = mlx_weights(files)
    return {
        "missing directory": (tmp_path / "nowhere", "nowhere: no such adapter directory"),
        "no weights": (_config_only(tmp_path, files), "no adapter weights: expected "
                       "adapters.safetensors or adapter_model.safetensors"),
        "another model's shapes": (
            edited(tmp_path, files["mlx-lm"], name="shapes", weights={
                f"{Q}.lora_a": mx.zeros((32, RANK)), f"{Q}.lora_b": mx.zeros((RANK, 64))}),
            r"adapters.safetensors: model.layers.2.self_attn.q_proj.lora_a / .*lora_b update "
            r"a 64 x 32 weight, but .* is 64 x 64 \(out x in\): the adapter is for another "
            "model"),
        "unknown module": (
            edited(tmp_path, files["mlx-lm"], name="unknown", weights={
                "model.layers.2.self_attn.c_attn.lora_a": w[f"{Q}.lora_a"],
                "model.layers.2.self_attn.c_attn.lora_b": w[f"{Q}.lora_b"]}),
            "adapt model.layers.2.self_attn.c_attn, which the llama model .* has no "
            "projection named"),
        "a layer past the model's": (
            edited(tmp_path, files["mlx-lm"], name="layer", weights={
                "model.layers.7.self_attn.q_proj.lora_a": w[f"{Q}.lora_a"],
                "model.layers.7.self_attn.q_proj.lora_b": w[f"{Q}.lora_b"]}),
            "adapt model.layers.7.self_attn.q_proj, which the llama model"),
        "rank mismatch": (
            edited(tmp_path, files["mlx-lm"], name="rank", weights={
                f"{Q}.lora_a": w[f"{Q}.lora_a"], f"{Q}.lora_b": w[f"{Q}.lora_b"][:2]}),
            "rank mismatch: model.layers.2.self_attn.q_proj.lora_a has rank 4 .*lora_b rank 2"),
        "a rank other than the config's": (
            edited(tmp_path, files["mlx-lm"], name="config-rank",
                   config={"lora_parameters": {"rank": 8, "scale": 1.0}}),
            "have rank 4, but .*adapter_config.json says 8"),
        "a matrix without its pair": (
            edited(tmp_path, files["mlx-lm"], name="pair",
                   weights={f"{Q}.lora_a": w[f"{Q}.lora_a"]}),
            f"{Q}.lora_a has no matching {Q}.lora_b"),
        "not a LoRA key": (
            edited(tmp_path, files["mlx-lm"], name="key",
                   weights={"model.norm.weight": mx.zeros((64,))}),
            "model.norm.weight is not a LoRA matrix"),
        "DoRA": (edited(tmp_path, files["mlx-lm"], name="dora",
                        config={"fine_tune_type": "dora"}),
                 "fine_tune_type 'dora' is not supported"),
        "a full fine-tune": (edited(tmp_path, files["mlx-lm"], name="full",
                                    config={"fine_tune_type": "full"}),
                             "fine_tune_type 'full' is not supported"),
        "PEFT's DoRA": (edited(tmp_path, files["peft"], name="peft-dora",
                               config={"use_dora": True}),
                        "use_dora = True is not supported"),
        "more layers than the model's": (
            edited(tmp_path, files["mlx-lm"], name="num-layers", config={"num_layers": 16}),
            "num_layers 16 is more than the model's 3 layers"),
        "a NaN scale": (
            edited(tmp_path, files["mlx-lm"], name="nan-scale",
                   config={"lora_parameters": {"rank": RANK, "scale": float("nan")}}),
            "adapter_config.json: lora_parameters.scale must be a finite number, got nan"),
        "an infinite lora_alpha": (
            edited(tmp_path, files["peft"], name="inf-alpha", config={"lora_alpha": float("inf")}),
            "adapter_config.json: lora_alpha must be a finite number, got inf"),
        "a scale no float holds": (
            edited(tmp_path, files["mlx-lm"], name="huge-scale",
                   config={"lora_parameters": {"rank": RANK, "scale": 10 ** 400}}),
            "lora_parameters.scale must be a finite number, got 1000000000"),
        "a rank no matrix has": (
            edited(tmp_path, files["peft"], name="huge-rank",
                   config={"r": 10 ** 400, "use_rslora": True}),
            r"adapter_config.json: r must be a positive integer below 2\*\*31, got 1000000000"),
        "PEFT's config without lora_alpha": (
            edited(tmp_path, files["peft"], name="no-alpha", dropped=("lora_alpha",)),
            "adapter_config.json: lora_alpha must be a finite number, got None"),
        "PEFT's use_rslora as a string": (
            edited(tmp_path, files["peft"], name="rslora-text", config={"use_rslora": "false"}),
            "adapter_config.json: use_rslora must be true or false, got 'false'"),
        "PEFT's layer_replication": (
            edited(tmp_path, files["peft"], name="replication",
                   config={"layer_replication": [[0, 2], [1, 3]]}),
            r"layer_replication = \[\[0, 2\], \[1, 3\]\] is not supported"),
        "an integer matrix": (
            edited(tmp_path, files["mlx-lm"], name="int32", weights={
                **w, f"{Q}.lora_a": w[f"{Q}.lora_a"].astype(mx.int32)}),
            f"adapters.safetensors: {Q}.lora_a is int32, expected a floating-point "
            "matrix"),
        "NaN in a matrix": (
            edited(tmp_path, files["mlx-lm"], name="nan-values", weights={
                **w, f"{Q}.lora_b": w[f"{Q}.lora_b"] * float("nan")}),
            f"adapters.safetensors: {Q}.lora_b holds NaN or infinite values"),
        "a key with no module": (
            edited(tmp_path, files["mlx-lm"], name="no-module", weights={
                ".lora_a": w[f"{Q}.lora_a"], ".lora_b": w[f"{Q}.lora_b"]}),
            r"\.lora_(a|b) is not a LoRA matrix \(expected <module>.lora_a"),
        "both formats' weights": (_both_formats(tmp_path, files),
                                  "holds both adapters.safetensors and adapter_model.safetensors"),
    }


def _both_formats(tmp_path: Path, files) -> Path:
    directory = edited(tmp_path, files["mlx-lm"], name="both-formats")
    mx.save_safetensors(str(directory / "adapter_model.safetensors"),
                        mx.load(str(files["peft"] / "adapter_model.safetensors")))
    return directory


def _config_only(tmp_path: Path, files) -> Path:
    directory = tmp_path / "config-only"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(
        (files["mlx-lm"] / "adapter_config.json").read_text())
    return directory


BAD = ["missing directory", "no weights", "another model's shapes", "unknown module",
       "a layer past the model's", "rank mismatch", "a rank other than the config's",
       "a matrix without its pair", "not a LoRA key", "DoRA", "a full fine-tune",
       "PEFT's DoRA", "more layers than the model's", "a NaN scale", "an infinite lora_alpha",
       "PEFT's config without lora_alpha", "PEFT's use_rslora as a string",
       "a scale no float holds", "a rank no matrix has", "PEFT's layer_replication",
       "an integer matrix", "NaN in a matrix",
       "a key with no module", "both formats' weights"]


@pytest.mark.parametrize("case", BAD)
def test_a_bad_adapter_is_an_error_naming_it(files, tmp_path, case):
    path, message = bad_adapters(files, tmp_path)[case]
    with pytest.raises(SettingError, match=f"^adapter_path: .*{message}") as caught:
        load_checkpoint(files["hf"], path)
    assert caught.value.setting == "adapter_path"
    assert str(path) in str(caught.value)


def test_a_missing_config_is_named(files, tmp_path):
    directory = tmp_path / "weights-only"
    directory.mkdir()
    mx.save_safetensors(str(directory / "adapters.safetensors"), mlx_weights(files))
    with pytest.raises(SettingError, match="weights-only: no adapter_config.json"):
        load_adapter(directory)


def test_the_gguf_base_checks_shapes_too(files, tmp_path):
    """A mismatched adapter over a GGUF base fails the same way, naming the
    adapter file and the model."""
    path, message = bad_adapters(files, tmp_path)["another model's shapes"]
    with pytest.raises(SettingError, match=message):
        load_checkpoint(files["q4_1"], path)


@pytest.mark.parametrize("command", [["generate", "-p", "hi"], ["chat"], ["serve", "--port", "0"],
                                     ["export-llm", "-o", "out"], ["perplexity", "TEXT"]])
def test_the_flag_exits_2_naming_it(files, tmp_path, capsys, command):
    """--adapter-path with a bad adapter: exit status 2, naming the flag and
    the file, before anything runs."""
    text = tmp_path / "text.txt"
    text.write_text("the the the")
    command = [str(text) if arg == "TEXT" else arg for arg in command]
    code = main([*command, "-m", str(files["hf"]), "--adapter-path", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--adapter-path: {tmp_path / 'nope'}: no such adapter directory" in err


def test_the_flag_fuses_the_adapter(files, expected, capsys):
    code = main(["generate", "-m", str(files["hf"]), "--adapter-path", str(files["mlx-lm"]),
                 "--no-chat", "-p", "the", "--max-tokens", "3", "--json", "--max-length", "32"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    llm = load_tiny(files["hf"], adapter_path=files["mlx-lm"])
    assert out["tokens"] == llm.generate("the", max_tokens=3, chat=False).tokens
