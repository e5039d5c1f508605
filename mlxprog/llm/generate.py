"""The :class:`LLM`: a loaded model's generation and embedding methods.

:func:`~mlxprog.llm.load` returns one. Its generation methods run on the
engine (:mod:`~mlxprog.llm.engine`), which keeps the device busy: the next
decode step is dispatched before the current tokens are read back and
detokenized.

Every generation method takes the same options, declared once by
:class:`~mlxprog.llm.GenerationOptions`: as keyword arguments, or as
``options=``. A prompt is text (rendered with the chat template when
``chat``), a list of chat messages, or a list of token ids.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import mlx.core as mx

from ..arrays import is_int
from ..errors import ModelError
from .cache import PromptCache
from .compiled import CompiledModel
from .constraints import OptionError
from .engine import Engine, Generation, Piece, Request, prefill_bucket, run
from .options import GenerationOptions
from .programs import POOLINGS, DecodeLoopInputs, EmbedInputs
from .speculative import check_draft_model
from .tokenizer import unicode_problem

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


class LLM(CompiledModel):
    """A loaded model with its tokenizer and compiled programs (see
    :class:`~mlxprog.llm.compiled.CompiledModel`), and the methods that
    generate and embed with it.

    ``LLM(checkpoint, options=ModelOptions(...))`` or ``LLM(checkpoint,
    max_length=4096, ...)``: the model's options
    (:class:`~mlxprog.llm.ModelOptions`: the KV cache's length and growth
    step, ``native``, ``numerics``, the chat template and extra EOS tokens,
    the KV cache's quantization and bound), as one object and/or keyword
    arguments named as its fields. ``group`` (an ``mx.distributed`` group)
    runs the model tensor-parallel over its processes. Bad values raise
    :class:`~mlxprog.llm.ModelError` naming the option. See docs/llm.md.
    """

    #: The result of the last :meth:`stream`, once it has finished.
    last_generation: Generation | None = None

    def use_draft_model(self, draft: CompiledModel | None) -> None:
        """Draft with ``draft`` (None: no draft model): a smaller model
        sharing this one's vocabulary (else a
        :class:`~mlxprog.llm.SettingError` naming ``draft_model``),
        which generations then draft with unless their ``draft`` option
        says otherwise (see :class:`~mlxprog.llm.GenerationOptions`)."""
        if draft is not None:
            check_draft_model(self, draft)
        self.draft = draft

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
        for name in ("constraint", "logit_bias"):
            if getattr(options, name) is not None:
                raise OptionError(name, "the in-program decode loop cannot apply it (its "
                                  "tokens are picked inside the program); use generate")
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
        program = self.embedder(pooling, normalize)
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
