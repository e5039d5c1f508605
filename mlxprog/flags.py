"""The command line's options, each declared once: a :class:`Flag` holds an
option's names and ``argparse`` settings, and every command that takes it
adds the same object (changing only what differs there, with
:meth:`Flag.but`). A command is its name, its handler (whose docstring is
the command's description), a line of help and the flags it takes, in order
(:func:`add_command`).

The ``type=`` helpers check a value as it is parsed, so a value out of range
exits with status 2 and names the flag (``argument --max-tokens: must be at
least 1, got 0``) before anything runs.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union


@dataclass(frozen=True)
class Flag:
    """One option (or positional argument): its ``names`` as
    ``add_argument`` takes them and its ``settings`` (``type``, ``default``,
    ``help``, ...)."""

    names: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    def but(self, **changes: Any) -> Flag:
        """This flag with some settings changed (a command's own default or
        help)."""
        return Flag(self.names, {**self.settings, **changes})

    @property
    def dest(self) -> str:
        """The attribute the parsed value is stored under."""
        if "dest" in self.settings:
            return self.settings["dest"]
        name = next((n for n in self.names if n.startswith("--")), self.names[0])
        return name.lstrip("-").replace("-", "_")

    def add(self, parser: argparse.ArgumentParser | argparse._ActionsContainer) -> None:
        """Add this flag to ``parser`` (a parser or one of its groups)."""
        parser.add_argument(*self.names, **self.settings)


def flag(*names: str, **settings: Any) -> Flag:
    """A :class:`Flag` named ``names`` with ``settings``."""
    return Flag(names, settings)


@dataclass(frozen=True)
class OneOf:
    """Flags of which a command line gives at most one (with ``required``,
    exactly one): argparse's mutually exclusive group."""

    flags: tuple[Flag, ...]
    required: bool = False

    def add(self, parser: argparse.ArgumentParser) -> None:
        """Add the group and its flags to ``parser``."""
        group = parser.add_mutually_exclusive_group(required=self.required)
        for member in self.flags:
            member.add(group)


#: What a command takes: a flag, or a group of flags of which one is given.
Option = Union[Flag, OneOf]


def add_command(commands: Any, name: str, handler: Callable[[argparse.Namespace], int],
                help: str, options: Sequence[Option]) -> argparse.ArgumentParser:
    """Add the command ``name`` to the subparsers ``commands``: ``help`` its
    line in the list of commands, ``handler``'s docstring its description,
    its ``options`` in order; ``handler`` runs with the parsed arguments."""
    parser = commands.add_parser(name, help=help, description=inspect.getdoc(handler))
    for option in options:
        option.add(parser)
    parser.set_defaults(handler=handler)
    return parser


def number(kind: type, accept: Callable[[Any], bool], requirement: str) -> Callable[[str], Any]:
    """An argparse ``type=``: the flag's text as a ``kind`` (int or float)
    that ``accept`` holds for; argparse reports anything else as
    ``argument --flag: must be {requirement}, got {text}`` and exits with
    status 2. NaN fails every comparison, so it is never accepted."""
    expected = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    return parse


def in_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer in [``low``, ``high``]."""
    return number(int, lambda v: low <= v <= high, f"in [{low}, {high}]")


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer of at least ``low``."""
    return number(int, lambda v: v >= low, f"at least {low}")


def choice(choices: Sequence[str]) -> Callable[[str], str]:
    """An argparse ``type=`` for one of ``choices``, reported as the numeric
    flags are: ``argument --flag: must be one of a, b, got c`` (exit status 2)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(choices)}, got {text}")
        return text

    return parse


def choices_metavar(choices: Sequence[str]) -> str:
    """How the help shows a flag that takes one of ``choices``: ``{a,b}``."""
    return "{" + ",".join(choices) + "}"


def non_empty(what: str) -> Callable[[str], str]:
    """An argparse ``type=`` for a non-empty string (``what`` it is)."""

    def parse(value: str) -> str:
        if not value:
            raise argparse.ArgumentTypeError(f"{what} must not be empty")
        return value

    return parse
