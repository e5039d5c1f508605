"""What a user chooses, declared once each: how a model is loaded and run
(:class:`ModelOptions`) and how it generates (:class:`GenerationOptions`).

Both are frozen dataclasses that check their values as they are made (a bad
value is a :class:`~mlxprog.llm.ModelError` naming the field), and both are
given the same two ways: as one object (``options=``), or as keyword
arguments named as their fields, which replace the object's fields
(:meth:`ModelOptions.given`, :meth:`GenerationOptions.given`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar, get_args

import mlx.core as mx

from ..arrays import is_int
from ..errors import ModelError
from ..ops.quant import Numerics
from .constraints import Constraint, ConstraintError, LogitBias
from .programs import Picking, Sampling
from .tokenizer import ChatTemplate

#: The numerics of the quantized matmuls (the ``quantized_matmul`` op's
#: ``numerics``): ``"exact"``, MLX's float numerics (weights dequantized,
#: float products); ``"int8"``, llama.cpp's (activations quantized to 8 bits
#: per weight group, integer dot products).
NUMERICS: tuple[str, ...] = get_args(Numerics)
#: The numerics choice that picks by device (see :func:`resolve_numerics`).
AUTO_NUMERICS = "auto"

#: The KV cache's length when none is given, and the slots it grows by.
DEFAULT_MAX_LENGTH = 2048
DEFAULT_CACHE_STEP = 128

#: The drafting methods a generation can ask for (``draft``): ``"prompt-lookup"``
#: (n-grams of the sequence itself) and ``"model"`` (the draft model the LLM
#: was loaded with), or ``"none"`` (plain decoding).
DRAFTS = ("prompt-lookup", "model", "none")
#: The drafts a step verifies by default and at most: on the CPU each
#: drafted token costs about a third of a decode step to verify, and longer
#: drafts are kept less often (on the benchmark's copy prompts 2 to 3 drafts
#: gave the most, 5 less).
DEFAULT_DRAFT_TOKENS = 3
MAX_DRAFT_TOKENS = 16
#: The longest n-gram prompt lookup matches, by default and at most.
DEFAULT_LOOKUP_NGRAM = 3
MAX_LOOKUP_NGRAM = 8
#: The most alternatives a generated token's log-probabilities report.
MAX_TOP_LOGPROBS = 20
#: The fields of :class:`ModelOptions` that set the KV cache's layout.
KV_CACHE_SETTINGS = ("kv_bits", "kv_group_size", "kv_recent", "max_kv_size", "keep")


def resolve_numerics(numerics: str | None, native: bool | None = None) -> str:
    """The quantized matmuls' numerics a choice means: ``"exact"`` or
    ``"int8"`` as given; None or ``"auto"``: ``"int8"`` (llama.cpp's numerics,
    what users of quantized models expect on the CPU) when the default device
    is the CPU and the native kernels are not turned off (``native=False``,
    or ``MLXPROG_NATIVE=0`` with ``native=None``: only the native kernels
    implement it), ``"exact"`` otherwise. Anything else is a
    :class:`ModelError` naming the choices."""
    if numerics is None or numerics == AUTO_NUMERICS:
        from .. import native as native_kernels

        enabled = native_kernels.default_enabled() if native is None else native
        return "int8" if enabled and mx.default_device() == mx.cpu else "exact"
    if numerics not in NUMERICS:
        raise ModelError(f"numerics must be one of {AUTO_NUMERICS!r}, "
                         f"{', '.join(map(repr, NUMERICS))} or None, got {numerics!r}")
    return numerics


Options = TypeVar("Options", "ModelOptions", "GenerationOptions")


def _given(cls: type[Options], options: Options | None, overrides: Mapping[str, Any],
           what: str) -> Options:
    """``options`` (None: the defaults) with the keyword arguments
    ``overrides`` replacing fields of ``cls``; an unknown keyword is a
    TypeError naming it and the ``what`` options there are."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}: not a {what} option "
                        f"(the options are {', '.join(sorted(names))})")
    if options is None:
        return cls(**overrides)
    if not isinstance(options, cls):
        raise TypeError(f"options must be a {cls.__name__}, got {type(options).__name__}")
    return dataclasses.replace(options, **overrides) if overrides else options


@dataclass(frozen=True)
class ModelOptions:
    """How a model is loaded and run: :func:`~mlxprog.llm.load` and
    :class:`~mlxprog.llm.LLM` take these, as keyword arguments or as
    ``options=``.

    ``max_length`` is the longest the KV cache gets: prompt plus generated
    tokens must fit (None: 2048, or an exported directory's length).
    Attention reads every slot of the cache, so the caches start at the
    prompt's length (rounded up to ``cache_step``) and grow in multiples of
    ``cache_step`` slots as tokens are generated (``cache_step >=
    max_length``: the whole cache from the start). ``native`` is passed to
    :func:`mlxprog.compile` (None: the ``MLXPROG_NATIVE`` default; False:
    MLX's own CPU ops).

    ``numerics`` is the decode steps' quantized matmuls' (see
    :func:`resolve_numerics`): ``"exact"``, MLX's float numerics;
    ``"int8"``, llama.cpp's (activations quantized to 8 bits per weight
    group, integer dot products); None or ``"auto"``: ``"int8"`` on the CPU
    with the native kernels, ``"exact"`` otherwise.

    ``chat_template`` replaces the model's chat template (a Jinja string or
    a file; see :meth:`~mlxprog.llm.Tokenizer.with_chat_template`, which
    checks that it renders), and the tokens ``extra_eos_tokens`` names (token
    texts such as ``"<|im_end|>"``) end every generation as EOS does (see
    :meth:`~mlxprog.llm.Tokenizer.with_extra_eos_tokens`).

    The KV cache (see :func:`~mlxprog.llm.cache.kv_cache_layout`):
    ``kv_bits`` 4 or 8 stores keys and values quantized in groups of
    ``kv_group_size`` features (default 32 with 4 bits, 64 with 8), about
    3.6x (8-bit) or 5.3x (4-bit) less memory than float32 for a head dim of
    64, and keeps the last ``kv_recent`` tokens' keys and values in float
    too (default 16, 0: none), which each query reads unrounded;
    ``max_kv_size`` bounds it to that many tokens, the first ``keep``
    (default 4) and the most recent, so that generation goes on past it (a
    rotating cache; prompts must fit it). See docs/llm.md, "KV cache".

    ``max_length``, ``cache_step`` and ``numerics`` are checked here (a
    :class:`~mlxprog.llm.ModelError`); the tokenizer's and the KV cache's
    settings as the model is built, a
    :class:`~mlxprog.llm.SettingError` naming the field.
    """

    max_length: int | None = None
    cache_step: int = DEFAULT_CACHE_STEP
    native: bool | None = None
    numerics: str | None = None
    chat_template: str | Path | ChatTemplate | None = None
    extra_eos_tokens: Sequence[str] = ()
    kv_bits: int | None = None
    kv_group_size: int | None = None
    kv_recent: int | None = None
    max_kv_size: int | None = None
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.max_length is not None and (not is_int(self.max_length) or self.max_length < 2):
            raise ModelError(f"max_length must be at least 2, got {self.max_length!r}")
        if not is_int(self.cache_step) or self.cache_step < 1:
            raise ModelError(f"cache_step must be at least 1, got {self.cache_step!r}")
        if self.numerics not in (None, AUTO_NUMERICS, *NUMERICS):
            resolve_numerics(self.numerics)  # the error naming the choices

    def kv_cache(self) -> dict[str, int | None]:
        """The KV cache's settings (:data:`KV_CACHE_SETTINGS`), by field name."""
        return {name: getattr(self, name) for name in KV_CACHE_SETTINGS}

    @classmethod
    def given(cls, options: ModelOptions | None, overrides: Mapping[str, Any]) -> ModelOptions:
        """What a loading function was given: ``options`` (None: the
        defaults) with the keyword arguments ``overrides`` replacing fields."""
        return _given(cls, options, overrides, "model")


@dataclass(frozen=True)
class GenerationOptions:
    """How :class:`~mlxprog.llm.LLM` generates; every generation method takes
    these, as keyword arguments or as ``options=``.

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

    Structured output (see docs/structured_output.md): ``constraint`` (a
    :class:`~mlxprog.llm.constraints.Constraint`) makes the output follow a
    JSON schema, a regex, a choice or a grammar, token by token: tokens
    that do not fit get ``-inf`` before sampling and log-probabilities.
    The generation ends as soon as the output is a complete match that
    cannot grow (``"stop"``), at an EOS the constraint allows (``"eos"``),
    or at ``max_tokens`` (``"length"``: the output is then incomplete).
    :meth:`given` also takes ``response_format=`` (an OpenAI
    ``response_format`` dict, a pydantic model class or a constraint) and
    ``grammar=`` (Lark or GBNF text), which become ``constraint``.
    ``logit_bias`` (OpenAI's: token id -> a number in [-100, 100] added to
    its logit; kept as a :class:`~mlxprog.llm.constraints.LogitBias`, or None
    when empty) applies before the constraint. A bad value of either is an
    :class:`~mlxprog.llm.constraints.OptionError` naming the field.

    ``special_tokens`` keeps the text of special tokens in the output
    (left out by default): a reader of the reply that needs their markers
    (Mistral's ``[TOOL_CALLS]``, Llama 3.1's ``<|python_tag|>``, the
    harmony format's channels; see :mod:`~mlxprog.llm.tool_calls`) asks
    for it, and leaves them out of what it shows.
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
    constraint: Constraint | None = None
    logit_bias: Mapping[int, float] | LogitBias | None = None
    special_tokens: bool = False
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
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise ConstraintError("constraint", "expected a Constraint (or give "
                                  "response_format= or grammar=), got "
                                  f"{type(self.constraint).__name__}")
        if not isinstance(self.logit_bias, LogitBias):
            # The token ids are checked against the model's vocabulary when a
            # request is made (Request), which knows the model.
            object.__setattr__(self, "logit_bias", LogitBias.parse(self.logit_bias, None))

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
        overrides = dict(overrides)
        response_format = overrides.pop("response_format", None)
        grammar = overrides.pop("grammar", None)
        given = [name for name, value in (("response_format", response_format),
                                          ("grammar", grammar), ("constraint",
                                                                 overrides.get("constraint")))
                 if value is not None]
        if len(given) > 1:
            raise ConstraintError(given[1], f"give one of {' and '.join(given)}: each "
                                  "constrains the whole output")
        if response_format is not None:
            overrides["constraint"] = Constraint.of(response_format, "response_format")
        elif grammar is not None:
            overrides["constraint"] = Constraint.grammar(grammar)
        return _given(cls, options, overrides, "generation")
