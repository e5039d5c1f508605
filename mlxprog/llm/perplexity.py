"""Perplexity: how well a model predicts each next token of a text.

:func:`perplexity` runs the text through a scoring program built like the
prefill (the model's embedding, layers, final norm and head, from
:mod:`~mlxprog.llm.programs`) that returns, for each position, the
log-probability of the token that follows it there; the perplexity is the
exponential of their negated mean.

Long texts are split into **segments** of at most ``segment_length`` tokens,
each started from an empty KV cache; a segment starts ``stride`` tokens after
the previous one and scores only the tokens the previous one did not, so every
scored token after the first segment sees at least ``segment_length - stride``
tokens of context (Hugging Face's strided perplexity). With ``segment_length``
at least the text's length (the default, up to the model's context length) there is one
segment and every token sees the whole text before it. Within a segment the
tokens go through the program in **chunks** of ``chunk`` tokens, each
attending to the chunks before it through the KV cache, so the logits held
at once are ``chunk x vocabulary`` floats whatever the text's length. Every
chunk has the same shape (the last is padded; causal attention keeps the
padding out of every real token's view), so the program is traced once.

The KV cache is the LLM's (:attr:`LLM.cache_layout <mlxprog.llm.LLM.cache_layout>`):
scoring with an LLM loaded with ``kv_bits`` (``mlxprog perplexity
--kv-bits 8``) gives the perplexity a generation with the quantized cache
sees, which is how its cost in quality is measured.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

import mlx.core as mx

from ..arrays import is_int
from ..builder import ProgramBuilder
from ..errors import ModelError
from ..format.program import Program
from ..runtime.executable import Executable
from .cache import CacheLayout
from .checkpoint import Checkpoint
from .generate import LLM
from .model_files import load_checkpoint
from .models import family_of
from .options import resolve_numerics
from .programs import declare_caches
from .spec import ModelSpec

DEFAULT_CHUNK = 256


@dataclass(frozen=True)
class Perplexity:
    """The result of :func:`perplexity`: ``perplexity`` (``exp(nll)``), the
    mean negative log-likelihood ``nll`` in nats per scored token, the number
    of ``tokens`` scored (the text's tokens but the first, and the first of
    each segment when ``stride == segment_length``), the ``numerics``,
    ``segment_length``, ``stride`` and ``chunk`` used, the wall-clock ``seconds`` the scoring
    took, and each scored token's log-probability (``logprobs``, in text
    order)."""

    perplexity: float
    nll: float
    tokens: int
    numerics: str
    segment_length: int
    stride: int
    chunk: int
    seconds: float
    logprobs: list[float] = field(repr=False)


def build_scoring(spec: ModelSpec, chunk: int, cache_length: int,
                  numerics: str = "exact", kv: CacheLayout | None = None,
                  top: int = 0) -> Program:
    """The scoring program of a model: inputs ``tokens [B, chunk]`` (int32),
    ``targets [B, chunk]`` (the token after each one), ``rope_offset [B]``,
    ``cache_offset []`` (the slot of the first token), ``key_mask [B,
    cache_length]`` and the caches ``k_cache.i``/``v_cache.i`` ``[B, kv_heads,
    cache_length, head_dim]``; outputs ``logprobs [B, chunk]`` (float32: the
    log-probability of each target after its token, under the model's
    distribution) and the new caches. ``numerics`` is the quantized matmuls'
    (see :func:`~mlxprog.llm.build_prefill`); with a quantized ``kv`` layout
    the caches are its arrays (``k_cache.i.values``, ...; see
    :meth:`CacheLayout.program_names
    <mlxprog.llm.CacheLayout.program_names>`), so the scores are those of a
    generation with that cache. ``top`` > 0 adds, after the log-probabilities,
    each position's ``top`` largest logits ``[B, chunk, top]`` and their
    tokens (int32), for comparing models' choices."""
    c = spec.config
    b = ProgramBuilder("score")
    b.dim("B", min=1, max=1)
    kv = kv or CacheLayout.of(c)
    if kv.rotating:
        raise ModelError("perplexity scores in segments of --segment-length tokens; it takes "
                         "no rotating cache (max_kv_size)")
    model = family_of(c).decoder(b, spec, spec.shard(), numerics, kv)
    tokens = b.input("tokens", ["B", chunk], "int32")
    targets = b.input("targets", ["B", chunk], "int32")
    rope_offset = b.input("rope_offset", ["B"], "int32")
    cache_offset = b.input("cache_offset", [], "int32")
    key_mask = b.input("key_mask", ["B", cache_length], "bool")
    caches = declare_caches(b, model.kv, cache_length)
    h, new_caches = model.trunk(b, model.embed(b, tokens), chunk, rope_offset, cache_offset,
                                key_mask, model.kv.layers(caches))
    new_caches = model.kv.flatten(new_caches)
    logits = model.logits(b, h)
    logprobs = logits - b.logsumexp(logits, axes=[-1], keepdims=True)
    picked = b.take_along_axis(logprobs, b.reshape(targets, shape=["B", chunk, 1]), axis=-1)
    extra = []
    if top > 0:
        values, ids = b.top_k(logits, k=top)
        extra = [values, b.astype(ids, dtype="int32")]
    return b.build([b.reshape(picked, shape=["B", chunk]), *extra, *new_caches], check=False)


#: What :func:`perplexity` scores with: a loaded LLM, a checkpoint, or a
#: model file or directory (None: the default model).
Model = Union[LLM, Checkpoint, str, Path, None]


def perplexity(model: Model, text: str | Sequence[int], *, numerics: str | None = None,
               segment_length: int | None = None, stride: int | None = None,
               chunk: int = DEFAULT_CHUNK, native: bool | None = None,
               window: int | None = None) -> Perplexity:
    """The perplexity of ``model`` on ``text`` (a string, tokenized as it is
    with the model's tokenizer, no chat template; or token ids).

    ``model`` is an :class:`~mlxprog.llm.LLM` (its weights, ``native`` choice
    and, unless ``numerics`` is given, its numerics), a
    :class:`~mlxprog.llm.Checkpoint`, or a model file or directory (None:
    the default model), loaded with ``native`` and ``numerics`` (see
    :func:`~mlxprog.llm.load`). ``segment_length`` is the most tokens a
    segment holds (default: the whole text, up to the model's context
    length), ``stride`` how far each segment starts after the previous one
    (default: half the segment length), ``chunk`` the tokens per program call (see the module
    docstring). Bad values raise :class:`~mlxprog.llm.ModelError` naming them.
    ``window`` is ``segment_length``'s old name (deprecated).
    """
    if window is not None:
        if segment_length is not None:
            raise ModelError("give segment_length only (window is its deprecated name)")
        warnings.warn("perplexity(window=...) is deprecated: pass segment_length",
                      DeprecationWarning, stacklevel=2)
        segment_length = window
    llm = _llm(model, numerics, native)
    numerics = llm.numerics if numerics is None else resolve_numerics(numerics, llm.native)
    ids = (llm.tokenizer.encode(text) if isinstance(text, str)
           else llm.prompt_ids(list(text), chat=False))
    if len(ids) < 2:
        raise ModelError(f"perplexity needs a text of at least 2 tokens, got {len(ids)}")
    context = llm.config.context_length
    length = min(len(ids), context) if segment_length is None else segment_length
    if not is_int(length) or not 2 <= length <= context:
        raise ModelError(f"segment_length must be an integer in [2, {context}] (the model's "
                         f"context length), got {length!r}")
    stride = max(length // 2, 1) if stride is None else stride
    if not is_int(stride) or not 1 <= stride <= length:
        raise ModelError(f"stride must be an integer in [1, segment_length {length}], "
                         f"got {stride!r}")
    if not is_int(chunk) or chunk < 1:
        raise ModelError(f"chunk must be a positive integer, got {chunk!r}")

    # A segment of `length` tokens runs its first length - 1 through the
    # program (the last is only a target); caches of whole chunks.
    chunk = min(chunk, length - 1)
    cache_length = -(-(length - 1) // chunk) * chunk
    start = time.perf_counter()
    score = llm.compile(build_scoring(llm.spec, chunk, cache_length, numerics,
                                      llm.cache_layout))
    logprobs: list[float] = []
    scored_to = 1  # the first token has no prediction
    for begin in range(0, len(ids), stride):
        end = min(begin + length, len(ids))
        first = max(scored_to, begin + 1)
        logprobs += _score_segment(score, llm, ids[begin:end], chunk, cache_length)[
            first - begin - 1:]
        scored_to = end
        if end == len(ids):
            break
    nll = -math.fsum(logprobs) / len(logprobs)
    return Perplexity(math.exp(nll), nll, len(logprobs), numerics, length, stride, chunk,
                      time.perf_counter() - start, logprobs)


def _llm(model: Model, numerics: str | None, native: bool | None) -> LLM:
    """The LLM that scores: ``model`` itself, or one loaded from it."""
    if isinstance(model, LLM):
        if model.world_size > 1:
            raise ModelError(f"perplexity needs the whole model: this LLM runs rank "
                             f"{model.rank} of {model.world_size}; load it without a group")
        return model
    checkpoint = model if isinstance(model, Checkpoint) else load_checkpoint(model)
    return LLM(checkpoint, native=native, numerics=numerics)


def _score_segment(score: Executable, llm: LLM, ids: list[int], chunk: int,
                   cache_length: int) -> list[float]:
    """The log-probability of each of ``ids[1:]`` after the tokens before it
    in the segment, from an empty cache."""
    layout = llm.cache_layout
    caches = list(layout.empty(1, cache_length))
    names = layout.program_names()
    # Every slot may be attended: causal attention hides the later ones.
    key_mask = mx.ones((1, cache_length), dtype=mx.bool_)
    out: list[float] = []
    for at in range(0, len(ids) - 1, chunk):
        n = min(chunk, len(ids) - 1 - at)
        pad = [0] * (chunk - n)
        logprobs, *caches = score(
            tokens=mx.array([ids[at:at + n] + pad], dtype=mx.int32),
            targets=mx.array([ids[at + 1:at + 1 + n] + pad], dtype=mx.int32),
            rope_offset=mx.array([at], dtype=mx.int32), cache_offset=mx.array(at, dtype=mx.int32),
            key_mask=key_mask, **dict(zip(names, caches)))
        out += logprobs[0, :n].tolist()
    return out
