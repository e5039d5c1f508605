"""Structured output on SmolLM2-135M-Instruct (Q4_1 GGUF): are constrained
replies valid, and what does the constraint cost?

- ``validity``: ``--schemas`` distinct JSON schemas, made here from a seed
  (nested objects, arrays with bounds, enums, ``anyOf``, ``$ref`` to
  ``$defs``, string formats and patterns, bounded numbers), each generated
  greedily under its schema; a reply counts as valid when it parses and the
  ``jsonschema`` package validates it (formats checked too). Replies cut by
  ``--max-tokens`` are counted apart (finish ``length``: incomplete, never
  claimed valid); a reply that completes and does not validate would be a
  bug.
- ``decode``: decode tok/s with and without a constraint on the same
  prompt (a JSON object of 40 lines, so both run to ``--max-tokens``),
  ``--runs`` rounds rotating the order; the median of the per-round ratios.
- ``batch``: a batch of ``--batch`` rows, half constrained, against the
  same batch unconstrained: generated tokens over the wall time.
- ``ttft``: time to the first constrained token, the schema's compile
  included (a new Constraint each time), against the unconstrained TTFT.

    python benchmarks/structured_output.py [--schemas 120] [--max-tokens 256]
                                           [--runs 5] [--batch 4]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import jsonschema

import mlxprog.llm
from mlxprog.llm.constraints import Constraint
from mlxprog.llm.engine import run
from mlxprog.llm.options import GenerationOptions

TOPICS = ["a book", "a city", "a customer order", "a movie", "a laptop", "a recipe",
          "an employee", "a flight", "a song", "a sensor reading", "a bank transfer",
          "a hotel booking", "a planet", "a football match", "a web server"]
WORDS = ["id", "name", "title", "count", "price", "tags", "kind", "owner", "date", "email",
         "code", "score", "items", "status", "address", "rating", "active", "notes", "host",
         "level"]
FORMATS = ["date", "email", "uuid", "ipv4", "time", "date-time"]
PATTERNS = [r"^[A-Z]{2}[0-9]{3}$", r"^[a-z]+(-[a-z]+)?$", r"^\+?[0-9]{6,10}$",
            r"^v[0-9]\.[0-9]{1,2}$", r"^#[0-9a-f]{6}$"]


def field_schema(rng: random.Random, depth: int, defs: dict[str, Any]) -> dict[str, Any]:
    """One property's schema, drawn from every kind the benchmark covers."""
    kinds = ["string", "pattern", "format", "integer", "number", "boolean", "enum", "array",
             "anyOf"]
    if depth < 2:
        kinds += ["object", "ref"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 3),
                "maxLength": rng.randint(5, 24)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "format":  # bounded: an email's or a time's parts may grow without end
        return {"type": "string", "format": rng.choice(FORMATS), "maxLength": 40}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(1, 10000)}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": rng.choice([1, 100, 1e6]),
                "multipleOf": rng.choice([0.5, 0.01, 0.25])}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "small", "large", "open", "closed",
                                    "pending", 1, 2, None, True], rng.randint(2, 5))}
    if kind == "array":
        low = rng.randint(0, 2)
        items = rng.choice([{"type": "integer", "minimum": 0, "maximum": 999},
                            {"type": "string", "maxLength": 10},
                            {"enum": ["a", "b", "c"]},
                            {"type": "boolean"}])
        return {"type": "array", "items": items, "minItems": low,
                "maxItems": low + rng.randint(1, 4)}
    if kind == "anyOf":
        return {"anyOf": rng.sample([{"type": "integer", "minimum": 0, "maximum": 100},
                                     {"type": "string", "maxLength": 8}, {"type": "null"},
                                     {"type": "boolean"}], 2)}
    if kind == "object":
        return object_schema(rng, depth + 1, defs, rng.randint(1, 3))
    name = f"Part{len(defs)}"
    defs[name] = {}  # the name taken before the parts it holds take theirs
    defs[name] = object_schema(rng, depth + 1, defs, rng.randint(1, 2))
    return {"$ref": f"#/$defs/{name}"}


def object_schema(rng: random.Random, depth: int, defs: dict[str, Any],
                  size: int) -> dict[str, Any]:
    """An object of ``size`` required properties, no others."""
    names = rng.sample(WORDS, size)
    return {"type": "object", "properties": {n: field_schema(rng, depth, defs) for n in names},
            "required": names, "additionalProperties": False}


def schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` distinct schemas drawn from ``seed``."""
    rng, made, seen = random.Random(seed), [], set()
    while len(made) < count:
        defs: dict[str, Any] = {}
        schema = object_schema(rng, 0, defs, rng.randint(2, 4))
        if defs:
            schema["$defs"] = defs
        text = json.dumps(schema, sort_keys=True)
        if text not in seen:
            seen.add(text)
            made.append(schema)
    return made


def validity(llm, args) -> None:
    valid, cut, invalid, tokens, seconds = 0, [], [], 0, 0.0
    for i, schema in enumerate(schemas(args.schemas)):
        topic = TOPICS[i % len(TOPICS)]
        start = time.perf_counter()
        out = llm.generate(f"Describe {topic} as a JSON object.", max_tokens=args.max_tokens,
                           constraint=Constraint.json_schema(schema))
        seconds += time.perf_counter() - start
        tokens += len(out.tokens)
        if out.finish_reason == "length":
            cut.append((i, out.text[-80:]))
            continue
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        try:
            validator.validate(json.loads(out.text))
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            invalid.append((i, out.text, str(exc)[:200]))
    print(f"validity: {args.schemas} schemas, {valid} valid ({valid / args.schemas:.0%}), "
          f"{len(cut)} cut by --max-tokens {args.max_tokens}, {len(invalid)} complete but "
          f"invalid; {tokens} tokens in {seconds:.1f} s")
    for i, tail in cut:
        print(f"  cut: schema {i}, ending {tail!r}")
    for i, text, reason in invalid:
        print(f"  INVALID schema {i}: {text!r}: {reason}")


#: A reply long enough to time: 40 lines of a story (the model cannot end
#: it sooner), so both modes decode --max-tokens tokens.
STORY = {"type": "object", "properties": {"lines": {
    "type": "array", "items": {"type": "string", "maxLength": 80}, "minItems": 40,
    "maxItems": 40}}, "required": ["lines"], "additionalProperties": False}
STORY_PROMPT = "Write a long story about a fox and a crow, as a JSON object with its lines."


def decode(llm, args) -> None:
    plain = GenerationOptions(max_tokens=args.max_tokens)
    modes = {"unconstrained": plain,
             "constrained": GenerationOptions(max_tokens=args.max_tokens,
                                              constraint=Constraint.json_schema(STORY))}
    for options in modes.values():  # warm up
        llm.generate(STORY_PROMPT, options=options)
    speeds: dict[str, list[float]] = {m: [] for m in modes}
    counts: dict[str, list[int]] = {m: [] for m in modes}
    ratios = []
    order = list(modes)
    for r in range(args.runs):
        for mode in order[r % 2:] + order[:r % 2]:
            out = llm.generate(STORY_PROMPT, options=modes[mode])
            speeds[mode].append(out.stats.decode_tps)
            counts[mode].append(out.stats.generated_tokens)
        ratios.append(speeds["constrained"][-1] / speeds["unconstrained"][-1])
    for mode in modes:
        print(f"decode {mode}: median {statistics.median(speeds[mode]):.1f} tok/s "
              f"(runs: {', '.join(f'{s:.1f}' for s in speeds[mode])}; tokens "
              f"{statistics.median(counts[mode]):.0f})")
    print(f"decode constrained / unconstrained: median ratio {statistics.median(ratios):.3f} "
          f"(per round: {', '.join(f'{x:.2f}' for x in ratios)})")


def batch(llm, args) -> None:
    prompts = [STORY_PROMPT, "Tell me about foxes.", "Describe a city.", "List some birds."]
    plain = GenerationOptions(max_tokens=args.max_tokens)
    constrained = GenerationOptions(max_tokens=args.max_tokens,
                                    constraint=Constraint.json_schema(STORY))

    def once(half: bool) -> float:
        requests = [llm.request(prompts[i % len(prompts)],
                                constrained if half and i % 2 == 0 else plain)
                    for i in range(args.batch)]
        start = time.perf_counter()
        for _ in run(llm, requests):
            pass
        return sum(len(r.read) for r in requests) / (time.perf_counter() - start)

    once(True), once(False)  # warm up
    ratios, speeds = [], {True: [], False: []}
    for r in range(args.runs):
        for half in ((True, False) if r % 2 else (False, True)):
            speeds[half].append(once(half))
        ratios.append(speeds[True][-1] / speeds[False][-1])
    print(f"batch of {args.batch}: unconstrained {statistics.median(speeds[False]):.1f} tok/s, "
          f"half constrained {statistics.median(speeds[True]):.1f} tok/s; median ratio "
          f"{statistics.median(ratios):.3f} (per round: {', '.join(f'{x:.2f}' for x in ratios)})")


def ttft(llm, args) -> None:
    made = schemas(args.runs, seed=1)
    constrained, plain = [], []
    prompt = "Describe a book as a JSON object."
    llm.generate(prompt, max_tokens=1)
    for schema in made:
        start = time.perf_counter()
        stream = llm.stream(prompt, max_tokens=2, constraint=Constraint.json_schema(schema))
        next(stream)
        constrained.append(time.perf_counter() - start)
        stream.close()
        start = time.perf_counter()
        stream = llm.stream(prompt, max_tokens=2)
        next(stream)
        plain.append(time.perf_counter() - start)
        stream.close()
    print(f"time to first token: constrained (schema compile included) median "
          f"{statistics.median(constrained) * 1000:.0f} ms, unconstrained "
          f"{statistics.median(plain) * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemas", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--only", choices=["validity", "decode", "batch", "ttft"])
    args = parser.parse_args()
    llm = mlxprog.llm.load(max_length=1024)
    for name, part in (("validity", validity), ("decode", decode), ("batch", batch),
                       ("ttft", ttft)):
        if args.only in (None, name):
            part(llm, args)


if __name__ == "__main__":
    main()
