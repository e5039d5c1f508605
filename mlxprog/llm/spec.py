"""What the program builders know about a model, and how it is split.

:class:`ModelSpec` is a loaded checkpoint's shape: its config, each
weight's shape, dtype and file name, the quantization of each quantized
layer, the tensor-parallel split of each layer (the family's weight table)
and the projections fused into one matmul. :class:`Shard` is one rank's
part of a model split over ``world_size`` ranks (mlx-lm's scheme): each
rank holds a contiguous block of the KV heads with the query heads of their
groups, and a block of the MLP's intermediate dim; layers split by rows
follow one block, layers split by columns are summed across the ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import mlx.core as mx
import numpy as np

from ..arrays import is_int, name_of
from ..errors import ModelError
from .checkpoint import Checkpoint, GGMLQuantization, Quantization
from .config import ModelConfig, MoEConfig


@dataclass(frozen=True)
class Split:
    """How a weight is cut across tensor-parallel ranks: by output rows
    (``axis`` 0) or input columns (``axis`` 1), following one block of a
    :class:`Shard` (``"heads"``, ``"kv_heads"``, ``"intermediate"`` or
    ``"expert_intermediate"``). A row split's bias is cut with it; a column
    split's bias is of its outputs, held whole by every rank and added once
    after the ranks' sum. A stack of matrices (a mixture's experts,
    ``(experts, out, in)``) is cut the same way in every expert: its rows
    and columns are its last two axes. A vector (a norm's weight) split by
    rows is cut along its one axis; block ``"head_values"`` cuts a vector
    of one value per query head (gpt-oss's attention sinks) by the rank's
    query heads."""

    axis: Literal[0, 1]
    block: Literal["heads", "kv_heads", "intermediate", "expert_intermediate", "head_values"]


ROWS_BY_HEADS = Split(0, "heads")
ROWS_BY_KV_HEADS = Split(0, "kv_heads")
ROWS_BY_INTERMEDIATE = Split(0, "intermediate")
COLUMNS_BY_HEADS = Split(1, "heads")
COLUMNS_BY_INTERMEDIATE = Split(1, "intermediate")
ROWS_BY_EXPERT_INTERMEDIATE = Split(0, "expert_intermediate")
COLUMNS_BY_EXPERT_INTERMEDIATE = Split(1, "expert_intermediate")
BY_QUERY_HEAD = Split(0, "head_values")


@dataclass(frozen=True)
class ModelSpec:
    """What the program builders need to know about a model: its config, the
    quantization of each quantized layer, each weight's shape/dtype, and the
    file's name for each weight."""

    config: ModelConfig
    quantization: dict[str, Quantization | GGMLQuantization]
    weights: dict[str, tuple[tuple[int, ...], str]]
    source_names: dict[str, str]
    #: The tensor-parallel split of every split layer (the family's table).
    splits: dict[str, Split] = field(default_factory=dict)
    #: Fused projections: a layer name (``layers.0.self_attn.qkv_proj``) to
    #: the layers whose output rows it stacks, in order (see :func:`_fuse`).
    fused: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def of(cls, checkpoint: Checkpoint, splits: Mapping[str, Split]) -> ModelSpec:
        """The spec of a loaded checkpoint whose layers split as ``splits``
        says (its family's weight table; :func:`mlxprog.llm.models.model_spec`
        finds them), with its q/k/v and gate/up projections fused where they
        are packed alike."""
        config = checkpoint.config
        spec = cls(
            config=config,
            quantization=dict(checkpoint.quantization),
            weights={n: (tuple(w.shape), name_of(w.dtype))
                     for n, w in checkpoint.weights.items()},
            source_names={n: checkpoint.source_names.get(n, n) for n in checkpoint.weights},
            splits=dict(splits),
        )
        for i in range(spec.config.num_layers):
            for fused, parts in _FUSIONS:
                _fuse(spec, f"layers.{i}.{fused}", [f"layers.{i}.{p}" for p in parts])
        return spec

    def shard(self, world_size: int = 1, rank: int = 0) -> Shard:
        """Rank ``rank``'s part of the model split over ``world_size`` ranks
        (see :class:`Shard`); a split the model's heads or quantization groups
        do not allow is a :class:`ModelError` naming ``world_size``, and so
        is a split of a mixture of experts whose expert stacks the family's
        table does not split."""
        unsplit = sorted(n for n, (shape, _) in self.weights.items()
                         if len(shape) == 3 and n.rsplit(".", 1)[0] not in self.splits)
        if world_size != 1 and unsplit:
            raise ModelError(f"world_size {world_size}: tensor parallelism does not split a "
                             f"mixture of experts' expert stacks ({unsplit[0]} and "
                             f"{len(unsplit) - 1} more): the {self.config.family} family's "
                             "weight table gives them no split across the ranks; run the "
                             "model in one process")
        return _shard(self.config, self.quantization, self.splits, world_size, rank)

    def local_shape(self, name: str, shard: Shard) -> tuple[int, ...]:
        """The shape of weight ``name`` on the rank of ``shard`` (of a fused
        layer: its parts' rows stacked)."""
        layer, part = name.rsplit(".", 1)
        if layer in self.fused:
            shapes = [self.local_shape(f"{p}.{part}", shard) for p in self.fused[layer]]
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        shape = list(self.weights[name][0])
        cut = self._slice(name, shard)
        if cut is not None:
            axis, start, end = cut
            shape[axis] = end - start
        return tuple(shape)

    def captures(self, checkpoint: Checkpoint, world_size: int = 1,
                 rank: int = 0) -> dict[str, mx.array]:
        """The checkpoint's weights under the programs' capture names, sliced
        to rank ``rank``'s part when ``world_size > 1``: rows of the
        q/k/v/gate/up projections (quantized weights with their scales and
        biases), whole quantization groups of the o/down projections' columns.
        A fused layer's arrays are its parts' (rank's) rows stacked, under the
        joined names that :func:`mlxprog.compile` also resolves from the
        model file itself (``blk.0.attn_q.weight+blk.0.attn_k.weight+...``).
        On one rank the checkpoint's part arrays are replaced by views of
        the fused ones (the same values), so no weight is held twice."""
        shard = self.shard(world_size, rank)
        out = {}
        for name, w in checkpoint.weights.items():
            cut = self._slice(name, shard)
            if cut is not None:
                axis, start, end = cut
                # A copy: a column slice is a strided view, and a copy gives the
                # kernels the dense row-major layout a weight read from a file has.
                w = mx.contiguous(w[(slice(None),) * axis + (slice(start, end),)])
            out[self.source_names[name]] = w
        for layer, parts in self.fused.items():
            for part in _PARTS:
                if f"{parts[0]}.{part}" not in self.weights:
                    continue
                names = [self.source_names[f"{p}.{part}"] for p in parts]
                fused = _stacked([out[n] for n in names])
                out[self.source_names[f"{layer}.{part}"]] = fused
                if world_size == 1:
                    # The parts become views of the fused array, in the
                    # checkpoint too: the weights are held once, and the
                    # whole model is never in memory twice while fusing.
                    start = 0
                    for p, name in zip(parts, names):
                        rows = out[name].shape[0]
                        out[name] = checkpoint.weights[f"{p}.{part}"] = fused[start:start + rows]
                        start += rows
        # Computed here: a lazy array belongs to this thread's stream, and
        # the executables may be compiled in another (the server's).
        mx.eval(list(out.values()))
        # The parts' own buffers, freed by fusing, would stay in MLX's cache
        # of free buffers (a third of SmolLM2's weights) for the process's
        # life: hand them back.
        mx.clear_cache()
        return out

    def _slice(self, name: str, shard: Shard) -> tuple[int, int, int] | None:
        """``(axis, start, end)`` of weight ``name``'s stored array that the
        rank of ``shard`` holds, or None: the whole array (replicated, or one
        rank). The axis counts the leading axes of an expert stack."""
        if shard.world_size == 1:
            return None
        layer, part = name.rsplit(".", 1)
        split = self.splits.get(layer)
        if split is None or (split.axis == 1 and part == "bias"):
            # A column split's bias is of its outputs: every rank holds it all
            # and adds it once, after the sum (see Decoder.linear).
            return None
        start, end = shard.features(split.block, self.config.head_dim)
        # The experts' axis of a stack (its weight's third-from-last axis).
        stacked = max(len(self.weights[f"{layer}.weight"][0]) - 2, 0)
        if split.axis == 0:
            return stacked, start, end
        quant = self.quantization.get(layer)
        if quant is not None:
            # The split keeps whole groups (see _shard).
            start, end = quant.stored_columns(part, start, end)
        return stacked + 1, start, end


def _stacked(arrays: list[mx.array]) -> mx.array:
    """``arrays`` (of one dtype and trailing shape) concatenated along their
    first axis into a new, evaluated array. The bytes are copied by numpy
    into the new array's memory: MLX's concatenate copied them at a third
    of memcpy's speed, most of a model's load time after the file's reads."""
    out = mx.zeros((sum(a.shape[0] for a in arrays), *arrays[0].shape[1:]), arrays[0].dtype)
    mx.eval(out)
    # As bytes (numpy has no bfloat16): the last axis widens by the item
    # size, so a 1-d array's rows are its bytes.
    rows = np.asarray(out.view(mx.uint8))
    start = 0
    for a in arrays:
        part = np.asarray(a.view(mx.uint8))
        rows[start:start + len(part)] = part
        start += len(part)
    return out


# The projections fused into one matmul (they read the same input), by the
# name of the fused layer under ``layers.<i>.``.
_FUSIONS = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj",
                                    "self_attn.v_proj")),
            ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))
_PARTS = ("weight", "scales", "biases", "bias")  # a layer's arrays


def _fuse(spec: ModelSpec, layer: str, parts: list[str]) -> None:
    """Declare ``layer`` in ``spec`` as the projections ``parts`` stacked by
    output rows, when they are all there and packed alike (the same
    quantization, or none; the same dtypes and input width; biases on all or
    none): one matmul then computes all their outputs, each row exactly as
    its own projection would. Its arrays are named by joining the parts'
    file names with ``+``."""
    arrays = [[spec.weights.get(f"{p}.{part}") for part in _PARTS] for p in parts]
    if any(a[0] is None for a in arrays):
        return
    if len({spec.quantization.get(p) for p in parts}) != 1:
        return
    weights = {}
    for i, part in enumerate(_PARTS):
        found = [a[i] for a in arrays]
        if found.count(None) == len(found):
            continue
        if None in found or len({(f[0][1:], f[1]) for f in found}) != 1:
            return
        weights[f"{layer}.{part}"] = ((sum(f[0][0] for f in found), *found[0][0][1:]),
                                      found[0][1])
    spec.weights.update(weights)
    spec.source_names.update({name: "+".join(spec.source_names[f"{p}.{name.rsplit('.', 1)[1]}"]
                                             for p in parts) for name in weights})
    if parts[0] in spec.quantization:
        spec.quantization[layer] = spec.quantization[parts[0]]
    spec.fused[layer] = tuple(parts)


@dataclass(frozen=True)
class Shard:
    """One rank's part of a model split over ``world_size`` ranks (tensor
    parallelism): the half-open ranges of the KV heads, the query heads (those
    of its KV heads' groups), the MLP intermediate dim and, in a mixture of
    experts, every expert's intermediate dim it holds."""

    world_size: int
    rank: int
    kv_heads: tuple[int, int]
    heads: tuple[int, int]
    intermediate: tuple[int, int]
    expert_intermediate: tuple[int, int] = (0, 0)

    @property
    def num_kv_heads(self) -> int:
        """The KV heads the rank holds (its caches' head count)."""
        return self.kv_heads[1] - self.kv_heads[0]

    @property
    def num_heads(self) -> int:
        """The query heads the rank holds."""
        return self.heads[1] - self.heads[0]

    def features(self, block: str, head_dim: int) -> tuple[int, int]:
        """The range of features ``block`` (a :class:`Split`'s) covers:
        heads count ``head_dim`` features each (``head_values``: one)."""
        if block == "head_values":
            return self.heads
        start, end = getattr(self, block)
        return (start * head_dim, end * head_dim) if block in ("heads", "kv_heads") else (
            start, end)


def _blocks(units: int, world_size: int) -> list[tuple[int, int]]:
    """``units`` split into ``world_size`` contiguous blocks, the first ones
    one larger when they do not divide evenly (3 over 2: 2 and 1)."""
    base, extra = divmod(units, world_size)
    bounds = [0]
    for r in range(world_size):
        bounds.append(bounds[-1] + base + (r < extra))
    return list(zip(bounds, bounds[1:]))


def _shard(config: ModelConfig, quantization: dict[str, Quantization | GGMLQuantization],
           layer_splits: dict[str, Split], world_size: int, rank: int) -> Shard:
    """Rank ``rank``'s :class:`Shard`: KV heads in contiguous blocks (with
    their query heads), the intermediate dim (and a mixture's experts')
    in blocks of whole quantization groups of the down projection's
    columns; every rank's split is checked,
    so all ranks agree on whether the model can be split."""
    if not is_int(world_size) or world_size < 1:
        raise ModelError(f"world_size must be a positive integer, got {world_size!r}")
    if not is_int(rank) or not 0 <= rank < world_size:
        raise ModelError(f"rank {rank!r} is not in [0, world_size {world_size})")
    c = config
    if world_size > c.num_kv_heads:
        raise ModelError(f"world_size {world_size}: the model has {c.num_kv_heads} KV heads "
                         f"and tensor parallelism gives each rank at least one; use a "
                         f"world_size of at most {c.num_kv_heads}")
    group = c.num_heads // c.num_kv_heads
    kv = _blocks(c.num_kv_heads, world_size)
    heads = [(start * group, end * group) for start, end in kv]

    def group_size(block: str) -> int:
        # One split serves every layer: blocks of whole groups of the
        # quantization of every layer whose input columns follow the block.
        return math.lcm(*(q.group_size for n, q in quantization.items()
                          if layer_splits.get(n) == Split(1, block)))

    o_group = group_size("heads")
    for start, _ in heads:
        if start * c.head_dim % o_group:
            raise ModelError(
                f"world_size {world_size}: a rank's query heads would start at column "
                f"{start * c.head_dim} of o_proj, inside a quantization group of "
                f"{o_group} columns; choose a world_size whose head blocks fall on group "
                "boundaries")

    def intermediate(block: str, size: int, what: str) -> tuple[int, int]:
        # Blocks of whole quantization groups of the down projection's columns.
        down_group = group_size(block)
        units = size // down_group
        if units < world_size:
            raise ModelError(
                f"world_size {world_size}: {what} {size} is {units} quantization groups of "
                f"{down_group} (down_proj's columns), fewer than the ranks; use a world_size "
                f"of at most {units}")
        start, end = _blocks(units, world_size)[rank]
        return start * down_group, end * down_group

    experts = ((0, 0) if not isinstance(c, MoEConfig) else intermediate(
        "expert_intermediate", c.expert_intermediate_size, "each expert's intermediate size"))
    return Shard(world_size, rank, kv[rank], heads[rank],
                 intermediate("intermediate", c.intermediate_size,
                              "the MLP's intermediate size"), experts)
