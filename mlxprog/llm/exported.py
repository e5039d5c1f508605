"""Exported programs: a model's programs written as JSON by
``mlxprog export-llm`` (:func:`export`), and run again without building
them (:func:`load_exported`).

A directory of exported programs holds ``prefill.json``, ``decode.json`` and
``decode_loop.json`` (or one directory of them per rank, ``rank<r>/``) and
``manifest.json``: the model file (and its LoRA adapter), the KV cache's
length and growth step, the quantized matmuls' numerics, the decode loop's
sampling, each program's inputs and, for several ranks, the world size. The
weights stay in the model file: the programs' captures bind to them by name.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelError, SettingError
from ..format.program import Program
from .compiled import BUILDERS, ExportedPrograms, program_numerics
from .generate import LLM
from .model_files import load_checkpoint
from .options import AUTO_NUMERICS, DEFAULT_CACHE_STEP, NUMERICS, ModelOptions
from .programs import PrefillInputs, Sampling

#: The programs a directory of exported programs holds, by kind.
EXPORTED = ("prefill", "decode", "decode_loop")


def load_exported(directory: str | Path, model: str | Path | None = None, *,
                  options: ModelOptions | None = None,
                  group: mx.distributed.Group | None = None, **overrides: Any) -> LLM:
    """An :class:`~mlxprog.llm.LLM` running the programs written by ``mlxprog
    export-llm`` (``prefill.json``, ``decode.json``, ``decode_loop.json``),
    with the model's weights bound by capture name from the model file
    (``model``; None: the one the manifest names). Programs exported for
    several ranks (``rank<r>/``, ``--world-size``) run on a ``group`` of that
    size, each process its rank's.

    ``options`` (:class:`~mlxprog.llm.ModelOptions`, and/or keyword
    arguments named as its fields) give ``native``, ``chat_template`` and
    ``extra_eos_tokens`` (no part of the programs). The KV cache's length
    and growth step and the numerics are the programs' (the manifest's;
    ``"exact"`` for a manifest that predates the choice): a ``max_length`` or
    ``numerics`` other than theirs (None and ``"auto"`` take theirs) is a
    :class:`~mlxprog.llm.ModelError`, a KV cache setting a
    :class:`~mlxprog.llm.SettingError` naming it (the programs are built for
    a float cache). The LoRA adapter the manifest names, if any, is fused
    into the model's weights again (the programs' captures are the adapted
    weights)."""
    directory = Path(directory)
    options = ModelOptions.given(options, overrides)
    given = [name for name, value in options.kv_cache().items() if value is not None]
    if given:
        raise SettingError(given[0], f"{directory} holds exported programs, built for a float "
                           "KV cache; load the model file to set the KV cache")
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
    if options.max_length is not None and options.max_length != manifest["max_length"]:
        raise ModelError(f"{directory}: the programs were exported with max_length "
                         f"{manifest['max_length']}, not {options.max_length}; export them "
                         "again for another")
    if options.numerics not in (None, AUTO_NUMERICS, exported_numerics):
        raise ModelError(f"{directory}: the programs were exported with numerics "
                         f"{exported_numerics!r}, not {options.numerics!r}; export them again "
                         "for another")
    where = directory if world_size == 1 else directory / f"rank{group.rank()}"
    programs = {kind: Program.load(where / f"{kind}.json") for kind in EXPORTED}
    options = dataclasses.replace(
        options, max_length=manifest["max_length"], numerics=exported_numerics,
        cache_step=manifest.get("cache_step", DEFAULT_CACHE_STEP))
    llm = LLM(load_checkpoint(model if model is not None else manifest.get("model"),
                              manifest.get("adapter")),
              options=options, group=group,
              programs=ExportedPrograms(programs, Sampling(**manifest["sampling"])))
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
    quantized matmuls' numerics (the LLM's :attr:`~mlxprog.llm.LLM.numerics`) and the
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
        per_rank = [{kind: BUILDERS[kind](llm.spec, llm.max_length, samplings[kind],
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
