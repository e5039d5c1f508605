"""A model ready to run: a checkpoint with its tokenizer, KV cache layout and
programs, built on first use and compiled with the model's weights as
captures (:class:`CompiledModel`).

This is what the engine (:mod:`~mlxprog.llm.engine`) and the drafters
(:mod:`~mlxprog.llm.speculative`) run; :class:`~mlxprog.llm.LLM` adds the
generation methods on top of it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

import mlx.core as mx

from .. import native as native_kernels
from ..errors import ModelError
from ..limits import Limits
from ..format.program import Program
from ..runtime.executable import Executable, compile as compile_program
from .cache import kv_cache_layout
from .checkpoint import Checkpoint
from .models import model_spec
from .models.base import ProgramNumerics
from .options import DEFAULT_MAX_LENGTH, ModelOptions, resolve_numerics
from .programs import (
    Picking, Sampling, build_decode, build_decode_loop, build_embed, build_pick, build_prefill,
    build_verify,
)

# The decode step is traced per batch size and cache length (64 x 16 with
# the defaults), the prefill per prompt bucket and cache length: room for a
# server's mix.
MAX_TRACES = 256

#: The programs a model builds by kind (``"verify"`` is built apart: it
#: always returns logits).
BUILDERS = {"prefill": build_prefill, "decode": build_decode, "decode_loop": build_decode_loop}


@dataclass(frozen=True)
class ExportedPrograms:
    """Programs written by ``mlxprog export-llm`` that a model runs as they
    are instead of building its own (see :func:`~mlxprog.llm.load_exported`):
    ``programs`` by kind (a logits-returning ``"prefill"`` and ``"decode"``,
    a ``"decode_loop"``), ``sampling`` the decode loop's."""

    programs: Mapping[str, Program]
    sampling: Sampling = Sampling()


def program_numerics(kind: str, numerics: str) -> ProgramNumerics:
    """The numerics of the model's ``kind`` program under its ``numerics``.
    The decode steps take the model's choice for every quantized matmul.
    The prefill's dense projections stay ``"exact"``: 8-bit activations
    would round every prompt token's activations in every layer, and the
    logits that pick the first token with them. (On the README prompt the
    first token is a tie, "The" 0.08 ahead of "L" in the logits, that 8-bit
    activations flip everywhere, llama.cpp's included, into a looping
    answer.) Two kinds take the model's choice in the prefill too:

    * layers (and an output head) stored wholly in GGML's super-block
      types, the K-quants and the IQ and TQ types (a Q4_K_M file of a model
      whose widths are multiples of 256: Q4_K and Q6_K throughout). There
      the exact path, which decodes every weight block to floats for each
      prompt, takes 1.2x-1.6x the int8 GEMM's time on a short prompt, and
      llama.cpp's prefill is that GEMM. The files of the 32-element types
      (Q4_1, Q8_0, and the fallbacks of rows that are no multiple of 256)
      keep the exact prefill;
    * a mixture's expert stacks: each expert multiplies only the few prompt
      rows routed to it (T x k / experts on average), where decoding its
      weight blocks to floats costs as much as the products and int8 dot
      products read the blocks as they are.

    (docs/benchmarks.md has the measurements.)"""
    if kind != "prefill":
        return ProgramNumerics.of(numerics)
    return ProgramNumerics(dense="exact", experts=numerics, superblocks=numerics)


def _no_generation(tokens: mx.array) -> mx.array:
    """The decode loop's ``emit`` callback when the loop is called as it was
    compiled: compiled decode loops are shared, so each in-program
    generation passes its own callback for its call (see
    :meth:`LLM.generate_in_program <mlxprog.llm.LLM.generate_in_program>`),
    and there is none to stream to here."""
    raise ModelError("the decode loop's emit callback has no generation to stream to; "
                     "run the loop with LLM.generate_in_program")


def _sampling_of(kind: str, sampling: Sampling | None) -> Sampling | None:
    """The sampling of a program of ``kind``: the decode loop always samples
    (None: greedy)."""
    return Sampling() if kind == "decode_loop" and sampling is None else sampling


class CompiledModel:
    """A checkpoint made ready to run under ``options``
    (:class:`~mlxprog.llm.ModelOptions`, as one object and/or keyword
    arguments named as its fields): its tokenizer (with the options' chat
    template and extra EOS tokens), its KV cache layout, and its programs,
    built on first use and compiled with the model's weights as captures.
    The prefill and decode step return logits and a small picker program per
    sampling configuration picks each sequence's token; the in-program decode
    loop samples inside the program (sampling parameters are its attributes).
    ``programs`` (exported ones) are run instead of built.

    :attr:`numerics` holds the resolved numerics of the decode steps'
    quantized matmuls and of the expert stacks; the prefill's dense
    projections stay exact, but for layers stored wholly in GGML's
    super-block types (see :func:`program_numerics`). Where a kernel
    cannot honour ``"int8"`` (an op on the GPU, bits the integer path lacks)
    it computes exactly and the executable's ``stats`` say so.

    ``group`` (an ``mx.distributed`` group of more than one process) runs the
    model tensor-parallel over it: this process builds and runs its rank's
    programs (:attr:`world_size`, :attr:`rank`; see
    :mod:`~mlxprog.llm.programs`), its caches hold its KV heads only, and
    every rank picks the same tokens (the logits are whole on every rank and
    the pickers start from the same seeds), so every rank's generation is the
    same. A group of one process (or None) runs the whole model here.

    Bad options raise :class:`~mlxprog.llm.ModelError` (a
    :class:`~mlxprog.llm.SettingError` for the tokenizer's and the KV
    cache's settings) naming the option.
    """

    def __init__(self, checkpoint: Checkpoint, *, options: ModelOptions | None = None,
                 group: mx.distributed.Group | None = None,
                 programs: ExportedPrograms | None = None, **overrides: Any):
        options = ModelOptions.given(options, overrides)
        #: The options the model was made with.
        self.options = options
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        # The settings change this model's copy of the tokenizer only: the
        # checkpoint's stays the model's.
        self.tokenizer = checkpoint.tokenizer
        if options.chat_template is not None:
            self.tokenizer = self.tokenizer.with_chat_template(options.chat_template)
        if options.extra_eos_tokens:
            self.tokenizer = self.tokenizer.with_extra_eos_tokens(options.extra_eos_tokens)
        self.max_length = DEFAULT_MAX_LENGTH if options.max_length is None else options.max_length
        self.cache_step = options.cache_step
        self.native = options.native
        #: The quantized matmuls' numerics the programs are built with:
        #: ``"exact"`` or ``"int8"``.
        self.numerics = resolve_numerics(options.numerics, options.native)
        if (native_kernels.default_enabled() if self.native is None else self.native) \
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
                                            self.config.head_dim, self.max_length,
                                            **options.kv_cache())
        self._captures = self.spec.captures(checkpoint, self.world_size, self.rank)
        if self.world_size > 1:
            # The sliced captures are copies: without the whole model's
            # weights, a rank holds only its part of the model.
            self.checkpoint = dataclasses.replace(checkpoint, weights={})
        self._given = ExportedPrograms({}) if programs is None else programs
        self._executables: dict[tuple[str, Sampling | None], Executable] = {}
        self._pickers: dict[Picking, Executable] = {}
        self._embedders: dict[tuple[str, bool], Executable] = {}
        #: The draft model speculative decoding drafts with (``draft="model"``;
        #: see :meth:`LLM.use_draft_model <mlxprog.llm.LLM.use_draft_model>`),
        #: or None.
        self.draft: CompiledModel | None = None

    # -- programs ----------------------------------------------------------
    def program(self, kind: str, sampling: Sampling | None = None) -> Program:
        """The ``"prefill"``, ``"decode"``, ``"decode_loop"`` or ``"verify"``
        program. The default (``sampling=None``) is what generation runs:
        steps that return logits, and a greedy decode loop (the loop always
        samples); with a ``Sampling``, steps that sample it. Exported
        programs (logits-returning prefill and decode, a decode loop for one
        sampling) are used as they are. The speculative verify step
        (:func:`~mlxprog.llm.programs.build_verify`, logits only) is always
        built here, with the decode step's numerics."""
        if kind == "verify" and sampling is None:
            return build_verify(self.spec, self.max_length, world_size=self.world_size,
                                rank=self.rank, numerics=program_numerics(kind, self.numerics),
                                kv=self.cache_layout)
        if kind not in BUILDERS:
            raise ModelError(f"unknown program kind {kind!r}; one of "
                             f"{sorted([*BUILDERS, 'verify'])} (verify: sampling=None)")
        sampling = _sampling_of(kind, sampling)
        if kind in self._given.programs:
            given_sampling = self._given.sampling if kind == "decode_loop" else None
            if sampling != given_sampling:
                raise ModelError(f"the given {kind} program samples with {given_sampling}; "
                                 f"{sampling} needs programs built (or exported) for it")
            return self._given.programs[kind]
        return BUILDERS[kind](self.spec, self.max_length, sampling,
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
        :meth:`LLM.generate_in_program
        <mlxprog.llm.LLM.generate_in_program>`); called as compiled, its
        ``emit`` raises :class:`~mlxprog.llm.ModelError`."""
        key = (kind, _sampling_of(kind, sampling))
        if key not in self._executables:
            self._executables[key] = self.compile(
                self.program(*key),
                callbacks={"emit": _no_generation} if kind == "decode_loop" else None,
                max_traces=MAX_TRACES,
                # The decode loop runs as long as its generation does, and
                # stops at its token count (max_new): no clock bounds it.
                limits=Limits(max_loop_seconds=math.inf) if kind == "decode_loop" else None,
            )
        return self._executables[key]

    def picker(self, picking: Picking) -> Executable:
        """The compiled token picker for ``picking`` (cached; see
        :func:`~mlxprog.llm.programs.build_pick`)."""
        if picking not in self._pickers:
            self._pickers[picking] = compile_program(
                build_pick(self.config.vocab_size, picking), native=self.native)
        return self._pickers[picking]

    def embedder(self, pooling: str, normalize: bool) -> Executable:
        """The compiled embedding program for ``pooling`` and ``normalize``
        (cached; see :func:`~mlxprog.llm.programs.build_embed`)."""
        key = (pooling, normalize)
        if key not in self._embedders:
            self._embedders[key] = self.compile(
                build_embed(self.spec, self.max_length, pooling, normalize,
                            world_size=self.world_size, rank=self.rank),
                max_traces=MAX_TRACES)
        return self._embedders[key]
