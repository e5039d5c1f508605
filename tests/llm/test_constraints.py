"""Constrained decoding (mlxprog.llm.constraints) over the real SmolLM2
vocabulary: masks allow exactly the tokens that keep the output a prefix of
a match, greedy decoding from random logits under a JSON schema always
gives JSON the ``jsonschema`` package validates, drafts and rollback keep
the state right, and bad constraints and ``logit_bias`` entries are errors
naming the field."""

from __future__ import annotations

import json
import re
from typing import Literal, Optional

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from llm_fixtures import smollm_tokenizer
from pydantic import BaseModel, Field
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from mlxprog.errors import ModelError
from mlxprog.llm import Tokenizer
from mlxprog.llm.constraints import (
    JSON_WHITESPACE, Constraint, ConstraintError, ConstraintVocabulary, LogitBias, MaskBatch,
    OptionError, apply_bitmask, bitmask_to_bool,
)

#: Replies longer than this are cut (and fail the test): the closing bias
#: below ends random JSON well within it.
MAX_TOKENS = 400
#: Hypothesis runs: each walks a constraint for tens of steps.
EXAMPLES = 12
_SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return smollm_tokenizer()


@pytest.fixture(scope="module")
def vocabulary(tokenizer) -> ConstraintVocabulary:
    return ConstraintVocabulary.of(tokenizer)


@pytest.fixture(scope="module")
def token_bytes(vocabulary) -> list[bytes]:
    """Every token's bytes as llguidance sees them."""
    return [vocabulary.token_bytes(i) for i in range(vocabulary.size)]


@pytest.fixture(scope="module")
def special_ids(tokenizer) -> set[int]:
    return {i for i, t in tokenizer.backend.get_added_tokens_decoder().items() if t.special}


@pytest.fixture(scope="module")
def closing_bias(vocabulary, token_bytes) -> LogitBias:
    """A bias towards tokens that close strings, objects and arrays, so that
    random logits end JSON within MAX_TOKENS."""
    closers = [i for i, b in enumerate(token_bytes) if any(c in b for c in b'"}],')]
    return LogitBias(tuple(closers), (3.0,) * len(closers))


def greedy(constraint: Constraint, vocabulary: ConstraintVocabulary, seed: int,
           bias: LogitBias | None = None) -> tuple[list[int], bool]:
    """Greedy decoding of random logits (wider than the vocabulary, as a
    padded model's are) under ``constraint``: the ids before EOS and
    whether EOS came within MAX_TOKENS."""
    rng = np.random.default_rng(seed)
    state = constraint.start(vocabulary)
    ids: list[int] = []
    for _ in range(MAX_TOKENS):
        logits = mx.array(rng.normal(size=(1, vocabulary.size + 40)).astype(np.float32))
        if bias is not None:
            logits = bias.apply(logits)
        token = int(mx.argmax(state.apply(logits), axis=-1).item())
        assert token < vocabulary.size
        if token in vocabulary.eos_token_ids:
            assert state.accepting
            return ids, True
        state.advance(token)
        ids.append(token)
    return ids, False


# ---------------------------------------------------------------------------
# The vocabulary


def test_the_vocabulary_is_built_once_per_tokenizer(tokenizer, vocabulary):
    assert ConstraintVocabulary.of(tokenizer) is vocabulary
    assert vocabulary.size == tokenizer.vocab_size == 49152
    assert vocabulary.words == 49152 // 32
    assert vocabulary.eos_token_ids == tokenizer.eos_token_ids


def test_token_bytes_are_the_tokens_text(tokenizer, token_bytes):
    for text in ("Hello", " world", "{\"", "\n\n", "é", "🙂", "<|im_end|>"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(token_bytes[i] for i in ids) == text.encode()


def test_the_token_bytes_worked_out_here_agree_with_llguidance(tokenizer, token_bytes):
    # For decoders llguidance reads itself, the bytes mlxprog works out for
    # the other decoders (Metaspace) agree with llguidance's on every token:
    # byte-level (SmolLM2) and SentencePiece with byte fallback.
    from mlxprog.llm.constraints import _VocabularyBytes

    spec = json.loads(tokenizer.backend.to_str())
    assert _VocabularyBytes(tokenizer, spec).tokens == token_bytes

    from test_tokenizer_parity import load_data, vocabulary_metadata

    spm = Tokenizer.from_gguf_metadata(vocabulary_metadata(load_data("spm")["recipe"]))
    theirs = ConstraintVocabulary(spm)
    ours = _VocabularyBytes(spm, json.loads(spm.backend.to_str())).tokens
    assert ours == [theirs.token_bytes(i) for i in range(theirs.size)]


def metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style vocabulary whose tokenizer.json decodes with
    ``Metaspace`` (as Hugging Face's newer Llama conversions do), which
    llguidance does not read."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "\u2581a": 6,
             "ab": 7, "\u2581ab": 8, "<0x7B>": 9, "<0x7D>": 10}
    backend = Backend(models.BPE(vocab=vocab, merges=[("\u2581", "a"), ("a", "b"),
                                                      ("\u2581a", "b")],
                                 unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    return Tokenizer(backend, bos_token_id=1, eos_token_ids=[2])


def test_a_metaspace_vocabulary_gets_its_spaces_and_bytes():
    vocabulary = ConstraintVocabulary(metaspace_tokenizer())
    assert [vocabulary.token_bytes(i) for i in (3, 6, 8, 9, 10)] == [b" ", b" a", b" ab", b"{",
                                                                     b"}"]
    state = Constraint.regex(r" a(b)?( a(b)?)*").start(vocabulary)
    assert np.flatnonzero(state.allowed()).tolist() == [3, 6, 8]
    state.advance(8)
    assert np.flatnonzero(state.allowed()).tolist() == [2, 3, 6, 8]  # EOS: a whole match
    # Forced text is taken in its canonical tokens (llguidance's rule).
    state = Constraint.regex(r" ab").start(vocabulary)
    assert np.flatnonzero(state.allowed()).tolist() == [8]
    state = Constraint.choice(["{}"]).start(vocabulary)
    assert np.flatnonzero(state.allowed()).tolist() == [9]


# ---------------------------------------------------------------------------
# Masks are exact


@pytest.fixture(scope="module")
def ids_by_bytes(token_bytes, special_ids) -> dict[bytes, set[int]]:
    """The ordinary tokens of each byte string."""
    found: dict[bytes, set[int]] = {}
    for i, b in enumerate(token_bytes):
        if b and i not in special_ids:
            found.setdefault(b, set()).add(i)
    return found


def continuing(choices: list[bytes], out: bytes, ids_by_bytes: dict[bytes, set[int]]) -> set[int]:
    """The tokens whose bytes continue ``out`` towards one of ``choices``."""
    found = set()
    for choice in choices:
        if choice.startswith(out):
            rest = choice[len(out):]
            for end in range(1, len(rest) + 1):
                found |= ids_by_bytes.get(rest[:end], set())
    return found


def expected_mask(state, fitting: set[int]) -> set[int]:
    """The tokens the mask must allow: those whose bytes keep the output a
    prefix of a match (``fitting``, EOS included at a whole match), except
    where the constraint forces the next bytes: then llguidance allows only
    the first token of their canonical tokenization."""
    forced = state.matcher.compute_ff_tokens()
    return {forced[0]} if forced else fitting


@settings(_SETTINGS, max_examples=4 * EXAMPLES)
@given(choices=st.lists(st.text(alphabet="ab c1{}\"é", min_size=1, max_size=10),
                        min_size=1, max_size=4, unique=True),
       seed=st.integers(0, 2**16))
def test_a_choice_allows_exactly_the_tokens_that_continue_a_choice(
        vocabulary, token_bytes, ids_by_bytes, choices, seed):
    encoded = [c.encode() for c in choices]
    state = Constraint.choice(choices).start(vocabulary)
    rng = np.random.default_rng(seed)
    out = b""
    while True:
        fitting = continuing(encoded, out, ids_by_bytes)
        if out in encoded:
            fitting |= set(vocabulary.eos_token_ids)
        expected = expected_mask(state, fitting)
        assert expected <= fitting
        allowed = set(np.flatnonzero(state.allowed()).tolist())
        assert allowed == expected, (out, sorted(allowed ^ expected)[:10])
        token = int(rng.choice(sorted(allowed)))
        if token in vocabulary.eos_token_ids:
            break
        state.advance(token)
        out += token_bytes[token]
    assert out.decode() in choices
    assert state.finished


#: A regex, and one matching exactly the prefixes of its matches.
REGEX, REGEX_PREFIXES = r"[0-9]{3}-[a-z]{2,4}", r"[0-9]{0,3}|[0-9]{3}-[a-z]{0,4}"


@pytest.mark.parametrize("seed", range(3))
def test_a_regex_allows_exactly_the_tokens_that_continue_a_match(
        vocabulary, token_bytes, ids_by_bytes, seed):
    # Only tokens of the regex's characters can continue a match.
    candidates = {b.decode(): ids for b, ids in ids_by_bytes.items()
                  if re.fullmatch(rb"[0-9a-z-]+", b)}
    state = Constraint.regex(REGEX).start(vocabulary)
    rng = np.random.default_rng(seed)
    out = ""
    while True:
        expected = set()
        for text, ids in candidates.items():
            if re.fullmatch(REGEX_PREFIXES, out + text):
                expected |= ids
        if re.fullmatch(REGEX, out):
            expected |= set(vocabulary.eos_token_ids)
        allowed = set(np.flatnonzero(state.allowed()).tolist())
        assert allowed == expected_mask(state, expected)
        token = int(rng.choice(sorted(allowed)))
        if token in vocabulary.eos_token_ids:
            break
        state.advance(token)
        out += token_bytes[token].decode()
    assert re.fullmatch(REGEX, out)


def test_apply_puts_disallowed_tokens_and_the_padding_at_minus_infinity(vocabulary):
    state = Constraint.choice(["yes", "no"]).start(vocabulary)
    logits = mx.arange(vocabulary.size + 40, dtype=mx.float32)[None]
    masked = np.array(state.apply(logits))[0]
    allowed = state.allowed()
    assert np.array_equal(np.isfinite(masked[:vocabulary.size]), allowed)
    assert np.all(masked[vocabulary.size:] == -np.inf)
    assert np.array_equal(masked[:vocabulary.size][allowed], np.flatnonzero(allowed))
    one_row = state.apply(mx.arange(vocabulary.size, dtype=mx.float16))
    assert one_row.shape == (vocabulary.size,) and one_row.dtype == mx.float16


def test_a_top_level_object_ends_the_output(vocabulary, tokenizer):
    state = Constraint.json_object().start(vocabulary)
    state.advance_all(tokenizer.encode('{"a": [1, {}]}', add_special_tokens=False))
    assert state.accepting and state.finished
    assert np.flatnonzero(state.allowed()).tolist() == sorted(vocabulary.eos_token_ids)


def test_json_whitespace_is_bounded(vocabulary, tokenizer):
    assert re.fullmatch(JSON_WHITESPACE, "\n" + " " * 20)
    state = Constraint.json_object().start(vocabulary)
    state.advance_all(tokenizer.encode("{", add_special_tokens=False))
    indent = tokenizer.encode("\n" + " " * 20 + '"', add_special_tokens=False)
    assert state.fitting_prefix(indent) == len(indent)
    too_far = tokenizer.encode("\n" + " " * 21 + '"', add_special_tokens=False)
    assert state.fitting_prefix(too_far) < len(too_far)
    assert state.fitting_prefix(tokenizer.encode("\n\n", add_special_tokens=False)) == 0
    tabs = tokenizer.encode("\n" + "\t" * 10 + '"', add_special_tokens=False)
    assert state.fitting_prefix(tabs) == len(tabs)
    for too_deep in ("\n" + "\t" * 11 + '"', "\n \t\t" + '"'):  # deeper, or mixed
        ids = tokenizer.encode(too_deep, add_special_tokens=False)
        assert state.fitting_prefix(ids) < len(ids)


def test_time_formats_bound_the_fraction_of_a_second(vocabulary, tokenizer):
    """A ``time``/``date-time`` string ends its fraction within 9 digits
    (RFC 3339 allows any number: a model could write zeros without end);
    what it allows is still of the format, and a schema's own pattern, or
    a ``format`` key that is data, is kept."""
    def fits(schema, text):
        ids = tokenizer.encode(json.dumps(text), add_special_tokens=False)
        return Constraint.json_schema(schema).start(vocabulary).fitting_prefix(ids) == len(ids)

    time_schema = {"type": "string", "format": "time"}
    assert fits(time_schema, "23:59:60.123456789Z") and fits(time_schema, "08:30:00+02:00")
    assert not fits(time_schema, "23:59:60.1234567890Z") and not fits(time_schema, "24:00:00Z")
    stamp = {"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}
    assert fits(stamp["properties"]["at"], "2024-02-29T23:59:59.5z")
    assert not fits(stamp["properties"]["at"], "2024-02-30T23:59:59Z")
    ids = tokenizer.encode('{"at": "2024-01-01T00:00:00.' + "0" * 10,
                           add_special_tokens=False)
    assert Constraint.json_schema(stamp).start(vocabulary).fitting_prefix(ids) < len(ids)
    own = {"type": "string", "format": "time", "pattern": "^1"}
    assert fits(own, "12:00:00.1234567890Z") and not fits(own, "22:00:00Z")
    assert fits({"const": {"format": "time"}}, {"format": "time"})


# ---------------------------------------------------------------------------
# Greedy decoding under JSON schemas


class Address(BaseModel):
    street: str = Field(max_length=20)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=130)
    role: Literal["admin", "user", "guest"]
    home: Address
    nicknames: list[str] = Field(min_length=1, max_length=3)
    manager: Optional[Address] = None


SCHEMAS = {
    "nested objects": {
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "object", "required": ["x"],
                             "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}}},
                       "b": {"type": "object", "properties": {"c": {"type": "string"}}}}},
    "array bounds": {"type": "array", "minItems": 2, "maxItems": 4,
                     "items": {"type": "integer", "minimum": -5, "maximum": 5}},
    "enum": {"type": "object", "required": ["color"],
             "properties": {"color": {"enum": ["red", "green", 3, None]}}},
    "anyOf": {"type": "array", "minItems": 3, "maxItems": 3,
              "items": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "number"},
                                  {"type": "null"}]}},
    "$ref recursion": {"$defs": {"node": {"type": "object", "required": ["v"], "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "maxItems": 2,
                                           "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"},
    "patterns and formats": {
        "type": "object", "required": ["code", "when", "id", "day"],
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{1,3}$"},
                       "when": {"type": "string", "format": "date-time"},
                       "id": {"type": "string", "format": "uuid"},
                       "day": {"type": "string", "format": "date"}}},
    "numbers": {"type": "object", "required": ["p", "q", "r"],
                "properties": {"p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                               "q": {"type": "integer", "multipleOf": 5},
                               "r": {"type": "number"}}},
    "additionalProperties": {"type": "object", "minProperties": 1, "maxProperties": 3,
                             "additionalProperties": {"type": "integer"}},
    "const and prefixItems": {"type": "array", "prefixItems": [{"const": "head"},
                                                                {"type": "boolean"}],
                              "items": False},
    "pydantic model": Person.model_json_schema(),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_greedy_decoding_under_a_schema_gives_json_it_validates(
        name, vocabulary, tokenizer, closing_bias):
    schema = SCHEMAS[name]
    constraint = Constraint.json_schema(schema)
    for seed in range(3):
        ids, ended = greedy(constraint, vocabulary, seed, closing_bias)
        assert ended, tokenizer.decode(ids)
        jsonschema.validate(json.loads(tokenizer.decode(ids)), schema)


def test_a_pydantic_model_class_is_its_schema(vocabulary, tokenizer, closing_bias):
    constraint = Constraint.json_schema(Person)
    assert constraint == Constraint.json_schema(Person.model_json_schema(), "elsewhere")
    ids, ended = greedy(constraint, vocabulary, 7, closing_bias)
    assert ended
    person = Person.model_validate_json(tokenizer.decode(ids))
    assert person.role in ("admin", "user", "guest")


def leaf_schemas() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-100, 100), st.integers(0, 50)),
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
        st.builds(lambda v: {"enum": v}, st.lists(st.one_of(st.integers(-9, 9),
                                                            st.text("xyz", max_size=3)),
                                                  min_size=1, max_size=3, unique=True)),
        st.just({"type": "string", "pattern": "^[a-c]{1,4}$"}),
    )


def composite(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    def obj(props: dict, required: list[bool]) -> dict:
        names = list(props)
        return {"type": "object", "properties": props,
                "required": [n for n, r in zip(names, required) if r]}

    def array(items: dict, low: int, extra: int) -> dict:
        return {"type": "array", "items": items, "minItems": low, "maxItems": low + extra}

    return st.one_of(
        st.builds(obj, st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children,
                                       min_size=1, max_size=3),
                  st.lists(st.booleans(), min_size=3, max_size=3)),
        st.builds(array, children, st.integers(0, 2), st.integers(0, 2)),
        st.builds(lambda a, b: {"anyOf": [a, b]}, children, children),
    )


@settings(_SETTINGS, max_examples=2 * EXAMPLES)
@given(schema=st.recursive(leaf_schemas(), composite, max_leaves=6),
       seed=st.integers(0, 2**16))
def test_greedy_decoding_under_generated_schemas_gives_json_they_validate(
        vocabulary, tokenizer, closing_bias, schema, seed):
    ids, ended = greedy(Constraint.json_schema(schema), vocabulary, seed, closing_bias)
    assert ended, tokenizer.decode(ids)
    jsonschema.validate(json.loads(tokenizer.decode(ids)), schema)


def test_json_object_gives_an_object(vocabulary, tokenizer, closing_bias):
    ids, ended = greedy(Constraint.from_response_format({"type": "json_object"}), vocabulary,
                        3, closing_bias)
    assert ended and isinstance(json.loads(tokenizer.decode(ids)), dict)


@pytest.mark.parametrize("grammar", [
    'root ::= "yes" | "no" | "maybe " [0-9]',                      # GBNF
    'start: answer\nanswer: "yes" | "no" | "maybe " /[0-9]/\n',    # Lark
])
def test_grammars_in_gbnf_and_lark(vocabulary, tokenizer, grammar):
    for seed in range(4):
        ids, ended = greedy(Constraint.grammar(grammar), vocabulary, seed)
        assert ended and re.fullmatch(r"yes|no|maybe [0-9]", tokenizer.decode(ids))


def test_a_lark_grammar_can_embed_a_json_schema(vocabulary, tokenizer, closing_bias):
    grammar = ('start: "ANSWER: " answer\n'
               'answer: %json {"type": "object", "properties": {"n": {"type": "integer"}},'
               ' "required": ["n"]}\n')
    ids, ended = greedy(Constraint.grammar(grammar), vocabulary, 1, closing_bias)
    text = tokenizer.decode(ids)
    assert ended and text.startswith("ANSWER: ")
    assert isinstance(json.loads(text.removeprefix("ANSWER: "))["n"], int)


# ---------------------------------------------------------------------------
# Advancing, rolling back, drafts, batches


def test_advance_refuses_a_token_outside_the_mask_and_keeps_the_state(vocabulary, tokenizer):
    state = Constraint.choice(["yes", "no"]).start(vocabulary)
    bad = tokenizer.encode("maybe", add_special_tokens=False)[0]
    with pytest.raises(ConstraintError, match=r"^choice: token \d+ \('maybe'\) does not fit"):
        state.advance(bad)
    with pytest.raises(ConstraintError, match="outside the vocabulary"):
        state.advance(vocabulary.size + 3)
    state.advance_all(tokenizer.encode("yes", add_special_tokens=False))
    assert state.accepting and state.finished


def test_rollback_returns_to_the_earlier_masks(vocabulary, tokenizer):
    constraint = Constraint.json_schema(SCHEMAS["nested objects"])
    state = constraint.start(vocabulary)
    ids = tokenizer.encode('{"a": {"x": 12, "y": true}, "b": {}}', add_special_tokens=False)
    masks = []
    for token in ids:
        masks.append(state.bitmask().copy())
        state.advance(token)
    assert state.finished
    state.rollback(4)
    assert state.tokens == ids[:-4] and not state.finished
    assert np.array_equal(state.bitmask(), masks[-4])
    state.advance_all(ids[-4:])
    assert state.finished
    state.rollback(len(ids))
    assert np.array_equal(state.bitmask(), masks[0])
    with pytest.raises(ConstraintError, match="cannot roll back 1 tokens: 0 were taken"):
        state.rollback(1)


def test_an_end_of_sequence_token_ends_the_output_and_rolls_back(vocabulary, tokenizer):
    eos = vocabulary.eos_token_ids[0]
    state = Constraint.choice(["yes", "yes sir"]).start(vocabulary)
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert state.fitting_prefix([eos]) == 0  # not a complete match yet
    with pytest.raises(ConstraintError, match="does not fit"):
        state.advance(eos)
    assert state.fitting_prefix([*yes, eos, *yes]) == len(yes) + 1
    state.advance_all(yes)
    assert state.accepting and not state.finished
    assert state.allowed()[eos]
    state.advance(eos)
    assert state.finished and state.tokens == [*yes, eos]
    assert np.flatnonzero(state.allowed()).tolist() == sorted(vocabulary.eos_token_ids)
    assert state.fitting_prefix(yes) == 0
    with pytest.raises(ConstraintError, match="comes after the end-of-sequence token"):
        state.advance(yes[0])
    state.rollback(1)  # the EOS alone: back to a complete match that may grow
    assert state.tokens == yes and not state.finished and state.allowed()[eos]
    state.advance_all(tokenizer.encode(" sir", add_special_tokens=False) + [eos])
    state.rollback(len(state.tokens))
    assert state.tokens == [] and not state.accepting
    assert state.fitting_prefix([*yes, eos]) == len(yes) + 1


def test_draft_masks_are_the_masks_of_each_position(vocabulary, tokenizer):
    constraint = Constraint.json_schema(SCHEMAS["array bounds"])
    state = constraint.start(vocabulary)
    state.advance_all(tokenizer.encode("[1,", add_special_tokens=False))
    draft = tokenizer.encode(" -3, 4]", add_special_tokens=False)
    masks = state.draft_bitmasks(draft)
    assert state.tokens == tokenizer.encode("[1,", add_special_tokens=False)
    follow = constraint.start(vocabulary)
    follow.advance_all(state.tokens)
    for i, token in enumerate(draft):
        assert np.array_equal(masks[i], follow.bitmask())
        follow.advance(token)
    assert np.array_equal(masks[-1], follow.bitmask())
    assert state.fitting_prefix(draft) == len(draft)

    # A draft token that does not fit: the rows after it repeat its mask.
    wrong = draft[:2] + tokenizer.encode("x", add_special_tokens=False) + draft[2:]
    assert state.fitting_prefix(wrong) == 2
    masks = state.draft_bitmasks(wrong)
    assert all(np.array_equal(masks[i], masks[2]) for i in range(3, len(wrong) + 1))
    assert not bitmask_to_bool(masks[2], vocabulary.size)[wrong[2]]
    assert state.tokens == tokenizer.encode("[1,", add_special_tokens=False)

    # Past an end-of-sequence token the rows repeat too: the output ends there.
    eos = vocabulary.eos_token_ids[0]
    done = draft + [eos] + draft[:2]
    masks = state.draft_bitmasks(done)
    assert bitmask_to_bool(masks[len(draft)], vocabulary.size)[eos]
    assert all(np.array_equal(masks[i], masks[len(draft)]) for i in range(len(draft), len(done)))
    assert state.fitting_prefix(done) == len(draft) + 1
    assert state.tokens == tokenizer.encode("[1,", add_special_tokens=False)


def test_a_batch_masks_constrained_rows_only(vocabulary, tokenizer):
    batch = MaskBatch(threads=2)
    assert batch.fill([None, None]) is None
    states = [Constraint.choice(["yes", "no"]).start(vocabulary), None,
              Constraint.regex(REGEX).start(vocabulary),
              Constraint.choice(["no"]).start(vocabulary)]
    states[3].advance_all([*tokenizer.encode("no", add_special_tokens=False),
                           vocabulary.eos_token_ids[0]])
    states[0].advance(tokenizer.encode("yes", add_special_tokens=False)[0])
    states[2].advance_all(tokenizer.encode("12", add_special_tokens=False))
    masks = batch.fill(states)
    assert masks.shape == (4, vocabulary.words)
    assert np.flatnonzero(bitmask_to_bool(masks[3], vocabulary.size)).tolist() == sorted(
        vocabulary.eos_token_ids)
    expected = Constraint.choice(["yes", "no"]).start(vocabulary)
    expected.advance_all(states[0].tokens)
    assert np.array_equal(masks[0], expected.bitmask())
    assert np.all(masks[1] == -1)
    expected = Constraint.regex(REGEX).start(vocabulary)
    expected.advance_all(states[2].tokens)
    assert np.array_equal(masks[2], expected.bitmask())
    # The states keep their step's mask: advancing needs no second computation.
    assert np.array_equal(states[2].bitmask(), masks[2])
    logits = mx.zeros((4, vocabulary.size + 8))
    applied = np.array(apply_bitmask(logits, masks))
    assert np.isfinite(applied[1, :vocabulary.size]).all()
    assert np.array_equal(np.isfinite(applied[0, :vocabulary.size]),
                          bitmask_to_bool(masks[0], vocabulary.size))
    assert np.all(applied[:, vocabulary.size:] == -np.inf)


# ---------------------------------------------------------------------------
# Bad constraints


@pytest.mark.parametrize("make, field, problem", [
    (lambda: Constraint.regex("a(("), "regex",
     r'the regex "a\(\(" does not compile: unclosed group \(at character 3\)'),
    (lambda: Constraint.grammar("start: foo\n"), "grammar",
     'the grammar does not compile: line 1, column 8: unknown name: "foo"'),
    (lambda: Constraint.grammar('root ::= "a" | ('), "grammar",
     "the GBNF grammar does not parse: Expected '\\)'"),
    (lambda: Constraint.grammar("  "), "grammar", "expected a grammar text"),
    (lambda: Constraint.json_schema({"type": "object", "properties": {
        "tags": {"type": "array", "uniqueItems": True}}}, "response_format.json_schema.schema"),
     "response_format.json_schema.schema",
     r"uniqueItems is not supported by constrained decoding at /properties/tags"),
    (lambda: Constraint.json_schema({"properties": {"d": {"type": "string", "format": "bogus"}}}),
     "json_schema", "format 'bogus' at /properties/d is not supported"),
    (lambda: Constraint.json_schema({"items": {"type": "strin"}}), "json_schema",
     "type 'strin' at /items is not supported"),
    (lambda: Constraint.json_schema({"properties": {"d": {"type": "string", "pattern": "(("}}}),
     "json_schema", r"the pattern at /properties/d does not compile: unclosed group"),
    (lambda: Constraint.json_schema({"$ref": "#/$defs/nope"}), "json_schema",
     r"the \$ref '#/\$defs/nope' points to nothing"),
    (lambda: Constraint.json_schema({"type": "integer", "minimum": 5, "maximum": 1}),
     "json_schema", r"minimum \(5\) is greater than maximum \(1\)"),
    (lambda: Constraint.json_schema({"oneOf": [{"type": "string"}, {"maxLength": 3}]}),
     "json_schema", "oneOf at / is supported only where its branches provably exclude"),
    (lambda: Constraint.json_schema([1, 2]), "json_schema", "a JSON schema is an object"),
    (lambda: Constraint.json_schema("{not json"), "json_schema", "the schema is not valid JSON"),
    (lambda: Constraint.json_schema(dict), "json_schema", "dict is not a pydantic model class"),
    (lambda: Constraint.choice([]), "choice", "expected a non-empty list of strings"),
    (lambda: Constraint.choice("yes"), "choice", "expected a non-empty list of strings"),
    (lambda: Constraint.choice(["a", 3]), "choice[1]", "a choice must be a non-empty string"),
    (lambda: Constraint("xml", ""), "constraint", "unknown constraint kind 'xml'"),
    (lambda: Constraint.from_response_format({"type": "xml"}), "response_format.type",
     "must be 'text', 'json_object' or 'json_schema'"),
    (lambda: Constraint.from_response_format({"type": "json_schema"}),
     "response_format.json_schema", "is required with type 'json_schema'"),
    (lambda: Constraint.from_response_format({"type": "json_schema", "json_schema": {
        "name": "x"}}), "response_format.json_schema.schema", "is required"),
    (lambda: Constraint.from_response_format({"type": "json_schema", "json_schema": {
        "schema": {}, "strict": "yes"}}), "response_format.json_schema.strict",
     "must be a boolean"),
    (lambda: Constraint.from_response_format({"type": "json_object", "schema": {
        "type": "nope"}}), "response_format.schema", "type 'nope'"),
    (lambda: Constraint.of(3.5), "response_format", "expected a Constraint"),
])
def test_a_bad_constraint_is_an_error_naming_its_field(make, field, problem):
    with pytest.raises(ConstraintError) as caught:
        make()
    assert caught.value.field == field
    assert re.search(problem, caught.value.problem), caught.value.problem
    assert str(caught.value) == f"{field}: {caught.value.problem}"
    assert isinstance(caught.value, OptionError) and isinstance(caught.value, ModelError)


def test_response_formats():
    assert Constraint.from_response_format(None) is None
    assert Constraint.from_response_format({"type": "text"}) is None
    assert Constraint.from_response_format({"type": "json_object"}) == Constraint.json_object()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    given = Constraint.from_response_format({"type": "json_schema", "json_schema": {
        "name": "thing", "schema": schema, "strict": True}})
    assert given == Constraint.json_schema(schema)
    assert given.field == "response_format.json_schema.schema"
    assert given.schema() == schema
    assert Constraint.from_response_format({"type": "json_object", "schema": schema}) == given
    assert Constraint.of(Person) == Constraint.json_schema(Person)
    assert Constraint.of(given) is given
    assert Constraint.of({"type": "json_object"}) == Constraint.json_object()
    assert len({Constraint.regex("a"), Constraint.regex("a", "elsewhere")}) == 1


# ---------------------------------------------------------------------------
# logit_bias


def test_logit_bias_adds_its_values():
    bias = LogitBias.parse({"3": 5, 7: -100, "0": 0.5}, vocab_size=10)
    assert bias == LogitBias((3, 7, 0), (5.0, -100.0, 0.5))
    expected = np.zeros(10, dtype=np.float32)
    expected[[3, 7, 0]] = [5, -100, 0.5]
    assert np.array_equal(np.array(bias.apply(mx.zeros((10,)))), expected)
    assert np.array_equal(np.array(bias.apply(mx.ones((2, 10)))), np.stack([expected + 1] * 2))
    assert LogitBias.parse(None, 10) is None and LogitBias.parse({}, 10) is None


@pytest.mark.parametrize("value, field, problem", [
    ({"abc": 1}, "logit_bias.abc", r'must be a token id \(an integer in \[0, 10\)\), got "abc"'),
    ({"10": 1}, "logit_bias.10", r"must be a token id"),
    ({"-1": 1}, "logit_bias.-1", r"must be a token id"),
    ({"1.5": 1}, "logit_bias.1.5", r"must be a token id"),
    ({"2": 101}, "logit_bias.2", r"must be a number in \[-100, 100\], got 101"),
    ({"2": -100.5}, "logit_bias.2", r"must be a number in \[-100, 100\]"),
    ({"2": True}, "logit_bias.2", r"must be a number"),
    ({"2": "5"}, "logit_bias.2", r'must be a number in \[-100, 100\], got "5"'),
    ({"2": float("nan")}, "logit_bias.2", r"must be a number"),
    ({"2": 1, 2: 3}, "logit_bias.2", r"token 2 is given twice"),
    ([1, 2], "logit_bias", r"expected an object mapping token ids to biases"),
])
def test_bad_logit_bias_names_the_key(value, field, problem):
    with pytest.raises(ConstraintError) as caught:
        LogitBias.parse(value, vocab_size=10)
    assert caught.value.field == field
    assert re.search(problem, caught.value.problem), caught.value.problem
