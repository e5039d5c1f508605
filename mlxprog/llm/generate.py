"""Text generation with compiled prefill, decode-step and token-picking programs.

:func:`load` returns an :class:`LLM`. Its generation methods run on the
engine (:mod:`~mlxprog.llm.engine`), which keeps the device busy: the next
decode step is dispatched before the current tokens are read back and
detokenized.

Every generation method takes the same options, declared once by
:class:`GenerationOptions`: as keyword arguments, or as ``options=``. A
prompt is text (rendered with the chat template when ``chat``), a list of
chat messages, or a list of token ids.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import mlx.core as mx

from .. import native as native_kernels
from ..format.program import Program
from ..runtime.executable import Executable, compile as compile_program
from .cache import PromptCache, kv_cache_layout
from .config import (
    AUTO_NUMERICS, NUMERICS, Checkpoint, ModelError, SettingError, is_int, resolve_numerics,
)
from .engine import Engine, Generation, Piece, Request, prefill_bucket, run
from .model_files import is_exported, load_checkpoint
from .programs import (
    POOLINGS, DecodeLoopInputs, EmbedInputs, Picking, PrefillInputs, Sampling, build_decode,
    build_decode_loop, build_embed, build_pick, build_prefill, build_verify,
)
from .models import model_spec
from .speculative import (
    DEFAULT_DRAFT_TOKENS, DEFAULT_LOOKUP_NGRAM, DRAFTS, MAX_DRAFT_TOKENS, MAX_LOOKUP_NGRAM,
    check_draft_model,
)
from .tokenizer import ChatTemplate, unicode_problem

DEFAULT_MAX_LENGTH = 2048
DEFAULT_CACHE_STEP = 128
MAX_TOP_LOGPROBS = 20
#: The most inputs one call of the embedding program runs (:meth:`LLM.embed`
#: runs more in several calls).
EMBED_BATCH = 16

#: A prompt: text, chat messages (dicts with ``role`` and ``content``), or token ids.
Prompt = Union[str, Sequence[Mapping[str, str]], Sequence[int]]
#: What :meth:`LLM.embed` embeds: a text, or token ids.
EmbeddingInput = Union[str, Sequence[int]]


class EmbeddingInputError(ModelError):
    """An input :meth:`LLM.embed` cannot embed: ``index`` is its place among
    the inputs (None: the inputs as a whole are wrong), ``tokens`` its
    length when it is longer than the model's ``max_length`` (else None)."""

    def __init__(self, index: int | None, problem: str, tokens: int | None = None):
        super().__init__(problem if index is None else f"input {index} {problem}")
        self.index = index
        self.tokens = tokens


@dataclass(frozen=True)
class GenerationOptions:
    """How :class:`LLM` generates; every generation method takes these, as
    keyword arguments or as ``options=``.

    ``max_tokens``: the most tokens to generate. ``temperature`` 0 is greedy;
    ``top_k``/``top_p``/``min_p`` filter the tempered distribution (see
    :class:`~mlxprog.llm.Sampling`, derived as :attr:`sampling`); ``seed`` makes
    sampling reproducible. ``repetition_penalty`` (None: off; mlx-lm's
    rule) makes the tokens among the last ``repetition_context_size`` ones
    less likely. ``logprobs`` reports each token's log-probability (off by
    default: on the CPU it costs about a millisecond per token);
    ``top_logprobs`` also those of that many most likely tokens (at most 20;
    implies ``logprobs``). Generation ends at EOS, a
    ``stop`` string (one string or several; kept as a tuple of the non-empty
    ones) or ``max_tokens`` tokens. ``chat`` renders a text prompt as a user
    message with the model's chat template, after ``system_prompt`` as a
    system message if given.

    Speculative decoding (see :mod:`~mlxprog.llm.speculative`): ``draft``
    ``"prompt-lookup"`` drafts from the sequence's own n-grams (the longest
    of at most ``prompt_lookup_ngram`` tokens that occurred before),
    ``"model"`` with the LLM's draft model (``draft_model``), ``"none"``
    decodes plainly; None (the default) is ``"model"`` when the LLM has a
    draft model, else ``"none"``. Each step verifies up to
    ``num_draft_tokens`` drafts at once. The output is the same (greedy:
    token for token; sampling: in distribution) and only the speed changes.
    Bad values raise :class:`~mlxprog.llm.ModelError` naming the option.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int = 0
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    logprobs: bool = False
    top_logprobs: int = 0
    stop: str | Sequence[str] = ()
    chat: bool = True
    system_prompt: str | None = None
    draft: str | None = None
    num_draft_tokens: int = DEFAULT_DRAFT_TOKENS
    prompt_lookup_ngram: int = DEFAULT_LOOKUP_NGRAM
    #: The sampling parameters (the programs' attributes), derived from the
    #: fields above once, which validates them.
    sampling: Sampling = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampling",
                           Sampling(self.temperature, self.top_k, self.top_p, self.min_p))
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ModelError(f"max_tokens must be at least 1, got {self.max_tokens!r}")
        if not is_int(self.seed) or not 0 <= self.seed < 2**64:
            raise ModelError(
                f"seed must be a non-negative integer below 2**64, got {self.seed!r}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ModelError(
                f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if not is_int(self.repetition_context_size) or self.repetition_context_size < 1:
            raise ModelError("repetition_context_size must be at least 1, got "
                             f"{self.repetition_context_size!r}")
        if not is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ModelError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                             f"got {self.top_logprobs!r}")
        if self.draft is not None and self.draft not in DRAFTS:
            raise ModelError(f"draft must be one of {', '.join(map(repr, DRAFTS))}, "
                             f"got {self.draft!r}")
        if not is_int(self.num_draft_tokens) or \
                not 1 <= self.num_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ModelError(f"num_draft_tokens must be in [1, {MAX_DRAFT_TOKENS}], "
                             f"got {self.num_draft_tokens!r}")
        if not is_int(self.prompt_lookup_ngram) or \
                not 1 <= self.prompt_lookup_ngram <= MAX_LOOKUP_NGRAM:
            raise ModelError(f"prompt_lookup_ngram must be in [1, {MAX_LOOKUP_NGRAM}], "
                             f"got {self.prompt_lookup_ngram!r}")
        # A bare string is one stop string, not one per character.
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) for s in stop):
            raise ModelError(f"stop must be strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(s for s in stop if s))

    @property
    def picking(self) -> Picking:
        """How each token is picked (greedy picking ignores the filters and
        the seed, so every greedy request shares one picker)."""
        sampling = self.sampling if self.sampling.temperature > 0 else Sampling()
        penalty = self.repetition_penalty
        return Picking(sampling, penalty, self.repetition_context_size if penalty else 1,
                       self.logprobs or self.top_logprobs > 0, self.top_logprobs)

    @classmethod
    def given(cls, options: GenerationOptions | None,
              overrides: Mapping[str, Any]) -> GenerationOptions:
        """What a generation method was given: ``options`` (None: the
        defaults) with the keyword arguments ``overrides`` replacing fields."""
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}: not a generation "
                            f"option (the options are {', '.join(sorted(names))})")
        if options is None:
            return cls(**overrides)
        return dataclasses.replace(options, **overrides) if overrides else options


def _no_generation(tokens: mx.array) -> mx.array:
    """The decode loop's ``emit`` callback when the loop is called as it was
    compiled: compiled decode loops are shared, so each in-program
    generation passes its own callback for its call (see
    :meth:`LLM.generate_in_program`), and there is none to stream to here."""
    raise ModelError("the decode loop's emit callback has no generation to stream to; "
                     "run the loop with LLM.generate_in_program")


# The decode step is traced per batch size and cache length (64 x 16 with
# the defaults), the prefill per prompt bucket and cache length: room for a
# server's mix.
MAX_TRACES = 256


def _sampling_of(kind: str, sampling: Sampling | None) -> Sampling | None:
    """The sampling of a program of ``kind``: the decode loop always samples
    (None: greedy)."""
    return Sampling() if kind == "decode_loop" and sampling is None else sampling


class LLM:
    """A loaded model with its tokenizer and compiled programs.

    ``max_length`` is the longest the KV cache gets: prompt plus generated
    tokens must fit. Attention reads every slot of the cache, so the caches
    start at the prompt's length (rounded up to ``cache_step``) and grow in
    multiples of ``cache_step`` slots as tokens are generated (``cache_step >=
    max_length``: the whole cache from the start). Programs are built on first
    use and compiled with the model's weights as captures: the prefill and
    decode step return logits and a small picker program per sampling
    configuration picks each sequence's token; the in-program decode loop
    samples inside the program (sampling parameters are its attributes).
    ``native`` is passed to :func:`mlxprog.compile` (None: the
    ``MLXPROG_NATIVE`` default; False: MLX's own CPU ops).

    ``numerics`` is the decode steps' quantized matmuls' (:attr:`numerics`
    holds the resolved choice): ``"exact"``, MLX's float numerics;
    ``"int8"``, llama.cpp's (activations quantized to 8 bits per weight
    group, integer dot products); None or ``"auto"``: ``"int8"`` on the CPU
    with the native kernels, ``"exact"`` otherwise (see
    :func:`~mlxprog.llm.config.resolve_numerics`). The prefill stays exact
    (see :func:`program_numerics`). Where a kernel cannot honour ``"int8"``
    (an op on the GPU, bits the integer path lacks) it computes exactly and
    the executable's ``stats`` say so.

    ``group`` (an ``mx.distributed`` group of more than one process) runs the
    model tensor-parallel over it: this process builds and runs its rank's
    programs (:attr:`world_size`, :attr:`rank`; see
    :mod:`~mlxprog.llm.programs`), its caches hold its KV heads only, and
    every rank picks the same tokens (the logits are whole on every rank and
    the pickers start from the same seeds), so every rank's generation is the
    same. A group of one process (or None) runs the whole model here.

    ``chat_template`` replaces the model's chat template (a Jinja string or
    a file; see :meth:`~mlxprog.llm.Tokenizer.with_chat_template`, which
    checks that it renders), and the tokens ``extra_eos_tokens`` names (token
    texts such as ``"<|im_end|>"``) end every generation as EOS does (see
    :meth:`~mlxprog.llm.Tokenizer.with_extra_eos_tokens`); bad values raise
    :class:`~mlxprog.llm.config.SettingError` naming the parameter.

    The KV cache (:attr:`cache_layout`, see :func:`~mlxprog.llm.cache.kv_cache_layout`):
    ``kv_bits`` 4 or 8 stores keys and values quantized in groups of
    ``kv_group_size`` features (default 32 with 4 bits, 64 with 8), about
    3.6x (8-bit) or 5.3x (4-bit) less memory than float32 for a head dim of
    64, and keeps the last ``kv_recent`` tokens' keys and values in float
    too (default 16, 0: none), which each query reads unrounded (SmolLM2's
    4-bit cache on four texts: +6.2% perplexity without, +0.3% with);
    ``max_kv_size`` bounds it to that many
    tokens, the first ``keep`` (default 4) and the most recent, so that
    generation goes on past it (a rotating cache; prompts must fit it).
    Out-of-range values raise :class:`~mlxprog.llm.config.SettingError`
    naming the parameter. See docs/llm.md, "KV cache".
    """

    def __init__(self, checkpoint: Checkpoint, max_length: int = DEFAULT_MAX_LENGTH,
                 programs: Mapping[str, Program] | None = None,
                 programs_sampling: Sampling = Sampling(),
                 cache_step: int = DEFAULT_CACHE_STEP, native: bool | None = None,
                 group: mx.distributed.Group | None = None, numerics: str | None = None,
                 chat_template: str | Path | ChatTemplate | None = None,
                 extra_eos_tokens: Sequence[str] = (), kv_bits: int | None = None,
                 kv_group_size: int | None = None, max_kv_size: int | None = None,
                 keep: int | None = None, kv_recent: int | None = None):
        if not is_int(max_length) or max_length < 2:
            raise ModelError(f"max_length must be at least 2, got {max_length!r}")
        if not is_int(cache_step) or cache_step < 1:
            raise ModelError(f"cache_step must be at least 1, got {cache_step!r}")
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        # The settings change this LLM's copy of the tokenizer only: the
        # checkpoint's stays the model's.
        self.tokenizer = checkpoint.tokenizer
        if chat_template is not None:
            self.tokenizer = self.tokenizer.with_chat_template(chat_template)
        if extra_eos_tokens:
            self.tokenizer = self.tokenizer.with_extra_eos_tokens(extra_eos_tokens)
        self.max_length = max_length
        self.cache_step = cache_step
        self.native = native
        #: The quantized matmuls' numerics the programs are built with:
        #: ``"exact"`` or ``"int8"``.
        self.numerics = resolve_numerics(numerics, native)
        if (native_kernels.default_enabled() if native is None else native) \
                and mx.default_device() == mx.cpu:
            # Build or load the kernels now: the programs compile inside the
            # first generation, where a first-use build (a minute or two)
            # would count as its time to first token.
            native_kernels.status()
        self.spec = model_spec(checkpoint)
        # A group of one process needs no collectives: the unsharded programs.
        self.group = group if group is not None and group.size() > 1 else None
        #: The ranks the model is split over, and this process's (1 and 0
        #: when it runs the whole model).
        self.world_size = 1 if self.group is None else self.group.size()
        self.rank = 0 if self.group is None else self.group.rank()
        shard = self.spec.shard(self.world_size, self.rank)
        #: The KV cache's layout: its shape, quantization and bound.
        self.cache_layout = kv_cache_layout(self.config.num_layers, shard.num_kv_heads,
                                            self.config.head_dim, max_length, kv_bits,
                                            kv_group_size, max_kv_size, keep, kv_recent)
        self._captures = self.spec.captures(checkpoint, self.world_size, self.rank)
        if self.world_size > 1:
            # The sliced captures are copies: without the whole model's
            # weights, a rank holds only its part of the model.
            self.checkpoint = dataclasses.replace(checkpoint, weights={})
        self._given = dict(programs or {})
        self._given_sampling = programs_sampling
        self._executables: dict[tuple[str, Sampling | None], Executable] = {}
        self._pickers: dict[Picking, Executable] = {}
        self._embedders: dict[tuple[str, bool], Executable] = {}
        #: The result of the last :meth:`stream`, once it has finished.
        self.last_generation: Generation | None = None
        #: The draft model speculative decoding drafts with (``draft="model"``;
        #: see :meth:`use_draft_model`), or None.
        self.draft: LLM | None = None

    def use_draft_model(self, draft: LLM | None) -> None:
        """Draft with ``draft`` (None: no draft model): a smaller model
        sharing this one's vocabulary (else a
        :class:`~mlxprog.llm.config.SettingError` naming ``draft_model``),
        which generations then draft with unless their ``draft`` option
        says otherwise (see :class:`GenerationOptions`)."""
        if draft is not None:
            check_draft_model(self, draft)
        self.draft = draft

    # -- programs ----------------------------------------------------------
    def program(self, kind: str, sampling: Sampling | None = None) -> Program:
        """The ``"prefill"``, ``"decode"``, ``"decode_loop"`` or ``"verify"``
        program. The default (``sampling=None``) is what generation runs:
        steps that return logits, and a greedy decode loop (the loop always
        samples); with a ``Sampling``, steps that sample it. Programs given
        to the constructor (exported ones: logits-returning prefill and
        decode, a decode loop for one sampling) are used as they are. The
        speculative verify step (:func:`~mlxprog.llm.programs.build_verify`,
        logits only) is always built here, with the decode step's numerics."""
        builders = {"prefill": build_prefill, "decode": build_decode,
                    "decode_loop": build_decode_loop}
        if kind == "verify" and sampling is None:
            return build_verify(self.spec, self.max_length, world_size=self.world_size,
                                rank=self.rank, numerics=program_numerics(kind, self.numerics),
                                kv=self.cache_layout)
        if kind not in builders:
            raise ModelError(f"unknown program kind {kind!r}; one of "
                             f"{sorted([*builders, 'verify'])} (verify: sampling=None)")
        sampling = _sampling_of(kind, sampling)
        if kind in self._given:
            given_sampling = self._given_sampling if kind == "decode_loop" else None
            if sampling != given_sampling:
                raise ModelError(f"the given {kind} program samples with {given_sampling}; "
                                 f"{sampling} needs programs built (or exported) for it")
            return self._given[kind]
        return builders[kind](self.spec, self.max_length, sampling,
                              world_size=self.world_size, rank=self.rank,
                              numerics=program_numerics(kind, self.numerics),
                              kv=self.cache_layout)

    @property
    def cache_slots(self) -> int:
        """The most slots the KV caches get: ``max_length``, or with a
        rotating cache ``max_kv_size + 1`` (its slots and the spare one a
        step writes to first; see :meth:`Decoder.forward
        <mlxprog.llm.models.base.Decoder.forward>`)."""
        size = self.cache_layout.max_kv_size
        return self.max_length if size is None else size + 1

    def cache_width(self, slots: int) -> int:
        """How wide the KV caches get to hold ``slots`` slots: the next
        multiple of ``cache_step``, at most :attr:`cache_slots`."""
        return min(-(-slots // self.cache_step) * self.cache_step, self.cache_slots)

    @property
    def prompt_limit(self) -> int:
        """The most tokens a prompt may have: ``max_length - 1`` (one slot
        left for a generated token), or with a rotating cache
        ``max_kv_size`` (a prompt must fit it; generation then rotates)."""
        size = self.cache_layout.max_kv_size
        return self.max_length - 1 if size is None else size

    def compile(self, program: Program, **options: Any) -> Executable:
        """``program``, built for this model (its captures named as the
        model's weights, e.g. with :class:`~mlxprog.llm.ModelSpec`), compiled
        with this process's weights as captures, the model's ``native`` choice
        and its group; ``options`` go to :func:`mlxprog.compile`."""
        return compile_program(program, captures=self._captures, native=self.native,
                               group=self.group, **options)

    def executable(self, kind: str, sampling: Sampling | None = None) -> Executable:
        """The compiled :meth:`program` of ``kind`` for ``sampling`` (cached).
        The decode loop is shared by the in-program generations, each of
        which calls it with an ``emit`` callback of its own (see
        :meth:`generate_in_program`); called as compiled, its ``emit``
        raises :class:`~mlxprog.llm.ModelError`."""
        key = (kind, _sampling_of(kind, sampling))
        if key not in self._executables:
            self._executables[key] = self.compile(
                self.program(*key),
                callbacks={"emit": _no_generation} if kind == "decode_loop" else None,
                max_traces=MAX_TRACES,
            )
        return self._executables[key]

    def picker(self, picking: Picking) -> Executable:
        """The compiled token picker for ``picking`` (cached; see
        :func:`~mlxprog.llm.programs.build_pick`)."""
        if picking not in self._pickers:
            self._pickers[picking] = compile_program(
                build_pick(self.config.vocab_size, picking), native=self.native)
        return self._pickers[picking]

    # -- prompts -----------------------------------------------------------
    def prompt_ids(self, prompt: Prompt, chat: bool = True,
                   system_prompt: str | None = None) -> list[int]:
        """Token ids of a prompt: text (rendered as a user message with the
        chat template when ``chat``, after ``system_prompt`` as a system
        message), a list of chat messages (``system_prompt`` goes first unless
        they start with one), or token ids (used as they are)."""
        if isinstance(prompt, str):
            if chat and self.tokenizer.chat_template:
                return self.prompt_ids([{"role": "user", "content": prompt}], True,
                                       system_prompt)
            if system_prompt:
                prompt = f"{system_prompt}\n{prompt}"
            ids = self.tokenizer.encode(prompt)
        elif len(prompt) and all(isinstance(m, Mapping) for m in prompt):
            messages = [dict(m) for m in prompt]
            if system_prompt and messages[0].get("role") != "system":
                messages.insert(0, {"role": "system", "content": system_prompt})
            ids = self.tokenizer.encode(self.tokenizer.apply_chat_template(messages))
        else:
            ids = self._token_ids(prompt)
        if not ids:
            raise ModelError("the prompt is empty")
        return ids

    def _token_ids(self, prompt: Sequence[Any]) -> list[int]:
        """A prompt given as token ids, checked against the vocabulary."""
        if isinstance(prompt, mx.array):
            prompt = prompt.tolist()
        vocab = self.config.vocab_size
        ids = list(prompt)
        for i, token in enumerate(ids):
            if not is_int(token):
                raise ModelError(f"prompt item {i} is {token!r}: a prompt is text, chat "
                                 "messages (dicts with role and content) or token ids")
            if not 0 <= token < vocab:
                raise ModelError(f"prompt token {i} is {token}, outside the vocabulary "
                                 f"[0, {vocab})")
        return ids

    def request(self, prompt: Prompt, options: GenerationOptions,
                prompt_cache: PromptCache | None = None) -> Request:
        """A :class:`~mlxprog.llm.engine.Request` generating ``prompt``."""
        if prompt_cache is not None and prompt_cache.layout != self.cache_layout:
            raise ModelError(f"the prompt cache was made by a model of "
                             f"{prompt_cache.layout.describe()}; this model has "
                             f"{self.cache_layout.describe()}")
        ids = self.prompt_ids(prompt, options.chat, options.system_prompt)
        return Request(self, ids, options, prompt_cache)

    # -- prompt caches -----------------------------------------------------
    def prompt_cache(self) -> PromptCache:
        """An empty :class:`~mlxprog.llm.PromptCache` for this model."""
        return PromptCache(self.cache_layout)

    def cache_prompt(self, prompt: Prompt, prompt_cache: PromptCache | None = None, *,
                     options: GenerationOptions | None = None,
                     **overrides: Any) -> PromptCache:
        """Prefill ``prompt`` into a prompt cache (a new one, or
        ``prompt_cache`` extended) and return it: generation from a prompt
        that starts with it prefills only the rest. Save it with
        :meth:`PromptCache.save <mlxprog.llm.PromptCache.save>`."""
        options = GenerationOptions.given(options, {**overrides, "max_tokens": 1})
        cache = prompt_cache if prompt_cache is not None else self.prompt_cache()
        self.generate(prompt, prompt_cache=cache, options=options)
        return cache

    def load_prompt_cache(self, path: str | Path) -> PromptCache:
        """A prompt cache saved with :meth:`PromptCache.save
        <mlxprog.llm.PromptCache.save>`, checked to fit this model."""
        return PromptCache.load(path, self.cache_layout)

    # -- generation --------------------------------------------------------
    # Each method takes GenerationOptions' fields as keyword arguments and/or
    # a whole GenerationOptions as ``options=`` (the keyword arguments replace
    # its fields), so the options and their defaults are declared only there.
    def generate(self, prompt: Prompt, *, prompt_cache: PromptCache | None = None,
                 options: GenerationOptions | None = None, **overrides: Any) -> Generation:
        """Generate a completion of ``prompt`` (text, chat messages or token
        ids); see :class:`GenerationOptions` for the options. With
        ``prompt_cache``, the prefix it shares with the prompt is not prefilled
        again, and it holds the prompt and the completion afterwards."""
        options = GenerationOptions.given(options, overrides)
        request = self.request(prompt, options, prompt_cache)
        for _ in run(self, [request]):
            pass
        return request.result()

    def stream(self, prompt: Prompt, *, prompt_cache: PromptCache | None = None,
               options: GenerationOptions | None = None, **overrides: Any) -> Iterator[Piece]:
        """Yield a :class:`~mlxprog.llm.Piece` per generated token: its text
        (never a broken UTF-8 character, never part of a stop string), token
        id, log-probability and the running stats; the last one has the
        ``finish_reason``. Options and ``prompt_cache`` as in
        :meth:`generate`; ``self.last_generation`` holds the full result once
        the iterator is exhausted. Closing the iterator early (or a Ctrl-C
        inside it) stops the generation; the prompt cache keeps what it
        generated."""
        options = GenerationOptions.given(options, overrides)
        request = self.request(prompt, options, prompt_cache)
        self.last_generation = None
        for _, piece in run(self, [request]):
            yield piece
        self.last_generation = request.result()

    def generate_batch(self, prompts: Sequence[Prompt], *,
                       options: GenerationOptions | None = None,
                       **overrides: Any) -> list[Generation]:
        """Generate for several prompts at once, decoded in one batch; each
        row stops on its own and picks its tokens with its own PRNG key
        (``seed``), so each row's output is the same as generating its prompt
        alone."""
        options = GenerationOptions.given(options, overrides)
        requests = [self.request(p, options) for p in prompts]
        for _ in run(self, requests):
            pass
        return [r.result() for r in requests]

    def generate_in_program(self, prompt: Prompt, *,
                            on_text: Callable[[str], None] | None = None,
                            options: GenerationOptions | None = None,
                            **overrides: Any) -> Generation:
        """Like :meth:`generate`, but the decode loop is one program: a ``while``
        loop whose body runs the decode step, samples the token and streams it
        to Python through a ``runtime_call`` (which also decides when to stop);
        ``on_text`` gets the text as it is generated. The loop does not report
        log-probabilities nor apply a repetition penalty.

        The loop's executable is shared; this generation calls it with an
        ``emit`` callback of its own (:meth:`Executable.with_callbacks
        <mlxprog.runtime.executable.Executable.with_callbacks>`), so
        generations in other threads, or started from ``on_text``, each get
        their own tokens."""
        options = GenerationOptions.given(options, overrides)
        if options.repetition_penalty is not None or options.picking.logprobs:
            raise ModelError("the in-program decode loop has no repetition_penalty, logprobs "
                             "or top_logprobs; use generate")
        if options.draft in ("prompt-lookup", "model"):
            raise ModelError(f"the in-program decode loop has no speculative decoding (draft "
                             f"{options.draft!r}); use generate")
        # The loop decodes plainly, a draft model or not.
        options = dataclasses.replace(options, draft="none")
        request = self.request(prompt, options)
        on_text = on_text or (lambda piece: None)
        loop = self.executable("decode_loop", options.sampling)
        engine = Engine(self)
        on_text(engine.add(request).text)
        if not request.finished:
            # The loop's caches cannot grow: room for every token it may make.
            n, max_new = request.length, request.budget - 1
            size = min(max(engine.width, n + max_new), self.cache_slots)
            caches = self.cache_layout.widened(engine.caches, size)

            def emit(tokens: mx.array) -> mx.array:  # the decode loop's runtime_call
                on_text(request.take(tokens.item(), None, []).text)
                return mx.array(request.finished)

            inputs = DecodeLoopInputs(
                tokens=request.next_token, rope_offset=mx.array([n], dtype=mx.int32),
                cache_offset=mx.array(n, dtype=mx.int32),
                key_mask=mx.ones((1, size), dtype=mx.bool_), key=request.key,
                caches=caches, max_new=mx.array(max_new, dtype=mx.int32))
            mx.eval(loop.with_callbacks({"emit": emit})(**inputs.by_name(self.cache_layout)))
        return request.result()

    # -- embeddings --------------------------------------------------------
    def embed(self, inputs: EmbeddingInput | Sequence[EmbeddingInput], *,
              pooling: str = "mean", normalize: bool = True) -> mx.array:
        """Embeddings of ``inputs``: one text or token-id list gives an array
        ``[hidden]``, a list of them ``[N, hidden]`` (float32, in input
        order). An input's embedding is the model's final hidden states
        (after the final norm, before the LM head) pooled over its tokens by
        ``pooling``: ``"mean"`` (the average over every token) or ``"last"``
        (the last token's, for models trained to embed that way), divided by
        its L2 norm unless ``normalize`` is false (:func:`~mlxprog.llm.programs.build_embed`).
        Texts are tokenized as they are (no chat template; the BOS/EOS the
        tokenizer adds, as with ``chat=False``). An input longer than
        ``max_length`` tokens, an empty one, or token ids outside the
        vocabulary raise :class:`EmbeddingInputError` naming the input,
        before anything runs: nothing is truncated. The inputs run together,
        :data:`EMBED_BATCH` at a time, those of similar lengths together
        (each batch padded on the right to a prefill bucket), and each
        input's embedding is the same as alone."""
        if pooling not in POOLINGS:
            raise ModelError(f"pooling must be one of {', '.join(map(repr, POOLINGS))}, "
                             f"got {pooling!r}")
        if not isinstance(normalize, bool):
            raise ModelError(f"normalize must be true or false, got {normalize!r}")
        if isinstance(inputs, (bytes, bytearray)):  # a Sequence of ints, but not token ids
            raise EmbeddingInputError(None, "the inputs are bytes: decode them to a text first")
        one = isinstance(inputs, str) or (
            isinstance(inputs, Sequence) and len(inputs) > 0 and all(map(is_int, inputs)))
        ids = self.embedding_ids([inputs] if one else inputs)
        program = self._embedder(pooling, normalize)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        parts = []
        for start in range(0, len(order), EMBED_BATCH):
            rows = [ids[i] for i in order[start:start + EMBED_BATCH]]
            width = min(prefill_bucket(len(rows[-1])), self.max_length)
            # Rows padded to a power of two (with one-token rows) and widths to
            # a bucket: a few traces serve every batch.
            rows += [[0]] * ((1 << (len(rows) - 1).bit_length()) - len(rows))
            batch = EmbedInputs(
                tokens=mx.array([r + [0] * (width - len(r)) for r in rows], dtype=mx.int32),
                lengths=mx.array([len(r) for r in rows], dtype=mx.int32))
            parts.append(program(**batch.by_name())[0][:min(EMBED_BATCH, len(order) - start)])
        place = [0] * len(order)
        for position, i in enumerate(order):
            place[i] = position
        out = mx.concatenate(parts)[mx.array(place)]
        mx.eval(out)
        return out[0] if one else out

    def embedding_ids(self, inputs: Sequence[EmbeddingInput]) -> list[list[int]]:
        """The token ids :meth:`embed` runs for a list of ``inputs`` (texts,
        tokenized as they are, or token ids), each checked: not empty, ids
        in the vocabulary, at most ``max_length`` tokens
        (:class:`EmbeddingInputError` otherwise, naming the input)."""
        if isinstance(inputs, str) or not isinstance(inputs, Sequence) or not inputs:
            raise EmbeddingInputError(None, f"the inputs must be a non-empty list of texts or "
                                      f"token-id lists, got {inputs!r:.60}")
        vocab = self.config.vocab_size
        out = []
        for index, item in enumerate(inputs):
            if isinstance(item, str):
                problem = unicode_problem(item)
                if problem:
                    raise EmbeddingInputError(index, f"is not valid Unicode text: it {problem}")
                ids = self.tokenizer.encode(item)
            elif isinstance(item, (bytes, bytearray)):
                raise EmbeddingInputError(index, "is bytes: decode it to a text first")
            elif isinstance(item, Sequence) and all(map(is_int, item)):
                ids = list(item)
                bad = next((t for t in ids if not 0 <= t < vocab), None)
                if bad is not None:
                    raise EmbeddingInputError(index, f"has token {bad}, outside the vocabulary "
                                              f"[0, {vocab})")
            else:
                raise EmbeddingInputError(index, f"is {item!r:.60}: an input is a text or a list "
                                          "of token ids")
            if not ids:
                raise EmbeddingInputError(index, "is empty")
            if len(ids) > self.max_length:
                raise EmbeddingInputError(
                    index, f"has {len(ids)} tokens, but the model embeds at most {self.max_length} "
                    "(max_length); load it with a larger max_length or shorten the input",
                    tokens=len(ids))
            out.append(ids)
        return out

    def _embedder(self, pooling: str, normalize: bool) -> Executable:
        """The compiled embedding program for ``pooling`` and ``normalize`` (cached)."""
        key = (pooling, normalize)
        if key not in self._embedders:
            self._embedders[key] = self.compile(
                build_embed(self.spec, self.max_length, pooling, normalize,
                            world_size=self.world_size, rank=self.rank),
                max_traces=MAX_TRACES)
        return self._embedders[key]


def program_numerics(kind: str, numerics: str) -> str:
    """The numerics of the LLM's ``kind`` program under its ``numerics``:
    the decode steps take the LLM's choice; the prefill is always
    ``"exact"``. A prefill multiplies one row per prompt token, and from
    eight rows on the int8 kernel hands the quantized activations to the
    same float kernel the exact path runs (docs/native.md), so int8 would
    save no time there and only round the prompt's activations: the logits
    that pick the first token stay exact. (On the README prompt the first
    token is a tie, "The" 0.08 ahead of "L" in the logits, that 8-bit
    activations flip everywhere, llama.cpp's included.)"""
    return "exact" if kind == "prefill" else numerics


def load(model: str | Path | None = None, max_length: int | None = None,
         cache_step: int = DEFAULT_CACHE_STEP, native: bool | None = None,
         group: mx.distributed.Group | None = None, numerics: str | None = None,
         chat_template: str | Path | ChatTemplate | None = None,
         extra_eos_tokens: Sequence[str] = (), kv_bits: int | None = None,
         kv_group_size: int | None = None, max_kv_size: int | None = None,
         keep: int | None = None, adapter_path: str | Path | None = None,
         draft_model: str | Path | None = None, kv_recent: int | None = None) -> LLM:
    """Load a model (a ``.gguf`` file or Hugging Face directory; None: the
    default SmolLM2-135M-Instruct, installed on first use) for generation;
    see :class:`LLM` for ``max_length`` (None: 2048), ``cache_step``,
    ``native`` and ``numerics`` (None: ``"int8"`` on the CPU, ``"exact"``
    otherwise). ``group=mx.distributed.init()`` splits the model over the
    launched processes when there are several (tensor parallelism; see
    :class:`LLM`). A directory written by ``mlxprog export-llm`` runs its
    programs (see :func:`load_exported`), with the ``max_length``,
    ``cache_step`` and ``numerics`` they were exported with.
    ``chat_template`` (a Jinja string or file replacing the model's) and
    ``extra_eos_tokens`` (token texts that end generation) are as in
    :class:`LLM`, and so are the KV cache's settings ``kv_bits``,
    ``kv_group_size``, ``kv_recent``, ``max_kv_size`` and ``keep`` (an exported directory's
    programs have a float cache and take none of them). ``adapter_path``, a
    LoRA adapter directory in mlx-lm's or PEFT's format, is fused into the
    model's weights as it loads (see :mod:`~mlxprog.llm.adapters`; a bad or
    mismatched adapter raises :class:`~mlxprog.llm.config.SettingError`
    naming ``adapter_path``); an exported directory's programs use the
    adapter they were exported with. ``draft_model`` (a model file or
    directory) is loaded with the same ``max_length``, ``cache_step``,
    ``native`` and ``numerics`` for speculative decoding (see
    :meth:`LLM.use_draft_model`; it must share the model's vocabulary)."""
    # Read and compiled before the model loads, which takes a while.
    template = None if chat_template is None else ChatTemplate.of(chat_template)
    kv_settings = dict(kv_bits=kv_bits, kv_group_size=kv_group_size, max_kv_size=max_kv_size,
                       keep=keep, kv_recent=kv_recent)
    if model is not None and is_exported(model):
        given = [name for name, value in kv_settings.items() if value is not None]
        if given:
            raise SettingError(given[0], f"{model} holds exported programs, built for a float "
                               "KV cache; load the model file to set the KV cache")
        if adapter_path is not None:
            raise SettingError("adapter_path", f"{model} holds exported programs, which use "
                               "the adapter their manifest names (or none); export them "
                               "again with this one")
        return load_exported(model, native=native, group=group, max_length=max_length,
                             numerics=numerics, chat_template=template,
                             extra_eos_tokens=extra_eos_tokens)
    llm = LLM(load_checkpoint(model, adapter_path),
              max_length=DEFAULT_MAX_LENGTH if max_length is None else max_length,
              cache_step=cache_step, native=native, group=group, numerics=numerics,
              chat_template=template, extra_eos_tokens=extra_eos_tokens, **kv_settings)
    if draft_model is not None:
        llm.use_draft_model(_load_draft(draft_model, llm))
    return llm


def _load_draft(path: str | Path, llm: LLM) -> LLM:
    """The draft model at ``path``, loaded as ``llm`` is; a file that does
    not load raises :class:`~mlxprog.llm.config.SettingError` naming
    ``draft_model``."""
    if is_exported(path):
        raise SettingError("draft_model", f"{path} holds exported programs; give the draft "
                           "model's file or directory")
    try:
        checkpoint = load_checkpoint(path)
    except ModelError as exc:
        raise SettingError("draft_model", str(exc)) from None
    return LLM(checkpoint, max_length=llm.max_length, cache_step=llm.cache_step,
               native=llm.native, numerics=llm.numerics)


EXPORTED = ("prefill", "decode", "decode_loop")


def load_exported(directory: str | Path, model: str | Path | None = None,
                  native: bool | None = None,
                  group: mx.distributed.Group | None = None,
                  max_length: int | None = None, numerics: str | None = None,
                  chat_template: str | Path | ChatTemplate | None = None,
                  extra_eos_tokens: Sequence[str] = ()) -> LLM:
    """An :class:`LLM` running the programs written by ``mlxprog export-llm``
    (``prefill.json``, ``decode.json``, ``decode_loop.json``), with the model's
    weights bound by capture name from the model file. Programs exported for
    several ranks (``rank<r>/``, ``--world-size``) run on a ``group`` of that
    size, each process its rank's. The LLM's :attr:`~LLM.numerics` are the
    ones the programs were exported with (the manifest's; ``"exact"`` for a
    manifest that predates the choice). A ``max_length`` or ``numerics``
    other than the programs' (None and ``"auto"`` take theirs) is a
    :class:`ModelError`: the programs are built for theirs. ``chat_template``
    and ``extra_eos_tokens`` are as in :class:`LLM` (no part of the programs).
    The LoRA adapter the manifest names, if any, is fused into the model's
    weights again (the programs' captures are the adapted weights)."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.exists():
        raise ModelError(f"{directory}: no manifest.json (write it with mlxprog export-llm)")
    manifest = json.loads(manifest_path.read_text())
    world_size = manifest.get("world_size", 1)
    size = 1 if group is None else group.size()
    if size != world_size:
        raise ModelError(f"{directory}: the programs were exported for world_size "
                         f"{world_size}; run them on that many processes (mlx.launch -n "
                         f"{world_size}), not {size}")
    exported_numerics = manifest.get("numerics", "exact")
    if exported_numerics not in NUMERICS:
        raise ModelError(f"{manifest_path}: numerics {exported_numerics!r} is not one of "
                         f"{', '.join(map(repr, NUMERICS))}")
    if max_length is not None and max_length != manifest["max_length"]:
        raise ModelError(f"{directory}: the programs were exported with max_length "
                         f"{manifest['max_length']}, not {max_length}; export them again "
                         "for another")
    if numerics not in (None, AUTO_NUMERICS, exported_numerics):
        raise ModelError(f"{directory}: the programs were exported with numerics "
                         f"{exported_numerics!r}, not {numerics!r}; export them again for "
                         "another")
    where = directory if world_size == 1 else directory / f"rank{group.rank()}"
    programs = {kind: Program.load(where / f"{kind}.json") for kind in EXPORTED}
    llm = LLM(load_checkpoint(model if model is not None else manifest.get("model"),
                              manifest.get("adapter")),
              max_length=manifest["max_length"], programs=programs,
              programs_sampling=Sampling(**manifest["sampling"]),
              cache_step=manifest.get("cache_step", DEFAULT_CACHE_STEP), native=native,
              group=group, numerics=exported_numerics, chat_template=chat_template,
              extra_eos_tokens=extra_eos_tokens)
    expected = list(PrefillInputs.names_for(llm.cache_layout))
    if [s.name for s in programs["prefill"].inputs] != expected:
        raise ModelError(f"{where / 'prefill.json'}: its inputs are not this version's "
                         f"({', '.join(expected[:4])}, ...); export the model again")
    return llm


def export(llm: LLM, directory: str | Path, sampling: Sampling = Sampling(),
           world_size: int = 1) -> list[Path]:
    """Write the model's programs as JSON (weights stay in the model file) plus a
    manifest naming the model (and its LoRA adapter, if one is fused in), the
    cache length and growth step, the
    quantized matmuls' numerics (the LLM's :attr:`~LLM.numerics`) and the
    decode loop's sampling; the prefill and decode step return logits (each
    token is picked outside them, so any sampling runs them). With
    ``world_size > 1``, each rank's programs of the tensor-parallel model go
    to ``rank<r>/`` and the manifest records the world size. Returns the
    files written; :func:`load_exported` runs them."""
    directory = Path(directory)
    if llm.world_size > 1:
        raise ModelError(f"export needs the LLM loaded without a group: this one runs rank "
                         f"{llm.rank} of {llm.world_size} only; load the whole model and "
                         "pass world_size to write every rank's programs")
    if llm.cache_layout.quantized or llm.cache_layout.rotating:
        raise ModelError(f"export writes programs for a float KV cache; this LLM's is "
                         f"{llm.cache_layout.describe()}: load it without kv_bits and "
                         "max_kv_size to export it")
    samplings = {"prefill": None, "decode": None, "decode_loop": sampling}
    if world_size == 1:
        per_rank = [{kind: llm.program(kind, samplings[kind]) for kind in EXPORTED}]
    else:
        builders = {"prefill": build_prefill, "decode": build_decode,
                    "decode_loop": build_decode_loop}
        per_rank = [{kind: builders[kind](llm.spec, llm.max_length, samplings[kind],
                                          world_size=world_size, rank=rank,
                                          numerics=program_numerics(kind, llm.numerics))
                     for kind in EXPORTED} for rank in range(world_size)]
    written = []
    for rank, programs in enumerate(per_rank):
        where = directory if world_size == 1 else directory / f"rank{rank}"
        where.mkdir(parents=True, exist_ok=True)
        for kind in EXPORTED:
            path = where / f"{kind}.json"
            programs[kind].save(path)
            written.append(path)
    manifest = {
        "model": str(llm.checkpoint.path),
        "max_length": llm.max_length,
        "cache_step": llm.cache_step,
        "numerics": llm.numerics,
        "sampling": dataclasses.asdict(sampling),
        # The input names are the same on every rank (only the caches' shapes differ).
        "inputs": {kind: [s.name for s in per_rank[0][kind].inputs] for kind in EXPORTED},
    }
    if world_size > 1:
        manifest["world_size"] = world_size
    if llm.checkpoint.adapter_path is not None:
        # The programs' captures are the adapted weights (their names end in
        # ":lora"): load_exported fuses the same adapter again.
        manifest["adapter"] = str(llm.checkpoint.adapter_path)
    path = directory / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return [*written, path]
