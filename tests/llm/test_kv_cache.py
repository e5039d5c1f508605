"""The KV cache's layouts: quantized keys and values (``kv_bits``,
``kv_group_size``) and the rotating cache (``max_kv_size``, ``keep``),
checked against float attention, plain decoding and an explicit reference
that attends to the kept and the most recent tokens."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import TINY, write_gguf
from llm_reference import KVCache, ReferenceModel

import mlxprog
from mlxprog.cli import main as cli_main
from mlxprog.errors import SettingError
from mlxprog.llm import LLM, Chat, GenerationOptions, ModelError, PromptCache, load
from mlxprog.llm.cache import CacheLayout, kv_cache_layout
from mlxprog.llm.engine import PromptTooLongError
from mlxprog.llm.perplexity import perplexity

MAX_LENGTH = 96
#: TINY with a head dim the quantization's groups (32 features at least) divide.
SIZES = dict(TINY, head_dim=32)
PROMPT = "the quick brown fox"
TEXT = "the quick brown fox jumps over the lazy dog; the dog sleeps on"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("kv") / "tiny.gguf"
    write_gguf(path, tied=False, sizes=SIZES)
    return path


@pytest.fixture(scope="module")
def plain(model_path) -> LLM:
    return load(model_path, max_length=MAX_LENGTH, cache_step=16)


def llm_with(model_path, **kv) -> LLM:
    return load(model_path, max_length=MAX_LENGTH, cache_step=16, **kv)


# ---------------------------------------------------------------------------
# The quantized cache's attention op


def _attention_programs(bits: int, group_size: int, window: int | None, softcap: float | None):
    """The quantized op, and kv_cache_sdpa_update over float caches, on
    [2, 4, 3, 64] queries (2 KV heads) and a cache of 12 slots."""
    settings = {k: v for k, v in dict(window=window, softcap=softcap).items() if v is not None}
    b = mlxprog.ProgramBuilder("quantized")
    q = b.input("q", [2, 4, 3, 64], "float32")
    k, v = (b.input(n, [2, 2, 3, 64], "float32") for n in ("k", "v"))
    packed, groups = 64 * bits // 32, 64 // group_size
    parts = [b.input(f"{kind}_{part}", [2, 2, 12, width], dtype)
             for kind in "kv" for part, width, dtype in (("values", packed, "uint32"),
                                                          ("scales", groups, "float32"),
                                                          ("biases", groups, "float32"))]
    offset, key_mask = b.input("offset", [], "int32"), b.input("key_mask", [2, 12], "bool")
    out, *caches = b.quantized_kv_cache_sdpa_update(q, k, v, *parts, offset, key_mask, bits=bits,
                                                    group_size=group_size, **settings)
    quantized = b.build([out, *caches])
    f = mlxprog.ProgramBuilder("float")
    q = f.input("q", [2, 4, 3, 64], "float32")
    k, v = (f.input(n, [2, 2, 3, 64], "float32") for n in ("k", "v"))
    kc, vc = (f.input(n, [2, 2, 12, 64], "float32") for n in ("k_cache", "v_cache"))
    offset, key_mask = f.input("offset", [], "int32"), f.input("key_mask", [2, 12], "bool")
    out, _, _ = f.kv_cache_sdpa_update(q, k, v, kc, vc, offset, key_mask, layout="BHTD",
                                       **settings)
    return quantized, f.build([out])


@pytest.mark.parametrize("bits, group_size, window, softcap",
                         [(8, 64, None, None), (4, 32, None, None), (8, 32, 4, None),
                          (4, 64, None, 5.0)])
def test_quantized_attention_matches_float_attention(bits, group_size, window, softcap):
    quantized, reference = _attention_programs(bits, group_size, window, softcap)
    keys = iter(mx.random.split(mx.random.key(bits + group_size), 5))
    q, k, v = (mx.random.normal(s, key=next(keys)) for s in ([2, 4, 3, 64], [2, 2, 3, 64],
                                                              [2, 2, 3, 64]))
    k_cache, v_cache = (mx.random.normal([2, 2, 12, 64], key=next(keys)) for _ in range(2))
    offset = mx.array(5, dtype=mx.int32)
    key_mask = mx.array([[True] * 12, [False] * 3 + [True] * 9])
    quant = dict(group_size=group_size, bits=bits)
    parts = [*mx.quantize(k_cache, **quant), *mx.quantize(v_cache, **quant)]
    out, *caches = mlxprog.run(quantized, q, k, v, *parts, offset, key_mask)

    def rounded(x):  # what the quantized cache holds of x
        return mx.dequantize(*mx.quantize(x, **quant), **quant)

    # Exactly float attention over the values the quantized cache holds...
    (expected,) = mlxprog.run(reference, q, rounded(k), rounded(v), rounded(k_cache),
                              rounded(v_cache), offset, key_mask)
    np.testing.assert_allclose(np.array(out), np.array(expected), atol=2e-5)
    # ... which is float attention within the quantization's rounding.
    (exact,) = mlxprog.run(reference, q, k, v, k_cache, v_cache, offset, key_mask)
    tolerance = 0.05 if bits == 8 else 0.5
    assert float(mx.abs(out - exact).max()) < tolerance
    # The new keys and values are written at the offset (slots 5..7).
    written = mx.dequantize(*caches[:3], **quant)[:, :, 5:8]
    np.testing.assert_allclose(np.array(written), np.array(rounded(k)), atol=1e-6)
    np.testing.assert_array_equal(np.array(caches[3][:, :, :5]), np.array(parts[3][:, :, :5]))


# ---------------------------------------------------------------------------
# A tiny model with a quantized cache


def test_kv_bits_8_scores_and_decodes_as_the_float_cache(model_path, plain):
    reference = perplexity(plain, TEXT, chunk=8)
    # (mean |logprob difference|, relative perplexity change) allowed: the
    # random tiny model gives about 0.02 and 0.3% with 8 bits, 0.3 and 5% with 4.
    for bits, (mean_error, ppl_change) in ((8, (0.04, 0.01)), (4, (0.6, 0.1))):
        llm = llm_with(model_path, kv_bits=bits, kv_group_size=32)
        scored = perplexity(llm, TEXT, chunk=8)
        errors = np.abs(np.array(scored.logprobs) - np.array(reference.logprobs))
        assert errors.mean() < mean_error
        assert abs(scored.perplexity / reference.perplexity - 1) < ppl_change
    # Greedy tokens are the same on the native kernels and on MLX's ops (the
    # float cache's may differ: the random model's logits are near ties), in
    # the decode loop as one program too.
    llm = llm_with(model_path, kv_bits=8, kv_group_size=32)
    expected = llm_with(model_path, kv_bits=8, kv_group_size=32, native=False).generate(
        PROMPT, max_tokens=8, chat=False).tokens
    assert llm.generate(PROMPT, max_tokens=8, chat=False).tokens == expected
    assert llm.generate_in_program(PROMPT, max_tokens=8, chat=False).tokens == expected
    # Batched rows (left padding) decode as alone.
    prompts = [PROMPT, "the"]
    alone = [llm.generate(p, max_tokens=6, chat=False).tokens for p in prompts]
    assert [g.tokens for g in llm.generate_batch(prompts, max_tokens=6, chat=False)] == alone


def test_layout_memory_per_token():
    # SmolLM2-135M: 30 layers x 3 KV heads x 64.
    float_layout = CacheLayout(30, 3, 64)
    assert float_layout.bytes_per_token() == 2 * 30 * 3 * 64 * 4
    eight = CacheLayout(30, 3, 64, kv_bits=8, kv_group_size=64)
    assert eight.bytes_per_token() == 2 * 30 * 3 * (64 + 8)
    four = CacheLayout(30, 3, 64, kv_bits=4, kv_group_size=32)
    assert four.bytes_per_token() == 2 * 30 * 3 * (32 + 16)
    caches = four.empty(1, 10)
    assert sum(c.nbytes for c in caches) == 10 * four.bytes_per_token()
    assert four.array_names()[:4] == ["k.0.values", "k.0.scales", "k.0.biases", "v.0.values"]


# ---------------------------------------------------------------------------
# The rotating cache


class RotatingKVCache(KVCache):
    """The reference's cache bounded as mlx-lm's RotatingKVCache: the first
    ``keep`` tokens and the most recent ``size - keep`` (this step's
    included), ``seen`` counting every token for the positions."""

    def __init__(self, num_layers: int, size: int, keep: int):
        super().__init__([None] * num_layers, [None] * num_layers)
        self.size, self.keep, self.seen = size, keep, 0

    @property
    def length(self) -> int:
        return self.seen

    def append(self, layer, k, v):
        k, v = super().append(layer, k, v)
        if k.shape[2] > self.size:
            recent = self.size - self.keep
            k, v = (mx.concatenate([x[:, :, :self.keep], x[:, :, -recent:]], axis=2)
                    for x in (k, v))
            self.keys[layer], self.values[layer] = k, v
        return k, v


def rotating_reference(llm: LLM, ids: list[int], max_tokens: int, size: int,
                       keep: int) -> list[int]:
    model = ReferenceModel(llm.checkpoint)
    cache = RotatingKVCache(llm.config.num_layers, size, keep)
    tokens, feed = [], ids
    for _ in range(max_tokens):
        logits = model(feed, cache, last_only=True)[-1]
        cache.seen += len(feed)
        tokens.append(mx.argmax(logits).item())
        feed = tokens[-1:]
    return tokens


@pytest.mark.parametrize("size, keep", [(24, 4), (20, 0)])
def test_rotating_cache_generates_past_its_size_as_the_reference(model_path, size, keep):
    llm = llm_with(model_path, max_kv_size=size, keep=keep)
    ids = llm.tokenizer.encode(PROMPT)
    # Past max_kv_size twice over, and past max_length.
    out = llm.generate(ids, max_tokens=MAX_LENGTH + 10, chat=False)
    assert out.finish_reason == "length" and not out.cache_full
    assert len(out.tokens) == MAX_LENGTH + 10
    expected = rotating_reference(llm, ids, 60, size, keep)
    assert out.tokens[:60] == expected
    # The decode loop as one program rotates the same way.
    assert llm.generate_in_program(ids, max_tokens=60, chat=False).tokens == expected


def test_rotating_batch_rows_decode_as_alone(model_path):
    # keep=0: a padded row's window is then its own last max_kv_size tokens.
    llm = llm_with(model_path, max_kv_size=20, keep=0)
    prompts = [PROMPT, "the lazy"]
    alone = [llm.generate(p, max_tokens=40, chat=False).tokens for p in prompts]
    assert [g.tokens for g in llm.generate_batch(prompts, max_tokens=40, chat=False)] == alone


def test_rotating_quantized_cache(model_path):
    both = llm_with(model_path, max_kv_size=24, kv_bits=8, kv_group_size=32)
    quantized = llm_with(model_path, kv_bits=8, kv_group_size=32)
    out = both.generate(PROMPT, max_tokens=50, chat=False)
    assert len(out.tokens) == 50
    # Until the cache wraps (18 prompt tokens, 24 slots) nothing is evicted.
    assert out.tokens[:6] == quantized.generate(PROMPT, max_tokens=6, chat=False).tokens


# ---------------------------------------------------------------------------
# Prompt caches record the layout


EIGHT = dict(kv_bits=8, kv_group_size=32)


@pytest.mark.parametrize("kv", [{}, EIGHT, dict(kv_bits=4, kv_group_size=32),
                                dict(max_kv_size=40)])
def test_prompt_cache_round_trips_each_layout(model_path, tmp_path, kv):
    llm = llm_with(model_path, **kv)
    cache = llm.cache_prompt(PROMPT, chat=False)
    assert len(cache) > 0
    path = tmp_path / "cache.safetensors"
    cache.save(path)
    loaded = llm.load_prompt_cache(path)
    assert loaded.layout == llm.cache_layout and loaded.tokens == cache.tokens
    for a, b in zip(loaded.caches, cache.caches, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    prompt = cache.tokens + llm.tokenizer.encode(" the")
    out = llm.generate(prompt, max_tokens=5, chat=False, prompt_cache=loaded)
    assert out.stats.cached_tokens == len(cache.tokens)
    assert out.tokens == llm.generate(prompt, max_tokens=5, chat=False).tokens
    # A model whose cache has another layout rejects the file, naming both.
    other = llm_with(model_path, **(EIGHT if kv != EIGHT else {}))
    with pytest.raises(ModelError, match="made by a model of .*; this model has"):
        other.load_prompt_cache(path)
    with pytest.raises(ModelError, match="made by a model of"):
        other.generate(PROMPT, prompt_cache=loaded)


def test_float_prompt_cache_files_of_before_load_as_float(model_path, tmp_path, plain):
    cache = plain.cache_prompt(PROMPT, chat=False)
    path = tmp_path / "old.safetensors"
    layout = plain.cache_layout
    old = {"num_layers": layout.num_layers, "num_kv_heads": layout.num_kv_heads,
           "head_dim": layout.head_dim}  # the layout record before quantized caches
    arrays = {"tokens": mx.array(cache.tokens, dtype=mx.int32),
              **dict(zip(layout.array_names(), cache.caches))}
    mx.save_safetensors(str(path), arrays, metadata={"format": "mlxprog.prompt_cache/1",
                                                     "layout": json.dumps(old)})
    assert plain.load_prompt_cache(path).tokens == cache.tokens


def test_a_wrapped_rotating_row_is_not_stored(model_path):
    llm = llm_with(model_path, max_kv_size=24)
    cache = llm.prompt_cache()
    llm.generate(PROMPT, max_tokens=30, chat=False, prompt_cache=cache)
    assert len(cache) == 0  # its slots no longer follow the tokens
    llm.generate(PROMPT, max_tokens=3, chat=False, prompt_cache=cache)
    assert len(cache) == len(llm.tokenizer.encode(PROMPT)) + 2


# ---------------------------------------------------------------------------
# Bad settings


@pytest.mark.parametrize("kv, setting", [
    (dict(kv_bits=3), "kv_bits"),
    (dict(kv_bits=8, kv_group_size=48), "kv_group_size"),
    (dict(kv_bits=8, kv_group_size=64), "kv_group_size"),  # does not divide head dim 32
    (dict(kv_group_size=32), "kv_group_size"),
    (dict(max_kv_size=MAX_LENGTH), "max_kv_size"),
    (dict(max_kv_size=1), "max_kv_size"),
    (dict(max_kv_size=8, keep=8), "max_kv_size"),
    (dict(max_kv_size=8, keep=-1), "keep"),
    (dict(keep=2), "keep"),
])
def test_out_of_range_settings_name_the_parameter(model_path, kv, setting):
    with pytest.raises(SettingError, match=f"^{setting}: ") as caught:
        llm_with(model_path, **kv)
    assert caught.value.setting == setting


def test_settings_checked_without_a_model():
    with pytest.raises(SettingError, match="max_kv_size: 64 must be below max_length"):
        kv_cache_layout(2, 2, 32, 64, max_kv_size=64)
    assert kv_cache_layout(2, 2, 32, 64, max_kv_size=3).keep == 2
    assert kv_cache_layout(2, 2, 64, 96, kv_bits=4).kv_group_size == 32
    assert kv_cache_layout(2, 2, 64, 96, kv_bits=8).kv_group_size == 64
    with pytest.raises(SettingError, match=r"^kv_bits: must be one of 4, 8, got \[4\]"):
        kv_cache_layout(2, 2, 64, 96, kv_bits=[4])


def test_prompt_longer_than_the_rotating_cache(model_path, capsys):
    llm = llm_with(model_path, max_kv_size=8)
    with pytest.raises(PromptTooLongError, match=r"KV cache holds 8 \(max_kv_size\)") as caught:
        llm.generate(list(range(5, 14)), max_tokens=2, chat=False)
    assert (caught.value.prompt_tokens, caught.value.setting) == (9, "max_kv_size")
    path = str(model_path)
    assert cli_main(["generate", "-m", path, "--max-length", "32", "--max-kv-size", "8",
                     "--no-chat", "-p", TEXT]) == 1
    assert re.search(r"error: the prompt has \d+ tokens, but the KV cache holds 8 "
                     r"\(--max-kv-size\); raise --max-kv-size", capsys.readouterr().err)


def test_chat_with_a_rotating_cache_replies_past_its_size(model_path):
    """A chat turn fits its prompt into the rotating cache (dropping old
    exchanges as it must) and replies for longer than the cache holds."""
    llm = llm_with(model_path, max_kv_size=40)
    chat = Chat(llm, options=GenerationOptions(max_tokens=60, temperature=0.0))
    lengths = []
    for turn in range(3):
        pieces = list(chat.send(f"turn {turn}"))   # 25 tokens with the template
        reply = llm.last_generation
        assert reply.finish_reason == "eos" or len(reply.tokens) == 60
        assert "".join(p.text for p in pieces) == reply.text
        lengths.append(len(reply.tokens))
    assert max(lengths) > 40 and chat.dropped > 0
    with pytest.raises(PromptTooLongError, match=r"holds 40 \(max_kv_size\)"):
        chat.send(TEXT * 4)


def test_export_rejects_a_quantized_cache(model_path, tmp_path):
    from mlxprog.llm import export

    with pytest.raises(ModelError, match="float KV cache"):
        export(llm_with(model_path, kv_bits=8, kv_group_size=32), tmp_path / "out")


def test_prompt_cache_of_another_layout_is_rejected_at_store(plain):
    quantized = PromptCache(CacheLayout(2, 2, 32, kv_bits=8, kv_group_size=32))
    with pytest.raises(ModelError, match="k.0.values must be"):
        quantized.store([1, 2], CacheLayout(2, 2, 32).empty(1, 2) * 3)


# ---------------------------------------------------------------------------
# The server


# Without a recent ring: a prefix reused from a prompt cache then holds the
# numbers a fresh prefill writes (a window's ring holds only the stored
# sequence's last tokens: see test_prompt_cache_reuse_with_a_recent_ring).
@pytest.mark.parametrize("kv", [dict(kv_bits=8, kv_group_size=32, kv_recent=0),
                                dict(kv_bits=4, max_kv_size=48, kv_recent=0)])
def test_the_server_serves_each_layout(model_path, kv):
    """Concurrent requests decode in one batch over the layout's cache and
    answer as the LLM does alone; a repeated prompt reuses the prompt cache
    (its prefix stored in the layout); a reply longer than a rotating cache
    goes on; a prompt too long for it is a 400 naming --max-kv-size."""
    import openai
    from concurrent.futures import ThreadPoolExecutor

    from mlxprog.llm.server import Server

    llm = llm_with(model_path, **kv)
    # Prompt and reply fit the rotating cache: the rows are stored for reuse.
    prompts = [PROMPT, "the lazy dog sleeps", PROMPT]
    alone = [llm.generate(p, max_tokens=20, chat=False).text for p in prompts]
    long_reply = llm.generate(PROMPT, max_tokens=80, chat=False).text
    server = Server(llm, model_id="tiny")
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)

        def complete(prompt, max_tokens=20):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                             temperature=0).choices[0].text

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(complete, prompts[:2])) == alone[:2]
        assert complete(prompts[2]) == alone[2]
        assert server.scheduler.stats()["prompt_tokens"] < sum(
            len(llm.prompt_ids(p, chat=False)) for p in prompts)   # the repeat was cached
        assert complete(PROMPT, max_tokens=80) == long_reply
        if "max_kv_size" in kv:
            with pytest.raises(openai.BadRequestError, match=r"holds 48 \(the server's "
                                                             r"--max-kv-size\)"):
                complete(list(range(5, 60)))
    finally:
        server.stop()


# ---------------------------------------------------------------------------
# The quantized cache's recent ring (kv_recent)


def test_kv_recent_defaults_with_kv_bits_and_is_checked(model_path):
    assert llm_with(model_path, kv_bits=4).cache_layout.kv_recent == 16
    windowless = llm_with(model_path, kv_bits=8, kv_group_size=32, kv_recent=0)
    assert windowless.cache_layout.kv_recent == 0
    assert llm_with(model_path).cache_layout.kv_recent == 0
    with pytest.raises(SettingError, match="kv_recent: is a setting of the quantized cache"):
        llm_with(model_path, kv_recent=8)
    with pytest.raises(SettingError, match="kv_recent: must be an integer >= 0"):
        llm_with(model_path, kv_bits=4, kv_recent=-1)


def test_a_ring_as_long_as_the_text_scores_as_the_float_cache(model_path, plain):
    # Every key within the window: each query reads all its keys unrounded.
    reference = perplexity(plain, TEXT, chunk=8)
    for native in (False, True):
        llm = llm_with(model_path, kv_bits=4, kv_recent=MAX_LENGTH, native=native)
        scored = perplexity(llm, TEXT, chunk=8)
        np.testing.assert_allclose(scored.logprobs, reference.logprobs, atol=2e-4)
    # A short window scores between the quantized cache and the float one.
    windowless = perplexity(llm_with(model_path, kv_bits=4, kv_recent=0), TEXT, chunk=8)
    windowed = perplexity(llm_with(model_path, kv_bits=4, kv_recent=8), TEXT, chunk=8)

    def error(scored):
        return np.abs(np.array(scored.logprobs) - np.array(reference.logprobs)).mean()
    assert error(windowed) < error(windowless)


@pytest.mark.parametrize("native", [False, True])
def test_the_ring_follows_batches_speculation_and_prompt_caches(model_path, native):
    """Greedy tokens with a 4-bit cache and its window are the same alone,
    in a batch whose rows join at other lengths (their slots shifted, the
    window's entries with them), decoded speculatively (rejected drafts'
    entries go unread) and continuing from a prompt cache holding the whole
    sequence so far (its window saved with it)."""
    llm = llm_with(model_path, kv_bits=4, native=native)
    prompts = [PROMPT, "the lazy dog sleeps on the warm mat all day", "a"]
    alone = [llm.generate(p, max_tokens=24, chat=False).tokens for p in prompts]
    batched = llm.generate_batch(prompts, max_tokens=24, chat=False)
    assert [g.tokens for g in batched] == alone
    options = GenerationOptions(max_tokens=24, draft="prompt-lookup", num_draft_tokens=3)
    repeat = PROMPT + " " + PROMPT + " " + PROMPT
    assert llm.generate(repeat, options=options, chat=False).tokens == llm.generate(
        repeat, max_tokens=24, chat=False).tokens
    cache = llm.prompt_cache()
    first = llm.generate(PROMPT, max_tokens=10, chat=False, prompt_cache=cache)
    follow = cache.tokens + llm.tokenizer.encode(" the dog")
    fresh = llm.generate(follow, max_tokens=10, chat=False).tokens
    assert llm.generate(follow, max_tokens=10, chat=False, prompt_cache=cache).tokens == fresh
    assert first.stats.cached_tokens == 0


def test_prompt_cache_reuse_with_a_recent_ring(model_path, tmp_path):
    """A saved prompt cache keeps its window; a file saved with another
    window (or none) loads with an empty one; a prefix shorter than the
    stored sequence finds the window's entries stale and reads those keys
    quantized (valid output, not bit-for-bit a fresh prefill's)."""
    llm = llm_with(model_path, kv_bits=4)
    cache = llm.cache_prompt(PROMPT, chat=False)
    names = llm.cache_layout.array_names()
    tags = np.array(cache.caches[names.index("recent.slots")])
    n = len(cache)
    np.testing.assert_array_equal(np.sort(tags[0]), np.arange(n - 16, n))
    path = tmp_path / "window.safetensors"
    cache.save(path)
    other = llm_with(model_path, kv_bits=4, kv_recent=4)
    loaded = other.load_prompt_cache(path)
    assert loaded.layout == other.cache_layout
    assert (np.array(loaded.caches[other.cache_layout.array_names().index(
        "recent.slots")]) == -1).all()
    prompt = cache.tokens + llm.tokenizer.encode(" the")
    assert len(other.generate(prompt, max_tokens=4, chat=False, prompt_cache=loaded).tokens) == 4
    windowless = llm_with(model_path, kv_bits=4, kv_recent=0).load_prompt_cache(path)
    assert len(windowless.caches) == 2 * 3 * llm.config.num_layers
    assert len(cache.caches) == (2 * 3 + 2) * llm.config.num_layers + 1
    with pytest.raises(ModelError, match="made by a model of .*; this model has"):
        llm_with(model_path, kv_bits=8, kv_group_size=32).load_prompt_cache(path)


@pytest.mark.parametrize("native", [False, True])
def test_a_wrapped_rotating_cache_drops_the_ring_entries_it_overwrites(model_path, native):
    """Once a rotating cache wraps, each step's token goes from the spare
    slot to the oldest slot past the kept ones: the window's entry for that
    slot (its earlier token's float keys) must go, or later steps would read
    the old token's keys for the new one."""
    from mlxprog.llm.engine import Engine

    size, keep = 12, 2
    llm = llm_with(model_path, kv_bits=4, max_kv_size=size, keep=keep, kv_recent=32,
                   native=native)
    request = llm.request("the quick", GenerationOptions(max_tokens=40, chat=False))
    engine = Engine(llm)
    engine.add(request)
    while engine.offset < size + 6:
        engine.step()
    assert engine.wrapped
    tags = np.array(engine.caches[llm.cache_layout.array_names().index("recent.slots")])[0]
    rewritten = {keep + (c - size) % (size - keep) for c in range(size, engine.offset)}
    stale = [t for t in tags if t >= 0 and t != size and t in rewritten]
    assert not stale, (tags, sorted(rewritten))
    assert tags.max() == size  # the spare slot: the newest token's entry


def test_the_server_serves_a_cache_with_a_recent_ring(model_path):
    """Concurrent requests over a 4-bit cache with its window answer as the
    LLM does alone (their rows join the batch at other lengths); a request
    continuing a finished one (as a chat's next turn does) reuses its stored
    sequence, window and all, and answers as a fresh prefill would."""
    import openai
    from concurrent.futures import ThreadPoolExecutor

    from mlxprog.llm.server import Server

    llm = llm_with(model_path, kv_bits=4)
    prompts = [llm.prompt_ids(p, chat=False)
               for p in (PROMPT, "the lazy dog sleeps on the warm mat all day")]
    alone = [llm.generate(p, max_tokens=20, chat=False).tokens for p in prompts]
    server = Server(llm, model_id="tiny")
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)

        def complete(ids):
            return client.completions.create(model="tiny", prompt=ids, max_tokens=20,
                                             temperature=0).choices[0].text

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(complete, prompts)) == [llm.tokenizer.decode(t) for t in alone]
        follow = prompts[0] + alone[0] + prompts[1][:3]
        before = server.scheduler.stats()["prompt_tokens"]
        assert complete(follow) == llm.generate(follow, max_tokens=20, chat=False).text
        # Only the new tokens were prefilled (and the last reply token, never fed).
        assert server.scheduler.stats()["prompt_tokens"] - before <= 4
    finally:
        server.stop()
