"""Speculative decoding: prompt lookup and a draft model give the plain
decode's greedy tokens (log-probabilities, repetition penalty, batches and
SmolLM2 too), the accept/reject rule keeps the target's distribution (the
rule alone, and generations sampled end to end), and bad settings fail
clearly."""

from __future__ import annotations

import argparse
from collections import Counter

import mlx.core as mx
import numpy as np
import openai
import pytest
from llm_fixtures import TINY, TINY_VOCAB, smollm_path, tiny_tokenizer_metadata, write_gguf

from mlxprog.llm import GenerationOptions, ModelError, SettingError, load
from mlxprog.llm.cli import add_commands
from mlxprog.llm.programs import Picking, Sampling
from mlxprog.llm.server import Server
from mlxprog.llm.speculative import Draft, PromptLookup, judge

MAX_LENGTH = 96
# Repeats, so that prompt lookup finds matches.
PROMPT = "the cat the dog the cat the dog the cat the"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("speculative")
    write_gguf(folder / "tiny.gguf", tied=False)
    write_gguf(folder / "other.gguf", tied=True)   # same vocabulary, other weights
    # Eight more tokens: another vocabulary.
    tokenizer = tiny_tokenizer_metadata()
    tokens = tokenizer["tokenizer.ggml.tokens"] + [f"extra{i}" for i in range(8)]
    write_gguf(folder / "wider.gguf", sizes=dict(TINY, vocab_size=len(tokens)),
               **{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type":
                  mx.array([3] * 3 + [1] * (len(tokens) - 3), dtype=mx.int32)})
    return folder


@pytest.fixture(scope="module")
def llm(paths):
    return load(paths / "tiny.gguf", max_length=MAX_LENGTH, cache_step=16,
                draft_model=paths / "other.gguf")


def test_prompt_lookup_drafts_what_followed_the_last_ngram():
    lookup = PromptLookup(num_draft_tokens=3, max_ngram=2)
    draft = lookup.propose([5, 6, 7, 8, 9, 1, 6, 7], 8, mx.random.key(0))
    assert draft.tokens.tolist() == [8, 9, 1]      # after the earlier "6 7"
    assert lookup.propose([5, 6, 7, 8, 9, 1, 6, 7, 2], 8, mx.random.key(0)) is None
    assert [lookup.drafting(), lookup.drafting()] == [False, True]   # a miss skips a step
    # A one-token match drafts one token.
    assert lookup.propose([5, 6, 7, 8, 9, 1, 6, 7, 2, 9], 8, mx.random.key(0)).tokens.tolist() \
        == [1]


@pytest.mark.parametrize("draft", ["prompt-lookup", "model"])
def test_greedy_is_token_for_token_the_plain_decode(llm, draft):
    options = dict(max_tokens=40, chat=False, logprobs=True, top_logprobs=3)
    plain = llm.generate(PROMPT, draft="none", **options)
    fast = llm.generate(PROMPT, draft=draft, num_draft_tokens=4, **options)
    assert fast.tokens == plain.tokens
    np.testing.assert_allclose(fast.logprobs, plain.logprobs, atol=1e-4)
    assert fast.stats.drafted_tokens > 0 and plain.stats.drafted_tokens == 0
    assert "drafted:" in fast.stats.summary()


def test_a_model_drafting_for_itself_has_its_drafts_kept(paths):
    llm = load(paths / "tiny.gguf", max_length=MAX_LENGTH, cache_step=16, numerics="exact",
               draft_model=paths / "tiny.gguf")
    plain = llm.generate(PROMPT, draft="none", max_tokens=30, chat=False)
    fast = llm.generate(PROMPT, max_tokens=30, chat=False)   # the draft model by default
    assert fast.tokens == plain.tokens
    assert fast.stats.accepted_tokens >= 0.8 * fast.stats.drafted_tokens > 0


def test_repetition_penalty_stops_and_batches_match_plain(llm):
    options = dict(max_tokens=30, chat=False, repetition_penalty=1.3, stop=["dog"])
    for draft in ("prompt-lookup", "model"):
        assert llm.generate(PROMPT, draft=draft, **options).text == \
            llm.generate(PROMPT, draft="none", **options).text
    prompts = [PROMPT, "a b a b a b", "the the the"]
    plain = llm.generate_batch(prompts, draft="none", max_tokens=20, chat=False)
    fast = llm.generate_batch(prompts, draft="prompt-lookup", max_tokens=20, chat=False)
    assert [g.tokens for g in fast] == [g.tokens for g in plain]


def test_smollm2_greedy_matches_plain_decoding():
    llm = load(smollm_path(), max_length=512)
    prompt = ("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog "
              "near the river bank.")
    plain = llm.generate(prompt, max_tokens=32, draft="none")
    fast = llm.generate(prompt, max_tokens=32, draft="prompt-lookup")
    assert fast.tokens == plain.tokens
    assert fast.stats.accepted_tokens > 0


# ---------------------------------------------------------------------------
# The accept/reject rule keeps the target distribution


def total_variation(counts: Counter, probs: np.ndarray, n: int) -> float:
    empirical = np.zeros_like(probs)
    for token, c in counts.items():
        empirical[token] = c / n
    return 0.5 * np.abs(empirical - probs).sum()


@pytest.mark.parametrize("drafter", ["one-hot", "distribution"])
def test_judge_draws_the_first_token_from_the_target(drafter):
    vocab, n = 6, 4000
    target = mx.array([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5]] * 3)   # k = 2 drafts, then the bonus
    picking = Picking(Sampling(temperature=1.0))
    p = np.array(mx.softmax(target[0]))
    q = mx.softmax(mx.array([[0.0, 2.0, 0.0, 1.0, 0.0, 0.0]] * 2), axis=-1)
    counts: Counter = Counter()
    key = mx.random.key(1)
    draw = mx.random.key(2)
    for _ in range(n):
        draw, sub = mx.random.split(draw)
        if drafter == "one-hot":   # prompt lookup: a fixed draft
            draft = Draft(mx.array([1, 3], dtype=mx.int32))
        else:                      # a draft model: drafts drawn from q
            draft = Draft(mx.random.categorical(mx.log(q), key=sub).astype(mx.int32), q)
        verdict = judge(target, draft, picking, mx.full((1, 1), -1, dtype=mx.int32), key)
        key = verdict.key
        counts[verdict.tokens[0]] += 1
    # Sampling noise alone: about sqrt(vocab / n) / 2 ~ 0.02.
    assert total_variation(counts, p, n) < 0.04


def test_sampled_generations_keep_the_plain_distribution(paths):
    """The first three tokens sampled (top-k 3: 27 outcomes) with prompt
    lookup and plainly, over many seeds: the same distribution. The prompt
    holds every token once, so prompt lookup always has a draft."""
    llm = load(paths / "tiny.gguf", max_length=320, cache_step=64)
    runs = 300
    options = dict(max_tokens=3, chat=False, temperature=1.0, top_k=3)
    ids = np.random.default_rng(0).permutation(TINY_VOCAB).tolist()
    plain = Counter(tuple(llm.generate(ids, draft="none", seed=s, **options).tokens)
                    for s in range(runs))
    fast_runs = [llm.generate(ids, draft="prompt-lookup", seed=s + runs, **options)
                 for s in range(runs)]
    assert sum(g.stats.drafted_tokens for g in fast_runs) >= runs   # drafts were judged
    fast = Counter(tuple(g.tokens) for g in fast_runs)
    outcomes = set(plain) | set(fast)
    tv = 0.5 * sum(abs(plain[o] - fast[o]) for o in outcomes) / runs
    # Two samples of 300 over ~27 outcomes: sampling noise gives TV ~0.1.
    assert tv < 0.2


# ---------------------------------------------------------------------------
# Bad settings


def test_a_draft_model_with_another_vocabulary_is_refused(paths):
    with pytest.raises(SettingError, match="draft_model.*vocabulary") as info:
        load(paths / "tiny.gguf", draft_model=paths / "wider.gguf")
    assert info.value.setting == "draft_model"
    with pytest.raises(SettingError, match="draft_model"):
        load(paths / "tiny.gguf", draft_model=paths / "missing.gguf")


def test_bad_options_name_themselves(paths):
    for field, value in [("draft", "ngram"), ("num_draft_tokens", 0),
                         ("prompt_lookup_ngram", 9)]:
        with pytest.raises(ModelError, match=field):
            GenerationOptions(**{field: value})
    plain = load(paths / "tiny.gguf", max_length=MAX_LENGTH)
    with pytest.raises(ModelError, match="draft_model"):
        plain.generate(PROMPT, draft="model", max_tokens=2)
    with pytest.raises(ModelError, match="in-program.*speculative"):
        plain.generate_in_program(PROMPT, draft="prompt-lookup", max_tokens=2)


def test_cli_flags_are_checked(capsys):
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["generate", "-p", "x", "--draft", "prompt-lookup",
                              "--num-draft-tokens", "5", "--draft-model", "d.gguf"])
    assert (args.draft, args.num_draft_tokens, args.draft_model) == ("prompt-lookup", 5,
                                                                     "d.gguf")
    for flags in (["--num-draft-tokens", "0"], ["--draft", "ngram"]):
        with pytest.raises(SystemExit) as info:
            parser.parse_args(["generate", "-p", "x", *flags])
        assert info.value.code == 2
        assert flags[0] in capsys.readouterr().err


def test_the_server_takes_draft_per_request(paths, llm):
    server = Server(load(paths / "tiny.gguf", max_length=MAX_LENGTH, cache_step=16),
                    model_id="tiny", max_batch=2)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)
        reply = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                          temperature=0, extra_body={"draft": "prompt-lookup"})
        plain = llm.generate(PROMPT, draft="none", max_tokens=24, chat=False)
        assert reply.choices[0].text == plain.text
        with pytest.raises(openai.BadRequestError, match="draft"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                      extra_body={"draft": "ngram"})
        with pytest.raises(openai.BadRequestError, match="draft_model"):   # none loaded
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                      extra_body={"draft": "model"})
        with pytest.raises(openai.BadRequestError, match="num_draft_tokens"):
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                      extra_body={"num_draft_tokens": 0})
    finally:
        server.stop()


def test_a_prompt_cache_keeps_only_the_kept_tokens(llm):
    """The cache a speculative generation stores holds the prompt and the
    kept tokens (no rejected draft): a chat turn reusing it answers as
    plain decoding does."""
    cache = llm.prompt_cache()
    first = llm.generate(PROMPT, draft="prompt-lookup", max_tokens=40, chat=False,
                         prompt_cache=cache)
    assert first.stats.drafted_tokens > 0
    follow = llm.tokenizer.encode(PROMPT) + first.tokens + llm.tokenizer.encode(" the cat")
    again = llm.generate(follow, draft="prompt-lookup", max_tokens=16, prompt_cache=cache)
    assert again.stats.cached_tokens > len(first.tokens)
    assert again.tokens == llm.generate(follow, draft="none", max_tokens=16).tokens


@pytest.mark.parametrize("cache", [dict(kv_bits=8, kv_group_size=32), dict(max_kv_size=72)])
def test_quantized_and_rotating_caches_match_plain(paths, cache):
    """A quantized cache is verified as decoded; a rotating one drafts until
    it would wrap, then steps plainly (90 tokens run past its 72)."""
    path = paths / "heads32.gguf"   # a head dim that 32-feature groups divide
    if not path.exists():
        write_gguf(path, tied=False, sizes=dict(TINY, head_dim=32))
    llm = load(path, max_length=MAX_LENGTH, cache_step=16, **cache)
    options = dict(max_tokens=90, chat=False)
    fast = llm.generate(PROMPT, draft="prompt-lookup", **options)
    assert fast.tokens == llm.generate(PROMPT, draft="none", **options).tokens
    assert fast.stats.drafted_tokens > 0
