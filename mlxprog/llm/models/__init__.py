"""Model families, one module each: :mod:`.llama` (Llama, Mistral, Qwen2),
:mod:`.qwen3`, :mod:`.gemma2`, :mod:`.gemma3_text`, :mod:`.phi3`, and the
mixtures of experts :mod:`.qwen3_moe`, :mod:`.qwen2_moe`, :mod:`.mixtral`,
:mod:`.olmoe`, :mod:`.gpt_oss`. Each
defines a :class:`~.base.Family`; this package finds the family of a
``config.json`` ``model_type``, a GGUF architecture or a loaded config.
Every module here but :mod:`.base` is a family (it defines ``FAMILY``),
found when the package is imported: adding a family is one new module (see
docs/contributing.md)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from ...errors import ModelError
from ..checkpoint import Checkpoint
from ..config import ModelConfig
from ..spec import ModelSpec
from .base import Family, splits


def _family_modules() -> list[str]:
    """Every module of this package but :mod:`.base`: each defines a family."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")


FAMILIES: dict[str, Family] = {}
for _module in _family_modules():
    _family = importlib.import_module(f"{__name__}.{_module}").FAMILY
    FAMILIES[_family.name] = _family


def _supported(attribute: str) -> list[str]:
    return sorted(t for f in FAMILIES.values() for t in getattr(f, attribute))


def supported_model_types() -> list[str]:
    """Every ``model_type`` some family reads."""
    return _supported("hf_model_types")


def supported_gguf_architectures() -> list[str]:
    """Every GGUF architecture some family reads."""
    return sorted(set(_supported("gguf_architectures")))


def _family_reading(attribute: str, value: object, what: str) -> Family:
    """The family whose ``attribute`` (a collection of names) holds
    ``value``; none is a :class:`ModelError` saying ``what`` was not
    supported, listing the supported names."""
    for family in FAMILIES.values():
        if value in getattr(family, attribute):
            return family
    raise ModelError(f"{what} {value!r} is not supported (supported: "
                     f"{', '.join(_supported(attribute))})")


def family_for_model_type(model_type: object) -> Family:
    """The family of a ``config.json`` ``model_type``; an unknown one is a
    :class:`ModelError` listing the supported ones."""
    return _family_reading("hf_model_types", model_type, "config.json: model_type")


def family_for_gguf(architecture: object, metadata: Mapping[str, Any] | None = None) -> Family:
    """The family of a GGUF file of ``general.architecture`` ``architecture``
    and ``metadata`` (None: none; see :meth:`Family.reads_gguf
    <mlxprog.llm.models.base.Family.reads_gguf>`); an unknown architecture
    is a :class:`ModelError` listing the supported ones."""
    for family in FAMILIES.values():
        if family.reads_gguf(architecture, metadata or {}):
            return family
    raise ModelError(f"GGUF architecture {architecture!r} is not supported (supported: "
                     f"{', '.join(supported_gguf_architectures())})")


def family_of(config: ModelConfig) -> Family:
    """The family a loaded config belongs to."""
    try:
        return FAMILIES[config.family]
    except KeyError:
        raise ModelError(f"model config: family {config.family!r} is not one of "
                         f"{', '.join(sorted(FAMILIES))}") from None


def model_spec(checkpoint: Checkpoint) -> ModelSpec:
    """The :class:`~mlxprog.llm.ModelSpec` of a loaded checkpoint, its
    layers split as its family's weight table says."""
    config = checkpoint.config
    return ModelSpec.of(checkpoint, splits(family_of(config).weights(config), config))
