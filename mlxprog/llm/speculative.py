"""Speculative decoding: draft a few tokens cheaply, verify them with the
target model in one step, keep those it agrees with.

A drafter proposes up to k tokens to follow a sequence: :class:`PromptLookup`
copies what followed the latest earlier occurrence of the sequence's last
n-gram (in the prompt or in what was generated; no second model), and
:class:`DraftModel` runs a smaller model with the same vocabulary. The
engine (:mod:`~mlxprog.llm.engine`) feeds the token it picked last and the k
drafts to the target's verify step (:func:`~mlxprog.llm.programs.build_verify`),
which writes them into the KV cache after the sequence and returns the
logits after each; :func:`judge` decides how many drafts to keep and picks
one more token from the logits after the last kept one. The cache slots of
the rejected drafts are left behind the sequence's end, where the next step
overwrites them.

:func:`judge` keeps the target's distribution: greedy, it keeps the drafts
that are the target's argmax, so the output is the plain decode's token for
token; sampling, it keeps draft ``d`` with probability ``min(1, p(d) /
q(d))`` (``p`` the target's distribution after the repetition penalty,
temperature and filters, as ``sample`` draws from; ``q`` the draft's, or a
one-hot on ``d`` for prompt lookup) and otherwise draws from ``max(p - q,
0)`` normalised, the standard rule (Leviathan et al., 2023; Chen et al.,
2023) under which every token is distributed as the target alone would
draw it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

import mlx.core as mx

from ..errors import ModelError, SettingError
from ..ops.sampling import RepetitionPenaltyAttrs, SampleAttrs, filter_logits, repetition_penalty
from .programs import DecodeInputs, LogitsOutputs, Picking, PrefillInputs, VerifyInputs

if TYPE_CHECKING:
    from .compiled import CompiledModel

#: Prompt lookup pauses when fewer than this share of its drafted tokens
#: were accepted over its last :data:`LOOKUP_WINDOW` drafted tokens: a
#: verify step of k + 1 tokens costs more than a decode step (on the CPU
#: about 0.3 of one per extra token), which drafts accepted this rarely do
#: not pay back.
LOOKUP_MIN_ACCEPTANCE = 0.3
LOOKUP_WINDOW = 8
#: The decode steps of its first pause, doubled by each pause that follows
#: another without an accepted draft between them, up to the most.
LOOKUP_PAUSE = 8
LOOKUP_MAX_PAUSE = 256
#: The decode steps prompt lookup skips after finding no match: 1, then
#: doubling while the misses go on, up to the most. A step that looks and
#: finds nothing costs the host's wait for the device (plain steps overlap
#: the two), which text that never repeats would pay on every token.
LOOKUP_MAX_MISS_PAUSE = 8


@dataclass
class Draft:
    """Drafted tokens: ``tokens [k]`` (int32) and, from a draft model that
    samples, the distributions they were drawn from (``probs [k, V]``; None:
    one-hot on each token, as prompt lookup's and greedy drafts are)."""

    tokens: mx.array
    probs: mx.array | None = None


class Drafter(Protocol):
    """What the engine asks of a drafter: whether to draft this step, the
    draft, and how many of its tokens the target kept."""

    def drafting(self) -> bool:
        """Whether to draft this step (False: a plain decode step)."""

    def propose(self, sequence: Sequence[int], k: int, key: mx.array) -> Draft | None:
        """Up to ``k`` tokens to follow ``sequence`` (the prompt and every
        generated token; the last is not yet in the target's cache), drawn
        with ``key`` where the drafter samples; None: no draft."""

    def record(self, drafted: int, accepted: int) -> None:
        """The target kept ``accepted`` of the ``drafted`` tokens last proposed."""


class PromptLookup:
    """Prompt-lookup drafting: the tokens that followed the most recent
    earlier occurrence of the sequence's last ``max_ngram`` tokens (or, if
    none, of fewer, down to one), at most ``num_draft_tokens`` of them (one
    after a match of one token only).

    It watches its acceptance: once :data:`LOOKUP_WINDOW` drafts from
    one-token matches have kept less than :data:`LOOKUP_MIN_ACCEPTANCE` of
    their tokens it matches two tokens or more only; when less than that
    share of its last :data:`LOOKUP_WINDOW` drafted tokens were kept it
    pauses for :data:`LOOKUP_PAUSE` steps (doubling while it keeps
    failing), and after finding no match it skips a step or a few
    (:data:`LOOKUP_MAX_MISS_PAUSE`), so a prompt it cannot copy from costs
    about what plain decoding does."""

    def __init__(self, num_draft_tokens: int, max_ngram: int):
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram = max_ngram
        # (n-gram) -> where the tokens after its latest indexed occurrence start.
        self._follows: dict[tuple[int, ...], int] = {}
        self._sequence: list[int] = []
        self._recent: list[tuple[int, int]] = []   # (drafted, accepted) per round
        self._paused = 0
        self._pause = LOOKUP_PAUSE
        self._shortest = 1           # the shortest n-gram still matched
        self._matched = 0            # the last draft's n-gram length
        self._single = [0, 0]        # drafted and accepted after one-token matches
        self._misses = 0             # lookups in a row that found no match

    def drafting(self) -> bool:
        """Whether to draft this step: not during a pause (each call counts
        one paused step)."""
        if self._paused:
            self._paused -= 1
            return False
        return True

    def _index(self, sequence: Sequence[int]) -> None:
        """Index the n-grams of the tokens ``sequence`` adds, each pointing
        at the token after it (so the sequence's own last n-gram, with
        nothing after it yet, is not indexed until the next token comes)."""
        seen = self._sequence
        start = len(seen)
        seen.extend(sequence[start:])
        for end in range(max(start, 1), len(seen)):   # n-grams ending at end - 1
            for n in range(1, min(self.max_ngram, end) + 1):
                self._follows[tuple(seen[end - n:end])] = end

    def propose(self, sequence: Sequence[int], k: int, key: mx.array) -> Draft | None:
        """The tokens after the latest earlier match of the sequence's last
        n-gram (the longest that matches), at most ``k``; None if none
        matches."""
        self._index(sequence)
        seen = self._sequence
        for n in range(min(self.max_ngram, len(seen) - 1), self._shortest - 1, -1):
            start = self._follows.get(tuple(seen[len(seen) - n:]))
            if start is not None:
                # One token's match says little about what follows: one draft.
                most = min(k, self.num_draft_tokens if n > 1 else 1)
                self._matched = n
                self._misses = 0
                return Draft(mx.array(seen[start:start + most], dtype=mx.int32))
        self._misses += 1
        self._paused = min(2 ** (self._misses - 1), LOOKUP_MAX_MISS_PAUSE)
        return None

    def record(self, drafted: int, accepted: int) -> None:
        """Track acceptance (see the class docstring): stop matching one
        token, or pause, when it is low."""
        if self._matched == 1:
            self._single = [self._single[0] + drafted, self._single[1] + accepted]
            if self._single[0] >= LOOKUP_WINDOW and \
                    self._single[1] < LOOKUP_MIN_ACCEPTANCE * self._single[0]:
                self._shortest = 2
        self._recent.append((drafted, accepted))
        while sum(d for d, _ in self._recent[1:]) >= LOOKUP_WINDOW:
            self._recent.pop(0)
        total = sum(d for d, _ in self._recent)
        if total < LOOKUP_WINDOW:
            return
        if sum(a for _, a in self._recent) < LOOKUP_MIN_ACCEPTANCE * total:
            self._paused = self._pause
            self._pause = min(2 * self._pause, LOOKUP_MAX_PAUSE)
            self._recent.clear()
        elif accepted:
            self._pause = LOOKUP_PAUSE


class DraftModel:
    """Drafting with a smaller model of the same vocabulary (``draft``, a
    :class:`~mlxprog.llm.compiled.CompiledModel`): ``num_draft_tokens`` decode steps of it a
    round, each token picked by ``picking``'s sampling (greedy: its argmax;
    otherwise drawn from its tempered, filtered distribution, which
    :func:`judge` needs). Its KV cache holds one sequence; after a round it
    keeps the tokens the target kept and catches up on the rest (one or two
    tokens) in the next round's first step."""

    def __init__(self, draft: CompiledModel, num_draft_tokens: int, picking: Picking):
        self.llm = draft
        self.num_draft_tokens = num_draft_tokens
        self.sampling = picking.sampling
        self.caches: tuple[mx.array, ...] = ()
        self.length = 0          # tokens of the sequence in the draft's cache
        self._round_start = 0    # the sequence's length when the round began

    def drafting(self) -> bool:
        """A draft model drafts every step."""
        return True

    def propose(self, sequence: Sequence[int], k: int, key: mx.array) -> Draft | None:
        """``k`` tokens from the draft model (at most ``num_draft_tokens``);
        dispatched, not waited for."""
        llm, k = self.llm, min(k, self.num_draft_tokens)
        out = self._catch_up(list(sequence[self.length:]), len(sequence) + k - 1, key)
        tokens, probs = [], []
        position = len(sequence)
        for i in range(k):
            key, draw = mx.random.split(key)
            token, p = self._pick(out.logits, draw)
            tokens.append(token)
            probs.append(p)
            self.caches = out.caches
            if i + 1 < k:
                out = LogitsOutputs.of(llm.executable("decode", None)(**DecodeInputs(
                    tokens=token, rope_offset=mx.array([position], dtype=mx.int32),
                    cache_offset=mx.array(position, dtype=mx.int32), key_mask=self._mask(),
                    key=key, caches=self.caches).by_name(llm.cache_layout)))
                position += 1
        self._round_start = len(sequence)
        return Draft(mx.concatenate(tokens),
                     None if self.sampling.temperature == 0 else mx.concatenate(probs))

    def _catch_up(self, behind: list[int], slots: int, key: mx.array) -> LogitsOutputs:
        """Feed the draft model the tokens ``behind`` its cache (caches of
        ``slots`` slots or more); its logits after the last. A few tokens
        (a round's usual one or two) run its verify step, in the decode
        step's numerics and unpadded; more (the prompt) its prefill, padded
        to :func:`_bucket`."""
        llm, start = self.llm, self.length
        position = dict(rope_offset=mx.array([start], dtype=mx.int32),
                        cache_offset=mx.array(start, dtype=mx.int32))
        if len(behind) <= FEW_TOKENS:
            self._room(max(start + len(behind), slots))
            out = LogitsOutputs.of(llm.executable("verify")(**VerifyInputs(
                tokens=mx.array([behind], dtype=mx.int32), key_mask=self._mask(),
                caches=self.caches, **position).by_name(llm.cache_layout)))
            return LogitsOutputs(logits=out.logits[:, -1], caches=out.caches)
        chunk = min(_bucket(len(behind)), llm.cache_slots - start)
        self._room(max(start + chunk, slots))
        return LogitsOutputs.of(llm.executable("prefill", None)(**PrefillInputs(
            tokens=mx.array([(behind + [0] * chunk)[:chunk]], dtype=mx.int32),
            last_index=mx.array([len(behind) - 1], dtype=mx.int32),
            key_mask=self._mask(), key=key, caches=self.caches,
            **position).by_name(llm.cache_layout)))

    def _pick(self, logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array | None]:
        """The draft token from ``logits [1, V]`` and the distribution it was
        drawn from (None when greedy)."""
        if self.sampling.temperature == 0:
            return mx.argmax(logits, axis=-1).astype(mx.int32), None
        filtered = filter_logits(logits, _sample_attrs(self.sampling))
        token = mx.random.categorical(filtered, axis=-1, key=key).astype(mx.int32)
        return token, mx.softmax(filtered, axis=-1)

    def record(self, drafted: int, accepted: int) -> None:
        """Keep the sequence and the accepted drafts the cache holds (it
        was fed every draft but the last)."""
        self.length = self._round_start + min(accepted, drafted - 1)

    def _room(self, slots: int) -> None:
        """Caches of at least ``slots`` slots (in ``cache_step`` steps)."""
        width = self.llm.cache_width(slots)
        if not self.caches:
            self.caches = self.llm.cache_layout.empty(1, width)
        elif width > self.caches[0].shape[2]:
            self.caches = self.llm.cache_layout.widened(self.caches, width)

    def _mask(self) -> mx.array:
        return mx.ones((1, self.caches[0].shape[2]), dtype=mx.bool_)


#: The most tokens a draft model catches up on with its verify step (one
#: trace per count); more go through its prefill.
FEW_TOKENS = 4


def _bucket(n: int) -> int:
    """A catch-up's padded length: the next power of two (one trace each)."""
    return 1 << (n - 1).bit_length()


def drafter_for(llm: CompiledModel, draft: str | None, num_draft_tokens: int, max_ngram: int,
                picking: Picking) -> Drafter | None:
    """The drafter a request asks for: ``draft`` ``"prompt-lookup"``,
    ``"model"`` (``llm``'s draft model), ``"none"``, or None (the draft model
    when ``llm`` has one, else none)."""
    if draft is None:
        draft = "model" if llm.draft is not None else "none"
    if draft == "none":
        return None
    if draft == "prompt-lookup":
        return PromptLookup(num_draft_tokens, max_ngram)
    if llm.draft is None:
        raise ModelError("draft 'model' needs a draft model: load the model with "
                         "draft_model=... (--draft-model)")
    return DraftModel(llm.draft, num_draft_tokens, picking)


def check_draft_model(target: CompiledModel, draft: CompiledModel) -> None:
    """A :class:`~mlxprog.llm.SettingError` naming ``draft_model``
    unless ``draft`` shares ``target``'s vocabulary (its size and every
    token's text: the drafts are token ids the target reads)."""
    ours, theirs = target.config.vocab_size, draft.config.vocab_size
    where = draft.checkpoint.path
    if ours != theirs:
        raise SettingError("draft_model", f"{where} has a vocabulary of {theirs} tokens, the "
                           f"model {ours}: a draft model must share the model's vocabulary")
    for token in range(target.tokenizer.vocab_size):
        text = target.tokenizer.id_to_token(token)
        if draft.tokenizer.id_to_token(token) != text:
            raise SettingError("draft_model", f"{where}: its token {token} is "
                               f"{draft.tokenizer.id_to_token(token)!r}, the model's {text!r}: "
                               "a draft model must share the model's vocabulary")


@dataclass
class Verdict:
    """What :func:`judge` decided: the ``tokens`` to emit (the kept drafts,
    then one picked from the target's logits after them), how many drafts
    were ``accepted``, their log-probabilities and top alternatives (when the
    picking asks for them), the next PRNG key."""

    tokens: list[int]
    accepted: int
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]]]
    key: mx.array


def judge(logits: mx.array, draft: Draft, picking: Picking, history: mx.array,
          key: mx.array) -> Verdict:
    """Decide on ``draft`` (k tokens) from the target's ``logits [k + 1, V]``
    (after the token picked last and after each draft), with the picking's
    repetition penalty over ``history [1, N]`` (the tokens before the
    first logits, each later row also after the drafts before it), and its
    sampling drawing with ``key``. See the module docstring for the rule."""
    k = draft.tokens.shape[0]
    drafts = draft.tokens
    if picking.repetition_penalty is not None:
        context = history.shape[1]
        extended = mx.concatenate([history[0], drafts])
        rows = mx.stack([extended[i:i + context] for i in range(k + 1)])
        logits = repetition_penalty([logits, rows],
                                    RepetitionPenaltyAttrs(penalty=picking.repetition_penalty))
    sampling = picking.sampling
    next_key, accept_key, draw_key = mx.random.split(key, 3)
    if sampling.temperature == 0:
        picked = mx.argmax(logits, axis=-1).astype(mx.int32)
        kept = picked[:k] == drafts
        fallback = picked
    else:
        filtered = filter_logits(logits, _sample_attrs(sampling))
        p = mx.softmax(filtered, axis=-1)
        q = draft.probs if draft.probs is not None else \
            (mx.arange(p.shape[1])[None, :] == drafts[:, None]).astype(mx.float32)
        p_d = mx.take_along_axis(p[:k], drafts[:, None], axis=1)[:, 0]
        q_d = mx.take_along_axis(q, drafts[:, None], axis=1)[:, 0]
        kept = mx.random.uniform(shape=(k,), key=accept_key) * q_d < p_d
        residual = mx.maximum(p[:k] - q, 0.0)
        mass = residual.sum(axis=1, keepdims=True)
        # No mass left only where p <= q everywhere, i.e. p == q: the draft is
        # then always kept and the residual never drawn from.
        residual = mx.where(mass > 0, residual, p[:k])
        weights = mx.concatenate([residual, p[k:]])
        fallback = mx.random.categorical(mx.log(weights), axis=-1,
                                         key=draw_key).astype(mx.int32)
    wanted = [logits - mx.logsumexp(logits, axis=-1, keepdims=True)] if picking.logprobs else []
    mx.eval(kept, fallback, drafts, *wanted)
    kept_list = kept.tolist()
    accepted = next((i for i, ok in enumerate(kept_list) if not ok), k)
    tokens = drafts.tolist()[:accepted] + [fallback.tolist()[accepted]]
    logprobs: list[float | None] = [None] * len(tokens)
    tops: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if wanted:
        (model_logprobs,) = wanted
        rows = model_logprobs[:len(tokens)]
        logprobs = mx.take_along_axis(rows, mx.array(tokens)[:, None], axis=1)[:, 0].tolist()
        if picking.top_logprobs:
            ids = mx.argsort(-rows, axis=-1)[:, :picking.top_logprobs]
            values = mx.take_along_axis(rows, ids, axis=1)
            tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return Verdict(tokens, accepted, logprobs, tops, next_key)


def _sample_attrs(sampling) -> SampleAttrs:
    """The ``sample`` op's attributes for a :class:`~mlxprog.llm.Sampling`."""
    return SampleAttrs(temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, min_p=sampling.min_p)
