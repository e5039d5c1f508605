"""What every model family module is made of: its weight table, the readers of
its config sources, and the decoder base its forward pass is written on.

A family module (``llama.py``, ``gemma2.py``, ...) defines one
:class:`Family`: the Hugging Face ``model_type`` values and GGUF
architectures it reads, a config parser for each source, one table of its
weights (:class:`Weight`: logical name, shape rule, names in both file
formats, tensor-parallel split, load-time transforms) and a
:class:`Decoder` subclass that emits its forward pass with the program
builder. Everything else (both loaders, the weight checks, the sharding,
the program declarations) is generic over those.

Logical weight names are Hugging Face's without the ``model.`` prefix
(``layers.3.self_attn.q_proj.weight``); a *matrix* entry (a projection or
embedding) names a layer whose arrays are ``.weight`` (or MLX's quantized
``.weight``/``.scales``/``.biases``) and, where the family has them,
``.bias``; a *vector* entry (a norm) names one ``.weight``. A matrix entry
of three axes is a mixture of experts' stack of matrices, ``(experts, out,
in)``: mlx-lm saves it stacked (``switch_mlp``), llama.cpp as one ``*_exps``
tensor, and an original Hugging Face checkpoint one tensor per expert,
stacked at load (``Weight.hf_experts``).
:class:`~mlxprog.llm.config.MoEConfig` holds the mixture's settings and
:meth:`Decoder.moe` is its forward pass.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Sequence

import mlx.core as mx

from ...arrays import is_int
from ...errors import ModelError
from ...ggml import types as ggml_types
from ...ggml.gguf_file import metadata_field, metadata_value
from ..cache import CacheLayout, LayerCache
from ..checkpoint import Checkpoint, GGMLQuantization, Quantization, infer_quantization
from ..config import ModelConfig, MoEConfig, check_expert_counts
from ..spec import (COLUMNS_BY_EXPERT_INTERMEDIATE, ROWS_BY_EXPERT_INTERMEDIATE, ModelSpec,
                    Shard, Split)

if TYPE_CHECKING:
    from ...builder import ProgramBuilder, Value
    from ..tokenizer import Tokenizer


# -- the weight table ---------------------------------------------------------

@dataclass(frozen=True)
class Transform:
    """A load-time change to a stored tensor (``name`` says what it does and
    marks the capture name, so a program never binds the untransformed file
    tensor by mistake)."""

    name: str
    apply: Callable[[mx.array], mx.array]


#: Gemma's norms scale by ``1 + w``: folded at load, in the stored dtype as
#: Gemma's own code adds it.
PLUS_ONE = Transform("1+w", lambda w: 1.0 + w)

Rows = Callable[[ModelConfig], tuple[int, int]]


def _always(config: ModelConfig) -> bool:
    return True


def _never(config: ModelConfig) -> bool:
    return False


@dataclass(frozen=True)
class Weight:
    """One entry of a family's weight table.

    ``name`` is the logical layer (matrix) or weight stem (vector), with
    ``{i}`` for the layer index in per-layer entries; ``shape`` gives its
    logical shape (``(out, in)`` for a matrix) from the config. ``hf`` and
    ``gguf`` are the stems of the stored tensors in each format (None: the
    format has no such tensor and the family reads none from it). A matrix
    of shape ``(experts, out, in)`` is a stack of the experts' matrices;
    ``hf_experts``, the stem of one expert's tensor with ``{e}`` for its
    index, names where an original Hugging Face checkpoint keeps them
    apart (stacked at load when ``hf``'s stacked tensor is not there).
    ``layers``, for a per-layer entry, gives the layers that have it (None:
    every layer). ``finite`` checks at load that it holds no NaN or
    infinity (a router: one would pick experts at random). ``hf_rows``
    / ``gguf_rows``, when given, say which rows of that stored tensor are this
    weight's (a fused ``qkv_proj`` stored as one tensor, split at load).
    ``hf_transform`` / ``gguf_transform`` change a vector at load. ``split``
    is the tensor-parallel cut (None: replicated). ``present`` says whether
    the config has this weight at all (``lm_head`` of untied models);
    ``bias`` whether a matrix has a ``.bias``. A matrix of three dimensions
    (``(experts, out, in)``) holds a mixture's experts stacked, its bias
    ``(experts, out)``. ``hf_bare``: the Hugging Face file stores a vector
    under its stem itself, with no ``.weight`` (gpt-oss's ``self_attn.sinks``)."""

    name: str
    shape: Callable[[ModelConfig], tuple[int, ...]]
    hf: str | None
    gguf: str | None
    matrix: bool = True
    split: Split | None = None
    bias: Callable[[ModelConfig], bool] = _never
    present: Callable[[ModelConfig], bool] = _always
    hf_rows: Rows | None = None
    gguf_rows: Rows | None = None
    hf_transform: Transform | None = None
    gguf_transform: Transform | None = None
    hf_experts: str | None = None
    layers: Callable[[ModelConfig], Sequence[int]] | None = None
    hf_bare: bool = False
    finite: bool = False

    @property
    def per_layer(self) -> bool:
        """Whether the table entry stands for one weight per layer."""
        return "{i}" in self.name

    def layer_indices(self, config: ModelConfig) -> Sequence[int | None]:
        """The layers of ``config`` that have this entry (``[None]``: a
        global entry)."""
        if not self.per_layer:
            return [None]
        return range(config.num_layers) if self.layers is None else self.layers(config)


Source = Literal["hf", "gguf"]
_MATRIX_PARTS = ("weight", "scales", "biases", "bias")


@dataclass(frozen=True)
class Entry:
    """A table entry for one layer index (or a global one): its logical stem
    and stored stem in the source being read."""

    weight: Weight
    name: str
    stored: str | None
    #: An expert stack's per-expert stem in the source (``{e}`` left for
    #: the expert), or None.
    stored_experts: str | None = None


def expand(table: Sequence[Weight], config: ModelConfig, source: Source | None = None
           ) -> list[Entry]:
    """The table's entries present in ``config``, per-layer ones once per
    layer; ``stored`` is the stem in ``source``'s files (None without one)."""
    out = []
    for w in table:
        if not w.present(config):
            continue
        stem = None if source is None else getattr(w, source)
        experts = w.hf_experts if source == "hf" else None
        for i in w.layer_indices(config):
            out.append(Entry(w, w.name.format(i=i), None if stem is None else stem.format(i=i),
                             None if experts is None else experts.format(i=i, e="{e}")))
    return out


def shapes(table: Sequence[Weight], config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The logical shape of every array of a dense (unquantized) checkpoint,
    by full weight name (``layers.0.self_attn.q_proj.weight``, ``...bias``)."""
    out = {}
    for e in expand(table, config):
        shape = tuple(e.weight.shape(config))
        out[f"{e.name}.weight"] = shape
        if e.weight.matrix and e.weight.bias(config):
            out[f"{e.name}.bias"] = shape[:-1]
    return out


def splits(table: Sequence[Weight], config: ModelConfig) -> dict[str, Split]:
    """The tensor-parallel split of every split layer, by logical layer name."""
    return {e.name: e.weight.split for e in expand(table, config) if e.weight.split}


def read_weights(table: Sequence[Weight], config: ModelConfig, tensors: dict[str, mx.array],
                 source: Source, where: str, ignored: Sequence[re.Pattern] = (),
                 block_types: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None
                 ) -> tuple[dict[str, mx.array], dict[str, str],
                            dict[str, Quantization | GGMLQuantization]]:
    """The logical weights of ``config`` read from a file's ``tensors`` (named
    as in ``source``): (weights, the stored name each came from, the
    quantization of every quantized layer). Rows are cut and transforms
    applied as the table says; every array's shape is checked against the
    table. Stored tensors no entry reads are an error, except those matching
    ``ignored`` and those of entries the config leaves out (a tied model's
    stored ``lm_head``). ``block_types`` names the GGML block type of each
    stored tensor kept in a GGUF file's blocks (``uint8 [rows, row_bytes]``).
    ``labels`` names what in the file a tensor re-laid at load came from
    (:meth:`Family.hf_tensors`; the stored name otherwise). ``where`` names
    the file in errors. Per-expert tensors stacked at load are removed from
    ``tensors`` (see :func:`_stored_parts`)."""
    weights: dict[str, mx.array] = {}
    names: dict[str, str] = {}
    quantization: dict[str, Quantization | GGMLQuantization] = {}
    block_types = block_types or {}
    missing: list[str] = []
    read: set[str] = set()
    for e in expand(table, config, source):
        if e.stored is None:
            raise ModelError(f"{where}: the {config.architecture} family reads no "
                             f"{e.name} from {source.upper()} files")
        rows_of = getattr(e.weight, f"{source}_rows")
        rows = None if rows_of is None else rows_of(config)
        transform = getattr(e.weight, f"{source}_transform")
        shape = tuple(e.weight.shape(config))
        parts = _MATRIX_PARTS if e.weight.matrix else ("weight",)
        found = {}
        bare = source == "hf" and e.weight.hf_bare
        for part, (key, value) in _stored_parts(e, parts, shape, tensors, read, where,
                                                    bare).items():
            label = (labels or {}).get(key, key)
            if rows is not None:
                value = value[rows[0]:rows[1]]
                label = f"{key}[{rows[0]}:{rows[1]}]"
            if transform is not None:
                if key in block_types:
                    raise ModelError(f"{where}: {key} is stored as {block_types[key]} "
                                     f"blocks, but {e.name} is changed at load "
                                     f"({transform.name}): store it as a float type")
                value, label = transform.apply(value), f"{label}:{transform.name}"
            found[part] = (value, label)
        has_bias = e.weight.matrix and e.weight.bias(config)
        required = ["weight"] + (["bias"] if has_bias else [])
        if "scales" in found or "biases" in found:
            # mxfp4 layers have no biases: their scales are E8M0 bytes.
            mxfp4 = "scales" in found and found["scales"][0].dtype == mx.uint8
            required += ["scales"] if mxfp4 else ["scales", "biases"]
        for part in required:
            if part not in found:
                missing.append((e.stored if bare else f"{e.stored}.{part}")
                               + ("" if rows is None else f" (rows {rows[0]}:{rows[1]})"))
        if "bias" in found and not has_bias:
            raise ModelError(f"{where}: {e.stored}.bias is there but the config gives "
                             f"{e.name} no bias")
        if any(part not in found for part in required):
            continue
        for part, (value, label) in found.items():
            weights[f"{e.name}.{part}"], names[f"{e.name}.{part}"] = value, label
        _check_shapes(e.name, found, shape, quantization, where,
                      block_types.get(f"{e.stored}.weight"))
        if e.weight.finite:
            _check_finite(e.name, found, where, f"{e.stored}.weight" in block_types)
    if missing:
        raise ModelError(f"{where}: missing weight(s) {_some(missing)} that the "
                         f"{config.architecture} config needs")
    absent = {f"{e.stored}." for e in _absent_entries(table, config, source)}
    extra = sorted(n for n in tensors if n not in read
                   and not any(p.search(n) for p in ignored)
                   and not any(n.startswith(stem) for stem in absent))
    if extra:
        raise ModelError(f"{where}: unexpected weight(s) {_some(extra)} (not part of the "
                         f"{config.architecture} model this config describes)")
    return weights, names, quantization


def _stored_parts(e: Entry, parts: Sequence[str], shape: tuple[int, ...],
                  tensors: dict[str, mx.array], read: set[str], where: str,
                  bare: bool = False) -> dict[str, tuple[str, mx.array]]:
    """The stored arrays of entry ``e``'s ``parts`` found in ``tensors``, as
    (stored name, array), each marked ``read``. An expert stack (``shape``
    ``(experts, out, in)``) whose stacked tensors are not there is stacked
    from one tensor per expert where the entry has them
    (``Weight.hf_experts``): computed at once, and the experts' tensors
    (lazy reads of the file) dropped from ``tensors``, so that each expert
    is held once, in its stack. Experts missing or unlike the others are a
    :class:`ModelError`; experts beyond the count are left unread (the
    caller's unexpected weights). ``bare``: a vector stored under the stem
    itself (``Weight.hf_bare``)."""
    if bare:
        if e.stored not in tensors:
            return {}
        read.add(e.stored)
        return {"weight": (e.stored, tensors[e.stored])}
    found = {part: (f"{e.stored}.{part}", tensors[f"{e.stored}.{part}"])
             for part in parts if f"{e.stored}.{part}" in tensors}
    if found or e.stored_experts is None:
        read.update(key for key, _ in found.values())
        return found
    count = shape[0]
    for part in parts:
        keys = [f"{e.stored_experts.format(e=x)}.{part}" for x in range(count)]
        present = [key for key in keys if key in tensors]
        if not present:
            continue
        if len(present) < count:
            raise ModelError(f"{where}: missing weight(s) "
                             f"{_some([k for k in keys if k not in tensors])} of {e.name}'s "
                             f"{count} experts")
        first = tensors[keys[0]]
        for key in keys[1:]:
            other = tensors[key]
            if tuple(other.shape) != tuple(first.shape) or other.dtype != first.dtype:
                raise ModelError(f"{where}: {key} is {tuple(other.shape)} {other.dtype}, "
                                 f"unlike {keys[0]} ({tuple(first.shape)} {first.dtype}): "
                                 f"{e.name}'s experts must be alike")
        read.update(keys)
        stack = mx.stack([tensors.pop(key) for key in keys])
        mx.eval(stack)
        found[part] = (f"{e.stored_experts.format(e='*')}.{part}", stack)
    return found


def _absent_entries(table: Sequence[Weight], config: ModelConfig, source: Source) -> list[Entry]:
    """The entries the config leaves out, with their stored stems."""
    out = []
    for w in table:
        stem = getattr(w, source)
        if w.present(config) or stem is None:
            continue
        out += [Entry(w, w.name.format(i=i), stem.format(i=i)) for i in w.layer_indices(config)]
    return out


def _check_shapes(name: str, found: dict[str, tuple[mx.array, str]], shape: tuple[int, ...],
                  quantization: dict[str, Quantization | GGMLQuantization], where: str,
                  block_type: str | None) -> None:
    """The arrays of one entry fit its logical ``shape`` (a matrix, or an
    expert stack ``(experts, out, in)``); records the quantization of a
    quantized layer (``block_type``: the GGML type of a weight kept in GGUF
    blocks)."""
    weight, label = found["weight"]
    what = (f"{name} ({shape[0]} experts of {shape[1:]})" if len(shape) == 3
            else name)
    if block_type is not None:
        t = ggml_types.BY_NAME[block_type]
        if len(shape) not in (2, 3):
            raise ModelError(f"{where}: {label} is {block_type} blocks, but {name} is not a "
                             "matrix")
        stored = (*shape[:-1], t.row_bytes(shape[-1]))
        if shape[-1] % t.block or tuple(weight.shape) != stored:
            raise ModelError(f"{where}: {label} holds {block_type} rows of "
                             f"{tuple(weight.shape)} bytes, expected {shape} values "
                             f"({stored} bytes) for {what}")
        quantization[name] = GGMLQuantization(block_type)
    elif "scales" in found:
        if len(shape) not in (2, 3):
            raise ModelError(f"{where}: {label} is quantized, but {name} is not a matrix")
        biases = found.get("biases")
        quantization[name] = infer_quantization(
            f"{where}: {what}", weight, found["scales"][0],
            None if biases is None else biases[0], shape)
    elif tuple(weight.shape) != shape:
        raise ModelError(f"{where}: {label} has shape {tuple(weight.shape)}, expected {shape} "
                         f"for {what}")
    if "bias" in found and tuple(found["bias"][0].shape) != shape[:-1]:
        raise ModelError(f"{where}: {found['bias'][1]} has shape "
                         f"{tuple(found['bias'][0].shape)}, expected {shape[:-1]}")


def _check_finite(name: str, found: dict[str, tuple[mx.array, str]], where: str,
                  blocks: bool) -> None:
    """A :class:`ModelError` naming the stored tensor when a float array of
    entry ``name`` (a float weight, or a quantized one's scales and biases;
    GGUF blocks' scales are checked as they are read) holds NaN or
    infinity."""
    for part, (value, label) in found.items():
        if (part == "weight" and (blocks or "scales" in found)) or not mx.issubdtype(
                value.dtype, mx.floating):
            continue
        if not mx.all(mx.isfinite(value)).item():
            raise ModelError(f"{where}: {label} holds NaN or infinite values ({name} would "
                             "route tokens by them)")


def _some(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# -- config sources -----------------------------------------------------------

_REQUIRED = object()


@dataclass
class HFConfig:
    """A parsed ``config.json`` as a family reads it: :meth:`get` names a
    missing field, :meth:`choice` / :meth:`reject` name a value the family
    does not support. ``tokenizer`` supplies BOS/EOS ids the config leaves
    out."""

    raw: Mapping[str, Any]
    tokenizer: Tokenizer | None = None

    @property
    def model_type(self) -> str:
        """The ``model_type`` field."""
        return self.raw.get("model_type")

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """Field ``key`` (a null counts as absent); without ``default`` a
        missing field is a :class:`ModelError`."""
        if self.raw.get(key) is None:
            if default is _REQUIRED:
                raise ModelError(f"config.json lacks {key!r}")
            return default
        return self.raw[key]

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        """Integer field ``key`` (None when absent and ``default`` is None)."""
        value = self.get(key, default)
        if value is None:
            return None
        if not is_int(value):
            raise ModelError(f"config.json: {key} must be an integer, got {value!r}")
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        """Numeric field ``key`` (finite) as a float (None when absent and
        ``default`` is None)."""
        value = self.get(key, default)
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise ModelError(f"config.json: {key} must be a finite number, got {value!r}")
        return float(value)

    def choice(self, key: str, allowed: Sequence[Any], default: Any) -> Any:
        """Field ``key``, which must be one of ``allowed``."""
        value = self.get(key, default)
        if value not in allowed:
            raise ModelError(f"config.json: {key} {value!r} is not supported by the "
                             f"{self.model_type} family (supported: "
                             f"{', '.join(map(repr, allowed))})")
        return value

    def reject(self, key: str, why: str) -> None:
        """A field that must be absent, false or null: its presence changes
        the model in a way the family does not implement (``why``)."""
        if self.raw.get(key):
            raise ModelError(f"config.json: {key} = {self.raw[key]!r} is not supported "
                             f"by the {self.model_type} family ({why})")

    def rope_scaling(self) -> Mapping[str, Any] | None:
        """The RoPE scaling entry: ``rope_scaling``, or transformers 5's
        ``rope_parameters`` (one entry for every layer) when its type is not
        ``default``; None without scaling."""
        parameters = self._rope_parameters()
        if parameters is None:
            scaling = self.get("rope_scaling", None)
            if scaling is not None and not isinstance(scaling, Mapping):
                raise ModelError(f"config.json: rope_scaling must be an object, got "
                                 f"{scaling!r}")
            return scaling
        kind = parameters.get("rope_type", "default")
        return None if kind == "default" else parameters

    def _rope_parameters(self) -> Mapping[str, Any] | None:
        parameters = self.get("rope_parameters", None)
        if parameters is None:
            return None
        if not isinstance(parameters, Mapping) or "rope_theta" not in parameters:
            raise ModelError(f"config.json: rope_parameters {parameters!r} is not supported "
                             f"by the {self.model_type} family (one entry with rope_theta "
                             "for every layer)")
        return parameters

    def experts(self, count_key: str = "num_experts",
                used_key: str = "num_experts_per_tok") -> tuple[int, int]:
        """A mixture of experts' (expert count, experts each token runs)
        from fields ``count_key`` and ``used_key``: at least one expert, and
        1 <= used <= count, else a :class:`ModelError` naming the fields."""
        count, used = self.integer(count_key), self.integer(used_key)
        check_expert_counts(f"config.json: {count_key}", count, f"config.json: {used_key}", used)
        return count, used

    def common(self) -> dict[str, Any]:
        """The :class:`ModelConfig` fields every decoder family reads alike
        from ``config.json`` (the RoPE base from ``rope_theta``, or from
        transformers 5's ``rope_parameters``)."""
        if "quantization_config" in self.raw:
            method = self.raw["quantization_config"].get("quant_method", "?")
            raise ModelError(f"config.json: quantized checkpoints ({method}) are not "
                             "supported; MLX-quantized ones (scales and biases) are")
        hidden, heads = self.integer("hidden_size"), self.integer("num_attention_heads")
        if heads <= 0:
            raise ModelError(f"config.json: num_attention_heads must be positive, got {heads}")
        kv_heads = self.integer("num_key_value_heads", heads)
        if kv_heads <= 0 or heads % kv_heads:
            raise ModelError(f"config.json: num_attention_heads {heads} is not a multiple of "
                             f"num_key_value_heads {kv_heads}")
        eos = self.get("eos_token_id", None)
        if eos is None:
            eos_ids = self.tokenizer.eos_token_ids if self.tokenizer else ()
        else:
            eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
        return dict(
            architecture=self.model_type,
            num_layers=layer_count("config.json: num_hidden_layers",
                                   self.integer("num_hidden_layers"), MAX_LAYERS,
                                   "mlxprog's limit"),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=self.integer("head_dim", hidden // heads),
            intermediate_size=self.integer("intermediate_size"),
            vocab_size=self.integer("vocab_size"),
            norm_eps=self.number("rms_norm_eps"),
            rope_theta=(self.number("rope_theta", 10000.0) if self._rope_parameters() is None
                        else float(self._rope_parameters()["rope_theta"])),
            rope_traditional=False,  # Hugging Face's half-split layout
            tie_embeddings=bool(self.get("tie_word_embeddings", False)),
            context_length=self.integer("max_position_embeddings"),
            bos_token_id=self.get("bos_token_id",
                                  self.tokenizer.bos_token_id if self.tokenizer else None),
            eos_token_ids=eos_ids,
        )


#: The most layers a config.json may give (models have hundreds at most).
MAX_LAYERS = 1 << 16


def layer_count(field: str, count: int, bound: int, why: str) -> int:
    """A model's number of layers (``field`` of its config), checked to be
    positive and at most ``bound`` (``why``: what bounds it) before the
    families build per-layer lists from it: a hostile count would make them
    without end."""
    if not 0 < count <= bound:
        raise ModelError(f"{field} is {count:,}; it must be from 1 to {bound:,} ({why})")
    return count


@dataclass
class GGUFMetadata:
    """A GGUF file's metadata as a family reads it: keys under the
    architecture's prefix (:meth:`get`), the tensor names (to tell tied
    embeddings and biases), tensors that hold settings rather than weights
    (``rope_freqs``, ``rope_factors_long``, ...) and the tokenizer."""

    metadata: Mapping[str, Any]
    tensor_names: set[str]
    tokenizer: Tokenizer
    setting_tensors: dict[str, mx.array] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        """``general.architecture``."""
        return metadata_value(self.metadata.get("general.architecture"))

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        """``<arch>.<key>`` as plain Python; without ``default`` a missing key
        is a :class:`ModelError`."""
        value = metadata_value(self.metadata.get(f"{self.architecture}.{key}"))
        if value is None:
            if default is _REQUIRED:
                raise ModelError(f"GGUF metadata lacks {self.architecture}.{key}")
            return default
        return value

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        """``<arch>.<key>``, an integer (:func:`metadata_field`)."""
        return self._field(key, "integer", default)

    def size(self, key: str, default: Any = _REQUIRED) -> int:
        """``<arch>.<key>``, a positive integer (a width, a count)."""
        value = self.integer(key, default)
        if value <= 0:
            raise ModelError(f"GGUF metadata key {self.architecture}.{key} must be positive, "
                             f"got {value}")
        return value

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        """``<arch>.<key>``, a finite number, as a float (None when absent
        and the default is None)."""
        value = self._field(key, "number", default)
        return None if value is None else float(value)

    def flag(self, key: str, default: bool) -> bool:
        """``<arch>.<key>``, a boolean."""
        return self._field(key, "flag", default)

    def string(self, key: str, default: Any = _REQUIRED) -> str:
        """``<arch>.<key>``, a string."""
        return self._field(key, "string", default)

    def _field(self, key: str, kind: str, default: Any) -> Any:
        return metadata_field(self.metadata, f"{self.architecture}.{key}", kind,
                              *(() if default is _REQUIRED else (default,)))

    def common(self) -> dict[str, Any]:
        """The :class:`ModelConfig` fields every decoder family reads alike
        from GGUF metadata (RoPE layout left to the family)."""
        hidden, heads = self.size("embedding_length"), self.size("attention.head_count")
        if isinstance(self.get("attention.head_count_kv", None), list):
            raise ModelError(f"GGUF metadata: per-layer {self.architecture}.attention."
                             "head_count_kv is not supported")
        kv_heads = self.size("attention.head_count_kv", heads)
        head_dim = self.size("attention.key_length", hidden // heads)
        if self.integer("attention.value_length", head_dim) != head_dim:
            raise ModelError(f"GGUF metadata: {self.architecture}.attention.value_length "
                             "differs from key_length: not supported")
        return dict(
            architecture=self.architecture,
            # Each layer has tensors of its own: a count above the file's
            # tensors is a hostile file's.
            num_layers=layer_count(f"GGUF metadata key {self.architecture}.block_count",
                                   self.integer("block_count"), len(self.tensor_names),
                                   "the file's tensors"),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=self.size("feed_forward_length"),
            vocab_size=self.integer("vocab_size", self.tokenizer.vocab_size),
            norm_eps=self.number("attention.layer_norm_rms_epsilon"),
            rope_theta=self.number("rope.freq_base", 10000.0),
            tie_embeddings="output.weight" not in self.tensor_names,
            context_length=self.size("context_length"),
            bos_token_id=self.tokenizer.bos_token_id,
            eos_token_ids=self.tokenizer.eos_token_ids,
        )

    def experts(self) -> tuple[int, int]:
        """A mixture of experts' (``expert_count``, ``expert_used_count``),
        checked as :meth:`HFConfig.experts` checks them."""
        count, used = self.get("expert_count"), self.get("expert_used_count")
        prefix = f"GGUF metadata: {self.architecture}"
        check_expert_counts(f"{prefix}.expert_count", count, f"{prefix}.expert_used_count", used)
        return int(count), int(used)

    def require_full_rope(self, head_dim: int, family: str) -> None:
        """A :class:`ModelError` unless RoPE turns all ``head_dim`` features
        of a head (``rope.dimension_count`` absent or equal): ``family`` has
        no partial RoPE."""
        dims = self.integer("rope.dimension_count", head_dim)
        if dims != head_dim:
            raise ModelError(f"GGUF metadata: partial RoPE ({self.architecture}.rope."
                             f"dimension_count {dims} of head_dim {head_dim}) is not supported "
                             f"by the {family} family")

    def expert_fields(self) -> dict[str, int]:
        """A mixture of experts' :class:`~mlxprog.llm.config.MoEConfig`
        counts: ``num_experts`` and ``experts_per_token`` (checked, see
        :meth:`experts`) and ``expert_intermediate_size``
        (``expert_feed_forward_length``, else ``feed_forward_length``)."""
        count, used = self.experts()
        width = self.integer("expert_feed_forward_length", None)
        return dict(num_experts=count, experts_per_token=used,
                    expert_intermediate_size=(self.size("feed_forward_length")
                                              if width is None else width))

    def linear_rope_scale(self) -> float:
        """The position scale of GGUF's linear RoPE scaling (1 without it);
        other scaling types are a :class:`ModelError`."""
        linear_factor = self.number("rope.scale_linear", None)  # older key for linear scaling
        scaling = self.string("rope.scaling.type", "none" if linear_factor is None else "linear")
        factor = self.number("rope.scaling.factor", linear_factor or 1.0)
        if scaling not in ("none", "linear"):
            raise ModelError(f"GGUF metadata: {self.architecture}.rope.scaling.type "
                             f"{scaling!r} is not supported (none, linear)")
        if scaling == "linear" and not factor > 0:
            raise ModelError(f"GGUF metadata key {self.architecture}.rope.scaling.factor must "
                             f"be positive, got {factor}")
        return 1.0 / factor if scaling == "linear" else 1.0


# -- mixtures of experts ---------------------------------------------------------

def gguf_expert_count(architecture: str, metadata: Mapping[str, Any]) -> int:
    """``<architecture>.expert_count`` of a GGUF file's metadata (0 without
    the key: a dense model)."""
    return metadata_field(metadata, f"{architecture}.expert_count", "integer", 0)


def moe_weights(hf_block: str = "mlp", hf_experts: Sequence[str] = ("gate_proj", "up_proj",
                                                                    "down_proj")
                ) -> tuple[Weight, ...]:
    """The weight table entries of a mixture of experts in the layers that
    have one (:meth:`~mlxprog.llm.config.MoEConfig.expert_layers`): the
    router ``layers.{i}.<hf_block>.gate`` (``[experts, hidden]``) and the
    experts' stacked gate, up and down projections
    ``layers.{i}.<hf_block>.switch_mlp.{gate,up,down}_proj`` (``[experts,
    out, in]``), read from mlx-lm's
    stacked tensors (``switch_mlp``), llama.cpp's ``ffn_gate_inp`` and
    ``ffn_{gate,up,down}_exps``, or an original Hugging Face checkpoint's
    ``<hf_block>.experts.{e}.<name>`` (``hf_experts``: the three
    projections' names there, Mixtral's ``w1``, ``w3``, ``w2``). Tensor
    parallelism splits every expert's intermediate features as a dense
    MLP's; the router is replicated."""
    layer = f"layers.{{i}}.{hf_block}"
    shapes = {"gate_proj": lambda c: (c.num_experts, c.expert_intermediate_size, c.hidden_size),
              "up_proj": lambda c: (c.num_experts, c.expert_intermediate_size, c.hidden_size),
              "down_proj": lambda c: (c.num_experts, c.hidden_size, c.expert_intermediate_size)}
    router = Weight(f"{layer}.gate", lambda c: (c.num_experts, c.hidden_size),
                    hf=f"model.{layer}.gate", gguf="blk.{i}.ffn_gate_inp", layers=MoEConfig.expert_layers,
                    finite=True)
    splits = {"gate_proj": ROWS_BY_EXPERT_INTERMEDIATE, "up_proj": ROWS_BY_EXPERT_INTERMEDIATE,
              "down_proj": COLUMNS_BY_EXPERT_INTERMEDIATE}
    return (router,) + tuple(
        Weight(f"{layer}.switch_mlp.{name}", shapes[name], hf=f"model.{layer}.switch_mlp.{name}",
               gguf=f"blk.{{i}}.ffn_{name[:-len('_proj')]}_exps",
               hf_experts=f"model.{layer}.experts.{{e}}.{stored}", layers=MoEConfig.expert_layers,
               split=splits[name])
        for name, stored in zip(("gate_proj", "up_proj", "down_proj"), hf_experts))


# -- the family -----------------------------------------------------------------

class Family:
    """A model family: the config sources it reads, its weight table and its
    decoder. Subclasses set the class attributes and implement the config
    parsers; one instance is registered in :mod:`mlxprog.llm.models`."""

    #: The family's name (docs, errors).
    name: ClassVar[str]
    #: The ``model_type`` values of ``config.json`` it reads.
    hf_model_types: ClassVar[tuple[str, ...]]
    #: The ``general.architecture`` values of GGUF files it reads.
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    #: Stored Hugging Face tensors that are not weights (buffers some
    #: checkpoints save).
    hf_ignored: ClassVar[tuple[re.Pattern, ...]] = (re.compile(r"rotary_emb\.inv_freq$"),)
    #: GGUF tensors that hold settings, popped before the weights are read.
    gguf_setting_tensors: ClassVar[tuple[str, ...]] = ()
    #: Its decoder: emits the forward pass.
    decoder: ClassVar[type[Decoder]]

    def config_from_hf(self, hf: HFConfig) -> ModelConfig:
        """The config of a ``config.json`` of this family."""
        raise NotImplementedError

    def reads_gguf(self, architecture: str, metadata: Mapping[str, Any]) -> bool:
        """Whether this family reads a GGUF file of ``general.architecture``
        ``architecture`` with ``metadata`` (llama.cpp writes Mixtral as
        ``llama`` with experts: two families share that architecture)."""
        return architecture in self.gguf_architectures

    def config_from_gguf(self, gguf: GGUFMetadata) -> ModelConfig:
        """The config of a GGUF file of this family."""
        raise ModelError(f"the {self.name} family does not read GGUF files")

    def weights(self, config: ModelConfig) -> tuple[Weight, ...]:
        """The family's weight table for ``config``."""
        raise NotImplementedError

    def hf_tensors(self, tensors: dict[str, mx.array], config: ModelConfig
                   ) -> tuple[dict[str, mx.array], Mapping[str, str]]:
        """A Hugging Face file's tensors as the weight table names them, and
        for each tensor re-laid what in the file it came from: as stored
        (no labels), unless the family's checkpoints come in a layout of
        their own to be re-laid first (gpt-oss's fused, interleaved
        experts)."""
        return tensors, {}


# -- the decoder ------------------------------------------------------------------

@dataclass(frozen=True)
class ProgramNumerics:
    """The numerics (``"exact"`` or ``"int8"``, see the ``quantized_matmul``
    op) of one program's quantized matmuls: ``dense``, the projections every
    token runs; ``superblocks``, those in layers stored wholly in GGML's
    super-block types (the K-quants, the IQ and the TQ types, whose int8
    dot products take Q8_K activation blocks of 256; see
    :meth:`Decoder.ggml_numerics`); and ``experts``, the gathered expert
    stacks of a mixture of experts.
    :func:`~mlxprog.llm.compiled.program_numerics` says which a model's
    programs take."""

    dense: str = "exact"
    experts: str = "exact"
    superblocks: str = "exact"

    @classmethod
    def of(cls, numerics: str | ProgramNumerics) -> ProgramNumerics:
        """``numerics`` as a :class:`ProgramNumerics`: a string is every
        quantized matmul's."""
        if isinstance(numerics, ProgramNumerics):
            return numerics
        return cls(dense=numerics, experts=numerics, superblocks=numerics)


class Decoder:
    """Emits a family's forward pass into a builder: the pieces every family
    shares (captures, projections with their quantization and
    tensor-parallel sums, embeddings, norms, RoPE, attention over the cache)
    and :meth:`forward`. A family's subclass writes :meth:`trunk` (its
    layers, ending with the final norm) and may change :meth:`embed` and
    :meth:`logits`."""

    def __init__(self, root: ProgramBuilder, spec: ModelSpec, shard: Shard,
                 numerics: str | ProgramNumerics = "exact", kv: CacheLayout | None = None):
        self.root = root
        self.spec = spec
        self.shard = shard
        numerics = ProgramNumerics.of(numerics)
        #: The dense projections' numerics and the expert stacks'.
        self.numerics, self.expert_numerics = numerics.dense, numerics.experts
        #: The numerics of dense projections wholly in GGML super-block types.
        self.superblock_numerics = numerics.superblocks
        self.c = spec.config
        #: The KV cache's layout (given None: float32, unbounded), with the
        #: rank's KV heads.
        self.kv = dataclasses.replace(kv or CacheLayout.of(self.c),
                                      num_kv_heads=shard.num_kv_heads)
        self._captures: dict[str, Value] = {}

    def weight(self, name: str) -> Value:
        """The capture of logical weight ``name`` (declared on first use)."""
        if name not in self._captures:
            dtype = self.spec.weights[name][1]
            self._captures[name] = self.root.capture(
                self.spec.source_names[name], self.spec.local_shape(name, self.shard), dtype)
        return self._captures[name]

    def has(self, name: str) -> bool:
        """Whether the model has logical weight ``name``."""
        return name in self.spec.weights

    def linear(self, sb, name: str, x: Value, reduce: bool = False) -> Value:
        """``x`` through projection ``name``. With ``reduce`` (projections
        split by input columns), the ranks' partial products are summed
        before the bias is added, so the bias counts once."""
        quant = self.spec.quantization.get(name)
        if isinstance(quant, GGMLQuantization):
            y = sb.ggml_matmul(x, self.weight(f"{name}.weight"), type=quant.type,
                               numerics=self.ggml_numerics(name))
        elif quant is not None:
            y = sb.quantized_matmul(x, *self._quantized_parts(name, quant), transpose=True,
                                    **self._packing(quant), **self._numerics(self.numerics))
        else:
            w = self.weight(f"{name}.weight")
            y = sb.matmul(x, sb.transpose(sb.astype(w, dtype="float32")))
        if reduce and self.shard.world_size > 1:
            y = sb.all_sum(y)
        if self.has(f"{name}.bias"):
            y = y + sb.astype(self.weight(f"{name}.bias"), dtype="float32")
        return y

    def ggml_numerics(self, name: str) -> str:
        """The numerics of dense projection ``name``, stored in GGML blocks:
        :attr:`superblock_numerics` where every dense projection of its
        layer (those under the same ``layers.<i>.``; the output head alone)
        is in a super-block type (the K-quants, the IQ and the TQ types:
        int8 dot products with Q8_K activation blocks of 256), else
        :attr:`numerics`. A layer's projections share numerics, so a layer
        computes alike as one ``transformer_layer`` op or op by op."""
        match = re.match(r"layers\.\d+\.", name)
        prefix = match.group(0) if match else name
        superblocks = all(
            isinstance(quant, GGMLQuantization)
            and ggml_types.BY_NAME[quant.type].activation == "q8_K"
            for layer, quant in self.spec.quantization.items()
            if (layer == name or (match and layer.startswith(prefix)))
            and len(self.spec.weights[f"{layer}.weight"][0]) == 2)
        return self.superblock_numerics if superblocks else self.numerics

    def _quantized_parts(self, name: str, quant: Quantization) -> list[Value]:
        """The captures of MLX-quantized layer ``name``: weight, scales and
        (affine) biases."""
        return [self.weight(f"{name}.{part}") for part in quant.parts]

    @staticmethod
    def _packing(quant: Quantization) -> dict[str, Any]:
        """The quantized ops' attributes of ``quant`` (``mode`` only where it
        is not affine, the ops' default, so such programs stay as they were)."""
        mode = {} if quant.mode == "affine" else {"mode": quant.mode}
        return dict(group_size=quant.group_size, bits=quant.bits, **mode)

    @staticmethod
    def _numerics(numerics: str) -> dict[str, Any]:
        """The quantized ops' ``numerics`` attribute for ``numerics``
        ("exact" is their default: such programs stay as they were)."""
        return {} if numerics == "exact" else {"numerics": numerics}

    def expert_linear(self, sb, name: str, x: Value, indices: Value,
                      per_slot: bool = False, bias: bool = True) -> Value:
        """``x`` through the experts ``indices`` ([..., k], from
        :meth:`route`) of expert stack ``name`` (``[experts, N, K]``, its
        quantization as :meth:`linear`'s, numerics
        :attr:`expert_numerics`): float32 [..., k, N]. ``x`` is [..., K], the same input for every slot, or
        with ``per_slot`` [..., k, K], one row per slot (a down projection).
        A stack with a ``.bias`` (``[experts, N]``) adds each slot's
        expert's row (unless ``bias`` is false: a stack split by columns
        across ranks adds it once, after the ranks' sum)."""
        quant = self.spec.quantization.get(name)
        weight = self.weight(f"{name}.weight")
        if isinstance(quant, GGMLQuantization):
            y = sb.ggml_gather_matmul(x, weight, indices, type=quant.type,
                                      numerics=self.expert_numerics, per_slot=per_slot)
        elif quant is not None:
            y = sb.gather_quantized_matmul(x, *self._quantized_parts(name, quant), indices,
                                           per_slot=per_slot, **self._packing(quant),
                                           **self._numerics(self.expert_numerics))
        else:
            y = sb.gather_matmul(x, weight, indices, per_slot=per_slot)
        if bias and self.has(f"{name}.bias"):
            y = y + sb.take(sb.astype(self.weight(f"{name}.bias"), dtype="float32"), indices,
                            axis=0)
        return y

    def route(self, sb, name: str, x: Value) -> tuple[Value, Value]:
        """The experts each row of ``x`` [..., hidden] runs, by router
        ``name`` (a projection to one logit per expert) and the config's
        routing (:class:`~mlxprog.llm.config.MoEConfig`): their indices
        (uint32 [..., k], best first) and weights (float32 [..., k])."""
        c = self.c
        renormalize = {"renormalize": True} if c.renormalize else {}
        return sb.moe_route(self.linear(sb, name, x), top_k=c.experts_per_token,
                            scoring=c.router, **renormalize)

    def moe(self, sb, prefix: str, x: Value) -> Value:
        """The mixture of experts ``prefix`` (``layers.3.mlp``, see
        :func:`moe_weights`) of the normed ``x`` [B, T, hidden]: each row's
        experts chosen by the router ``<prefix>.gate`` (:meth:`route`), each
        a SwiGLU of the stacks ``<prefix>.switch_mlp.{gate,up,down}_proj``
        (:meth:`expert_linear`: one gathered matmul per projection, whatever
        the number of experts), their outputs summed by the router's
        weights: [B, T, hidden] float32. Split across ranks (each holding
        a block of every expert's intermediate features, the router whole),
        the ranks' partial sums are added."""
        indices, weights = self.route(sb, f"{prefix}.gate", x)
        stack = f"{prefix}.switch_mlp"
        gate = self.expert_linear(sb, f"{stack}.gate_proj", x, indices)
        up = self.expert_linear(sb, f"{stack}.up_proj", x, indices)
        down = self.expert_linear(sb, f"{stack}.down_proj", sb.fast_swiglu(gate, up), indices,
                                  per_slot=True)
        y = sb.sum(down * sb.expand_dims(weights, axes=[-1]), axes=[-2])
        if self.shard.world_size > 1:
            y = sb.all_sum(y)
        return y

    def embed(self, sb, tokens: Value) -> Value:
        """The float32 embeddings of ``tokens``."""
        quant = self.spec.quantization.get("embed_tokens")
        if isinstance(quant, GGMLQuantization):
            rows = sb.ggml_dequantize(sb.take(self.weight("embed_tokens.weight"), tokens, axis=0),
                                      type=quant.type)
        elif quant is None:
            rows = sb.take(self.weight("embed_tokens.weight"), tokens, axis=0)
        else:
            codes, *scaling = [sb.take(self.weight(f"embed_tokens.{p}"), tokens, axis=0)
                               for p in quant.parts]
            if quant.mode == "affine":
                # MLX dequantizes in the scales' dtype: float16 scales would
                # round each value to 11 bits (GGUF's Q8_0 rows re-laid as
                # affine ones are exact only in float32), so the gathered
                # rows' scales and biases are widened first.
                scaling = [sb.astype(s, dtype="float32") for s in scaling]
            rows = sb.dequantize(codes, *scaling, **self._packing(quant))
        return sb.astype(rows, dtype="float32")

    def norm(self, sb, name: str, x: Value) -> Value:
        """RMS norm of ``x`` over its last axis by weight ``name``."""
        weight = sb.astype(self.weight(name), dtype="float32")
        return sb.fast_rms_norm(x, weight, eps=self.c.norm_eps)

    def heads(self, sb, x: Value, n: int, T: int | str) -> Value:
        """[B, T, n*D] -> [B, n, T, D]; one token needs no transpose (the
        layouts hold the same order), which saves a graph node."""
        if T == 1:
            return sb.reshape(x, shape=["B", n, 1, self.c.head_dim])
        x = sb.reshape(x, shape=["B", T, n, self.c.head_dim])
        return sb.transpose(x, axes=[0, 2, 1, 3])

    def merge_heads(self, sb, x: Value, n: int, T: int | str) -> Value:
        """[B, n, T, D] -> [B, T, n*D], the inverse of :meth:`heads`."""
        if T == 1:
            return sb.reshape(x, shape=["B", 1, n * self.c.head_dim])
        return sb.reshape(sb.transpose(x, axes=[0, 2, 1, 3]), shape=["B", T, n * self.c.head_dim])

    def rope(self, sb, x: Value, rope_offset: Value, *, base: float | None = None,
             dims: int | None = None, freqs: Sequence[float] | None = None,
             rotated_scale: float = 1.0, scale: float | None = None) -> Value:
        """``x`` [B, heads, T, D] rotated from each row's ``rope_offset``:
        the first ``dims`` features (default the head dim), by ``base``
        (default the config's theta) or the per-pair periods ``freqs``
        (default the config's), the rotated features scaled by
        ``rotated_scale`` first; positions times ``scale`` (default the
        config's position scale); the config's layout."""
        c = self.c
        dims = dims or c.head_dim
        freqs = c.rope_freqs if freqs is None and base is None else freqs
        scale = c.rope_scale if scale is None else scale
        extra = {} if rotated_scale == 1.0 else {"rotated_scale": rotated_scale}
        if freqs is not None:
            return sb.fast_rope_with_freqs(x, sb.constant(list(freqs), "float32"), rope_offset,
                                           dims=dims, traditional=c.rope_traditional,
                                           scale=scale, **extra)
        return sb.fast_rope(x, rope_offset, dims=dims, traditional=c.rope_traditional,
                            base=c.rope_theta if base is None else base, scale=scale, **extra)

    def attend(self, sb, q: Value, k: Value, v: Value, T, cache_offset, key_mask,
               cache: LayerCache, sinks: Value | None = None,
               **settings: Any) -> tuple[Value, LayerCache]:
        """q, k, v [B, heads, T, D] (q and k rotated) written into the
        layer's ``cache`` (its arrays as the cache ops take them,
        :meth:`CacheLayout.layers <mlxprog.llm.cache.CacheLayout.layers>`) at
        ``cache_offset`` and attended by the layout's op
        (``kv_cache_sdpa_update``, or ``quantized_kv_cache_sdpa_update``
        where the cache is quantized; settings: the op's ``scale``,
        ``softcap``, ``window``; ``sinks``: the rank's heads' attention-sink
        logits [heads]): [B, T, heads * D] and the layer's new cache."""
        settings = {k: v for k, v in settings.items() if v is not None}
        op, attributes = self.kv.sdpa_op()
        extra = []
        if sinks is not None:
            extra, settings["sinks"] = [sinks], True
        attn, *new = sb.op(op, q, k, v, *cache, cache_offset, key_mask, *extra, **attributes,
                           **settings)
        return self.merge_heads(sb, attn, self.shard.num_heads, T), tuple(new)

    def trunk(self, sb, h: Value, T, rope_offset, cache_offset, key_mask,
              caches: Sequence[LayerCache]) -> tuple[Value, tuple[LayerCache, ...]]:
        """Every layer on the embedded tokens ``h`` [B, T, hidden], then the
        final norm: the normed hidden states and each layer's new cache
        (``caches``: each layer's, :meth:`CacheLayout.layers
        <mlxprog.llm.cache.CacheLayout.layers>`)."""
        raise NotImplementedError

    def logits(self, sb, h: Value) -> Value:
        """The logits of the final hidden states ``h`` [B, hidden] (or [B, T, hidden])."""
        head = "embed_tokens" if self.c.tie_embeddings else "lm_head"
        return self.linear(sb, head, h)

    def forward(self, sb, tokens: Value, T, rope_offset, cache_offset, key_mask,
                caches: Sequence[Value], last_index: Value | None = None,
                every_position: bool = False) -> tuple[Value, tuple[Value, ...]]:
        """Logits [B, V] after token ``last_index`` (per row) of the T tokens
        (None: the one token), or with ``every_position`` [B, T, V] after
        each of them (a speculative verify step), and the new caches
        (program order, as ``caches``).

        :meth:`trunk` takes the caches by layer (:meth:`CacheLayout.layers
        <mlxprog.llm.cache.CacheLayout.layers>`). With a rotating cache (capacity
        ``max_kv_size`` W, ``keep``), ``cache_offset`` counts every slot
        written so far, and the caches have W + 1 slots once it reaches W:
        from then on a decode step writes its token into the spare slot W
        (the attention ops write at the offset clamped to it) and then over
        the oldest of the rotating slots (those past the kept ones), slot
        ``keep + (cache_offset - W) % (W - keep)``, which the step's
        attention no longer sees; slots rewritten so far are seen whatever
        ``key_mask`` says of them (it marks the batch's left padding, which
        the rotation overwrites). Keys are stored rotated, so the slots'
        order does not matter to attention. A prefill never wraps: it writes
        below W (a prompt fits the rotating cache)."""
        rotates = self.kv.rotating and T == 1
        if rotates:
            cache_offset, key_mask, slot, wrapped = self._rotation(sb, cache_offset, key_mask)
        h, new_caches = self.trunk(sb, self.embed(sb, tokens), T, rope_offset, cache_offset,
                                   key_mask, self.kv.layers(caches))
        new_caches = self.kv.flatten(new_caches)
        if rotates:
            # Copied from where the ops wrote it: the spare slot once wrapped,
            # else the slot itself (then the copy changes nothing); a recent
            # ring's entry for the slot the copy overwrites is then stale.
            written = sb.reshape(cache_offset, shape=[1])

            def copied(c: Value) -> Value:
                return sb.put_slice(c, sb.take(c, written, axis=2), slot, dynamic_axes=[2])

            def fresh(tags: Value) -> Value:
                stale = sb.logical_and(wrapped, sb.equal(tags, slot))
                return sb.select(stale, sb.constant(-1, "int32"), tags)

            new_caches = self.kv.map_slots(new_caches, copied, tags=fresh)
        if every_position:
            return self.logits(sb, h), new_caches
        if last_index is not None:
            h = sb.take_along_axis(h, sb.reshape(last_index, shape=["B", 1, 1]), axis=1)
        h = sb.reshape(h, shape=["B", self.c.hidden_size])
        return self.logits(sb, h), new_caches

    def _rotation(self, sb, cache_offset: Value, key_mask: Value
                  ) -> tuple[Value, Value, Value, Value]:
        """A rotating cache's decode step at ``cache_offset`` (the slots
        written so far; see :meth:`forward`): the offset the attention ops
        write at, the key mask they use, the slot the token lands in, and
        whether the cache has wrapped."""
        capacity, keep = self.kv.max_kv_size, self.kv.keep
        past = cache_offset - capacity  # rotations done before this step (once wrapped)
        wrapped = sb.greater_equal(cache_offset, capacity)
        slot = sb.select(wrapped, sb.remainder(sb.max(past, 0), capacity - keep) + keep,
                        cache_offset)
        slots = sb.iota(shape=["B", "S"], dtype="int32", axis=1)
        rewritten = sb.logical_and(
            sb.logical_and(sb.greater_equal(slots, keep), sb.less(slots, capacity)),
            sb.less(slots - keep, past))
        evicted = sb.logical_and(wrapped, sb.equal(slots, slot))
        mask = sb.logical_and(sb.logical_or(key_mask, rewritten), sb.logical_not(evicted))
        return sb.min(cache_offset, capacity), mask, slot, wrapped

    def pick(self, sb, logits: Value, key: Value, sampling) -> tuple[Value, Value]:
        """The next tokens from ``logits`` by ``sampling``, and the next key."""
        if sampling.temperature == 0:
            return sb.sample_greedy(logits), key
        return sb.sample(logits, key, temperature=sampling.temperature, top_k=sampling.top_k,
                         top_p=sampling.top_p, min_p=sampling.min_p)


def load_checkpoint_tensors(family: Family, config: ModelConfig, tensors: dict[str, mx.array],
                            source: Source, where: str, path, tokenizer: Tokenizer,
                            block_types: Mapping[str, str] | None = None) -> Checkpoint:
    """A :class:`Checkpoint` of ``family`` from a file's ``tensors``
    (``block_types``: see :func:`read_weights`)."""
    ignored = family.hf_ignored if source == "hf" else ()
    labels: Mapping[str, str] = {}
    if source == "hf":
        try:
            tensors, labels = family.hf_tensors(tensors, config)
        except ModelError as e:
            raise ModelError(f"{where}: {e}") from None
    weights, names, quantization = read_weights(family.weights(config), config, tensors,
                                                source, where, ignored, block_types, labels)
    return Checkpoint(path=path, config=config, weights=weights, quantization=quantization,
                      tokenizer=tokenizer, source_names=names)
