"""Loading a model for generation: :func:`load`, the one entry point for a
model file, a Hugging Face directory or a directory of exported programs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelError, SettingError
from .exported import load_exported
from .generate import LLM
from .model_files import is_exported, load_checkpoint
from .options import ModelOptions
from .tokenizer import ChatTemplate


def load(model: str | Path | None = None, *, options: ModelOptions | None = None,
         group: mx.distributed.Group | None = None, adapter_path: str | Path | None = None,
         draft_model: str | Path | None = None, **overrides: Any) -> LLM:
    """Load a model (a ``.gguf`` file or Hugging Face directory; None: the
    default SmolLM2-135M-Instruct, installed on first use) for generation,
    under ``options`` (:class:`~mlxprog.llm.ModelOptions`: the KV cache's
    length, growth step, quantization and bound, ``native``, ``numerics``,
    the chat template and extra EOS tokens), given as one object and/or as
    keyword arguments named as its fields: ``load("model.gguf",
    max_length=4096, kv_bits=8)``.

    ``group=mx.distributed.init()`` splits the model over the launched
    processes when there are several (tensor parallelism; see
    :class:`~mlxprog.llm.LLM`). A directory written by ``mlxprog export-llm``
    runs its programs (see :func:`~mlxprog.llm.load_exported`), with the
    ``max_length``, ``cache_step`` and ``numerics`` they were exported with
    (they have a float cache and take no KV cache settings).
    ``adapter_path``, a LoRA adapter directory in mlx-lm's or PEFT's format,
    is fused into the model's weights as it loads (see
    :mod:`~mlxprog.llm.adapters`; a bad or mismatched adapter raises
    :class:`~mlxprog.llm.SettingError` naming ``adapter_path``); an exported
    directory's programs use the adapter they were exported with.
    ``draft_model`` (a model file or directory) is loaded with the same
    ``max_length``, ``cache_step``, ``native`` and ``numerics`` for
    speculative decoding (see :meth:`LLM.use_draft_model
    <mlxprog.llm.LLM.use_draft_model>`; it must share the model's
    vocabulary)."""
    options = ModelOptions.given(options, overrides)
    if options.chat_template is not None:
        # Read and compiled before the model loads, which takes a while.
        options = dataclasses.replace(options,
                                      chat_template=ChatTemplate.of(options.chat_template))
    if model is not None and is_exported(model):
        if adapter_path is not None:
            raise SettingError("adapter_path", f"{model} holds exported programs, which use "
                               "the adapter their manifest names (or none); export them "
                               "again with this one")
        return load_exported(model, options=options, group=group)
    llm = LLM(load_checkpoint(model, adapter_path), options=options, group=group)
    if draft_model is not None:
        llm.use_draft_model(_load_draft(draft_model, llm))
    return llm


def _load_draft(path: str | Path, llm: LLM) -> LLM:
    """The draft model at ``path``, loaded as ``llm`` is; a file that does
    not load raises :class:`~mlxprog.llm.SettingError` naming
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
