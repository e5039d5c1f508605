"""Text generation with compiled prefill and decode-step programs.

:func:`load` returns an :class:`LLM`. Its host loop keeps the device busy: the
next decode step is dispatched (``mx.async_eval``) before the current tokens
are read back and detokenized, and the tokens a step picked are fed to the
next step as lazy arrays, so the loop never waits on the host between steps.

Every generation method takes the same options, declared once by
:class:`GenerationOptions`: as keyword arguments, or as ``options=``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

import mlx.core as mx

from ..format.program import Program
from ..runtime.executable import Executable, compile as compile_program
from .config import Checkpoint, ModelError
from .model_files import load_checkpoint
from .programs import (
    DecodeInputs, DecodeLoopInputs, ModelSpec, PrefillInputs, Sampling, StepOutputs,
    build_decode, build_decode_loop, build_prefill,
)

DEFAULT_MAX_LENGTH = 2048
DEFAULT_CACHE_STEP = 128


@dataclass(frozen=True)
class GenerationOptions:
    """How :class:`LLM` generates; every generation method takes these, as
    keyword arguments or as ``options=``.

    ``max_tokens``: the most tokens to generate. ``temperature`` 0 is greedy;
    ``top_k``/``top_p``/``min_p`` filter the tempered distribution (see
    :class:`~mlxprog.llm.Sampling`, derived as :attr:`sampling`); ``seed`` makes
    sampling reproducible. Generation ends at EOS, a ``stop`` string (one
    string or several; kept as a tuple of the non-empty ones) or
    ``max_tokens`` tokens. ``chat`` renders a text prompt as one user message
    with the model's chat template. Bad values raise
    :class:`~mlxprog.llm.ModelError`.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int = 0
    stop: str | Sequence[str] = ()
    chat: bool = True
    #: The sampling parameters (the programs' attributes), derived from the
    #: fields above once, which validates them.
    sampling: Sampling = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampling",
                           Sampling(self.temperature, self.top_k, self.top_p, self.min_p))
        if self.max_tokens < 1:
            raise ModelError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**64:
            raise ModelError(
                f"seed must be a non-negative integer below 2**64, got {self.seed!r}")
        # A bare string is one stop string, not one per character.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        object.__setattr__(self, "stop", tuple(s for s in stop if s))

    @classmethod
    def given(cls, options: GenerationOptions | None,
              overrides: Mapping[str, Any]) -> GenerationOptions:
        """What a generation method was given: ``options`` (None: the
        defaults) with the keyword arguments ``overrides`` replacing fields."""
        if options is None:
            return cls(**overrides)
        return dataclasses.replace(options, **overrides) if overrides else options


@dataclass
class GenerationStats:
    """Timings of one generation. ``prompt_tps`` counts prompt tokens over the
    prefill time; ``decode_tps`` generated tokens (after the first) over the
    decode time; ``ttft`` is the time to the first token, in seconds."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    ttft: float = 0.0
    peak_memory_gb: float = 0.0

    @property
    def prompt_tps(self) -> float:
        """Prompt tokens per second."""
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tps(self) -> float:
        """Generated tokens per second, after the first."""
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0

    def summary(self) -> str:
        """One line: prompt and decode speed, time to first token, peak memory."""
        return (f"prompt: {self.prompt_tokens} tokens, {self.prompt_tps:.1f} tok/s | "
                f"decode: {self.generated_tokens} tokens, {self.decode_tps:.1f} tok/s | "
                f"ttft: {self.ttft:.3f} s | peak memory: {self.peak_memory_gb:.2f} GB")


@dataclass
class Generation:
    """What :meth:`LLM.generate` returns: the text, the generated token ids
    (without the EOS), why it stopped (``"eos"``, ``"stop"`` or ``"length"``),
    and stats."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats = field(default_factory=GenerationStats)


class _Row:
    """Host-side state of one sequence of a batch: tokens, detokenizer, stops."""

    def __init__(self, llm: LLM, stop: tuple[str, ...]):
        self.tokens: list[int] = []
        self.text = ""
        self.emitted = 0
        self.finish_reason: str | None = None
        self.decoder = llm.tokenizer.stream_decoder(skip_special_tokens=True)
        self.eos = set(llm.tokenizer.eos_token_ids) | set(llm.config.eos_token_ids)
        self.stop = stop
        self.hold = max((len(s) for s in self.stop), default=1) - 1

    def add(self, token: int) -> str:
        """Take one token; return the text that can be shown now."""
        if self.finish_reason is not None:
            return ""
        if token in self.eos:
            self.finish_reason = "eos"
        else:
            self.tokens.append(token)
            self.text += self.decoder.add(token)
            for s in self.stop:
                at = self.text.find(s)
                if at >= 0:
                    self.text = self.text[:at]
                    self.finish_reason = "stop"
        if self.finish_reason is not None:
            self.text += "" if self.finish_reason == "stop" else self.decoder.flush()
            end = len(self.text)
        else:  # hold back what could still become a stop string
            end = max(self.emitted, len(self.text) - self.hold)
        piece, self.emitted = self.text[self.emitted:end], end
        return piece

    def finish(self) -> str:
        """Mark a row that ran out of tokens; return its remaining text."""
        if self.finish_reason is None:
            self.text += self.decoder.flush()
            self.finish_reason = "length"
        piece, self.emitted = self.text[self.emitted:], len(self.text)
        return piece


# The handler of the in-program generation running in this context (thread,
# or generation started from another's on_text): compiled decode loops are
# shared, so their ``emit`` callback cannot hold a generation of its own.
_EMIT_HANDLER: ContextVar[Callable[[mx.array], mx.array]] = ContextVar("mlxprog_llm_emit")


def _emit(tokens: mx.array) -> mx.array:
    """The decode loop's ``emit`` callback: hands the picked tokens to the
    in-program generation running in the caller's context; returns its stop."""
    handler = _EMIT_HANDLER.get(None)
    if handler is None:
        raise ModelError("the decode loop's emit callback has no generation to stream to; "
                         "run the loop with LLM.generate_in_program")
    return handler(tokens)


class LLM:
    """A loaded model with its tokenizer and compiled programs.

    ``max_length`` is the longest the KV cache gets: prompt plus generated
    tokens must fit. Attention reads every slot of the cache, so the caches
    start at the prompt's length and the decode steps grow them to multiples of
    ``cache_step`` slots as tokens are generated (``cache_step >= max_length``:
    the whole cache from the first decode step on). Programs are built on
    first use for each sampling configuration (sampling parameters are program
    attributes) and compiled with the model's weights as captures; the prefill
    program has a symbolic prompt length (one trace per length, least recently
    used evicted), and the decode step is traced once per batch size and cache
    length. ``native`` is passed to :func:`mlxprog.compile` (None: the
    ``MLXPROG_NATIVE`` default; False: MLX's own CPU ops).
    """

    def __init__(self, checkpoint: Checkpoint, max_length: int = DEFAULT_MAX_LENGTH,
                 programs: Mapping[str, Program] | None = None,
                 programs_sampling: Sampling = Sampling(),
                 cache_step: int = DEFAULT_CACHE_STEP, native: bool | None = None):
        if max_length < 2:
            raise ModelError(f"max_length must be at least 2, got {max_length}")
        if cache_step < 1:
            raise ModelError(f"cache_step must be at least 1, got {cache_step}")
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.tokenizer = checkpoint.tokenizer
        self.max_length = max_length
        self.cache_step = cache_step
        self.native = native
        self.spec = ModelSpec.of(checkpoint)
        self._captures = self.spec.captures(checkpoint)
        self._given = dict(programs or {})
        self._given_sampling = programs_sampling
        self._executables: dict[tuple[str, Sampling], Executable] = {}

    # -- programs ----------------------------------------------------------
    def program(self, kind: str, sampling: Sampling = Sampling()) -> Program:
        """The ``"prefill"``, ``"decode"`` or ``"decode_loop"`` program for
        ``sampling`` (programs given to the constructor are used as they are)."""
        if kind in self._given:
            if sampling != self._given_sampling:
                raise ModelError(f"the given programs sample with {self._given_sampling}; "
                                 f"{sampling} needs programs built (or exported) for it")
            return self._given[kind]
        builders = {"prefill": build_prefill, "decode": build_decode,
                    "decode_loop": build_decode_loop}
        if kind not in builders:
            raise ModelError(f"unknown program kind {kind!r}; one of {sorted(builders)}")
        return builders[kind](self.spec, self.max_length, sampling)

    def executable(self, kind: str, sampling: Sampling = Sampling()) -> Executable:
        """The compiled program of ``kind`` for ``sampling`` (cached). The decode
        loop's ``emit`` callback forwards to the in-program generation running
        in the caller's context (see :meth:`generate_in_program`)."""
        key = (kind, sampling)
        if key not in self._executables:
            # The prefill is traced per prompt length rather than padded to
            # buckets: a trace costs less than a few padded tokens on the CPU.
            self._executables[key] = compile_program(
                self.program(kind, sampling), captures=self._captures,
                callbacks={"emit": _emit} if kind == "decode_loop" else None,
                native=self.native,
            )
        return self._executables[key]

    # -- prompts -----------------------------------------------------------
    def prompt_ids(self, prompt: str | Sequence[Mapping[str, str]], chat: bool = True) -> list[int]:
        """Token ids of a prompt: text (rendered as one user message with the
        chat template when ``chat``), or a list of chat messages."""
        if not isinstance(prompt, str):
            return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt))
        if chat and self.tokenizer.chat_template:
            prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ModelError("the prompt is empty")
        return ids

    # -- generation --------------------------------------------------------
    # Each method takes GenerationOptions' fields as keyword arguments and/or
    # a whole GenerationOptions as ``options=`` (the keyword arguments replace
    # its fields), so the options and their defaults are declared only there.
    def generate(self, prompt: str | Sequence[Mapping[str, str]], *,
                 options: GenerationOptions | None = None, **overrides: Any) -> Generation:
        """Generate a completion of ``prompt``; see :class:`GenerationOptions`
        for the options."""
        options = GenerationOptions.given(options, overrides)
        return _drain(self._run([self.prompt_ids(prompt, options.chat)], options))[0]

    def stream(self, prompt: str | Sequence[Mapping[str, str]], *,
               options: GenerationOptions | None = None, **overrides: Any) -> Iterator[str]:
        """Yield the completion's text as it is generated (never a broken UTF-8
        character, never part of a stop string); see :class:`GenerationOptions`
        for the options. ``self.last_generation`` holds the full result and
        stats once the iterator is exhausted."""
        options = GenerationOptions.given(options, overrides)
        run = self._run([self.prompt_ids(prompt, options.chat)], options)
        while True:
            try:
                _, piece = next(run)
            except StopIteration as finished:
                self.last_generation = finished.value[0]
                return
            if piece:
                yield piece

    def generate_batch(self, prompts: Sequence[str | Sequence[Mapping[str, str]]], *,
                       options: GenerationOptions | None = None,
                       **overrides: Any) -> list[Generation]:
        """Generate for several prompts at once (left-padded into one batch);
        each row stops on its own. Under greedy decoding each row's output is
        the same as generating its prompt alone."""
        options = GenerationOptions.given(options, overrides)
        if not prompts:
            return []
        return _drain(self._run([self.prompt_ids(p, options.chat) for p in prompts], options))

    def generate_in_program(self, prompt: str | Sequence[Mapping[str, str]], *,
                            on_text: Callable[[str], None] | None = None,
                            options: GenerationOptions | None = None,
                            **overrides: Any) -> Generation:
        """Like :meth:`generate`, but the decode loop is one program: a ``while``
        loop whose body runs the decode step, picks the token and streams it to
        Python through a ``runtime_call`` (which also decides when to stop);
        ``on_text`` gets the text as it is generated.

        The executable's ``emit`` callback finds this generation through a
        context variable set for the duration of the loop, so generations in
        other threads, or started from ``on_text``, each get their own tokens."""
        options = GenerationOptions.given(options, overrides)
        state = self._start([self.prompt_ids(prompt, options.chat)], options)
        row = state.rows[0]
        on_text = on_text or (lambda piece: None)

        def emit(tokens: mx.array) -> mx.array:  # the decode loop's runtime_call
            on_text(row.add(tokens.item()))
            return mx.array(row.finish_reason is not None)

        on_text(row.add(state.first.item()))
        state.mark_first_token()
        loop = self.executable("decode_loop", options.sampling)
        state.reserve(state.width + state.max_new)  # the loop's caches cannot grow
        if row.finish_reason is None and state.max_new > 0:
            inputs = DecodeLoopInputs(
                tokens=state.first, rope_offset=state.rope_offset(0),
                cache_offset=state.cache_offset(0), key_mask=state.key_mask, key=state.key,
                caches=state.caches, max_new=state.max_new)
            handler_set = _EMIT_HANDLER.set(emit)
            try:
                mx.eval(loop(**inputs.by_name()))
            finally:
                _EMIT_HANDLER.reset(handler_set)
        on_text(row.finish())
        return state.finish()[0]

    def _start(self, ids: list[list[int]], options: GenerationOptions) -> _State:
        """The batch of prompts ``ids`` after the prefill: its first tokens,
        PRNG key and caches (dispatched, not yet evaluated)."""
        state = _State(self, ids, options)
        prefill = self.executable("prefill", options.sampling)
        out = StepOutputs.of(prefill(**PrefillInputs(
            tokens=state.tokens, rope_offset=state.rope_offset(-state.width),
            key_mask=state.key_mask, key=mx.random.key(options.seed), caches=state.caches,
        ).by_name()))
        state.first, state.key, state.caches = out.next_tokens, out.key, out.caches
        mx.async_eval(out.values())
        return state

    def _run(self, ids: list[list[int]], options: GenerationOptions
             ) -> Generator[tuple[int, str], None, list[Generation]]:
        """Yield ``(row, text piece)`` as tokens arrive; return the results.

        The first tokens are read and yielded as soon as the prefill is done,
        before the decode step is built or traced (on a cold start that takes a
        few tenths of a second). After that each decode step is dispatched
        before the previous step's tokens are read, so the device does not wait
        for the host."""
        state = self._start(ids, options)
        first = state.first.tolist()
        state.mark_first_token()
        yield from state.add(first)
        tokens, unread = state.first, None
        for step in range(state.max_new):
            if state.done:
                break
            state.reserve(state.width + step + 1)
            decode = self.executable("decode", options.sampling)  # built on first use
            # The inputs are not kept: once the step is dispatched nothing
            # refers to the old caches, so the step writes them in place.
            out = StepOutputs.of(decode(**DecodeInputs(
                tokens=tokens, rope_offset=state.rope_offset(step),
                cache_offset=state.cache_offset(step), key_mask=state.key_mask,
                key=state.key, caches=state.caches,
            ).by_name()))
            tokens, state.key, state.caches = out.next_tokens, out.key, out.caches
            mx.async_eval(out.values())
            if unread is not None:
                yield from state.add(unread.tolist())
            unread = tokens
        if unread is not None and not state.done:
            yield from state.add(unread.tolist())
        for i, row in enumerate(state.rows):
            yield i, row.finish()
        return state.finish()


class _State:
    """One generation's batch: padded tokens, masks, caches and timings."""

    def __init__(self, llm: LLM, ids: list[list[int]], options: GenerationOptions):
        c = llm.config
        self.width = max(len(p) for p in ids)
        if self.width >= llm.max_length:
            raise ModelError(f"the prompt has {self.width} tokens, but the KV cache holds "
                             f"{llm.max_length} (max_length); load the model with a larger "
                             "max_length or shorten the prompt")
        self.pads = [self.width - len(p) for p in ids]
        self.tokens = mx.array([[0] * pad + p for pad, p in zip(self.pads, ids)], dtype=mx.int32)
        self.max_length, self.cache_step = llm.max_length, llm.cache_step
        # The prefill's caches hold just the prompt (attention reads every
        # slot); the decode steps grow them with reserve().
        shape = (len(ids), c.num_kv_heads, self.width, c.head_dim)
        self.caches = tuple(mx.zeros(shape, dtype=mx.float32) for _ in range(2 * c.num_layers))
        self.key_mask = self._key_mask(self.width)
        # Decode steps after the first token: bounded by max_tokens and the cache.
        self.max_new = min(options.max_tokens - 1, llm.max_length - self.width)
        self.rows = [_Row(llm, options.stop) for _ in ids]
        self.prompt_tokens = sum(len(p) for p in ids)
        self.first: mx.array | None = None
        self.key: mx.array | None = None
        mx.reset_peak_memory()
        self.start = time.perf_counter()
        self.first_token_at = self.start

    @property
    def done(self) -> bool:
        """Whether every row has finished."""
        return all(row.finish_reason is not None for row in self.rows)

    def add(self, tokens: list[int]) -> Iterator[tuple[int, str]]:
        """Give each row its token; yield ``(row, text piece)``."""
        for i, (row, token) in enumerate(zip(self.rows, tokens)):
            yield i, row.add(token)

    def reserve(self, slots: int) -> None:
        """Grow the caches (zero-filled) and the key mask to at least ``slots``
        slots: the next multiple of ``cache_step``, at most ``max_length``."""
        size = self.key_mask.shape[1]
        if slots <= size:
            return
        new_size = min(-(-slots // self.cache_step) * self.cache_step, self.max_length)
        grow = [(0, 0), (0, 0), (0, new_size - size), (0, 0)]
        self.caches = tuple(mx.pad(cache, grow) for cache in self.caches)
        self.key_mask = self._key_mask(new_size)

    def _key_mask(self, size: int) -> mx.array:
        """``[B, size]``: false on each row's left padding."""
        return mx.arange(size)[None, :] >= mx.array(self.pads)[:, None]

    def rope_offset(self, step: int) -> mx.array:
        """Each row's position of the token written at ``step`` (``-width``: the
        prompt's first token)."""
        return mx.array([self.width + step - pad for pad in self.pads], dtype=mx.int32)

    def cache_offset(self, step: int) -> mx.array:
        """The cache slot the token of decode step ``step`` is written to."""
        return mx.array(self.width + step, dtype=mx.int32)

    def mark_first_token(self) -> None:
        self.first_token_at = time.perf_counter()

    def finish(self) -> list[Generation]:
        end = time.perf_counter()
        stats = GenerationStats(
            prompt_tokens=self.prompt_tokens,
            generated_tokens=sum(len(r.tokens) + (r.finish_reason == "eos") for r in self.rows),
            prompt_seconds=self.first_token_at - self.start,
            decode_seconds=end - self.first_token_at,
            ttft=self.first_token_at - self.start,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
        )
        return [Generation(r.text, r.tokens, r.finish_reason or "length", stats)
                for r in self.rows]


def load(model: str | Path | None = None, max_length: int = DEFAULT_MAX_LENGTH,
         cache_step: int = DEFAULT_CACHE_STEP, native: bool | None = None) -> LLM:
    """Load a model (a ``.gguf`` file or Hugging Face directory; None: the
    default SmolLM2-135M-Instruct, installed on first use) for generation;
    see :class:`LLM` for ``max_length``, ``cache_step`` and ``native``."""
    return LLM(load_checkpoint(model), max_length=max_length, cache_step=cache_step,
               native=native)


def load_exported(directory: str | Path, model: str | Path | None = None,
                  native: bool | None = None) -> LLM:
    """An :class:`LLM` running the programs written by ``mlxprog export-llm``
    (``prefill.json``, ``decode.json``, ``decode_loop.json``), with the model's
    weights bound by capture name from the model file."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise ModelError(f"{directory}: no manifest.json (write it with mlxprog export-llm)")
    manifest = json.loads(manifest_path.read_text())
    programs = {kind: Program.load(directory / f"{kind}.json") for kind in EXPORTED}
    sampling = Sampling(**manifest["sampling"])
    return LLM(load_checkpoint(model if model is not None else manifest.get("model")),
               max_length=manifest["max_length"], programs=programs, programs_sampling=sampling,
               cache_step=manifest.get("cache_step", DEFAULT_CACHE_STEP), native=native)


EXPORTED = ("prefill", "decode", "decode_loop")


def export(llm: LLM, directory: str | Path, sampling: Sampling = Sampling()) -> list[Path]:
    """Write the model's programs as JSON (weights stay in the model file) plus a
    manifest naming the model, the cache length and growth step, and the
    sampling; returns the files written. :func:`load_exported` runs them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in EXPORTED:
        path = directory / f"{kind}.json"
        llm.program(kind, sampling).save(path)
        written.append(path)
    manifest = {
        "model": str(llm.checkpoint.path),
        "max_length": llm.max_length,
        "cache_step": llm.cache_step,
        "sampling": dataclasses.asdict(sampling),
        "inputs": {kind: [s.name for s in llm.program(kind, sampling).inputs]
                   for kind in EXPORTED},
    }
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return [*written, path]



def _drain(run: Generator[tuple[int, str], None, list[Generation]]) -> list[Generation]:
    """Run a generation to the end; its results."""
    while True:
        try:
            next(run)
        except StopIteration as finished:
            return finished.value
