"""Chat fidelity: an interrupted reply stays cached for the next turn, and
old exchanges make room for a reply before it starts, never after it has
been cut at the cache limit."""

from __future__ import annotations

import numpy as np
import pytest
from llm_fixtures import smollm_path, write_gguf

from mlxprog.llm import LLM, Chat, load
from mlxprog.llm.engine import Request

MAX_LENGTH = 128

#: Two exchanges of one-token characters, so their prompt lengths are known.
HISTORY = [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d e f"},
           {"role": "user", "content": "g h i"}, {"role": "assistant", "content": "j k l"}]
MESSAGE = "m n o"


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_gguf(path, tied=False)
    return load(path, max_length=MAX_LENGTH, cache_step=16)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# ---------------------------------------------------------------------------
# Interrupted replies


def test_the_turn_after_an_interrupted_reply_reuses_its_prompt_and_partial_reply():
    llm = load(smollm_path(), max_length=512)
    chat = Chat(llm, max_tokens=60)
    reply = chat.send("Tell me about the moon.")
    pieces = [next(reply) for _ in range(8)]
    reply.close()
    first_prompt = llm.prompt_ids([user("Tell me about the moon.")])
    partial = [p.token for p in pieces]
    assert chat.cache.tokens == first_prompt + partial
    assert chat.messages[-1] == {"role": "assistant", "content": "".join(p.text for p in pieces)}
    second = list(chat.send("And the sun?"))
    # Everything cached is reused: the first prompt and the partial reply.
    assert second[-1].stats.cached_tokens == len(first_prompt) + len(partial)
    assert second[-1].stats.prompt_tokens == len(llm.prompt_ids(chat.conversation()[:-1]))


def test_a_ctrl_c_while_a_token_is_read_keeps_the_tokens_read_cached(llm, monkeypatch):
    # A Ctrl-C lands where a reply waits most: in the read of a token that
    # the engine has already fed to the cache.
    take = Request.take

    def interrupted_take(self, token, logprob, top):
        if len(self.read) == 3:
            raise KeyboardInterrupt
        return take(self, token, logprob, top)

    monkeypatch.setattr(Request, "take", interrupted_take)
    chat = Chat(llm, max_tokens=20)
    pieces = []
    with pytest.raises(KeyboardInterrupt):
        for piece in chat.send("he"):
            pieces.append(piece)
    monkeypatch.undo()
    prompt = llm.prompt_ids([user("he")])
    kept = prompt + [p.token for p in pieces]
    assert len(pieces) == 3 and chat.cache.tokens == kept
    assert chat.messages == [user("he"), {"role": "assistant",
                                          "content": "".join(p.text for p in pieces)}]
    # The cached keys and values are those of the tokens kept.
    fresh = llm.cache_prompt(kept)
    assert fresh.tokens == kept
    for cached, expected in zip(chat.cache.caches, fresh.caches, strict=True):
        np.testing.assert_allclose(cached, expected, atol=1e-4)
    assert llm.last_generation is None
    # The chat goes on from there.
    assert list(chat.send("fox"))[-1].finish_reason == "length"


# ---------------------------------------------------------------------------
# Room for the reply


@pytest.mark.parametrize("spare, dropped", [(0, 0), (1, 1)])
def test_old_exchanges_make_room_for_a_whole_reply_before_it_starts(llm, spare, dropped):
    # max_tokens fills the cache exactly after the whole conversation, or is
    # one token more: then the oldest exchange goes before the reply starts.
    whole = len(llm.prompt_ids([*HISTORY, user(MESSAGE)]))
    max_tokens = MAX_LENGTH + 1 - whole + spare
    chat = Chat(llm, max_tokens=max_tokens)
    chat.messages = list(HISTORY)
    reply = chat.send(MESSAGE)
    assert chat.dropped == dropped
    assert chat.messages == [*HISTORY[2 * dropped:], user(MESSAGE)]
    pieces = list(reply)
    result = llm.last_generation
    # The random model never picks its EOS here: the reply runs to
    # max_tokens, with an older exchange still in its prompt.
    assert (result.finish_reason, len(result.tokens), result.cache_full) == (
        "length", max_tokens, False)
    assert pieces[-1].stats.prompt_tokens == len(llm.prompt_ids(chat.conversation()[:-1]))
    assert chat.conversation()[:2] == HISTORY[2 * dropped:2 * dropped + 2]


def test_a_reply_stops_at_the_cache_limit_only_with_no_older_exchange_left(llm):
    alone = len(llm.prompt_ids([user(MESSAGE)]))
    chat = Chat(llm, max_tokens=MAX_LENGTH)
    chat.messages = list(HISTORY)
    reply = chat.send(MESSAGE)
    assert chat.dropped == 2 and chat.messages == [user(MESSAGE)]
    list(reply)
    result = llm.last_generation
    assert (result.finish_reason, len(result.tokens), result.cache_full) == (
        "length", MAX_LENGTH + 1 - alone, True)
