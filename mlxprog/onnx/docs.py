"""The per-op table of ``docs/onnx.md``, generated: each ONNX op ONNX's
backend test suite has cases of, its schema versions, whether the importer
converts it (the converter registry, :mod:`.registry`) and how its cases
fare (given: the tests classify them).

``python tests/onnx/exclusions.py --docs`` rewrites the table between its
markers (``--refresh`` too, after classifying the cases), and
``tests/onnx/test_backend_nodes.py`` fails while the committed table is not
what these functions write.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from . import registry
from .importer import MIN_OPSET

BEGIN = ("<!-- The op table: generated from the converter registry and the test cases by "
         "`python tests/onnx/exclusions.py --docs`; do not edit. -->")
END = "<!-- End of the op table. -->"

DEFAULT_DOMAIN = "ai.onnx"


def opset_versions(op_type: str, domain: str) -> list[int]:
    """The versions of ``op_type``'s ONNX schema: for the default domain
    those from :data:`~.importer.MIN_OPSET` on (older models are converted
    first), or the newest where none is that new; for the other domains all
    of them."""
    versions = sorted({schema.since_version for schema in onnx.defs.get_all_schemas_with_history()
                       if schema.name == op_type
                       and (schema.domain or DEFAULT_DOMAIN) == domain})
    if domain != DEFAULT_DOMAIN:
        return versions
    return [v for v in versions if v >= MIN_OPSET] or versions[-1:]


def converter_column(op_type: str, domain: str) -> str:
    """``yes`` (a converter converts the op), ``import`` (the importer
    computes it at import without one) or ``no``."""
    if registry.find(op_type, domain) is not None:
        return "yes"
    return "import" if registry.supported(op_type, domain) else "no"


def op_table(cases: Mapping[tuple[str, str], Mapping[str, int]]) -> str:
    """The table in Markdown: one row per (op type, domain) of ``cases``
    (the op's backend node cases: how many pass, under ``"pass"``, and how
    many are excluded or expected to fail, by category in the order given),
    the default domain's ops first, each group by op type."""
    lines = ["| op | domain | opset versions (from 13) | converter | node cases passing "
             "| other cases |",
             "| --- | --- | --- | --- | --- | --- |"]
    for (op_type, domain), outcomes in sorted(cases.items(),
                                              key=lambda kv: (kv[0][1] != DEFAULT_DOMAIN,
                                                              kv[0][0])):
        versions = ", ".join(map(str, opset_versions(op_type, domain)))
        total = sum(outcomes.values())
        other = ", ".join(f"{what} {n}" for what, n in outcomes.items() if what != "pass" and n)
        lines.append(f"| {op_type} | {domain} | {versions} | "
                     f"{converter_column(op_type, domain)} | {outcomes.get('pass', 0)}/{total} "
                     f"| {other} |")
    return "\n".join(lines)


def with_table(text: str, table: str) -> str:
    """``text`` (``docs/onnx.md``) with ``table`` between its markers."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return f"{text[:start]}\n{table}\n{text[end:]}"
