"""The generation engine: rows joining and leaving a running batch, prompt
caches (reuse, save and load), chats that keep their cache, per-row picking
(seeds, repetition penalty, log-probabilities), prompts as token ids, and
the KV cache filling up."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import write_gguf
from llm_reference import KVCache, ReferenceModel

from mlxprog.llm import LLM, Chat, GenerationOptions, ModelError, PromptCache, load
from mlxprog.llm.cache import CacheLayout, PromptCachePool, common_prefix
from mlxprog.llm.engine import Engine, PromptTooLongError, prefill_bucket

MAX_LENGTH = 64
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_gguf(path, tied=False)
    return path


@pytest.fixture(scope="module")
def llm(model_path) -> LLM:
    return load(model_path, max_length=MAX_LENGTH, cache_step=16)


def ids_of(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.encode(text)


def drain(engine: Engine, requests, start_after: dict[int, int]) -> None:
    """Run ``engine`` until every request has finished; request i joins after
    ``start_after[i]`` steps."""
    pending = dict(enumerate(requests))
    steps = 0
    while pending or engine.rows:
        for i in [i for i, n in start_after.items() if i in pending and n <= steps]:
            engine.add(pending.pop(i))
        engine.step()
        steps += 1
        assert steps < 500


# ---------------------------------------------------------------------------
# Rows joining and leaving


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.3, "top_k": 50}])
def test_rows_joining_a_running_batch_get_what_they_would_alone(llm, sampling):
    prompts = [PROMPT, "he", "the the the quick brown fox jumps over the lazy dog again", "t"]
    options = [GenerationOptions(max_tokens=n, chat=False, seed=i, **sampling)
               for i, n in enumerate([12, 20, 6, 9])]
    options = [dataclasses.replace(o, logprobs=True) for o in options]
    alone = [llm.generate(p, options=o) for p, o in zip(prompts, options)]
    engine = Engine(llm)
    requests = [llm.request(p, o) for p, o in zip(prompts, options)]
    # The third prompt is longer than the batch so far: the batch shifts right.
    drain(engine, requests, {0: 0, 1: 2, 2: 3, 3: 7})
    for request, expected in zip(requests, alone):
        result = request.result()
        assert (result.tokens, result.text, result.finish_reason) == (
            expected.tokens, expected.text, expected.finish_reason)
        np.testing.assert_allclose(result.logprobs, expected.logprobs, atol=1e-4)
    assert not engine.rows and engine.width == 0


def finish_prefills(engine: Engine, order=min) -> list:
    """Advance ``engine``'s prefills (``order`` picks the next by tokens
    left) until none is left; the (request, piece) pairs, in order."""
    pieces = []
    while engine.prefilling:
        pieces += engine.advance(order(engine.prefilling, key=lambda p: p.remaining))
    return pieces


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_prefills_in_chunks_begun_together_give_what_each_would_alone(llm, chunk):
    """Prompts begun together (one prefill of several rows, of different
    lengths) and run in chunks of ``chunk`` tokens: each row's tokens and
    log-probabilities are those of its whole-prompt generation alone."""
    prompts = [PROMPT, "he", "the the the quick brown fox jumps over the lazy dog again"]
    options = [GenerationOptions(max_tokens=8, chat=False, seed=i, logprobs=True,
                                 temperature=0.9) for i in range(3)]
    alone = [llm.generate(p, options=o) for p, o in zip(prompts, options)]
    engine = Engine(llm, prefill_chunk=chunk)
    requests = [llm.request(p, o) for p, o in zip(prompts, options)]
    [prefill] = engine.begin(requests)
    lengths = sorted(len(r.ids) for r in requests)
    assert [p.chunks for p in engine.prefilling] == [engine._chunks(0, lengths[-1])]
    first = finish_prefills(engine)
    # The shortest prompt completes first, and each leaves once prefilled.
    assert [len(r.ids) for r, _ in first] == lengths and not engine.prefilling
    drain(engine, [], {})
    for request, expected in zip(requests, alone):
        result = request.result()
        assert (result.tokens, result.text) == (expected.tokens, expected.text)
        np.testing.assert_allclose(result.logprobs, expected.logprobs, atol=1e-4)


def test_chunks_are_buckets_within_the_cache(llm):
    engine = Engine(llm, prefill_chunk=20)
    # 20-token chunks, each padded to its bucket; none past MAX_LENGTH.
    assert engine._chunks(0, 45) == [(20, 24), (20, 24), (5, 8)]
    assert engine._chunks(50, 13) == [(13, 14)]  # 16 would pass the 64 slots
    assert Engine(llm)._chunks(3, 45) == [(45, 48)]  # no chunk size: one chunk
    assert Engine(llm)._chunks(3, 58) == [(58, 61)]  # 64 would pass the 64 slots
    with pytest.raises(ModelError, match="prefill_chunk must be at least 1, got 0"):
        Engine(llm, prefill_chunk=0)


def test_a_prefill_resumes_a_prompt_cache_in_chunks(llm):
    options = GenerationOptions(max_tokens=6, chat=False)
    cache = llm.cache_prompt(PROMPT, options=options)
    longer = PROMPT + " jumps over the lazy dog"
    expected = llm.generate(longer, options=options)
    engine = Engine(llm, prefill_chunk=2)
    request = llm.request(longer, options, cache)
    [prefill] = engine.begin([request])
    assert prefill.start == request.cached == len(ids_of(llm, PROMPT))
    finish_prefills(engine)
    drain(engine, [], {})
    assert request.result().tokens == expected.tokens


def test_a_row_cancelled_while_prefilling_leaves_unread(llm):
    options = GenerationOptions(max_tokens=6, chat=False)
    engine = Engine(llm, prefill_chunk=2)
    stays, goes = (llm.request(p, options) for p in (PROMPT, PROMPT + " again and again"))
    engine.begin([stays, goes])
    goes.cancel()
    pieces = finish_prefills(engine)
    assert [r for r, _ in pieces] == [stays] and goes.finish_reason == "cancelled"
    assert goes.read == [] and engine.rows == [stays]


def test_a_cancelled_row_leaves_and_the_others_go_on(llm):
    options = GenerationOptions(max_tokens=15, chat=False)
    expected = llm.generate("he", options=options)
    engine = Engine(llm)
    stay, leave = llm.request("he", options), llm.request(PROMPT, options)
    engine.add(stay)
    engine.add(leave)
    engine.step()
    leave.cancel()
    engine.step()
    assert engine.rows == [stay]
    assert leave.result().finish_reason == "cancelled"
    while engine.rows:
        engine.step()
    assert stay.result().tokens == expected.tokens


def test_the_batch_is_bounded(llm):
    engine = Engine(llm, max_batch=2)
    options = GenerationOptions(max_tokens=5, chat=False)
    for prompt in ("a", "b"):
        engine.add(llm.request(prompt, options))
    assert engine.full
    with pytest.raises(ModelError, match=r"the batch is full \(2 rows\)"):
        engine.add(llm.request("c", options))
    with pytest.raises(ModelError, match=r"max_batch must be in \[1, 64\], got 0"):
        Engine(llm, max_batch=0)


def test_a_full_cache_ends_the_row_with_a_notice_flag(llm):
    prompt = ids_of(llm, "the quick brown fox " * 5)[:50]
    out = llm.generate(prompt, max_tokens=30, chat=False)
    # 14 free slots: the last token picked needs no slot.
    assert (len(out.tokens), out.finish_reason, out.cache_full) == (15, "length", True)
    assert llm.generate(prompt, max_tokens=5).cache_full is False


def test_rows_reaching_the_end_of_the_cache_leave_room_for_the_others(llm):
    long_prompt = ids_of(llm, "the quick brown fox " * 5)[:55]
    options = GenerationOptions(max_tokens=40, chat=False)
    alone = [llm.generate(p, options=options) for p in (long_prompt, "he")]
    engine = Engine(llm)
    requests = [llm.request(p, options) for p in (long_prompt, "he")]
    drain(engine, requests, {0: 0, 1: 4})
    for request, expected in zip(requests, alone):
        assert request.result().tokens == expected.tokens
        assert request.result().cache_full == expected.cache_full


def test_widening_keeps_every_slot_and_adds_empty_ones_one_array_at_a_time(llm):
    """The widened caches hold the old slots and empty ones after them; the
    old arrays are let go as the new ones are made, so the memory in use
    never grows by the whole new cache (it would, widened all at once)."""
    engine = Engine(llm)
    engine.add(llm.request(PROMPT, GenerationOptions(max_tokens=4, chat=False)))
    engine.step()
    mx.eval(engine.caches)
    before = [np.array(x) for x in engine.caches]
    width = engine.width
    new_bytes = sum(x.nbytes for x in before) * (width + 16) // width
    mx.synchronize()
    in_use = mx.get_active_memory()
    mx.reset_peak_memory()
    engine._widen(width + 16)
    # One array (and its padding) at a time: 12 KB of this 24 KB cache; at once: 32 KB.
    assert mx.get_peak_memory() - in_use < new_bytes
    assert len(engine.caches) == len(before)
    for old, new in zip(before, engine.caches):
        new = np.array(new)
        assert new.shape[2] == width + 16
        np.testing.assert_array_equal(new[:, :, :width], old)
        assert not new[:, :, width:].any()


def test_prefill_lengths_are_bucketed():
    assert [prefill_bucket(n) for n in (1, 8, 9, 31, 33, 42, 100, 129, 512, 513, 600, 1100)] == [
        8, 8, 16, 32, 40, 48, 104, 144, 512, 576, 640, 1152]
    lengths = range(1, 8193)
    padded = [prefill_bucket(n) for n in lengths]
    # At most 7 padded tokens or an eighth of the prompt, and few traces:
    # eight lengths an octave past 128.
    assert all(n <= p <= n + max(7, n // 8) for n, p in zip(lengths, padded))
    assert padded == sorted(padded) and len(set(padded)) == 16 + 6 * 8


# ---------------------------------------------------------------------------
# Prompt caches


def test_a_prompt_cache_prefills_only_the_new_tokens(llm):
    first = ids_of(llm, PROMPT)
    cache = llm.prompt_cache()
    out = llm.generate(first, max_tokens=6, chat=False, prompt_cache=cache)
    assert out.stats.cached_tokens == 0
    # The cache holds the prompt and the tokens fed back (the last one picked is not).
    assert cache.tokens == first + out.tokens[:-1]
    follow = cache.tokens + ids_of(llm, " and the")
    reused = llm.generate(follow, max_tokens=8, chat=False, prompt_cache=cache)
    assert reused.stats.cached_tokens == len(first) + 5
    assert reused.tokens == llm.generate(follow, max_tokens=8, chat=False).tokens
    # A prompt that diverges reuses the shared prefix only.
    other = first[:3] + ids_of(llm, " lazy dog")
    again = llm.generate(other, max_tokens=4, chat=False, prompt_cache=cache)
    assert again.stats.cached_tokens == 3
    assert again.tokens == llm.generate(other, max_tokens=4, chat=False).tokens
    # A prompt the cache holds whole still prefills its last token.
    held = list(cache.tokens)
    whole = llm.generate(held, max_tokens=3, chat=False, prompt_cache=cache)
    assert whole.stats.cached_tokens == len(held) - 1


def test_cache_prompt_then_generate_from_it(llm):
    system = ids_of(llm, "the the quick")
    cache = llm.cache_prompt(system, chat=False)
    assert cache.tokens == system
    prompt = system + ids_of(llm, " brown fox")
    out = llm.generate(prompt, max_tokens=6, chat=False, prompt_cache=cache)
    assert out.stats.cached_tokens == len(system)
    assert out.tokens == llm.generate(prompt, max_tokens=6, chat=False).tokens


def test_prompt_caches_save_and_load(llm, tmp_path):
    cache = llm.cache_prompt(PROMPT, chat=False)
    path = tmp_path / "prompt.safetensors"
    cache.save(path)
    loaded = llm.load_prompt_cache(path)
    assert loaded.tokens == cache.tokens and len(loaded.caches) == len(cache.caches)
    for a, b in zip(loaded.caches, cache.caches):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    prompt = cache.tokens + ids_of(llm, " the")
    out = llm.generate(prompt, max_tokens=5, chat=False, prompt_cache=loaded)
    assert out.stats.cached_tokens == len(cache.tokens)
    assert out.tokens == llm.generate(prompt, max_tokens=5, chat=False).tokens
    # Another model's cache, or not a cache at all, is an error naming the file.
    other = PromptCache(CacheLayout(3, 2, 16))
    other.save(tmp_path / "other.safetensors")
    with pytest.raises(ModelError, match="made by a model of 3 layers x 2 KV heads x 16"):
        llm.load_prompt_cache(tmp_path / "other.safetensors")
    mx.save_safetensors(str(tmp_path / "plain.safetensors"), {"x": mx.zeros(2)})
    with pytest.raises(ModelError, match="plain.safetensors: not a prompt cache"):
        llm.load_prompt_cache(tmp_path / "plain.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelError, match="junk.safetensors: cannot read a prompt cache"):
        llm.load_prompt_cache(tmp_path / "junk.safetensors")
    with pytest.raises(ModelError, match="made by a model of 3 layers"):
        llm.generate(PROMPT, prompt_cache=other)


def test_prompt_cache_contents_are_checked():
    layout = CacheLayout(1, 2, 4)
    with pytest.raises(ModelError, match="needs 2 caches, got 1"):
        PromptCache(layout, [1, 2], [mx.zeros((1, 2, 2, 4))])
    with pytest.raises(ModelError, match=r"k.0 must be float32\[1, 2, 2, 4\]"):
        PromptCache(layout, [1, 2], [mx.zeros((1, 2, 3, 4))] * 2)


def test_a_pool_keeps_the_most_recent_prefixes(llm):
    pool = PromptCachePool(llm.cache_layout, capacity=2)
    for text in ("fox", "he he", "the lazy dog"):  # no two share a first token
        llm.generate(text, max_tokens=3, chat=False, prompt_cache=pool)
    assert len(pool) == 2  # the oldest went
    tokens, _ = pool.lookup(ids_of(llm, "the lazy dog sleeps"))
    assert tokens[:len(ids_of(llm, "the lazy dog"))] == ids_of(llm, "the lazy dog")
    follow = tokens + ids_of(llm, " again")
    out = llm.generate(follow, max_tokens=3, chat=False, prompt_cache=pool)
    assert out.stats.cached_tokens == len(tokens)
    # The longer sequence replaces its prefix's entry.
    assert len(pool) == 2
    assert pool.lookup(ids_of(llm, "he he"))[0][:2] == ids_of(llm, "he he")[:2]


# ---------------------------------------------------------------------------
# Picking: log-probabilities, repetition penalty, ids


def reference_logits(llm: LLM, ids: list[int]) -> mx.array:
    """The plain-MLX reference model's logits after ``ids``."""
    return ReferenceModel(llm.checkpoint)(ids, KVCache.empty(llm.config.num_layers),
                                          last_only=True)[-1]


def test_logprobs_are_the_models_log_probabilities(llm):
    ids = ids_of(llm, PROMPT)
    out = llm.generate(ids, max_tokens=4, chat=False, top_logprobs=3)
    pieces = list(llm.stream(ids, max_tokens=4, chat=False, top_logprobs=3))
    for step, (token, logprob) in enumerate(zip(out.tokens, out.logprobs)):
        logits = reference_logits(llm, ids + out.tokens[:step])
        expected = logits - mx.logsumexp(logits)
        assert logprob == pytest.approx(expected[token].item(), abs=1e-3)
        top = pieces[step].top_logprobs
        assert [t for t, _ in top] == np.argsort(-np.array(expected))[:3].tolist()
        assert top[0][0] == token  # greedy
    assert [p.token for p in pieces] == out.tokens


def test_repetition_penalty_follows_the_rule(llm):
    ids = ids_of(llm, PROMPT)
    penalty, context = 1.8, 6
    out = llm.generate(ids, max_tokens=8, chat=False, repetition_penalty=penalty,
                       repetition_context_size=context, logprobs=True)
    tokens = list(ids)
    for expected, logprob in zip(out.tokens, out.logprobs):
        logits = np.array(reference_logits(llm, tokens))
        for seen in set(tokens[-context:]):
            logits[seen] = logits[seen] / penalty if logits[seen] > 0 else logits[seen] * penalty
        assert expected == int(np.argmax(logits))
        # The log-probabilities are those of the penalized distribution.
        shifted = logits - logits.max()
        assert logprob == pytest.approx(shifted[expected] - np.log(np.exp(shifted).sum()),
                                        abs=1e-3)
        tokens.append(expected)
    with pytest.raises(ModelError, match="repetition_penalty must be > 0, got 0"):
        llm.generate(ids, repetition_penalty=0)
    with pytest.raises(ModelError, match="no repetition_penalty"):
        llm.generate_in_program(ids, repetition_penalty=1.2)


def test_logprobs_are_reported_only_when_asked_for(llm):
    plain = llm.generate(PROMPT, max_tokens=4)
    assert plain.logprobs == [] and all(p.logprob is None for p in llm.stream(PROMPT, max_tokens=4))
    asked = llm.generate(PROMPT, max_tokens=4, logprobs=True)
    assert asked.tokens == plain.tokens and len(asked.logprobs) == 4


def test_prompts_are_text_messages_or_ids(llm):
    ids = ids_of(llm, PROMPT)
    assert llm.generate(ids, max_tokens=5).tokens == llm.generate(
        PROMPT, max_tokens=5, chat=False).tokens
    assert llm.generate(mx.array(ids), max_tokens=5).tokens == llm.generate(
        ids, max_tokens=5).tokens
    messages = [{"role": "user", "content": PROMPT}]
    assert llm.generate(messages, max_tokens=5).tokens == llm.generate(
        PROMPT, max_tokens=5).tokens
    with pytest.raises(ModelError, match=r"prompt token 1 is 99999, outside the vocabulary"):
        llm.generate([1, 99999])
    with pytest.raises(ModelError, match="prompt item 0 is 'x'"):
        llm.generate(["x"])
    with pytest.raises(ModelError, match="the prompt is empty"):
        llm.generate([])


def test_a_system_prompt_comes_first(llm):
    with_system = llm.prompt_ids(PROMPT, system_prompt="be brief")
    assert with_system == llm.prompt_ids(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}])
    assert llm.prompt_ids(PROMPT, chat=False, system_prompt="be brief") == ids_of(
        llm, "be brief\n" + PROMPT)


def test_unknown_options_name_the_keyword(llm):
    with pytest.raises(TypeError, match="unexpected keyword argument 'temp'"):
        llm.generate(PROMPT, temp=0.5)
    with pytest.raises(ModelError, match=r"top_logprobs must be in \[0, 20\], got 21"):
        GenerationOptions(top_logprobs=21)
    with pytest.raises(ModelError, match="max_tokens must be at least 1, got 1.5"):
        GenerationOptions(max_tokens=1.5)


# ---------------------------------------------------------------------------
# Chat


def test_chat_turns_reuse_the_cache_and_match_a_fresh_generation(model_path):
    llm = load(model_path, max_length=256)
    chat = Chat(llm, max_tokens=6, system_prompt="the")
    first = list(chat.send("he"))
    assert first[0].stats.cached_tokens == 0
    held = list(chat.cache.tokens)
    second = list(chat.send("fox"))
    assert chat.dropped == 0
    # What the cache shares with the new prompt: the first turn's prompt and
    # as much of the reply as survives being rendered as text and tokenized
    # again (the random model's replies are bytes that may not).
    ids = llm.prompt_ids(chat.conversation()[:-1], chat=True)
    assert second[-1].stats.cached_tokens == min(common_prefix(held, ids), len(ids) - 1)
    assert second[-1].stats.cached_tokens >= first[-1].stats.prompt_tokens
    # The reply equals a generation of the whole conversation from scratch.
    conversation = chat.conversation()[:-1]
    expected = llm.generate(conversation, max_tokens=6)
    assert [p.token for p in second if p.token in expected.tokens] == expected.tokens
    assert "".join(p.text for p in second) == expected.text
    assert chat.conversation()[-1] == {"role": "assistant", "content": expected.text}


def test_chat_drops_the_oldest_turns_when_the_cache_is_outgrown(llm):
    chat = Chat(llm, max_tokens=30, system_prompt="be brief")
    system = [{"role": "system", "content": "be brief"}]
    dropped = []
    for turn in range(6):
        text = f"the quick brown fox {turn}"
        offered = [*chat.messages, {"role": "user", "content": text}]
        pieces = list(chat.send(text))
        assert pieces[-1].finish_reason is not None
        # The fewest oldest exchanges dropped that leave the reply its 30
        # tokens; all of them if none does (the reply may then stop early).
        fits = [d for d in range(len(offered) // 2 + 1)
                if len(llm.prompt_ids(system + offered[2 * d:], chat=True)) + 30
                <= MAX_LENGTH + 1]
        assert chat.dropped == (fits[0] if fits else len(offered) // 2)
        dropped.append(chat.dropped)
    assert sum(dropped) >= 1
    assert chat.conversation()[0] == {"role": "system", "content": "be brief"}
    assert chat.messages[-2] == {"role": "user", "content": "the quick brown fox 5"}
    assert pieces[-1].stats.prompt_tokens < MAX_LENGTH
    with pytest.raises(PromptTooLongError, match="the prompt has 2[0-9]* tokens"):
        chat.send("x" * 200)
    assert chat.messages[-2] == {"role": "user", "content": "the quick brown fox 5"}


def test_an_interrupted_reply_keeps_what_was_generated(llm):
    chat = Chat(llm, max_tokens=20)
    reply = chat.send("he")
    pieces = [next(reply), next(reply), next(reply)]
    reply.close()
    assert chat.messages[-1] == {"role": "assistant",
                                 "content": "".join(p.text for p in pieces)}
    # The chat goes on.
    assert list(chat.send("fox"))[-1].finish_reason is not None
    chat.reset()
    assert chat.messages == [] and len(chat.cache) == 0


# ---------------------------------------------------------------------------
# docs/llm.md


def test_llm_md_generation_and_prompt_cache_examples_run(model_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    docs = (Path(__file__).parents[2] / "docs" / "llm.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", docs, re.S | re.M)
    examples = [b for b in blocks if ("llm.stream(" in b or "prompt_cache()" in b)
                and "load(" not in b]
    assert len(examples) == 2
    llm = load(model_path, max_length=512)
    for block in examples:
        exec(compile(block, "docs/llm.md", "exec"), {"llm": llm, "print": lambda *a: None})
    assert llm.load_prompt_cache(tmp_path / "chat.safetensors").tokens
