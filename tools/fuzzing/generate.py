"""One entry point for the three generators: ``generate(chooser, kind)``."""

from __future__ import annotations

import json

from .attacks import attack, to_text
from .case import Case
from .choice import Chooser
from .mutate import mutated_example
from .registry_gen import registry_program

KINDS = ("registry", "mutation", "attack")
"""(a) random registry ops, (b) mutated examples, (c) targeted attacks."""


def generate(c: Chooser, kind: str) -> Case:
    """A case of one kind; the worker's input seed is drawn last."""
    options: dict = {}
    if kind == "registry":
        text = json.dumps(registry_program(c))
    elif kind == "mutation":
        text = mutated_example(c)
    elif kind == "attack":
        text, options = to_text(attack(c))
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    return Case(text=text, kind=kind, seed=c.integer(0, 2**31 - 1), options=options)
