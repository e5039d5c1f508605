"""Structured output in generation, with the real SmolLM2 model: JSON
schemas (also as OpenAI ``response_format`` dicts and pydantic models), regexes,
choices and grammars constrain the output, which then parses and validates;
``logit_bias`` forces and bans tokens; constrained rows sample, draft and
share a batch without changing the unconstrained rows; a constraint cut by
``max_tokens`` ends with ``"length"``; the CLI flags, and bad values naming
the option or flag."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import numpy as np
import pytest
from llm_fixtures import smollm_path
from pydantic import BaseModel, ConfigDict, Field

from mlxprog.cli import main
from mlxprog.llm import load
from mlxprog.llm.constraints import (
    Constraint, ConstraintError, ConstraintVocabulary, OptionError,
)
from mlxprog.llm.engine import run
from mlxprog.llm.options import GenerationOptions

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 2},
    },
    "required": ["name", "age", "pets"],
    "additionalProperties": False,
}
PROMPT = "Describe a person as JSON with a name, an age and their pets."


class City(BaseModel):
    # As OpenAI's strict schemas: no properties but these.
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=16)
    population: int = Field(ge=0, le=10**9)


@pytest.fixture(scope="module")
def llm():
    return load(smollm_path(), max_length=256)


def test_a_json_schema_output_parses_and_validates(llm):
    out = llm.generate(PROMPT, max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert out.finish_reason in ("stop", "eos"), out
    jsonschema.validate(json.loads(out.text), PERSON)


def test_a_pydantic_model_as_response_format(llm):
    out = llm.generate("What is the capital of France? Answer as JSON.", max_tokens=40,
                       response_format=City)
    assert out.finish_reason in ("stop", "eos"), out
    city = City.model_validate_json(out.text)
    assert city.name


def test_json_object_and_a_grammar(llm):
    out = llm.generate(PROMPT, max_tokens=80, response_format={"type": "json_object"})
    if out.finish_reason != "length":
        assert isinstance(json.loads(out.text), dict)
    else:  # cut short: still a prefix of a JSON object
        assert out.text.lstrip().startswith("{")
    gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
    out = llm.generate("Is the sky blue?", max_tokens=20, grammar=gbnf)
    assert re.fullmatch(r"The answer is (yes|no)\.", out.text), out.text
    assert out.finish_reason == "stop"


def test_a_regex_and_a_choice(llm):
    out = llm.generate("Give me a phone number.", max_tokens=20,
                       constraint=Constraint.regex(r"\(\d{3}\) \d{3}-\d{4}"))
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", out.text), out.text
    assert out.finish_reason == "stop"
    choices = ["red", "green", "blue"]
    out = llm.generate("What colour is the sky?", max_tokens=10,
                       constraint=Constraint.choice(choices), top_logprobs=5)
    assert out.text in choices and out.finish_reason == "stop"


def test_log_probabilities_are_those_of_the_constrained_distribution(llm):
    constraint = Constraint.choice(["yes", "no"])
    allowed = set(np.flatnonzero(
        constraint.start(ConstraintVocabulary.of(llm.tokenizer)).allowed()).tolist())
    assert 2 <= len(allowed) <= 5  # "yes", "no" and their prefixes ("y", "n", ...)
    first = next(llm.stream("Is the sky blue?", max_tokens=4, constraint=constraint,
                            top_logprobs=5))
    finite = [(t, lp) for t, lp in first.top_logprobs if lp > -math.inf]
    assert {t for t, _ in finite} == allowed
    assert math.isclose(sum(math.exp(lp) for _, lp in finite), 1.0, rel_tol=1e-3)
    assert first.logprob == max(lp for _, lp in finite)


def test_logit_bias_forces_and_bans_tokens(llm):
    plain = llm.generate(PROMPT, max_tokens=3)
    forced = llm.tokenizer.encode(" banana")[0]
    out = llm.generate(PROMPT, max_tokens=3, logit_bias={forced: 100})
    assert out.tokens == [forced] * 3
    banned = plain.tokens[0]
    out = llm.generate(PROMPT, max_tokens=3, logit_bias={str(banned): -100})
    assert out.tokens[0] != banned
    # A bias and a constraint: the bias applies under the mask.
    out = llm.generate("Is the sky blue?", max_tokens=3, constraint=Constraint.choice(
        ["yes", "no"]), logit_bias={llm.tokenizer.encode("no")[0]: 100,
                                    llm.tokenizer.encode("yes")[0]: -100})
    assert out.text == "no"


def test_constrained_sampling_validates_and_repeats_with_its_seed(llm):
    options = dict(max_tokens=60, temperature=0.9, top_p=0.95, seed=7,
                   response_format={"type": "json_schema",
                                    "json_schema": {"name": "p", "schema": PERSON}})
    first = llm.generate(PROMPT, **options)
    assert first.finish_reason in ("stop", "eos"), first
    jsonschema.validate(json.loads(first.text), PERSON)
    assert llm.generate(PROMPT, **options).tokens == first.tokens
    other = llm.generate(PROMPT, **{**options, "seed": 8})
    jsonschema.validate(json.loads(other.text), PERSON)


def test_a_constrained_and_an_unconstrained_row_share_a_batch(llm):
    # The unconstrained row's tokens are those it gets beside the same
    # prompt unconstrained: the constrained rows change nothing for it.
    plain = GenerationOptions(max_tokens=16)
    constrained = GenerationOptions.given(plain, {"max_tokens": 60, "response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})

    def batch(options: GenerationOptions) -> list:
        rows = [llm.request(PROMPT, options), llm.request("Tell me about foxes.", plain),
                llm.request(PROMPT, options)]
        for _ in run(llm, rows):
            pass
        return [row.result() for row in rows]

    beside_plain = batch(GenerationOptions(max_tokens=60))
    beside_constrained = batch(constrained)
    assert beside_constrained[1].tokens == beside_plain[1].tokens
    for result in (beside_constrained[0], beside_constrained[2]):
        jsonschema.validate(json.loads(result.text), PERSON)


def test_speculative_decoding_keeps_the_constrained_output(llm):
    schema = {"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4}},
        "required": ["items"], "additionalProperties": False}
    prompt = "List: apple, apple, apple, apple. Repeat the list as JSON."
    plain = llm.generate(prompt, max_tokens=50, constraint=Constraint.json_schema(schema))
    drafted = llm.generate(prompt, max_tokens=50, constraint=Constraint.json_schema(schema),
                           draft="prompt-lookup")
    assert drafted.tokens == plain.tokens
    assert drafted.stats.drafted_tokens > 0
    jsonschema.validate(json.loads(drafted.text), schema)


def test_finish_reasons_of_a_complete_match(llm):
    # A match that cannot grow ends the generation ("stop"); one that could
    # ends where the model writes EOS, which the mask allows only there.
    # (Exactly 80 characters: no complete match before the 80th, so no EOS
    # the model might take there, whatever the numerics; every token adds at
    # least one character, so 80 tokens reach it.)
    out = llm.generate("Say hello.", max_tokens=80,
                       constraint=Constraint.regex("[A-Za-z ,.!]{80}"))
    assert len(out.text) == 80 and out.finish_reason == "stop", out
    out = llm.generate("What is 2+2?", max_tokens=40,
                       constraint=Constraint.regex("[A-Za-z0-9 ,.!]+"))
    assert re.fullmatch("[A-Za-z0-9 ,.!]+", out.text) and out.finish_reason == "eos", out


def test_a_constraint_cut_by_max_tokens_ends_with_length(llm):
    pieces = list(llm.stream(PROMPT, max_tokens=5, response_format={
        "type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}))
    assert pieces[-1].finish_reason == "length"
    assert len(llm.last_generation.tokens) == 5
    with pytest.raises(ValueError):
        json.loads(llm.last_generation.text)


def test_bad_values_name_the_option(llm):
    with pytest.raises(ConstraintError, match="grammar"):
        llm.generate(PROMPT, response_format={"type": "json_object"}, grammar='start: "a"')
    with pytest.raises(OptionError, match=r"logit_bias\.5: the bias must be a number"):
        llm.generate(PROMPT, logit_bias={5: 200})
    with pytest.raises(OptionError, match=r"logit_bias\.x: the key must be a token id"):
        GenerationOptions(logit_bias={"x": 1})
    with pytest.raises(OptionError, match=r"logit_bias\.999999: .*\[0, 49152\)"):
        llm.generate(PROMPT, logit_bias={999999: 1})
    with pytest.raises(OptionError, match="constraint: expected a Constraint"):
        GenerationOptions(constraint={"type": "json_object"})
    with pytest.raises(ConstraintError, match="response_format.type"):
        llm.generate(PROMPT, response_format={"type": "xml"})
    with pytest.raises(OptionError, match="constraint: the in-program decode loop cannot apply it"):
        llm.generate_in_program(PROMPT, constraint=Constraint.regex("a"))


def test_options_with_constraints_stay_hashable():
    a = GenerationOptions(constraint=Constraint.regex("[a-z]+"), logit_bias={"3": 1.5})
    b = GenerationOptions(constraint=Constraint.regex("[a-z]+"), logit_bias={3: 1.5})
    assert a == b and hash(a) == hash(b)
    assert GenerationOptions(logit_bias={}).logit_bias is None


# -- the CLI ------------------------------------------------------------------

def test_generate_with_a_json_schema_file(tmp_path, capsys):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    assert main(["generate", "-m", str(smollm_path()), "-p", PROMPT, "--json-schema",
                 str(schema), "--max-tokens", "60", "--max-length", "256", "--json",
                 "--no-verbose"]) == 0
    result = json.loads(capsys.readouterr().out)
    jsonschema.validate(json.loads(result["text"]), PERSON)


def test_generate_with_a_regex_names_the_finish(capsys):
    assert main(["generate", "-m", str(smollm_path()), "-p", "A year?", "--regex",
                 "(19|20)[0-9]{2}", "--max-length", "128"]) == 0
    captured = capsys.readouterr()
    assert re.fullmatch(r"(19|20)[0-9]{2}\n", captured.out), captured.out
    assert "finish: stop (a --stop text, or the constrained reply complete)" in captured.err


@pytest.mark.parametrize("flags, named", [
    (["--json-schema", "{schema}"], "argument --json-schema: uniqueItems is not supported"),
    (["--json-schema", "{missing}"], "argument --json-schema: cannot read"),
    (["--regex", "a(("], "argument --regex: the regex"),
    (["--grammar", "{schema}"], "argument --grammar: the GBNF grammar does not parse"),
    (["--regex", "a", "--json-schema", "{good}"], "not allowed with argument"),
])
def test_bad_constraint_flags_exit_2_naming_the_flag(tmp_path, capsys, flags, named):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "array", "uniqueItems": True}))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(PERSON))
    flags = [f.format(schema=bad, missing=tmp_path / "none.json", good=good) for f in flags]
    assert main(["generate", "-p", "x", *flags]) == 2
    assert named in capsys.readouterr().err


def test_in_program_refuses_a_constraint(capsys):
    assert main(["generate", "-p", "x", "--regex", "a", "--in-program"]) == 2
    assert "--in-program" in capsys.readouterr().err


def test_chat_with_a_constraint(monkeypatch, capsys):
    feed = iter(["Is the sky blue?", "And grass?", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(feed))
    assert main(["chat", "-m", str(smollm_path()), "--max-length", "256", "--max-tokens", "8",
                 "--regex", "(yes|no)"]) == 0
    replies = capsys.readouterr().out.split()
    assert len(replies) == 2 and set(replies) <= {"yes", "no"}
