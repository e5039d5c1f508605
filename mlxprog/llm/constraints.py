"""Constrained decoding: the output follows a JSON schema, a regex, a choice
of strings or a grammar, token by token.

A :class:`Constraint` is an option of a generation request, like its
temperature: what the output must match, checked and compiled when it is
made (a schema, regex or grammar that cannot be used is a
:class:`ConstraintError` naming the request field). The grammar engine is
`llguidance <https://github.com/guidance-ai/llguidance>`_: it compiles the
constraint into a grammar over bytes and, for each step, computes which
tokens of the vocabulary keep the output a prefix of some match.

- :class:`ConstraintVocabulary` is a tokenizer's vocabulary as llguidance
  sees it (the bytes of every token), built once per
  :class:`~mlxprog.llm.Tokenizer` from the ``tokenizers`` JSON it already
  holds (GGUF vocabularies included, which :mod:`~mlxprog.llm.tokenizer`
  rebuilds as ``tokenizers`` objects).
- :class:`ConstraintState` follows one request: the next token's mask
  (:meth:`~ConstraintState.bitmask`, :meth:`~ConstraintState.allowed`),
  applied to a logits row (:meth:`~ConstraintState.apply`: disallowed
  tokens get ``-inf``, so sampling and log-probabilities both see the
  constrained distribution), then :meth:`~ConstraintState.advance` with the
  sampled token; :meth:`~ConstraintState.rollback` and
  :meth:`~ConstraintState.draft_bitmasks` serve speculative decoding.
- :class:`MaskBatch` computes the masks of a batch's constrained rows in
  parallel (one row per request; unconstrained rows cost nothing, and a
  batch without constrained rows gets no mask at all).
- :class:`LogitBias` is OpenAI's ``logit_bias``: validated against the
  vocabulary and added to a logits row.

A step's mask depends on the token sampled at the step before, not on the
forward pass: compute it (llguidance releases the GIL) while MLX evaluates
the next logits, then apply it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import llguidance
import llguidance.numpy as llguidance_numpy
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer as Backend

from ..errors import ModelError

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

#: The kinds of constraint.
KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")

#: JSON whitespace a constrained output may have at each place JSON allows
#: it: a few spaces or tabs, or one line break and an indent of at most 20
#: spaces or 10 tabs (a tab is a level, as pretty printers write it;
#: JavaScript's ``JSON.stringify`` caps its indent at 10). llguidance's own
#: default (any run of whitespace) lets a model that is unsure what comes
#: next write blank lines until ``max_tokens``; llama.cpp bounds it in its
#: JSON grammars for the same reason (a 135M model indented every line of
#: an array with 20 tabs, one token each). A schema's own ``x-guidance``
#: options take precedence.
JSON_WHITESPACE = r"[ \t]{1,4}|\r?\n(?: {0,20}|\t{0,10})"
_JSON_DEFAULTS = {"whitespace_pattern": JSON_WHITESPACE}

#: The most digits a constrained ``time`` or ``date-time`` string gives
#: its fraction of a second (nanoseconds). RFC 3339 allows any number, and
#: a model that is unsure how to end one writes zeros until ``max_tokens``;
#: 9 is what Go's ``RFC3339Nano`` and Java's ``Instant`` write.
FRACTION_DIGITS = 9
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:(?:[0-5][0-9]|60)"
         rf"(?:\.[0-9]{{1,{FRACTION_DIGITS}}})?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_DATE = (r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
         r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-9]))")
#: The string formats whose free-running parts a constraint bounds: the
#: pattern that replaces each (RFC 3339's, the fraction bounded).
_BOUNDED_FORMATS = {"time": f"^{_TIME}$", "date-time": f"^{_DATE}[tT]{_TIME}$"}
#: Schema keywords whose values are data, not schemas.
SCHEMA_DATA = frozenset({"enum", "const", "default", "examples"})
#: Schema keywords whose values map names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})

#: Bits in one word of a token bitmask (llguidance's layout: token ``t`` is
#: bit ``t % 32`` of int32 word ``t // 32``).
_WORD_BITS = 32


class OptionError(ModelError):
    """A bad value of a request option that names a field: ``field`` is
    its path as a request spells it (``response_format.json_schema.schema``,
    ``tools[0].function.name``, ``logit_bias.50256``) and ``problem`` what
    is wrong, so that the server can answer a 400 naming the field and the
    CLI can name its flag instead."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ConstraintError(OptionError):
    """A constraint cannot be used: a JSON schema llguidance cannot compile
    (or uses keywords it cannot enforce), an invalid regex or grammar, a bad
    choice list or ``logit_bias``; or a token that breaks the constraint was
    given to :meth:`ConstraintState.advance`."""


@dataclass(frozen=True)
class Constraint:
    """What a generation's output must match: ``kind`` (one of
    :data:`KINDS`) and ``source``, its text: the JSON schema (JSON text;
    ``{"type": "object"}`` for ``json_object``), the regex, the choices (a
    JSON list of strings) or the grammar (Lark, or llama.cpp's GBNF).
    ``field`` names where it came from in a request (errors name it; it
    takes no part in equality).

    Make one with :meth:`json_object`, :meth:`json_schema`, :meth:`regex`,
    :meth:`choice`, :meth:`grammar`, :meth:`from_response_format` or
    :meth:`of`; each compiles the constraint, so a bad one is a
    :class:`ConstraintError` at once, before any token is generated.
    Constraints are hashable and compare by what they constrain."""

    kind: str
    source: str
    field: str = dataclasses.field(default="constraint", compare=False)
    #: llguidance's grammar, compiled from :attr:`source` once.
    grammar_spec: str = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(self.field, f"unknown constraint kind {self.kind!r}; one of "
                                  + ", ".join(KINDS))
        object.__setattr__(self, "grammar_spec", _compile(self.kind, self.source, self.field))

    @classmethod
    def json_object(cls, field: str = "response_format") -> Constraint:
        """Any JSON object (OpenAI's ``{"type": "json_object"}``)."""
        return cls("json_object", '{"type": "object"}', field)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str | type,
                    field: str = "json_schema") -> Constraint:
        """JSON that ``schema`` validates: a schema as a dict (or ``True``),
        as JSON text, or a pydantic model class (its
        ``model_json_schema()``). Properties come out in the schema's order."""
        return cls("json_schema", _schema_text(schema, field), field)

    @classmethod
    def regex(cls, pattern: str, field: str = "regex") -> Constraint:
        """Text that the regex ``pattern`` matches whole (Rust ``regex``
        syntax: no lookaround or backreferences)."""
        if not isinstance(pattern, str):
            raise ConstraintError(field, f"expected a regex string, got {type(pattern).__name__}")
        return cls("regex", pattern, field)

    @classmethod
    def choice(cls, options: Sequence[str], field: str = "choice") -> Constraint:
        """Exactly one of the strings ``options``."""
        if isinstance(options, str) or not isinstance(options, Sequence) or not options:
            raise ConstraintError(field, "expected a non-empty list of strings, got "
                                  f"{shown(options)}")
        for i, option in enumerate(options):
            if not isinstance(option, str) or not option:
                raise ConstraintError(f"{field}[{i}]", "a choice must be a non-empty string, "
                                      f"got {shown(option)}")
        return cls("choice", json.dumps(list(options), ensure_ascii=False), field)

    @classmethod
    def grammar(cls, text: str, field: str = "grammar") -> Constraint:
        """Text that the grammar ``text`` derives: llguidance's Lark syntax
        (a ``start:`` rule; ``%json {...}`` embeds a JSON schema) or
        llama.cpp's GBNF (a ``root ::=`` rule), told apart as llguidance
        does."""
        if not isinstance(text, str) or not text.strip():
            raise ConstraintError(field, f"expected a grammar text, got {shown(text)}")
        return cls("grammar", text, field)

    @classmethod
    def from_response_format(cls, value: Mapping[str, Any] | None,
                             field: str = "response_format") -> Constraint | None:
        """The constraint an OpenAI ``response_format`` asks for: None for
        ``{"type": "text"}`` (or None); ``{"type": "json_object"}`` (with
        llama.cpp's optional ``schema``); ``{"type": "json_schema",
        "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``.
        Output always follows the schema, so ``strict`` changes nothing."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConstraintError(field, f"expected an object, got {shown(value)}")
        kind = value.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            if value.get("schema") is not None:
                return cls.json_schema(value["schema"], f"{field}.schema")
            return cls.json_object(field)
        if kind != "json_schema":
            raise ConstraintError(f"{field}.type", "must be 'text', 'json_object' or "
                                  f"'json_schema', got {shown(kind)}")
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ConstraintError(f"{field}.json_schema", "is required with type "
                                  "'json_schema': an object with the schema under 'schema', got "
                                  f"{shown(spec)}")
        for key, kinds in (("name", str), ("description", str), ("strict", bool)):
            if spec.get(key) is not None and not isinstance(spec[key], kinds):
                raise ConstraintError(f"{field}.json_schema.{key}", f"must be a "
                                      f"{'boolean' if kinds is bool else 'string'}, got "
                                      f"{shown(spec[key])}")
        if "schema" not in spec:
            raise ConstraintError(f"{field}.json_schema.schema", "is required")
        return cls.json_schema(spec["schema"], f"{field}.json_schema.schema")

    @classmethod
    def of(cls, value: Constraint | Mapping[str, Any] | type | None,
           field: str = "response_format") -> Constraint | None:
        """The constraint ``value`` stands for: a :class:`Constraint` as it
        is, a pydantic model class (its JSON schema), an OpenAI
        ``response_format`` dict (:meth:`from_response_format`), or None."""
        if value is None or isinstance(value, Constraint):
            return value
        if isinstance(value, type):
            return cls.json_schema(value, field)
        if isinstance(value, Mapping):
            return cls.from_response_format(value, field)
        raise ConstraintError(field, "expected a Constraint, a pydantic model class or a "
                              f"response_format object, got {type(value).__name__}")

    def schema(self) -> dict[str, Any] | bool | None:
        """The JSON schema of a ``json_schema`` or ``json_object``
        constraint (None for the other kinds)."""
        return json.loads(self.source) if self.kind in ("json_schema", "json_object") else None

    def start(self, vocabulary: ConstraintVocabulary) -> ConstraintState:
        """A new :class:`ConstraintState` following this constraint over
        ``vocabulary``, at the start of the output."""
        return ConstraintState(self, vocabulary)


def shown(value: Any) -> str:
    """A value a client gave, as JSON cut to 60 characters (for messages)."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _schema_text(schema: Any, field: str) -> str:
    """A JSON schema given as a dict, a bool, JSON text or a pydantic model
    class, as JSON text (keys in their order: the output's order)."""
    if isinstance(schema, type):
        to_schema = getattr(schema, "model_json_schema", None)
        if to_schema is None:
            raise ConstraintError(field, f"{schema.__name__} is not a pydantic model class (it "
                                  "has no model_json_schema)")
        schema = to_schema()
    elif isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise ConstraintError(field, f"the schema is not valid JSON: {exc}") from None
    if not isinstance(schema, (Mapping, bool)):
        raise ConstraintError(field, f"a JSON schema is an object (or true/false), got "
                              f"{shown(schema)}")
    try:
        return json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConstraintError(field, f"the schema is not JSON: {exc}") from None


def _compile(kind: str, source: str, field: str) -> str:
    """llguidance's grammar for a constraint, checked: anything llguidance
    refuses is a :class:`ConstraintError` naming ``field`` with its reason."""
    if kind in ("json_object", "json_schema"):
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(_bounded_formats(json.loads(source))), defaults=_JSON_DEFAULTS)
        except ValueError as exc:
            raise ConstraintError(field, f"the schema is not a JSON object: {exc}") from None
    elif kind == "regex":
        grammar = llguidance.LLMatcher.grammar_from_regex(source)
    elif kind == "choice":
        grammar = llguidance.grammar_from("choice", json.loads(source))
    else:
        try:
            grammar = llguidance.grammar_from("grammar", source)
        except ValueError as exc:  # GBNF that does not parse
            reason = str(exc).removeprefix("Failed to convert the grammar from GBNF to Lark: ")
            raise ConstraintError(field, f"the GBNF grammar does not parse: {reason}") from None
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        raise ConstraintError(field, _problem(kind, source, messages[0]))
    return grammar


def _bounded_formats(schema: Any) -> Any:
    """``schema`` with each ``time`` and ``date-time`` string format that
    has no ``pattern`` of its own given as the pattern of
    :data:`_BOUNDED_FORMATS` (its fraction of a second at most
    :data:`FRACTION_DIGITS` digits); every string it allows is still of the
    format. Data (``enum``, ``const``, ...) is kept as it is."""
    if isinstance(schema, list):
        return [_bounded_formats(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for key, value in schema.items():
        if key in SCHEMA_DATA:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _bounded_formats(sub) for name, sub in value.items()}
        else:
            out[key] = _bounded_formats(value)
    form = out.get("format")
    if isinstance(form, str) and form in _BOUNDED_FORMATS and "pattern" not in out:
        del out["format"]
        out["pattern"] = _BOUNDED_FORMATS[form]
    return out


def _problem(kind: str, source: str, message: str) -> str:
    """llguidance's reason for refusing a constraint, in our words."""
    if kind == "regex":
        return f"the regex {shown(source)} does not compile: {_regex_reason(message)}"
    if kind == "grammar":
        return f"the grammar does not compile: {_grammar_reason(message)}"
    if kind == "choice":  # every choice is a string literal: only limits can fail
        return f"the choices cannot be compiled: {_one_line(message)}"
    return _schema_problem(json.loads(source), message)


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def _regex_reason(message: str) -> str:
    """The reason of a ``regex`` crate error (``regex parse error:`` the
    pattern, a caret under the place, ``error: ...``), with the place as a
    character position."""
    lines = message.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("error: "):
            reason = line.removeprefix("error: ")
            caret = lines[i - 1] if i >= 2 else ""
            if caret.strip() == "^" and lines[i - 2].startswith("    "):
                reason += f" (at character {len(caret) - 4})"
            return reason
    return _grammar_reason(message)


def _grammar_reason(message: str) -> str:
    """A Lark error's first line with its place (``at 1(8): ...``) as
    ``line 1, column 8: ...``; the excerpt of the grammar after it is left
    out."""
    first = message.strip().split("\n")[0]
    return re.sub(r"^(?:at )?(\d+)\((\d+)\):\s*", r"line \1, column \2: ", first)


#: Keywords whose values are maps of names to schemas (the names are no
#: keywords), and those whose values are a schema or a list of schemas.
_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalProperties", "prefixItems", "anyOf", "allOf", "oneOf", "not",
               "contains", "propertyNames", "if", "then", "else", "unevaluatedItems",
               "unevaluatedProperties")


def _schema_places(schema: Any, pointer: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every (sub)schema of ``schema`` with its JSON pointer."""
    if not isinstance(schema, Mapping):
        return
    yield pointer or "/", schema
    for key in _NAMED_SCHEMAS:
        if isinstance(schema.get(key), Mapping):
            for name, sub in schema[key].items():
                yield from _schema_places(sub, f"{pointer}/{key}/{_escape(name)}")
    for key in _SUBSCHEMAS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _schema_places(sub, f"{pointer}/{key}/{i}")
        else:
            yield from _schema_places(value, f"{pointer}/{key}")


def _escape(name: str) -> str:
    return str(name).replace("~", "~0").replace("/", "~1")


def _schema_problem(schema: Any, message: str) -> str:
    """Why llguidance refuses a JSON schema, naming the place in the schema
    (a JSON pointer) where the reason allows finding it."""
    unimplemented = re.match(r'Unimplemented keys: \[(.*)\]', message)
    if unimplemented:
        keys = [k.strip().strip('"') for k in unimplemented.group(1).split(",")]
        where = _find(schema, lambda s: any(k in s for k in keys))
        return (f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} not supported by "
                f"constrained decoding{where} (llguidance cannot enforce "
                f"{'it' if len(keys) == 1 else 'them'})")
    if message.startswith("oneOf constraints are not supported"):
        return (f"oneOf{_find(schema, lambda s: 'oneOf' in s)} is supported only where its "
                "branches provably exclude each other; use anyOf")
    missing = re.match(r"Pointer '(.*)' does not exist", message)
    if missing:
        return f"the $ref '#{missing.group(1)}' points to nothing in the schema"
    for pattern, key in ((r"Unknown format: (.*)", "format"), (r"Invalid type: (.*)", "type")):
        match = re.match(pattern, message)
        if match:
            value = match.group(1).strip()
            where = _find(schema, lambda s: s.get(key) == value)
            return f"{key} {value!r}{where} is not supported by constrained decoding"
    if message.startswith("regex parse error"):
        def bad_pattern(sub: Mapping[str, Any]) -> bool:
            pattern = sub.get("pattern")
            return isinstance(pattern, str) and bool(llguidance.LLMatcher.validate_grammar(
                llguidance.LLMatcher.grammar_from_regex(pattern)))
        return (f"the pattern{_find(schema, bad_pattern)} does not compile: "
                f"{_regex_reason(message)}")
    return f"the schema cannot be compiled for constrained decoding: {_one_line(message)}"


def _find(schema: Any, test: Callable[[Mapping[str, Any]], bool]) -> str:
    """`` at /pointer`` of the first subschema passing ``test`` ("" if none)."""
    for pointer, sub in _schema_places(schema):
        if test(sub):
            return f" at {pointer}"
    return ""


class ConstraintVocabulary:
    """A tokenizer's vocabulary as llguidance sees it: ``lltokenizer`` (the
    bytes of every token, the end-of-sequence tokens), ``size`` (the token
    ids, added tokens included) and ``words``, the int32 words of one row of
    a token bitmask.

    Built from the ``tokenizers`` JSON of ``tokenizer.backend``: llguidance
    reads it directly when its decoder is byte-level or byte-fallback with
    ``\u2581`` as the space (every GGUF vocabulary, most Hugging Face ones);
    other decoders (``Metaspace``) get their token bytes worked out here.
    Building takes a fraction of a second; :meth:`of` builds once per
    tokenizer."""

    _built: weakref.WeakKeyDictionary[Tokenizer, ConstraintVocabulary] = \
        weakref.WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, tokenizer: Tokenizer):
        text = tokenizer.backend.to_str()
        spec = json.loads(text)
        self.size = tokenizer.vocab_size
        self.words = (self.size + _WORD_BITS - 1) // _WORD_BITS
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        eos = list(self.eos_token_ids) or None
        if _llguidance_reads(spec.get("decoder")):
            self.lltokenizer = llguidance.LLTokenizer(text, n_vocab=self.size,
                                                      eos_token=eos)
        else:
            self.lltokenizer = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_VocabularyBytes(tokenizer, spec)),
                n_vocab=self.size, eos_token=eos)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ConstraintVocabulary:
        """The vocabulary of ``tokenizer``, built on first use and kept
        while the tokenizer lives."""
        with cls._lock:
            vocabulary = cls._built.get(tokenizer)
            if vocabulary is None:
                vocabulary = cls._built[tokenizer] = cls(tokenizer)
            return vocabulary

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for in llguidance's view (a special
        token's text after a 0xFF marker byte)."""
        return self.lltokenizer.decode_bytes([token_id])


def _llguidance_reads(decoder: Any) -> bool:
    """Whether llguidance works out token bytes right from a ``tokenizers``
    decoder: a byte-level one, or a sequence with byte fallback whose space
    symbol is written back as a space by a ``Replace`` (not by
    ``Metaspace``, which llguidance leaves as ``\u2581``)."""
    if not isinstance(decoder, Mapping):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    steps = (decoder.get("decoders") or []) if decoder.get("type") == "Sequence" else []
    kinds = {step.get("type") for step in steps if isinstance(step, Mapping)}
    return "ByteFallback" in kinds and "Metaspace" not in kinds


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte
    (printable Latin-1 bytes as themselves, the others as 256 + n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


class _VocabularyBytes:
    """A vocabulary as ``llguidance.TokenizerWrapper`` takes it: the bytes
    of every token (worked out from the ``tokenizers`` JSON ``spec``:
    byte-level characters mapped back to bytes, ``<0xNN>`` byte tokens,
    the ``Metaspace``/``Replace`` space symbol as a space), which are
    special, and tokenizing a text as a continuation of the output (without
    the space SentencePiece puts before a whole text), as llguidance does
    for the tokenizers it reads itself."""

    def __init__(self, tokenizer: Tokenizer, spec: Mapping[str, Any]):
        self._continuation = Backend.from_str(json.dumps(_without_prefix_space(spec)))
        self.eos_token_id = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
        self.bos_token_id = tokenizer.bos_token_id
        steps = _decoder_steps(spec.get("decoder"))
        byte_level = any(s.get("type") == "ByteLevel" for s in steps)
        byte_fallback = bool((spec.get("model") or {}).get("byte_fallback")) or any(
            s.get("type") == "ByteFallback" for s in steps)
        space = next((s["replacement"] for s in steps if s.get("type") == "Metaspace"), None)
        for s in steps:
            pattern = s.get("pattern") if s.get("type") == "Replace" else None
            if s.get("content") == " " and isinstance(pattern, Mapping) and "String" in pattern:
                space = pattern["String"]
        alphabet = _byte_level_alphabet() if byte_level else {}

        def piece_bytes(text: str) -> bytes:
            if byte_fallback and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
                piece = bytes([int(text[3:5], 16)])
            elif byte_level and all(c in alphabet for c in text):
                piece = bytes(alphabet[c] for c in text)
            else:
                piece = (text.replace(space, " ") if space else text).encode()
            # llguidance marks special tokens with a leading 0xFF byte, which
            # no UTF-8 text holds: a token starting with it could never fit.
            return b"" if piece.startswith(b"\xff") else piece

        tokens = [b""] * tokenizer.vocab_size
        for text, token_id in tokenizer.backend.get_vocab(with_added_tokens=False).items():
            tokens[token_id] = piece_bytes(text)
        special = []
        for token_id, added in tokenizer.backend.get_added_tokens_decoder().items():
            # Special tokens are their text; other added tokens are decoded
            # as vocabulary entries are.
            tokens[token_id] = added.content.encode() if added.special else \
                piece_bytes(added.content)
            if added.special:
                special.append(token_id)
        self.tokens = tokens
        self.special_token_ids = special

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance asks whether bytes are taken: they are not
            raise TypeError("the vocabulary tokenizes texts, not bytes")
        return self._continuation.encode(text, add_special_tokens=False).ids


def _without_prefix_space(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ``tokenizers`` JSON spec that tokenizes a text as a continuation:
    without ``Prepend`` normalizers, and with ``Metaspace`` pre-tokenizers
    that prepend nothing."""
    def normalizer(step: Any) -> Any:
        if not isinstance(step, Mapping) or step.get("type") == "Prepend":
            return None
        if step.get("type") == "Sequence":
            kept = [n for n in map(normalizer, step.get("normalizers") or []) if n is not None]
            return {**step, "normalizers": kept} if kept else None
        return step

    def pre_tokenizer(step: Any) -> Any:
        if not isinstance(step, Mapping):
            return step
        if step.get("type") == "Metaspace":
            return {**step, "prepend_scheme": "never", "add_prefix_space": False}
        if step.get("type") == "Sequence":
            return {**step, "pretokenizers": [pre_tokenizer(p)
                                              for p in step.get("pretokenizers") or []]}
        return step

    return {**spec, "normalizer": normalizer(spec.get("normalizer")),
            "pre_tokenizer": pre_tokenizer(spec.get("pre_tokenizer"))}


def _decoder_steps(decoder: Any) -> list[Mapping[str, Any]]:
    """A ``tokenizers`` decoder as a flat list of its steps."""
    if not isinstance(decoder, Mapping):
        return []
    if decoder.get("type") == "Sequence":
        return [s for d in decoder.get("decoders") or [] for s in _decoder_steps(d)]
    return [decoder]


class ConstraintState:
    """One request's progress through a :class:`Constraint`: which tokens
    may come next, and the tokens taken so far.

    Each step: :meth:`apply` the mask to the step's logits (or read
    :meth:`bitmask` / :meth:`allowed`), sample, then :meth:`advance` with
    the sampled token. The mask is computed on first use after each
    :meth:`advance` and kept for that step. Where the constraint forces the
    next bytes, the mask allows only the first token of their canonical
    tokenization (llguidance's rule), so forced text is tokenized as the
    tokenizer would. End-of-sequence tokens are allowed where the output is
    a complete match; when :attr:`finished`, nothing else is (the engine
    can end the generation). :attr:`accepting` says whether the output so
    far is a complete match, so a generation cut by ``max_tokens`` is known
    to be incomplete."""

    def __init__(self, constraint: Constraint, vocabulary: ConstraintVocabulary):
        self.constraint = constraint
        self.vocabulary = vocabulary
        self.matcher = llguidance.LLMatcher(vocabulary.lltokenizer, constraint.grammar_spec,
                                            log_level=0)
        if self.matcher.is_error():  # a grammar that depends on the vocabulary (special tokens)
            raise ConstraintError(constraint.field, _problem(
                constraint.kind, constraint.source, self.matcher.get_error()))
        #: The tokens taken, an end-of-sequence token last if one was.
        self.tokens: list[int] = []
        # llguidance stops at an end-of-sequence token without counting it
        # as a token it can roll back: it is kept here instead.
        self._ended = False
        self._mask: np.ndarray | None = None

    @property
    def accepting(self) -> bool:
        """Whether the output so far is a complete match."""
        return self.matcher.is_accepting()

    @property
    def finished(self) -> bool:
        """Whether the output can take no more tokens: an end-of-sequence
        token was taken, or the match is complete and cannot grow (only an
        end-of-sequence token may follow)."""
        return self._ended or self.matcher.is_stopped()

    def bitmask(self) -> np.ndarray:
        """The next token's mask as int32 words (``vocabulary.words`` of
        them): token ``t`` is allowed when bit ``t % 32`` of word ``t // 32``
        is set."""
        if self._mask is None:
            mask = np.zeros(self.vocabulary.words, dtype=np.int32)
            if self._ended:  # the output is over: it may only go on ending
                for token in self.vocabulary.eos_token_ids:
                    mask.view(np.uint32)[token // _WORD_BITS] |= np.uint32(
                        1 << (token % _WORD_BITS))
            else:
                self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            self._mask = mask
        return self._mask

    def allowed(self) -> np.ndarray:
        """The next token's mask as booleans over the vocabulary."""
        return bitmask_to_bool(self.bitmask(), self.vocabulary.size)

    def apply(self, logits: mx.array) -> mx.array:
        """``logits`` (the next token's: ``[V]`` or ``[1, V]``) with every
        token the constraint does not allow at ``-inf`` (also the ids past
        the vocabulary, where the model's logits are wider)."""
        return apply_bitmask(logits, self.bitmask())

    def check(self, token: int) -> str:
        """Why ``token`` may not come next ("" when it may)."""
        if self._ended:
            return f"token {token} comes after the end-of-sequence token that ended the output"
        if 0 <= token < self.vocabulary.size:
            mask = self._mask
            if mask is not None:
                if (mask[token // _WORD_BITS] >> (token % _WORD_BITS)) & 1:
                    return ""
            elif token in self.vocabulary.eos_token_ids:
                if self.matcher.is_accepting():
                    return ""
            elif self.matcher.validate_tokens([token]) == 1:
                return ""
        return (f"token {token} ({self._shown_token(token)}) does not fit the constraint after "
                f"{len(self.tokens)} tokens ({self._shown_text()})")

    def advance(self, token: int) -> None:
        """Take ``token`` as the next one of the output. A token the mask
        does not allow is a :class:`ConstraintError` (a sampler bug: it was
        not sampled under the mask), and leaves the state as it was."""
        token = int(token)
        problem = self.check(token)
        if problem:
            raise ConstraintError(self.constraint.field, problem)
        if token in self.vocabulary.eos_token_ids:
            self._ended = True
        elif not self.matcher.consume_token(token):
            raise ConstraintError(self.constraint.field, f"llguidance failed on token {token}: "
                                  f"{_one_line(self.matcher.get_error())}")
        self.tokens.append(token)
        self._mask = None

    def advance_all(self, tokens: Sequence[int]) -> None:
        """:meth:`advance` with each of ``tokens`` in turn."""
        for token in tokens:
            self.advance(token)

    def fitting_prefix(self, draft: Sequence[int]) -> int:
        """How many of the tokens ``draft`` could be taken from here on
        (leading ones): a draft is cut there before it is verified."""
        if self._ended:
            return 0
        draft = [int(t) for t in draft]
        eos = next((i for i, t in enumerate(draft) if t in self.vocabulary.eos_token_ids),
                   len(draft))
        fitting = self.matcher.validate_tokens(draft[:eos]) if eos else 0
        if fitting == eos < len(draft) and self._accepting_after(draft[:eos]):
            fitting += 1  # the end-of-sequence token ends a complete match
        return fitting

    def _accepting_after(self, tokens: list[int]) -> bool:
        """Whether the output would be a complete match after ``tokens``
        (which fit)."""
        if not tokens:
            return self.matcher.is_accepting()
        if not self.matcher.consume_tokens(tokens):
            raise ConstraintError(self.constraint.field, "llguidance failed on tokens it "
                                  f"validated: {_one_line(self.matcher.get_error())}")
        accepting = self.matcher.is_accepting()
        self.matcher.rollback(len(tokens))
        return accepting

    def draft_bitmasks(self, draft: Sequence[int]) -> np.ndarray:
        """The masks of the ``len(draft) + 1`` positions a verify step
        scores, as int32 rows: row ``i`` allows the tokens that may follow
        ``draft[:i]``. Past the first draft token that does not fit, or an
        end-of-sequence token, rows repeat the mask before it (verification
        rejects that token or the output ends there, so they are never
        used). The state is left as it was."""
        masks = np.empty((len(draft) + 1, self.vocabulary.words), dtype=np.int32)
        masks[0] = self.bitmask()
        taken = 0
        for i, token in enumerate(draft, start=1):
            token = int(token)
            if taken == i - 1 and token not in self.vocabulary.eos_token_ids and \
                    not self.check(token) and self.matcher.consume_token(token):
                taken += 1
                self._mask = None
                masks[i] = self.bitmask()
            else:
                masks[i] = masks[i - 1]
        if taken:
            self.matcher.rollback(taken)
            self._mask = masks[0].copy()
        return masks

    def rollback(self, count: int) -> None:
        """Take back the last ``count`` tokens (rejected drafts)."""
        if not 0 <= count <= len(self.tokens):
            raise ConstraintError(self.constraint.field, f"cannot roll back {count} tokens: "
                                  f"{len(self.tokens)} were taken")
        if count == 0:
            return
        in_matcher = count - 1 if self._ended else count
        if in_matcher and not self.matcher.rollback(in_matcher):
            raise ConstraintError(self.constraint.field, f"llguidance cannot roll back "
                                  f"{in_matcher} tokens: {_one_line(self.matcher.get_error())}")
        self._ended = False
        del self.tokens[len(self.tokens) - count:]
        self._mask = None

    def _pending(self) -> bool:
        """Whether this step's mask is still to be computed by llguidance."""
        return self._mask is None and not self._ended

    def _keep(self, mask: np.ndarray) -> None:
        """Keep ``mask``, computed elsewhere (:class:`MaskBatch`), as this
        step's."""
        self._mask = mask

    def _shown_token(self, token: int) -> str:
        if not 0 <= token < self.vocabulary.size:
            return f"outside the vocabulary of {self.vocabulary.size}"
        return repr(self.vocabulary.token_bytes(token).decode("utf-8", "replace"))

    def _shown_text(self) -> str:
        text = self.vocabulary.lltokenizer.decode_str(self.tokens)
        return repr(text if len(text) <= 60 else "..." + text[-57:])


def bitmask_to_bool(bitmask: np.ndarray, size: int) -> np.ndarray:
    """A token bitmask (int32 words, one row or ``[B, W]``) as booleans over
    ``size`` token ids."""
    words = np.ascontiguousarray(bitmask, dtype=np.int32)
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :size].astype(bool)


def apply_bitmask(logits: mx.array, bitmask: np.ndarray) -> mx.array:
    """``logits`` (``[V]`` or ``[B, V]``) with the tokens that ``bitmask``
    (int32 words, a row or ``[B, W]`` rows) does not allow at ``-inf``.
    Logits wider than the mask (a model's padded vocabulary) are
    disallowed past it. The mask is unpacked by MLX, in the same graph as
    the logits."""
    width = logits.shape[-1]
    words = mx.array(np.ascontiguousarray(bitmask, dtype=np.int32).view(np.uint32))
    bits = (words[..., None] >> mx.arange(_WORD_BITS, dtype=mx.uint32)) & 1
    allowed = bits.reshape(*words.shape[:-1], -1).astype(mx.bool_)
    have = allowed.shape[-1]
    if have >= width:
        allowed = allowed[..., :width]
    else:
        pad = mx.zeros((*allowed.shape[:-1], width - have), dtype=mx.bool_)
        allowed = mx.concatenate([allowed, pad], axis=-1)
    return mx.where(allowed, logits, mx.array(-math.inf, dtype=logits.dtype))


class MaskBatch:
    """Token masks of a decode batch, one row per sequence, computed for
    all constrained rows at once on llguidance's threads.
    ``threads``: how many (None: llguidance's default, from the CPU count)."""

    def __init__(self, threads: int | None = None):
        self._executor = llguidance.LLExecutor(threads)

    def fill(self, states: Sequence[ConstraintState | None]) -> np.ndarray | None:
        """The ``[len(states), W]`` masks of a batch whose rows follow
        ``states`` (None: an unconstrained row, all tokens allowed); None
        when no row is constrained, so such a batch applies no mask."""
        constrained = [(i, s) for i, s in enumerate(states) if s is not None]
        if not constrained:
            return None
        words = constrained[0][1].vocabulary.words
        masks = np.full((len(states), words), -1, dtype=np.int32)
        pending = [(s.matcher, i) for i, s in constrained if s._pending()]
        if pending:
            llguidance_numpy.fill_next_token_bitmask_par(self._executor, pending, masks)
            for _, i in pending:
                states[i]._keep(masks[i].copy())
        for i, state in constrained:
            masks[i] = state.bitmask()
        return masks


@dataclass(frozen=True)
class LogitBias:
    """OpenAI's ``logit_bias``: ``token_ids`` and the ``values`` added to
    their logits (each in [-100, 100]; -100 bans a token in practice, 100
    all but forces it)."""

    token_ids: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def parse(cls, value: Mapping[Any, Any] | None, vocab_size: int | None,
              field: str = "logit_bias") -> LogitBias | None:
        """The bias a request's ``logit_bias`` asks for (None when absent
        or empty): keys are token ids (JSON's string keys, such as
        ``"50256"``, or ints), below ``vocab_size`` (None: any non-negative
        id; :meth:`check` them once the vocabulary is known); values numbers
        in [-100, 100]. A bad entry is a :class:`ConstraintError` naming it
        (``logit_bias.50256``)."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConstraintError(field, f"expected an object mapping token ids to biases, got "
                                  f"{shown(value)}")
        ids: dict[int, float] = {}
        for key, bias in value.items():
            where = f"{field}.{key}"
            token = _token_id(key)
            if token is None or token < 0 or (vocab_size is not None and token >= vocab_size):
                bound = "a non-negative integer" if vocab_size is None else \
                    f"an integer in [0, {vocab_size})"
                raise ConstraintError(where, f"the key must be a token id ({bound}), got "
                                      f"{shown(key)}")
            if token in ids:
                raise ConstraintError(where, f"token {token} is given twice")
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or \
                    not -100 <= bias <= 100:
                raise ConstraintError(where, f"the bias must be a number in [-100, 100], got "
                                      f"{shown(bias)}")
            ids[token] = float(bias)
        if not ids:
            return None
        return cls(tuple(ids), tuple(ids.values()))

    def check(self, vocab_size: int, field: str = "logit_bias") -> None:
        """Raise a :class:`ConstraintError` naming the first token id that
        is not below ``vocab_size`` (the model's vocabulary)."""
        for token in self.token_ids:
            if token >= vocab_size:
                raise ConstraintError(f"{field}.{token}", f"the key must be a token id (an "
                                      f"integer in [0, {vocab_size})), got {token}")

    def apply(self, logits: mx.array) -> mx.array:
        """``logits`` (``[V]`` or ``[B, V]``) with the biases added."""
        ids = mx.array(self.token_ids, dtype=mx.int32)
        return logits.at[..., ids].add(mx.array(self.values, dtype=logits.dtype))


def _token_id(key: Any) -> int | None:
    """A ``logit_bias`` key as a token id: an int, or a string of decimal
    digits (JSON object keys are strings)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key.strip()):
        return int(key)
    return None
