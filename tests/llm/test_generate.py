"""Generation with the program-built llama model: the programs' declared
inputs and outputs, logits and greedy tokens against the plain-MLX reference
and mlx-lm, batches, JSON export, the in-program decode loop (and two of them
at once), generation options, sampling, stop conditions, the CLI, and one
short run of the real SmolLM2-135M-Instruct.

Tiny random-weight checkpoints, written once per module, cover dense and
MLX-quantized weights and both RoPE layouts:

- ``gguf``: dense float32 GGUF, untied head, interleaved (traditional) RoPE;
- ``hf``: dense Hugging Face checkpoint, untied head, half-split RoPE;
- ``hf-q``: Hugging Face checkpoint with an 8-bit embedding (also the tied
  head) and 4-bit layers, half-split RoPE.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import family_checks
from llm_fixtures import CHAT_PROMPT, mlx_lm_llama, smollm_path, write_gguf, write_hf
from llm_reference import KVCache, ReferenceModel, greedy_generate

import mlxprog as mp
from mlxprog.cli import main
from mlxprog.limits import Limits
from mlxprog.llm import (
    LLM, GenerationOptions, ModelError, Sampling, build_decode, build_decode_loop, build_prefill,
    export, load, load_exported,
)
from mlxprog.llm.cache import CacheLayout
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.programs import (
    DecodeInputs, DecodeLoopInputs, LogitsOutputs, LoopOutputs, PrefillInputs, StepOutputs,
)

MAX_LENGTH = 64
PROMPT = "the quick brown fox"
KINDS = ["gguf", "hf", "hf-q"]


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    write_gguf(root / "tiny.gguf", tied=False)
    write_hf(root / "hf", tied=False)
    write_hf(root / "hf-q", quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32))
    return {"gguf": root / "tiny.gguf", "hf": root / "hf", "hf-q": root / "hf-q"}


@pytest.fixture(scope="module")
def llms(model_paths) -> dict[str, LLM]:
    # Exact numerics: these models are checked against float references (the
    # int8 mode's own checks are in test_numerics.py and test_perplexity.py).
    return {kind: load(path, max_length=MAX_LENGTH, numerics="exact")
            for kind, path in model_paths.items()}


@pytest.fixture(params=KINDS)
def tiny(request, llms) -> LLM:
    return llms[request.param]


@pytest.fixture
def gguf(llms) -> LLM:
    return llms["gguf"]


def weight_files(path: Path) -> Path | list[Path]:
    """The files holding a checkpoint's tensors."""
    return sorted(path.glob("*.safetensors")) if path.is_dir() else path


def program_logits(llm: LLM, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """Logits after ``prompt`` (prefill program) and after each ``continuation``
    token (one decode step each), from the programs built with ``sampling=None``."""
    return family_checks.program_logits(llm, prompt, continuation, max_length=MAX_LENGTH)


def prompt_inputs(prompt: list[int], key_mask: mx.array,
                  caches: tuple[mx.array, ...]) -> PrefillInputs:
    """The prefill inputs of one whole prompt, written from slot 0."""
    return PrefillInputs(
        tokens=mx.array([prompt], dtype=mx.int32),
        last_index=mx.array([len(prompt) - 1], dtype=mx.int32),
        rope_offset=mx.array([0], dtype=mx.int32), cache_offset=mx.array(0, dtype=mx.int32),
        key_mask=key_mask, key=mx.random.key(0), caches=caches)


def empty_caches(c, batch: int, slots: int) -> tuple[mx.array, ...]:
    """Zeroed KV caches of ``slots`` slots for the model of config ``c``."""
    return tuple(mx.zeros((batch, c.num_kv_heads, slots, c.head_dim))
                 for _ in range(2 * c.num_layers))


def reference_logits(llm: LLM, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """What :func:`program_logits` computes, with the plain-MLX reference model."""
    model = ReferenceModel(llm.checkpoint)
    cache = KVCache.empty(llm.config.num_layers)
    steps = [model(prompt, cache, last_only=True)[-1]]
    steps += [model([token], cache, last_only=True)[-1] for token in continuation]
    return np.array(mx.stack(steps))


# ---------------------------------------------------------------------------
# The programs' inputs and outputs, as declared once in programs.py

CACHES_2 = ["k_cache.0", "v_cache.0", "k_cache.1", "v_cache.1"]


@pytest.mark.parametrize("build, inputs, names", [
    (build_prefill, PrefillInputs,
         ["tokens", "last_index", "rope_offset", "cache_offset", "key_mask", "key", *CACHES_2]),
    (build_decode, DecodeInputs,
     ["tokens", "rope_offset", "cache_offset", "key_mask", "key", *CACHES_2]),
    (build_decode_loop, DecodeLoopInputs,
     ["tokens", "rope_offset", "cache_offset", "key_mask", "key", *CACHES_2, "max_new"]),
])
def test_input_declarations_are_the_programs_inputs(gguf, build, inputs, names):
    # The names and their order are the exported programs' interface (docs/llm.md).
    c = gguf.config
    assert c.num_layers == 2
    program = build(gguf.spec, MAX_LENGTH)
    assert [s.name for s in program.inputs] == list(inputs.names_for(CacheLayout.of(c))) == names
    expected = {f.name: (f.metadata["shape"], f.metadata["dtype"])
                for f in dataclasses.fields(inputs) if f.name != "caches"}
    expected.update({name: (("B", c.num_kv_heads, "S", c.head_dim), "float32")
                     for name in CACHES_2})
    assert {s.name: (tuple(s.shape), s.dtype) for s in program.inputs} == expected


def test_output_declarations_are_the_programs_outputs(gguf):
    c = gguf.config
    captures = gguf.spec.captures(gguf.checkpoint)
    prompt = gguf.tokenizer.encode(PROMPT)
    width = len(prompt)
    inputs = prompt_inputs(prompt, mx.ones((1, width), dtype=mx.bool_),
                           empty_caches(c, 1, width))
    cache_shape = (1, c.num_kv_heads, width, c.head_dim)
    for sampling, outputs in [(Sampling(), StepOutputs), (None, LogitsOutputs)]:
        exe = mp.compile(build_prefill(gguf.spec, MAX_LENGTH, sampling), captures=captures)
        out = outputs.of(exe(**inputs.by_name(CacheLayout.of(c))))
        assert [(a.shape, a.dtype) for a in out.caches] == [(cache_shape, mx.float32)] * 4
        if sampling is None:
            assert (out.logits.shape, out.logits.dtype) == ((1, c.vocab_size), mx.float32)
        else:
            assert (out.next_tokens.shape, out.next_tokens.dtype) == ((1,), mx.int32)
            assert (out.key.shape, out.key.dtype) == ((2,), mx.uint32)
    loop = mp.compile(build_decode_loop(gguf.spec, MAX_LENGTH), captures=captures,
                      callbacks={"emit": lambda tokens: mx.array(False)})
    out = LoopOutputs.of(loop(**DecodeLoopInputs(
        tokens=mx.array([5], dtype=mx.int32), rope_offset=mx.array([width], dtype=mx.int32),
        cache_offset=mx.array(width, dtype=mx.int32), key_mask=mx.ones((1, width + 3), mx.bool_),
        key=mx.random.key(0), caches=empty_caches(c, 1, width + 3),
        max_new=mx.array(3, dtype=mx.int32)).by_name(CacheLayout.of(c))))
    assert (out.next_tokens.shape, out.next_tokens.dtype) == ((1,), mx.int32)
    assert (out.key.shape, out.key.dtype) == ((2,), mx.uint32)
    assert len(out.caches) == 4 and out.made.item() == 3


def test_declarations_map_values_to_names_and_back():
    layout = CacheLayout(num_layers=2, num_kv_heads=1, head_dim=4)
    names = DecodeLoopInputs.names_for(layout)
    inputs = DecodeLoopInputs.of(list(range(len(names))), layout)
    assert (inputs.key, inputs.caches, inputs.max_new) == (4, (5, 6, 7, 8), 9)
    assert inputs.values() == list(range(10))
    assert inputs.by_name(layout) == dict(zip(names, range(10)))
    with pytest.raises(ModelError, match="by_name needs the cache's layout"):
        inputs.by_name()
    with pytest.raises(ModelError, match=r"takes 6 values and the 4 arrays of a cache of 2 "
                       r"layers x 1 KV heads x 4, got 7"):
        DecodeLoopInputs.of(list(range(7)), layout)


# ---------------------------------------------------------------------------
# Program-built model versus the reference forward pass and mlx-lm


def test_prefill_and_decode_logits_match_reference(tiny):
    prompt = tiny.tokenizer.encode(PROMPT)
    continuation = greedy_generate(ReferenceModel(tiny.checkpoint), prompt, 5).tokens
    ours = program_logits(tiny, prompt, continuation)
    expected = reference_logits(tiny, prompt, continuation)
    assert ours.shape == (6, tiny.config.vocab_size)
    assert np.abs(expected).max() > 1  # not trivially small
    np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_greedy_tokens_match_reference(tiny):
    prompt = tiny.tokenizer.encode(PROMPT)
    eos = (*tiny.tokenizer.eos_token_ids, *tiny.config.eos_token_ids)
    expected = greedy_generate(ReferenceModel(tiny.checkpoint), prompt, 20, stop_ids=eos).tokens
    out = tiny.generate(PROMPT, max_tokens=20, chat=False)
    if expected[-1] in eos:
        assert (out.tokens, out.finish_reason) == (expected[:-1], "eos")
    else:
        assert (out.tokens, out.finish_reason) == (expected, "length")


@pytest.mark.parametrize("kind", ["hf", "hf-q"])
def test_hf_loader_matches_mlx_lm_llama(llms, model_paths, kind):
    llm = llms[kind]
    model = mlx_lm_llama(llm, weight_files(model_paths[kind]))

    prompt = llm.tokenizer.encode(PROMPT)
    continuation = greedy_generate(ReferenceModel(llm.checkpoint), prompt, 4).tokens
    cache = model.make_cache()
    steps = [model(mx.array([prompt]), cache=cache)[0, -1]]
    steps += [model(mx.array([[token]]), cache=cache)[0, -1] for token in continuation]
    np.testing.assert_allclose(program_logits(llm, prompt, continuation),
                               np.array(mx.stack(steps)), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# Batches, JSON export, the in-program decode loop


def test_growing_the_cache_in_chunks_changes_nothing(model_paths, gguf):
    # cache_step=4 grows the caches (and retraces the decode step) every 4
    # tokens; the default step of 128 never grows them within max_length.
    chunked = load(model_paths["gguf"], max_length=MAX_LENGTH, cache_step=4)
    for run in (lambda m: m.generate(PROMPT, max_tokens=20, chat=False),
                lambda m: m.generate_batch([PROMPT, "hello"], max_tokens=20, chat=False)[1],
                lambda m: m.generate_in_program(PROMPT, max_tokens=20, chat=False)):
        assert run(chunked).tokens == run(gguf).tokens
    decode = chunked.executable("decode", None)
    assert decode.stats.traces >= 4  # one per cache length reached
    assert all(b["S"] % 4 == 0 or b["S"] == MAX_LENGTH for b in decode.stats.bindings)


def test_batch_rows_equal_single_generation(tiny):
    prompts = [PROMPT, "hello", [{"role": "user", "content": "the"}], "a b c d e f g h i j k"]
    batch = tiny.generate_batch(prompts, max_tokens=12, chat=False)
    assert len(batch) == len(prompts)
    for prompt, row in zip(prompts, batch):
        single = tiny.generate(prompt, max_tokens=12, chat=False)
        assert (row.tokens, row.text, row.finish_reason) == (
            single.tokens, single.text, single.finish_reason)


def test_exported_programs_reproduce_generation(tiny, tmp_path):
    files = export(tiny, tmp_path)
    assert [f.name for f in files] == [
        "prefill.json", "decode.json", "decode_loop.json", "manifest.json"]
    expected = tiny.generate(PROMPT, max_tokens=12, chat=False)
    exported = load_exported(tmp_path)
    assert exported.max_length == MAX_LENGTH
    assert exported.generate(PROMPT, max_tokens=12, chat=False).tokens == expected.tokens
    assert exported.generate_in_program(PROMPT, max_tokens=12, chat=False).tokens == expected.tokens
    # The prefill and decode step return logits: any sampling runs them; the
    # decode loop samples as it was exported.
    sampled = dict(max_tokens=12, chat=False, temperature=0.5, seed=1)
    assert exported.generate(PROMPT, **sampled).tokens == tiny.generate(PROMPT, **sampled).tokens
    with pytest.raises(mp.ProgramError, match="needs programs built"):
        exported.generate_in_program(PROMPT, **sampled)


def test_exported_programs_bind_weights_from_the_model_file(tiny, tmp_path):
    export(tiny, tmp_path)
    weights = weight_files(tiny.checkpoint.path)
    for kind in ("decode", "decode_loop"):
        mp.compile(mp.Program.load(tmp_path / f"{kind}.json"), weights=weights,
                   callbacks={"emit": lambda tokens: mx.array(True)})
    prefill = mp.compile(mp.Program.load(tmp_path / "prefill.json"), weights=weights)
    c = tiny.config
    inputs = prompt_inputs(tiny.tokenizer.encode(PROMPT), mx.ones((1, MAX_LENGTH), dtype=mx.bool_),
                           empty_caches(c, 1, MAX_LENGTH))
    ours = LogitsOutputs.of(prefill(**inputs.by_name(tiny.cache_layout)))
    theirs = LogitsOutputs.of(tiny.executable("prefill", None)(
        **inputs.by_name(tiny.cache_layout)))
    for a, b in zip(ours.values(), theirs.values(), strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    first = mx.argmax(ours.logits[0]).item()
    assert first == tiny.generate(PROMPT, max_tokens=1, chat=False).tokens[0]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["inputs"] == {
        "prefill": list(PrefillInputs.names_for(tiny.cache_layout)),
        "decode": list(DecodeInputs.names_for(tiny.cache_layout)),
        "decode_loop": list(DecodeLoopInputs.names_for(tiny.cache_layout))}


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.5, "seed": 3}])
def test_in_program_loop_matches_generate_and_streams(tiny, sampling):
    expected = tiny.generate(PROMPT, max_tokens=16, chat=False, **sampling)
    pieces = []
    out = tiny.generate_in_program(PROMPT, max_tokens=16, chat=False, on_text=pieces.append,
                                   **sampling)
    assert (out.tokens, out.text, out.finish_reason) == (
        expected.tokens, expected.text, expected.finish_reason)
    # one call per token picked (the EOS included)
    assert len(pieces) == len(out.tokens) + (out.finish_reason == "eos")
    assert "".join(pieces) == out.text


def test_in_program_loop_stops_at_stop_string(gguf):
    full = gguf.generate(PROMPT, max_tokens=20, chat=False).text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    pieces = []
    out = gguf.generate_in_program(PROMPT, max_tokens=20, chat=False, stop=[stop],
                                   on_text=pieces.append)
    assert (out.text, out.finish_reason) == (full[:full.index(stop)], "stop")
    assert "".join(pieces) == out.text


def test_in_program_generation_started_from_on_text_gets_its_own_tokens(gguf):
    # The compiled decode loop is shared; each generation's emit handler is not.
    outer_expected = gguf.generate(PROMPT, max_tokens=10, chat=False)
    inner_expected = gguf.generate("hello", max_tokens=6, chat=False, temperature=1.5, seed=2)
    inner, calls = [], []

    def on_text(piece: str) -> None:
        calls.append(piece)
        if len(calls) == 3:  # inside the outer loop's emit callback
            inner.append(gguf.generate_in_program("hello", max_tokens=6, chat=False,
                                                  temperature=1.5, seed=2))

    outer = gguf.generate_in_program(PROMPT, max_tokens=10, chat=False, on_text=on_text)
    assert (outer.tokens, outer.text) == (outer_expected.tokens, outer_expected.text)
    assert "".join(calls) == outer.text
    assert [g.tokens for g in inner] == [inner_expected.tokens]


def test_in_program_generations_in_two_threads_get_their_own_tokens(gguf):
    prompts = [PROMPT, "hello"]
    expected = [gguf.generate(p, max_tokens=8, chat=False).tokens for p in prompts]
    # Both make all 8 tokens, so both call on_text as often and neither waits
    # at the barrier for a generation that has finished.
    assert [len(tokens) for tokens in expected] == [8, 8]
    gguf.generate_in_program(PROMPT, max_tokens=2, chat=False)  # compile before the threads
    # The loops wait for each other at each token, so they are in flight together.
    barrier = threading.Barrier(2, timeout=60)
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = gguf.generate_in_program(prompts[i], max_tokens=8, chat=False,
                                              on_text=lambda piece: barrier.wait()).tokens
        mx.clear_streams()  # MLX's per-thread state, before the thread ends (docs/llm.md)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results.get(i) for i in range(2)] == expected


def test_the_shared_decode_loop_called_as_compiled_has_no_generation(gguf):
    # Each in-program generation calls the loop with its own emit callback.
    loop = gguf.executable("decode_loop")
    c, width = gguf.config, 8
    inputs = DecodeLoopInputs(
        tokens=mx.array([5], dtype=mx.int32), rope_offset=mx.array([width], dtype=mx.int32),
        cache_offset=mx.array(width, dtype=mx.int32), key_mask=mx.ones((1, width + 3), mx.bool_),
        key=mx.random.key(0), caches=empty_caches(c, 1, width + 3),
        max_new=mx.array(3, dtype=mx.int32))
    with pytest.raises(mp.CallbackError, match="emit callback has no generation to stream to"):
        loop(**inputs.by_name(gguf.cache_layout))


# ---------------------------------------------------------------------------
# Sampling and stop conditions


def test_sampling_is_reproducible_per_seed(gguf):
    def sample(seed):
        return gguf.generate(PROMPT, max_tokens=20, chat=False, temperature=2.0, seed=seed)

    first, again = sample(1), sample(1)
    assert (again.tokens, again.text) == (first.tokens, first.text)
    assert sample(2).tokens != first.tokens
    assert first.tokens != gguf.generate(PROMPT, max_tokens=20, chat=False).tokens


@pytest.mark.parametrize("only_best", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999}])
def test_filters_keeping_only_the_best_token_are_greedy(gguf, only_best):
    greedy = gguf.generate(PROMPT, max_tokens=12, chat=False)
    sampled = gguf.generate(PROMPT, max_tokens=12, chat=False, temperature=2.0, seed=7,
                            **only_best)
    assert sampled.tokens == greedy.tokens


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, r"temperature must be >= 0, got -0.5"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ({"min_p": 1.0}, r"min_p must be in \[0, 1\), got 1.0"),
    ({"top_k": 0}, r"top_k must be a positive integer, got 0"),
    ({"max_tokens": 0}, r"max_tokens must be at least 1, got 0"),
    ({"seed": -1}, r"seed must be a non-negative integer below 2\*\*64, got -1"),
])
def test_invalid_generation_parameters(gguf, kwargs, message):
    with pytest.raises(ModelError, match=message):
        GenerationOptions(**kwargs)
    with pytest.raises(ModelError, match=message):
        GenerationOptions.given(GenerationOptions(), kwargs)
    for method in (gguf.generate, gguf.generate_in_program,
                   lambda prompt, **kw: gguf.generate_batch([prompt], **kw),
                   lambda prompt, **kw: list(gguf.stream(prompt, **kw))):
        with pytest.raises(mp.ProgramError, match=message):
            method(PROMPT, chat=False, **kwargs)


def test_generation_options_are_one_object(gguf):
    options = GenerationOptions(max_tokens=12, temperature=1.5, top_k=20, seed=4, chat=False)
    assert options.sampling == Sampling(temperature=1.5, top_k=20)
    expected = gguf.generate(PROMPT, max_tokens=12, temperature=1.5, top_k=20, seed=4,
                             chat=False)
    assert gguf.generate(PROMPT, options=options).tokens == expected.tokens
    assert gguf.generate_in_program(PROMPT, options=options).tokens == expected.tokens
    assert gguf.generate_batch([PROMPT], options=options)[0].tokens == expected.tokens
    assert "".join(p.text for p in gguf.stream(PROMPT, options=options)) == expected.text
    # Keyword arguments replace the fields of options=.
    assert gguf.generate(PROMPT, options=options, max_tokens=3).tokens == expected.tokens[:3]
    assert GenerationOptions.given(options, {"seed": 5}) == GenerationOptions(
        max_tokens=12, temperature=1.5, top_k=20, seed=5, chat=False)
    # A bare stop string is one string; empty ones are dropped.
    assert GenerationOptions(stop="ab").stop == ("ab",)
    assert GenerationOptions(stop=["", "x", "yz"]).stop == ("x", "yz")
    with pytest.raises(TypeError, match="unexpected keyword argument 'temp'"):
        gguf.generate(PROMPT, temp=0.5)


def test_prompt_errors(gguf):
    with pytest.raises(mp.ProgramError, match=r"the prompt has 100 tokens, but the KV cache "
                                              r"holds 64 \(max_length\)"):
        gguf.generate("x" * 100, chat=False)
    with pytest.raises(mp.ProgramError, match="the prompt is empty"):
        gguf.generate("", chat=False)


def test_stop_strings_end_the_text_before_the_stop(gguf):
    full = gguf.generate(PROMPT, max_tokens=20, chat=False)
    assert full.finish_reason == "length" and len(full.tokens) == 20
    text = full.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    expected = text[:text.index(stop)]
    out = gguf.generate(PROMPT, max_tokens=20, chat=False, stop=["never seen", stop])
    assert (out.text, out.finish_reason) == (expected, "stop")
    assert out.tokens == full.tokens[:len(out.tokens)]
    pieces = [p.text for p in gguf.stream(PROMPT, max_tokens=20, chat=False, stop=[stop])]
    assert "".join(pieces) == gguf.last_generation.text == expected
    # A single stop string may be given bare (not split into characters).
    assert gguf.generate(PROMPT, max_tokens=20, chat=False, stop=stop).text == expected


def test_stream_pieces_join_to_the_text(gguf):
    pieces = [p.text for p in gguf.stream(PROMPT, max_tokens=20, chat=False)]
    result = gguf.last_generation
    assert len(pieces) == 20  # one per token
    assert "".join(pieces) == result.text
    assert result.tokens == gguf.generate(PROMPT, max_tokens=20, chat=False).tokens
    assert result.finish_reason == "length"
    assert result.stats.prompt_tokens == len(gguf.tokenizer.encode(PROMPT))
    assert result.stats.generated_tokens == 20


@pytest.mark.parametrize("kind", ["gguf", "hf"])
def test_eos_ends_generation(llms, tmp_path, kind):
    """The checkpoint is rewritten with a token the model picks mid-way as
    its EOS: the GGUF's tokenizer EOS, or a second id in config.json's list."""
    full = llms[kind].generate(PROMPT, max_tokens=20, chat=False).tokens
    at = next(i for i in range(3, len(full)) if full[i] > 2 and full[i] not in full[:i])
    if kind == "gguf":
        path = tmp_path / "eos.gguf"
        write_gguf(path, tied=False, **{"tokenizer.ggml.eos_token_id": mx.array(
            full[at], dtype=mx.uint32)})
    else:
        path = tmp_path / "eos"
        write_hf(path, tied=False, eos_token_id=[2, full[at]])
    llm = load(path, max_length=MAX_LENGTH)
    out = llm.generate(PROMPT, max_tokens=20, chat=False)
    assert (out.tokens, out.finish_reason) == (full[:at], "eos")
    assert out.text == llm.generate(PROMPT, max_tokens=at, chat=False).text


# ---------------------------------------------------------------------------
# CLI


@pytest.mark.parametrize("flags, options", [
    ([], {}),
    (["--temp", "1.5", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.01", "--seed", "3"],
     {"temperature": 1.5, "top_k": 20, "top_p": 0.9, "min_p": 0.01, "seed": 3}),
    (["--in-program", "--temp", "1.5", "--seed", "3"], {"temperature": 1.5, "seed": 3}),
])
def test_cli_generate_streams_text_and_stats(model_paths, gguf, capsys, flags, options):
    expected = gguf.generate(PROMPT, max_tokens=8, chat=False, **options)
    assert main(["generate", "--model", str(model_paths["gguf"]), "--prompt", PROMPT,
                 "--max-tokens", "8", "--no-chat", *flags]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected.text + "\n"
    prompt_tokens = len(gguf.tokenizer.encode(PROMPT))
    assert f"prompt: {prompt_tokens} tokens" in captured.err
    assert "decode: 8 tokens" in captured.err
    assert "ttft:" in captured.err and "peak memory:" in captured.err
    assert "finish: length (--max-tokens 8)" in captured.err


def test_cli_export_llm_writes_the_programs(model_paths, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export-llm", str(model_paths["gguf"]), "-o", str(out),
                 "--max-length", str(MAX_LENGTH), "--temp", "0.7", "--top-k", "5"]) == 0
    names = ["prefill.json", "decode.json", "decode_loop.json", "manifest.json"]
    assert capsys.readouterr().out.split() == [str(out / name) for name in names]
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sampling"] == dataclasses.asdict(Sampling(temperature=0.7, top_k=5))


@pytest.mark.parametrize("option, value, message", [
    ("--top-p", "1.5", "argument --top-p: must be in (0, 1], got 1.5"),
    ("--seed", "-1", "argument --seed: must be a non-negative integer below 2**64, got -1"),
])
def test_cli_bad_sampling_option_is_an_error(model_paths, capsys, option, value, message):
    assert main(["generate", "--model", str(model_paths["gguf"]), "--prompt", PROMPT,
                 option, value]) == 2
    assert capsys.readouterr().err.endswith(f"mlxprog generate: error: {message}\n"
                                            "Run 'mlxprog generate --help' for usage.\n")


# ---------------------------------------------------------------------------
# The real model


@pytest.fixture(scope="module")
def smollm() -> LLM:
    return load(smollm_path(), max_length=MAX_LENGTH)


def test_smollm_greedy_answer(smollm):
    out = smollm.generate(CHAT_PROMPT, max_tokens=8, chat=False)
    assert out.text.startswith("The capital of France is Paris."), out.text


def test_the_decode_loop_has_no_time_limit(llms):
    # Bounded by its token count: a long in-program generation must not hit
    # the 10 s default of Limits.max_loop_seconds.
    llm = llms["gguf"]
    assert llm.executable("decode_loop").options.max_loop_seconds == math.inf
    assert llm.executable("decode").options.max_loop_seconds == Limits().max_loop_seconds
