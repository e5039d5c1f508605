"""Checks every model family's tests run against mlx-lm.

A family's test writes a tiny random checkpoint with mlx-lm
(:func:`write_checkpoint`: mlx-lm's own ``Model`` built from the
``config.json`` it writes, its parameters saved under their Hugging Face
names), then loads it twice, independently: mlxprog from the directory, and
mlx-lm through its own loader (:func:`mlx_lm_model`, which reads the
checkpoint's ``config.json`` itself). The checks compare logits, greedy
tokens, batches and prompt caches; :class:`MoEChecks` adds a mixture of
experts' checkpoint layouts (per-expert tensors, mlx-lm's quantized
stacks, GGUF's ``*_exps``).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import TINY_VOCAB, write_tiny_tokenizer
from mlx.utils import tree_flatten, tree_map_with_path

import mlxprog as mp
from mlxprog.llm import LLM, load
from mlxprog.llm.cache import CacheLayout
from mlxprog.llm.compiled import program_numerics
from mlxprog.llm.programs import (
    DecodeInputs, LogitsOutputs, PrefillInputs, build_decode, build_prefill,
)

MAX_LENGTH = 96
#: Every family's tiny sizes: 2 query heads per KV head, a vocabulary the
#: tiny tokenizer fills.
TINY_CONFIG = dict(hidden_size=64, num_hidden_layers=3, intermediate_size=128,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   rms_norm_eps=1e-6, vocab_size=TINY_VOCAB, max_position_embeddings=512,
                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
#: A prompt of 40 tokens, longer than the families' tiny sliding windows.
PROMPT_IDS = [(7 * i + 3) % (TINY_VOCAB - 3) + 3 for i in range(40)]


def write_checkpoint(directory: Path, config: dict, seed: int = 0) -> Path:
    """A tiny random-weight checkpoint of ``config`` (a ``config.json``)
    made by mlx-lm: its model class for the ``model_type``, every parameter
    random (norm weights too, so a norm's ``1 + w`` matters), saved as
    ``model.safetensors`` with ``config.json`` and the tiny tokenizer."""
    from mlx_lm.utils import _get_classes

    directory.mkdir(parents=True, exist_ok=True)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    key = mx.random.key(seed)

    def randomize(path: str, p: mx.array) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        if p.ndim == 1:
            return 0.5 + mx.random.uniform(shape=p.shape, key=sub)
        return 0.2 * mx.random.normal(p.shape, key=sub)

    model.update(tree_map_with_path(randomize, model.parameters()))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(directory / "model.safetensors"), weights)
    (directory / "config.json").write_text(json.dumps(config))
    write_tiny_tokenizer(directory)
    return directory


def mlx_lm_model(directory: Path):
    """mlx-lm's model of the checkpoint, through mlx-lm's own loading."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(directory))
    return model


def mlx_lm_logits(model, tokens: list[int]) -> np.ndarray:
    """mlx-lm's logits after every token of ``tokens`` ([T, V])."""
    return np.array(model(mx.array([tokens]))[0].astype(mx.float32))


def mlx_lm_greedy(model, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens by mlx-lm with its own caches."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    out = []
    for _ in range(n):
        token = int(mx.argmax(logits).item())
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)[0, -1]
    return out


def load_tiny(directory: Path, **options) -> LLM:
    """mlxprog's LLM of the checkpoint (caches of :data:`MAX_LENGTH`)."""
    return load(directory, max_length=MAX_LENGTH, **options)


_PROGRAMS: dict[tuple[LLM, int, CacheLayout | None], tuple] = {}


def program_logits(llm: LLM, prompt: list[int], continuation: list[int] = (),
                   max_length: int = MAX_LENGTH, kv: CacheLayout | None = None) -> np.ndarray:
    """mlxprog's logits after ``prompt`` (the prefill program) and after
    each ``continuation`` token (a decode step each), [1 + len(continuation),
    V], from the step programs built with ``sampling=None`` and the numerics
    ``llm.generate`` runs them with, on caches of ``max_length`` slots laid
    out as ``kv`` says (None: float32)."""
    c = llm.config
    if (llm, max_length, kv) not in _PROGRAMS:
        captures = llm.spec.captures(llm.checkpoint)
        _PROGRAMS[llm, max_length, kv] = tuple(
            mp.compile(build(llm.spec, max_length, sampling=None,
                             numerics=program_numerics(kind, llm.numerics), kv=kv),
                       captures=captures)
            for kind, build in (("prefill", build_prefill), ("decode", build_decode)))
    prefill, decode = _PROGRAMS[llm, max_length, kv]
    key_mask = mx.ones((1, max_length), dtype=mx.bool_)
    key = mx.random.key(0)
    layout = kv or CacheLayout.of(c)  # the programs' cache
    caches = layout.empty(1, max_length)
    out = LogitsOutputs.of(prefill(**PrefillInputs(
        tokens=mx.array([prompt], dtype=mx.int32),
        last_index=mx.array([len(prompt) - 1], dtype=mx.int32),
        rope_offset=mx.array([0], dtype=mx.int32), cache_offset=mx.array(0, dtype=mx.int32),
        key_mask=key_mask, key=key, caches=caches).by_name(layout)))
    steps = [out.logits[0]]
    for position, token in enumerate(continuation, start=len(prompt)):
        out = LogitsOutputs.of(decode(**DecodeInputs(
            tokens=mx.array([token], dtype=mx.int32),
            rope_offset=mx.array([position], dtype=mx.int32),
            cache_offset=mx.array(position, dtype=mx.int32), key_mask=key_mask, key=key,
            caches=out.caches).by_name(layout)))
        steps.append(out.logits[0])
    return np.array(mx.stack(steps))


def check_logits_match_mlx_lm(directory: Path, prompt: list[int] = PROMPT_IDS,
                              decode_steps: int = 6, tolerance: float = 1e-4,
                              **options) -> None:
    """The prefill's logits after ``prompt`` and ``decode_steps`` decode
    steps' (fed mlx-lm's greedy tokens) match mlx-lm's within float32
    tolerance (``options``: the model's load options)."""
    model = mlx_lm_model(directory)
    continuation = mlx_lm_greedy(model, prompt, decode_steps)
    expected = mlx_lm_logits(model, prompt + continuation)[len(prompt) - 1:]
    assert np.abs(expected).max() > 1  # not trivially small
    ours = program_logits(load_tiny(directory, **options), prompt, continuation)
    np.testing.assert_allclose(ours, expected, rtol=tolerance, atol=tolerance)


def check_greedy_matches_mlx_lm(directory: Path, prompt: list[int] = PROMPT_IDS,
                                n: int = 16) -> None:
    """``n`` greedy tokens equal mlx-lm's, up to an end-of-sequence token."""
    expected = mlx_lm_greedy(mlx_lm_model(directory), prompt, n)
    llm = load_tiny(directory)
    eos = set(llm.tokenizer.eos_token_ids) | set(llm.config.eos_token_ids)
    stop = next((i for i, t in enumerate(expected) if t in eos), None)
    out = llm.generate(prompt, max_tokens=n, chat=False)
    if stop is None:
        assert (out.tokens, out.finish_reason) == (expected, "length")
    else:
        assert (out.tokens, out.finish_reason) == (expected[:stop], "eos")


def check_batch_and_prompt_cache(directory: Path) -> None:
    """Batched rows (prompts of different lengths, left-padded) and a
    generation that reuses a prompt cache give single generation's tokens."""
    llm = load_tiny(directory)
    prompts = [PROMPT_IDS, PROMPT_IDS[:9], PROMPT_IDS[5:30]]
    singles = [llm.generate(p, max_tokens=10, chat=False).tokens for p in prompts]
    batch = llm.generate_batch(prompts, max_tokens=10, chat=False)
    assert [row.tokens for row in batch] == singles
    cache = llm.cache_prompt(PROMPT_IDS[:20])
    reused = llm.generate(PROMPT_IDS, prompt_cache=cache, max_tokens=10, chat=False)
    assert reused.tokens == singles[0]


_RANK_SCRIPT = """
import json
import mlx.core as mx
from mlxprog.llm import load

llm = load({path!r}, max_length={max_length}, group=mx.distributed.init(), numerics="exact")
out = llm.generate({prompt!r}, max_tokens=12, chat=False, logprobs=True)
print(json.dumps([llm.rank, llm.world_size, out.tokens, out.logprobs]), flush=True)
"""


def check_two_ranks_generate_as_one_process(path) -> None:
    """Two tensor-parallel ranks of the checkpoint at ``path`` give one
    process's greedy tokens and nearly its log-probabilities (exact
    numerics)."""
    from distributed_helpers import run_ranks

    want = load(path, max_length=MAX_LENGTH, numerics="exact").generate(
        PROMPT_IDS, max_tokens=12, chat=False, logprobs=True)
    script = _RANK_SCRIPT.format(path=str(path), max_length=MAX_LENGTH, prompt=PROMPT_IDS)
    for r in run_ranks(script, 2, timeout=180):
        assert r.returncode == 0, f"rank {r.rank} (status {r.returncode}):\n{r.stderr}"
        rank, world_size, tokens, logprobs = json.loads(r.stdout.splitlines()[-1])
        assert (rank, world_size) == (r.rank, 2)
        assert tokens == want.tokens
        assert all(abs(a - b) < 1e-4 for a, b in zip(logprobs, want.logprobs, strict=True))


class MlxLmParity:
    """The checks above as tests: a family's test module defines a
    ``checkpoint`` fixture (the tiny checkpoint directories, one per
    config) and ``class TestMlxLmParity(MlxLmParity)``, which collects these
    for every checkpoint."""

    def test_logits_match_mlx_lm(self, checkpoint):
        check_logits_match_mlx_lm(checkpoint)

    def test_greedy_tokens_match_mlx_lm(self, checkpoint):
        check_greedy_matches_mlx_lm(checkpoint)

    def test_batch_and_prompt_cache_match_single_generation(self, checkpoint):
        check_batch_and_prompt_cache(checkpoint)


# -- mixtures of experts ---------------------------------------------------------

def write_per_expert_checkpoint(directory: Path, out: Path,
                                names: dict[str, str] | None = None) -> Path:
    """The mlx-lm checkpoint in ``directory`` as an original Hugging Face
    checkpoint at ``out``: each stacked ``<block>.switch_mlp.<projection>``
    tensor saved as one tensor per expert, ``<block>.experts.<e>.<name>``
    (``names``: the projections' names there, default their own)."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, value in mx.load(str(directory / "model.safetensors")).items():
        block, found, rest = name.partition(".switch_mlp.")
        if not found:
            weights[name] = value
            continue
        projection, part = rest.split(".", 1)
        projection = (names or {}).get(projection, projection)
        for e in range(value.shape[0]):
            weights[f"{block}.experts.{e}.{projection}.{part}"] = value[e]
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    for file in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (directory / file).exists():
            (out / file).write_text((directory / file).read_text())
    return out


def write_quantized_checkpoint(directory: Path, out: Path, bits: int = 4,
                               group_size: int = 32, router_bits: int | None = None) -> Path:
    """The checkpoint in ``directory`` quantized by mlx-lm (``nn.quantize``
    of its model: the expert stacks become ``QuantizedSwitchLinear``, the
    routers quantized too, to ``router_bits`` where given, as
    mlx-community's mixed recipes keep them) and saved as mlx-lm saves it,
    with the per-layer entries of its ``quantization`` config, at ``out``."""
    import mlx.nn as nn

    out.mkdir(parents=True, exist_ok=True)
    model = mlx_lm_model(directory)
    routers: dict[str, dict] = {}

    def settings(path: str, module) -> bool | dict:
        if router_bits is None or not path.endswith(".gate"):
            return hasattr(module, "to_quantized")
        routers[path] = {"group_size": group_size, "bits": router_bits}
        return routers[path]

    nn.quantize(model, group_size=group_size, bits=bits, class_predicate=settings)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = json.loads((directory / "config.json").read_text())
    config["quantization"] = {"group_size": group_size, "bits": bits, **routers}
    (out / "config.json").write_text(json.dumps(config))
    write_tiny_tokenizer(out)
    return out


class MoEChecks:
    """A mixture of experts' checks, for a family test module whose
    ``checkpoint`` fixture gives its tiny checkpoints: the original Hugging
    Face layout (one tensor per expert) and mlx-lm's quantized checkpoint
    against mlx-lm, the float GGUF file against the checkpoint.
    ``EXPERT_NAMES`` maps mlx-lm's projection names to the family's Hugging
    Face ones."""

    EXPERT_NAMES: dict[str, str] = {}

    def not_in_gguf(self, config: dict) -> str | None:
        """Why llama.cpp's GGUF files cannot hold the model of ``config``
        (None: they can)."""
        if config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
            return "llama.cpp's architecture has experts in every layer"
        return None

    def test_per_expert_checkpoint_matches_mlx_lm(self, checkpoint, tmp_path):
        """One tensor per expert (what Hugging Face publishes), stacked at
        load, gives mlx-lm's logits (mlx-lm stacks them in its sanitize)."""
        directory = write_per_expert_checkpoint(checkpoint, tmp_path / "per-expert",
                                                self.EXPERT_NAMES)
        llm = load_tiny(directory)
        stacks = [n for n, w in llm.checkpoint.weights.items() if w.ndim == 3]
        assert stacks and all(".experts.*." in llm.checkpoint.source_names[n] for n in stacks)
        check_logits_match_mlx_lm(directory, decode_steps=3)

    def test_quantized_checkpoint_matches_mlx_lm(self, checkpoint, tmp_path):
        """mlx-lm's 4-bit checkpoint (quantized expert stacks, as
        mlx-community publishes), its routers at 8 bits, loads quantized
        and gives mlx-lm's logits."""
        directory = write_quantized_checkpoint(checkpoint, tmp_path / "q4", router_bits=8)
        llm = load_tiny(directory, numerics="exact")
        quantization = llm.checkpoint.quantization
        stacks = [n for n, w in llm.checkpoint.weights.items()
                  if w.ndim == 3 and n.endswith(".weight")]
        assert stacks and all(quantization[n[:-len(".weight")]].bits == 4 for n in stacks)
        routers = [n for n in quantization if n.endswith(".gate")]
        assert routers and all(quantization[n].bits == 8 for n in routers)
        check_logits_match_mlx_lm(directory, decode_steps=3, numerics="exact")

    def test_gguf_gives_the_checkpoints_logits(self, checkpoint, tmp_path):
        """The float GGUF file llama.cpp's converter would write (experts
        merged into ``*_exps`` tensors, the router ``ffn_gate_inp``) gives
        the checkpoint's logits."""
        from gguf_writer import write_gguf_from_hf

        reason = self.not_in_gguf(json.loads((checkpoint / "config.json").read_text()))
        if reason:
            pytest.skip(reason)
        gguf = load_tiny(write_gguf_from_hf(checkpoint, tmp_path / "model.gguf"))
        assert "blk.0.ffn_gate_exps.weight" in gguf.checkpoint.source_names.values()
        continuation = [5, 60, 7]
        np.testing.assert_allclose(program_logits(gguf, PROMPT_IDS, continuation),
                                   program_logits(load_tiny(checkpoint), PROMPT_IDS,
                                                  continuation), rtol=1e-4, atol=1e-4)
