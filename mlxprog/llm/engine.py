"""The generation engine: sequences decoded together in one batch, joining
when their prefill is done and leaving when they finish.

Every generation runs here: :class:`~mlxprog.llm.LLM`'s methods (one
sequence, or a fixed batch) and the server (requests joining a running
batch). The engine runs the model's logits programs (``prefill`` and
``decode`` built with ``sampling=None``) and picks each sequence's token with
its own picker program (:func:`~mlxprog.llm.programs.build_pick`), so every
sequence has its own sampling, PRNG key, repetition penalty and
log-probabilities, whatever else shares the batch.

The batch's caches are ``[B, kv_heads, W, head_dim]``; every row writes its
next token at the same slot ``offset``, so a row holding ``n`` tokens sits at
slots ``[offset - n, offset)`` behind ``pad`` masked slots. A joining row
whose prompt is longer than ``offset`` shifts the batch right; rows that leave
are cut out and the slots no row uses any more are dropped. ``W`` grows in
steps of ``cache_step`` slots (attention reads every slot), at most
``max_length``.

A prefill reuses a prompt cache (:mod:`~mlxprog.llm.cache`): the tokens it
shares with the prompt are not run again; its caches start from the cached
keys and values and only the rest of the prompt is prefilled. A finished
sequence stores its tokens and caches back.

The host never waits between steps: a decode step is dispatched
(``mx.async_eval``) before the tokens of the previous one are read and
detokenized, and the picked tokens feed the next step as lazy arrays.

A batch of one row whose request drafts (speculative decoding, see
:mod:`~mlxprog.llm.speculative`) steps differently: it reads its tokens,
asks its drafter for up to k more, runs the verify program on the token it
picked last and the drafts (written from slot ``offset`` on), and moves
``offset`` past the token and the drafts :func:`~mlxprog.llm.speculative.judge`
keeps only, so the rejected drafts' slots are overwritten by the next step.
Larger batches take plain steps.

Structured output (see docs/structured_output.md): a request with a
constraint follows it with a :class:`~mlxprog.llm.constraints.ConstraintState`,
and its logits get its ``logit_bias`` and the constraint's mask
(:meth:`Request.shaped`) before its picker (or the verdict on a draft)
samples from them. A mask follows the token picked before, so a step with
constrained rows starts its forward pass, reads those rows' tokens (the
other rows stay asynchronous) and computes their masks while it runs.
Requests with neither pick from the raw logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol, Sequence

import mlx.core as mx

from ..errors import ModelError
from .cache import common_prefix
from .constraints import ConstraintState, ConstraintVocabulary, MaskBatch, apply_bitmask
from .programs import DecodeInputs, LogitsOutputs, PrefillInputs, VerifyInputs
from .speculative import Draft, Drafter, drafter_for, judge

if TYPE_CHECKING:
    from .compiled import CompiledModel
    from .options import GenerationOptions

FINISH_REASONS = ("eos", "stop", "length", "cancelled")


@dataclass
class GenerationStats:
    """Timings of one generation. ``prompt_tokens`` counts the whole prompt,
    ``cached_tokens`` the part of it reused from a prompt cache (not
    prefilled); ``prompt_tps`` counts the prefilled tokens over the prefill
    time; ``decode_tps`` generated tokens (after the first) over the decode
    time; ``ttft`` is the time to the first token, in seconds."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    ttft: float = 0.0
    peak_memory_gb: float = 0.0
    #: Speculative decoding: the tokens drafted, and those the model kept.
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @property
    def acceptance(self) -> float:
        """The share of the drafted tokens the model kept (0 when none were drafted)."""
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prompt_tps(self) -> float:
        """Prefilled prompt tokens per second."""
        prefilled = self.prompt_tokens - self.cached_tokens
        return prefilled / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second, after the first."""
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0

    def summary(self) -> str:
        """One line: prompt and decode speed, time to first token, peak memory,
        and the drafted and accepted tokens when decoding was speculative."""
        cached = f" ({self.cached_tokens} cached)" if self.cached_tokens else ""
        drafted = (f" | drafted: {self.drafted_tokens}, accepted: {self.accepted_tokens} "
                   f"({self.acceptance:.0%})" if self.drafted_tokens else "")
        return (f"prompt: {self.prompt_tokens} tokens{cached}, {self.prompt_tps:.1f} tok/s | "
                f"decode: {self.generated_tokens} tokens, {self.decode_tps:.1f} tok/s{drafted} | "
                f"ttft: {self.ttft:.3f} s | peak memory: {self.peak_memory_gb:.2f} GB")

    def as_dict(self) -> dict[str, float]:
        """The stats and the derived speeds and acceptance, for JSON."""
        return {**vars(self), "prompt_tps": self.prompt_tps, "decode_tps": self.decode_tps,
                "acceptance": self.acceptance}


@dataclass
class Piece:
    """One generated token, as :meth:`LLM.stream <mlxprog.llm.LLM.stream>`
    yields it: the ``text`` it completes (possibly empty: a character still
    incomplete, or text that could still become a stop string), its ``token``
    id and ``logprob`` (None unless asked for with ``logprobs``), the most likely alternatives (``top_logprobs``:
    ``(token, logprob)`` pairs, when asked for), the running ``stats``, and
    ``finish_reason`` on the last piece (see :class:`Generation`)."""

    text: str
    token: int
    logprob: float | None
    stats: GenerationStats
    finish_reason: str | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Generation:
    """A finished generation: the text, the generated token ids (without the
    EOS) and, if asked for (``logprobs``), their log-probabilities, why it
    stopped, and stats.

    ``finish_reason`` is ``"eos"``, ``"stop"`` (a stop string, or a
    constrained output complete: nothing but EOS could follow), ``"length"``
    (``max_tokens``, or the KV cache full: then ``cache_full``) or
    ``"cancelled"``."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)
    logprobs: list[float] = field(default_factory=list)
    cache_full: bool = False


#: The tokens of a prompt an :class:`Engine` prefills in one program call by
#: default: the prefill's activations and the native layer's scratch are
#: per chunk, so chunks bound the peak memory of a long prompt, and on
#: SmolLM2's files a long prompt's prefill was faster in chunks of 128 than
#: of 256 or in one (docs/benchmarks.md, issue 35).
PREFILL_CHUNK = 128
#: The flags of the settings that bound a prompt (:class:`PromptTooLongError`).
SIZE_FLAGS = {"max_length": "--max-length", "max_kv_size": "--max-kv-size"}


class PromptTooLongError(ModelError):
    """A prompt that does not fit the KV cache: ``prompt_tokens`` tokens
    against ``max_length`` slots, the limit of the model's ``setting``
    (``"max_length"``, or a rotating cache's ``"max_kv_size"``, which holds
    a prompt of that many tokens); the front ends word it for their flags."""

    def __init__(self, prompt_tokens: int, max_length: int, setting: str = "max_length"):
        self.prompt_tokens, self.max_length, self.setting = prompt_tokens, max_length, setting
        super().__init__(f"the prompt has {prompt_tokens} tokens, but the KV cache holds "
                         f"{max_length} ({setting}); load the model with a larger "
                         f"{setting} or shorten the prompt")


class CacheStore(Protocol):
    """Where a sequence finds a cached prefix and leaves its own caches: a
    :class:`~mlxprog.llm.PromptCache` or :class:`~mlxprog.llm.PromptCachePool`."""

    def lookup(self, ids: Sequence[int]) -> tuple[list[int], tuple[mx.array, ...]]:
        """Cached tokens and their caches, to share a prefix with ``ids``."""

    def store(self, tokens: Sequence[int], caches: Sequence[mx.array]) -> None:
        """Keep a finished sequence's tokens and caches."""


class Request:
    """One sequence to generate: its prompt ids, options and prompt cache,
    and, once running, its tokens, text and place in the batch.

    ``cancel()`` may be called from any thread; the engine drops the row at
    its next step."""

    def __init__(self, llm: CompiledModel, ids: Sequence[int], options: GenerationOptions,
                 prompt_cache: CacheStore | None = None):
        self.ids = list(ids)
        if not self.ids:
            raise ModelError("the prompt is empty")
        rotating = llm.cache_layout.max_kv_size
        if len(self.ids) > llm.prompt_limit:
            if rotating is not None:
                raise PromptTooLongError(len(self.ids), rotating, "max_kv_size")
            raise PromptTooLongError(len(self.ids), llm.max_length)
        self.options = options
        self.picking = options.picking
        self.prompt_cache = prompt_cache
        #: Structured output: the constraint's progress (None: unconstrained)
        #: and the logit bias; a row with neither picks from the raw logits.
        self.constraint: ConstraintState | None = None
        if options.constraint is not None:
            self.constraint = options.constraint.start(ConstraintVocabulary.of(llm.tokenizer))
        self.logit_bias = options.logit_bias
        if self.logit_bias is not None:
            self.logit_bias.check(llm.config.vocab_size)
        #: Where speculative decoding gets its drafts (None: plain decoding).
        self.drafter: Drafter | None = drafter_for(
            llm, options.draft, options.num_draft_tokens, options.prompt_lookup_ngram,
            self.picking)
        self.drafted = 0
        self.accepted = 0
        # Tokens it may generate: max_tokens, and what the cache has room for
        # (the last token is never written, so one more than the free slots;
        # a rotating cache always has room).
        room = options.max_tokens if rotating else llm.max_length - len(self.ids) + 1
        self.budget = min(options.max_tokens, room)
        self.limited_by_cache = room < options.max_tokens
        self.cancelled = False
        # Text.
        self.decoder = llm.tokenizer.stream_decoder(
            skip_special_tokens=not options.special_tokens)
        self.eos = set(llm.tokenizer.eos_token_ids) | set(llm.config.eos_token_ids)
        self.hold = max((len(s) for s in options.stop), default=1) - 1
        self.text = ""
        self.emitted = 0
        self.tokens: list[int] = []       # generated, without the EOS
        self.logprobs: list[float] = []
        self.read: list[int] = []         # every token read, the EOS included
        self.finish_reason: str | None = None
        self.cache_full = False
        # Device state: the PRNG key, the repetition history, the token to
        # feed next, and what was picked but not yet read.
        self.key = mx.random.key(options.seed)
        context = self.picking.repetition_context_size
        recent = self.ids[-context:]
        self.history = mx.array([[-1] * (context - len(recent)) + recent], dtype=mx.int32)
        self.next_token: mx.array | None = None
        self.unread: tuple[mx.array, ...] | None = None
        self.dispatched = 0   # tokens picked (read or not)
        self.fed = 0          # generated tokens written to the cache
        self.cached = 0       # prompt tokens reused from the prompt cache
        self.pad = 0          # masked slots before the row in the batch
        # Timings.
        self.start = time.perf_counter()
        self.first_token_at = self.start
        self.end = self.start

    def cancel(self) -> None:
        """Stop generating (thread-safe); the finish reason is ``"cancelled"``."""
        self.cancelled = True

    @property
    def finished(self) -> bool:
        """Whether the sequence has finished (or was cancelled)."""
        return self.finish_reason is not None

    @property
    def length(self) -> int:
        """Tokens in the sequence's cache: the prompt and the generated tokens fed."""
        return len(self.ids) + self.fed

    def stats(self) -> GenerationStats:
        """The stats so far."""
        end = self.end if self.finished else time.perf_counter()
        return GenerationStats(
            prompt_tokens=len(self.ids), cached_tokens=self.cached,
            generated_tokens=len(self.read),
            prompt_seconds=self.first_token_at - self.start,
            decode_seconds=end - self.first_token_at if self.read else 0.0,
            ttft=self.first_token_at - self.start,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            drafted_tokens=self.drafted, accepted_tokens=self.accepted)

    def result(self) -> Generation:
        """The generation (once finished)."""
        return Generation(self.text, list(self.tokens), self.finish_reason or "length",
                          self.stats(), list(self.logprobs), self.cache_full)

    # -- picking ---------------------------------------------------------------
    def pick(self, llm: CompiledModel, logits: mx.array) -> tuple[mx.array, ...]:
        """Dispatch the pick of the next token from ``logits [1, V]``; the
        picked token becomes the one fed next."""
        token, self.key, *rest = llm.picker(self.picking)(self.shaped(logits), self.key,
                                                          self.history)
        if self.picking.repetition_penalty is not None:
            self.history = mx.concatenate([self.history[:, 1:], token[None]], axis=1)
        self.next_token = token
        self.dispatched += 1
        return (token, *rest)

    def shaped(self, logits: mx.array, draft: Sequence[int] | None = None) -> mx.array:
        """``logits`` (``[1, V]``, or a verify step's ``[k + 1, V]`` after
        the token picked last and each token of ``draft``) with the logit
        bias added and the tokens the constraint does not allow at ``-inf``
        (each row under its own mask: a draft token that does not fit is
        then never kept): what the picker or the verdict samples from and
        reports log-probabilities of. Without either, ``logits`` as they
        are. A constrained row's masks need its previous token taken."""
        if self.logit_bias is not None:
            logits = self.logit_bias.apply(logits)
        if self.constraint is not None:
            logits = self.constraint.apply(logits) if draft is None else \
                apply_bitmask(logits, self.constraint.draft_bitmasks(draft))
        return logits

    # -- text ------------------------------------------------------------------
    def take(self, token: int, logprob: float | None,
             top: list[tuple[int, float]]) -> Piece:
        """Take one picked token (and its log-probability, if known); the
        piece of text it lets through."""
        if not self.read:
            self.first_token_at = time.perf_counter()
        if self.constraint is not None:
            self.constraint.advance(token)
        self.read.append(token)
        if token in self.eos:
            self.finish_reason = "eos"
        else:
            self.tokens.append(token)
            if logprob is not None:
                self.logprobs.append(logprob)
            self.text += self.decoder.add(token)
            for stop in self.options.stop:
                at = self.text.find(stop)
                if at >= 0:
                    self.text = self.text[:at]
                    self.finish_reason = "stop"
            if self.finish_reason is None and self.constraint is not None \
                    and self.constraint.finished:
                # A complete match that cannot grow: only EOS could follow.
                self.finish_reason = "stop"
                self.text += self.decoder.flush()
        if self.finish_reason is None and len(self.read) >= self.budget:
            self.finish_reason = "length"
            self.cache_full = self.limited_by_cache
        return self._piece(token, logprob, top)

    def finish(self, reason: str) -> None:
        """End the sequence early (``"cancelled"``), keeping what it made."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.end = time.perf_counter()

    def _piece(self, token: int, logprob: float | None, top: list[tuple[int, float]]) -> Piece:
        if self.finish_reason is not None:
            if self.finish_reason in ("eos", "length"):
                self.text += self.decoder.flush()
            end = len(self.text)
            self.end = time.perf_counter()
        else:  # hold back what could still become a stop string
            end = max(self.emitted, len(self.text) - self.hold)
        text, self.emitted = self.text[self.emitted:end], end
        return Piece(text, token, logprob, self.stats(), self.finish_reason, top)


@dataclass(eq=False)
class Prefill:
    """Prompts being prefilled together, a chunk at a time (see
    :meth:`Engine.begin`). The ``rows`` (their requests, in the caches'
    batch order) share ``start``, the prompt tokens their caches held before
    (a prompt cache's prefix, one length for all), and ``done``, the
    positions prefilled since; ``chunks`` are the chunks still to run, as
    (tokens, length padded to a bucket: a few traces serve every prompt). The caches ``[rows, kv_heads, size, head_dim]`` have room for
    every chunk."""

    rows: list[Request]
    start: int
    chunks: list[tuple[int, int]]
    caches: tuple[mx.array, ...]
    done: int = 0

    @property
    def remaining(self) -> int:
        """Prompt tokens still to prefill in the longest row."""
        return max(len(r.ids) for r in self.rows) - self.start - self.done


class Engine:
    """A batch of sequences decoded together with ``llm``'s programs.

    :meth:`begin` starts prefilling requests (reusing their prompt caches),
    together where their cached prefixes have one length; :meth:`advance`
    runs the next chunk of such a :class:`Prefill` (at most
    ``prefill_chunk`` tokens a row, :data:`PREFILL_CHUNK` by default; None:
    a prompt in one chunk) and returns
    the first pieces of the rows it completes, which join the batch unless
    that finished them. :meth:`add` does both for one request. :meth:`step`
    runs one decode step of every row and returns the pieces read. At most
    ``max_batch`` rows run or prefill at once (the programs' batch dim
    allows 64)."""

    def __init__(self, llm: CompiledModel, max_batch: int = 64,
                 prefill_chunk: int | None = PREFILL_CHUNK):
        if not 1 <= max_batch <= 64:
            raise ModelError(f"max_batch must be in [1, 64], got {max_batch}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ModelError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.llm = llm
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.prefilling: list[Prefill] = []
        self.rows: list[Request] = []
        self.caches: tuple[mx.array, ...] = ()
        self.offset = 0        # the slot every row writes its next token to
        self._key_mask: mx.array | None = None
        self._mask_batch: MaskBatch | None = None
        # The step programs' key input is unused: each row picks with its own.
        self._step_key = mx.random.key(0)

    @property
    def width(self) -> int:
        """Slots in the batch's caches."""
        return self.caches[0].shape[2] if self.caches else 0

    @property
    def occupied(self) -> int:
        """Rows in the batch and in prefills."""
        return len(self.rows) + sum(len(p.rows) for p in self.prefilling)

    @property
    def full(self) -> bool:
        """Whether no more requests can begin: the batch is full, or its
        rotating cache has wrapped (a joining row's slots could not line up
        with the rows'; requests wait until the batch drains)."""
        return self.occupied >= self.max_batch or self.wrapped

    @property
    def wrapped(self) -> bool:
        """Whether the batch's rotating cache has overwritten a slot: its
        slots are then no longer in the order of the tokens (see
        :meth:`Decoder.forward <mlxprog.llm.models.base.Decoder.forward>`),
        so rows can neither join nor be trimmed nor stored as prompt caches."""
        size = self.llm.cache_layout.max_kv_size
        return size is not None and self.offset > size

    # -- joining ---------------------------------------------------------------
    def add(self, request: Request) -> Piece:
        """Prefill ``request`` whole (after the prefix its prompt cache
        holds), pick and read its first token, and, unless it has finished,
        add it to the batch. The engine must not be :attr:`full`."""
        [prefill] = self.begin([request])
        while True:
            for _, piece in self.advance(prefill):
                return piece

    def begin(self, requests: Sequence[Request]) -> list[Prefill]:
        """Start prefilling ``requests``: one :class:`Prefill` for those
        whose prompt caches hold prefixes of one length (each prefill
        leaves at least one token to run: its logits pick the first token).
        They must fit: at most ``max_batch`` rows and prefills in all."""
        if self.occupied + len(requests) > self.max_batch:
            raise ModelError(f"the batch is full ({self.max_batch} rows)")
        groups: dict[int, list[tuple[Request, tuple[mx.array, ...]]]] = {}
        for request in requests:
            prefix, cached = self._cached_prefix(request)
            request.cached = prefix
            groups.setdefault(prefix, []).append((request, cached))
        llm, layout = self.llm, self.llm.cache_layout
        begun = []
        for start, members in groups.items():
            chunks = self._chunks(start, max(len(r.ids) for r, _ in members) - start)
            size = llm.cache_width(start + sum(padded for _, padded in chunks))
            caches = []
            for request, cached in members:
                if start:
                    caches.append(list(layout.widened(
                        layout.map_slots(cached, lambda x: x[:, :, :start]), size)))
                else:
                    # The layout's KV heads: this rank's, when the model is split.
                    caches.append(list(layout.empty(1, size)))
            stacked = tuple(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
                            for parts in zip(*caches))
            begun.append(Prefill([r for r, _ in members], start, chunks, stacked))
        self.prefilling += begun
        return begun

    def _chunks(self, start: int, tokens: int) -> list[tuple[int, int]]:
        """The chunks that prefill ``tokens`` tokens after ``start``, as
        (tokens, padded length): at most ``prefill_chunk`` tokens each,
        padded on the right to a bucket length (prompts of nearby lengths
        share one trace and its compiled kernels), none past the cache's
        last slot (:attr:`~mlxprog.llm.compiled.CompiledModel.cache_slots`)."""
        step = tokens if self.prefill_chunk is None else self.prefill_chunk
        chunks, at = [], start
        while at < start + tokens:
            n = min(step, start + tokens - at)
            chunk = min(prefill_bucket(n), self.llm.cache_slots - at)
            chunks.append((n, chunk))
            at += n
        return chunks

    def advance(self, prefill: Prefill) -> list[tuple[Request, Piece]]:
        """Run the next chunk of ``prefill``; ``(request, first piece)`` of
        the rows whose prompts it completes. Those leave the prefill and,
        unless finished, join the batch; cancelled rows leave it unread. A
        prefill with no rows left is done."""
        self._drop_cancelled(prefill)
        if not prefill.rows:
            return []
        llm, rows = self.llm, prefill.rows
        at = prefill.start + prefill.done
        step, length = prefill.chunks.pop(0)
        tokens = [(r.ids[at:at + step] + [0] * length)[:length] for r in rows]
        out = LogitsOutputs.of(llm.executable("prefill", None)(**PrefillInputs(
            tokens=mx.array(tokens, dtype=mx.int32),
            last_index=mx.array([min(max(len(r.ids) - 1 - at, 0), length - 1) for r in rows],
                                dtype=mx.int32),
            rope_offset=mx.array([at] * len(rows), dtype=mx.int32),
            cache_offset=mx.array(at, dtype=mx.int32),
            # The rows' own slots: their padding, never attended by their
            # tokens, is kept out of a quantized cache's recent ring too.
            key_mask=mx.arange(prefill.caches[0].shape[2])[None, :]
            < mx.array([[len(r.ids)] for r in rows]),
            key=self._step_key, caches=prefill.caches,
        ).by_name(llm.cache_layout)))
        prefill.caches, prefill.done = out.caches, prefill.done + step
        complete = [i for i, r in enumerate(rows) if len(r.ids) <= at + step]
        picked = {i: rows[i].pick(llm, out.logits if len(rows) == 1 else out.logits[i:i + 1])
                  for i in complete}
        mx.async_eval(*[a for p in picked.values() for a in p], *out.caches)
        pieces = []
        for i in complete:
            request = rows[i]
            pieces.append((request, self._take(request, picked[i])))
            if request.finished:
                self._store(request, out.caches, i)
            else:
                self._join(request, llm.cache_layout.map_slots(
                    [x[i:i + 1] for x in out.caches], lambda x: x[:, :, :len(request.ids)]))
        self._keep(prefill, [i for i in range(len(rows)) if i not in picked])
        return pieces

    def _drop_cancelled(self, prefill: Prefill) -> None:
        """Cut the cancelled rows out of ``prefill`` (finished "cancelled")."""
        for request in prefill.rows:
            if request.cancelled:
                request.finish("cancelled")
        self._keep(prefill, [i for i, r in enumerate(prefill.rows) if not r.finished])

    def _keep(self, prefill: Prefill, keep: list[int]) -> None:
        """Keep rows ``keep`` of ``prefill``; a prefill left empty is done."""
        if len(keep) == len(prefill.rows):
            return
        prefill.rows = [prefill.rows[i] for i in keep]
        if not keep:
            self.prefilling.remove(prefill)
            return
        index = mx.array(keep, dtype=mx.int32)
        prefill.caches = tuple(mx.take(x, index, axis=0) for x in prefill.caches)

    def _cached_prefix(self, request: Request) -> tuple[int, tuple[mx.array, ...]]:
        """How many prompt tokens the prompt cache holds (leaving at least one
        to prefill: its logits pick the first token), and its caches."""
        if request.prompt_cache is None:
            return 0, ()
        tokens, caches = request.prompt_cache.lookup(request.ids)
        if not caches:
            return 0, ()
        return min(common_prefix(tokens, request.ids), len(request.ids) - 1), caches

    def _join(self, request: Request, caches: tuple[mx.array, ...]) -> None:
        """Add a prefilled row holding ``request.length`` tokens."""
        n, layout = request.length, self.llm.cache_layout
        if not self.rows:
            self.caches, self.offset = caches, n
        else:
            if n > self.offset:  # shift the batch right to line the rows up
                shift = n - self.offset
                self.caches = layout.shifted(
                    self.caches, shift, lambda x: mx.pad(x, [(0, 0), (0, 0), (shift, 0), (0, 0)]))
                for row in self.rows:
                    row.pad += shift
                self.offset = n
            place = [(0, 0), (0, 0), (self.offset - n, self.width - self.offset), (0, 0)]
            caches = layout.shifted(caches, self.offset - n, lambda x: mx.pad(x, place))
            self.caches = tuple(mx.concatenate([x, new], axis=0)
                                for x, new in zip(self.caches, caches))
        request.pad = self.offset - n
        self.rows.append(request)
        self._key_mask = None

    # -- stepping --------------------------------------------------------------
    def step(self) -> list[tuple[Request, Piece]]:
        """One decode step of every row; returns ``(request, piece)`` for the
        tokens read (those of the previous step: this step's are read on the
        next). Cancelled and finished rows leave the batch."""
        pieces: list[tuple[Request, Piece]] = []
        for row in self.rows:
            if row.cancelled:
                row.finish("cancelled")
        if any(r.dispatched >= r.budget for r in self.rows if not r.finished):
            # Their last token is picked: read every row's now, so that they
            # leave before the step.
            pieces += self._read()
        self._leave()
        if not self.rows:
            return pieces
        if len(self.rows) == 1 and self.rows[0].drafter is not None \
                and self.rows[0].drafter.drafting():
            row = self.rows[0]
            pieces += self._read()  # a draft follows every token so far
            self._leave()
            if not self.rows:
                return pieces
            draft = self._draft(row)
            if draft is not None:
                return pieces + self._verify(row, draft)
        self._make_room()
        llm = self.llm
        tokens = [r.next_token for r in self.rows]
        out = LogitsOutputs.of(llm.executable("decode", None)(**DecodeInputs(
            tokens=tokens[0] if len(tokens) == 1 else mx.concatenate(tokens),
            rope_offset=mx.array([self.offset - r.pad for r in self.rows], dtype=mx.int32),
            cache_offset=mx.array(self.offset, dtype=mx.int32), key_mask=self.key_mask(),
            key=self._step_key, caches=self.caches,
        ).by_name(llm.cache_layout)))
        self.caches, self.offset = out.caches, self.offset + 1
        constrained = [r for r in self.rows if r.constraint is not None]
        if constrained:
            # A constrained row's mask follows the token it picked last: start
            # the forward pass, read those tokens (only those rows wait) and
            # compute the masks while it runs.
            mx.async_eval(out.logits, *out.caches)
            pieces += self._read(constrained)
            if len(constrained) > 1:
                self._masks().fill([r.constraint for r in constrained])
        picked = []
        for i, row in enumerate(self.rows):
            row.fed += 1
            logits = out.logits if len(self.rows) == 1 else out.logits[i:i + 1]
            picked.append(row.pick(llm, logits))
        mx.async_eval(*[a for p in picked for a in p], *self.caches)
        pieces += self._read()
        for row, p in zip(self.rows, picked):
            row.unread = p
        self._leave()
        return pieces

    # -- speculative decoding ------------------------------------------------
    # A batch of one row decodes speculatively when its request asks for it
    # (see mlxprog.llm.speculative); a larger batch steps plainly, every row
    # one token a step, and a row left alone resumes drafting.
    def _draft(self, row: Request) -> Draft | None:
        """The row's drafter's tokens to verify (at most what its budget and
        the cache leave room for: a rotating cache is verified only below
        ``max_kv_size``, where it does not wrap), or None."""
        llm = self.llm
        limit = llm.cache_layout.max_kv_size or llm.max_length
        k = min(row.budget - len(row.read), limit - self.offset) - 1
        if k < 1:
            return None
        row.key, draft_key = mx.random.split(row.key)
        return row.drafter.propose(row.ids + row.read, k, draft_key)

    def _verify(self, row: Request, draft: Draft) -> list[tuple[Request, Piece]]:
        """Feed the row's next token and ``draft`` to the verify step, keep
        what :func:`~mlxprog.llm.speculative.judge` accepts (the cache's
        offset moves past them only: the rejected drafts' slots are
        overwritten later) and read the tokens it emits."""
        llm, drafted = self.llm, draft.tokens.shape[0]
        self._make_room(drafted + 1)
        out = LogitsOutputs.of(llm.executable("verify")(**VerifyInputs(
            tokens=mx.concatenate([row.next_token, draft.tokens])[None],
            rope_offset=mx.array([self.offset - row.pad], dtype=mx.int32),
            cache_offset=mx.array(self.offset, dtype=mx.int32), key_mask=self.key_mask(),
            caches=self.caches,
        ).by_name(llm.cache_layout)))
        self.caches = out.caches
        verdict = judge(row.shaped(out.logits[0], draft.tokens.tolist()), draft, row.picking,
                        row.history, row.key)
        fed = verdict.accepted + 1   # the token picked last and the drafts kept
        self.offset += fed
        row.fed += fed
        row.key = verdict.key
        row.drafter.record(drafted, verdict.accepted)
        row.drafted += drafted
        row.accepted += verdict.accepted
        row.dispatched += len(verdict.tokens)
        row.next_token = mx.array(verdict.tokens[-1:], dtype=mx.int32)
        if row.picking.repetition_penalty is not None:
            emitted = mx.array([verdict.tokens], dtype=mx.int32)
            context = row.history.shape[1]
            row.history = mx.concatenate([row.history, emitted], axis=1)[:, -context:]
        pieces = []
        for token, logprob, top in zip(verdict.tokens, verdict.logprobs, verdict.top_logprobs):
            pieces.append((row, row.take(token, logprob, top)))
            if row.finished:
                break
        self._leave()
        return pieces

    def _masks(self) -> MaskBatch:
        """The batch's mask computer (llguidance's threads), made when two
        constrained rows first share a step."""
        if self._mask_batch is None:
            self._mask_batch = MaskBatch()
        return self._mask_batch

    def _read(self, rows: Sequence[Request] | None = None) -> list[tuple[Request, Piece]]:
        """Read the unread tokens of ``rows`` (None: every row); their pieces."""
        pieces = []
        for row in self.rows if rows is None else rows:
            if row.unread is not None and not row.finished:
                pieces.append((row, self._take(row, row.unread)))
            row.unread = None
        return pieces

    @staticmethod
    def _take(row: Request, picked: tuple[mx.array, ...]) -> Piece:
        """Read one picked token (and its log-probabilities, if asked for)."""
        token, *logprobs = picked
        logprob = logprobs[0].item() if logprobs else None
        top = list(zip(logprobs[1][0].tolist(), logprobs[2][0].tolist())) if len(logprobs) > 1 else []
        return row.take(token.item(), logprob, top)

    def _leave(self) -> None:
        """Cut out the finished rows (storing their caches) and the slots no
        row uses any more."""
        gone = [i for i, r in enumerate(self.rows) if r.finished]
        if not gone:
            return
        for i in gone:
            self._store(self.rows[i], self.caches, i)
        keep = [i for i, r in enumerate(self.rows) if not r.finished]
        self.rows = [self.rows[i] for i in keep]
        if not self.rows:
            self.caches, self.offset = (), 0
        else:
            index = mx.array(keep, dtype=mx.int32)
            self.caches = tuple(mx.take(x, index, axis=0) for x in self.caches)
            self._trim()
        self._key_mask = None

    def _store(self, row: Request, caches: tuple[mx.array, ...], index: int) -> None:
        """Give a finished row's tokens and caches to its prompt cache: the
        prompt and the generated tokens both written and read (a row
        cancelled while a token was read has it written, not read)."""
        if row.prompt_cache is None or self.wrapped:
            return
        kept = min(row.fed, len(row.read))
        start, end = row.pad, row.pad + len(row.ids) + kept
        # Copies: a slice shares its array's buffer, so a stored slice of the
        # batch's caches would keep all of them alive (every row, every slot)
        # as long as the prompt cache keeps the entry.
        stored = self.llm.cache_layout.shifted([x[index:index + 1] for x in caches], -start,
                                               lambda x: x[:, :, start:end])
        row.prompt_cache.store(row.ids + row.read[:kept], [mx.contiguous(x) for x in stored])

    def _trim(self) -> None:
        """Drop the leading slots that are padding in every row (none once a
        rotating cache has wrapped: a slot's place then says which token it
        holds)."""
        unused = 0 if self.wrapped else min(r.pad for r in self.rows)
        if unused:
            self.caches = self.llm.cache_layout.shifted(self.caches, -unused,
                                                        lambda x: x[:, :, unused:])
            self.offset -= unused
            for row in self.rows:
                row.pad -= unused
            self._key_mask = None

    def _make_room(self, tokens: int = 1) -> None:
        """Make the caches ``offset + tokens`` slots or more wide (the next
        multiple of ``cache_step``, at most :attr:`CompiledModel.cache_slots
        <mlxprog.llm.compiled.CompiledModel.cache_slots>`: a rotating cache then rotates)."""
        llm = self.llm
        if self.offset + 1 > llm.cache_slots:
            self._trim()  # each row has room, so some slots are padding everywhere
        width = llm.cache_width(self.offset + tokens)
        if width > self.width:
            self._widen(width)
            self._key_mask = None
        elif width < self.width:
            self.caches = llm.cache_layout.map_slots(self.caches, lambda x: x[:, :, :width])
            self._key_mask = None

    def _widen(self, width: int) -> None:
        """Make the caches ``width`` slots wide, one array at a time: each
        widened copy is computed and the old array's buffer handed back
        before the next, so the old and new caches are never held whole
        together (twice the cache's memory at the peak; and MLX's cache of
        free buffers, which keeps the old buffers, cannot reuse them for
        the larger arrays)."""
        widened = list(self.llm.cache_layout.widened(self.caches, width))
        self.caches = ()
        for array in widened:
            mx.eval(array)
            mx.clear_cache()
        self.caches = tuple(widened)

    def key_mask(self) -> mx.array:
        """``[B, W]``: false on each row's padding."""
        if self._key_mask is None:
            pads = mx.array([r.pad for r in self.rows], dtype=mx.int32)
            self._key_mask = mx.arange(self.width)[None, :] >= pads[:, None]
        return self._key_mask


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def prefill_bucket(n: int) -> int:
    """The padded length a prefill of ``n`` tokens runs at: the next multiple
    of 8 up to 128 tokens, then of a sixteenth of the power of two at or above
    ``n`` (16 up to 256, 32 up to 512, ...), so the padding is at most 7
    tokens or an eighth of ``n``. Every padded row costs a real row's compute
    (a 42-token chat prompt run as 64 took 22% longer than as 48,
    docs/benchmarks.md); each new length costs a trace, once per process."""
    return _round_up(n, max(8, 1 << max(0, (n - 1).bit_length() - 4)))


def run(llm: CompiledModel, requests: Iterable[Request]) -> Iterator[tuple[Request, Piece]]:
    """Generate ``requests`` together (joining as rows free up); yield
    ``(request, piece)`` as tokens are read. Closed early, or left by an
    exception (a Ctrl-C), it cancels the rows still running: they leave the
    batch, storing what they generated in their prompt caches (a chat's
    interrupted reply is then cached for the next turn)."""
    engine = Engine(llm)
    waiting = list(requests)
    try:
        while waiting or engine.rows:
            while waiting and not engine.full:
                request = waiting.pop(0)
                yield request, engine.add(request)
            yield from engine.step()
    finally:
        if engine.rows:
            for row in engine.rows:
                row.cancel()
            engine.step()
