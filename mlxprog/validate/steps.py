"""What validation produces: steps, blocks and validated programs.

Environment layout (one flat list per block):
``[inputs | captures | constants | carry | results]``. A step reads its
operands from slots and writes its results to the slots after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from ..arrays import AVal
from ..format.paths import StepPath, render
from ..format.program import Program
from ..limits import Limits
from ..ops.attrs import Attrs
from ..ops.registry import OpSpec


@dataclass(frozen=True, eq=False)
class Step:
    """One validated instruction: where it is (``path``), its op spec and
    attrs, its operand slots and result slots, and its subprograms' blocks."""

    index: int
    path: StepPath
    spec: OpSpec
    attrs: Attrs
    args: tuple[int, ...]
    out: int
    n_out: int
    blocks: dict[str, Block] = field(default_factory=dict)

    @property
    def location(self) -> str:
        """The path as text, for messages: ``"instruction 3 > body > instruction 0"``."""
        return render(self.path)

    @property
    def unpack(self) -> bool:
        """True when the implementation returns a sequence of results."""
        return self.spec.outputs != 1

    @property
    def results(self) -> range:
        """The environment slots this step writes."""
        return range(self.out, self.out + self.n_out)


def make_step(index, path, spec, attrs, args, out, n_out, blocks) -> Step:
    """``Step(...)`` for the validator's loop. The frozen dataclass's ``__init__``
    sets each of the eight fields with its own ``object.__setattr__`` call
    (about a third of the time a simple instruction takes to validate); this
    sets the instance dict to the same contents at once."""
    step = object.__new__(Step)
    object.__setattr__(step, "__dict__", {
        "index": index, "path": path, "spec": spec, "attrs": attrs,
        "args": args, "out": out, "n_out": n_out, "blocks": blocks,
    })
    return step


@dataclass(frozen=True, eq=False)
class Block:
    """A validated instruction list (the program body or a subprogram)."""

    path: StepPath
    steps: tuple[Step, ...]
    n_prefix: int
    n_carry: int
    outputs: tuple[int, ...]
    avals: tuple[AVal, ...]

    @property
    def location(self) -> str:
        """The path as text ('' for the program body)."""
        return render(self.path)

    @property
    def n_slots(self) -> int:
        """Size of the environment this block runs in."""
        return len(self.avals)

    @property
    def carry_avals(self) -> list[AVal]:
        """Shapes and dtypes of the carry values."""
        return list(self.avals[self.n_prefix : self.n_prefix + self.n_carry])

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the block's outputs."""
        return [self.avals[s] for s in self.outputs]

    def instruction_count(self) -> int:
        """Instructions in the block, its subprograms' included."""
        return sum(1 + sum(b.instruction_count() for b in s.blocks.values()) for s in self.steps)

    def walk(self):
        """Every step of the block and of its subprograms, depth first."""
        for step in self.steps:
            yield step
            for sub in step.blocks.values():
                yield from sub.walk()


@dataclass(frozen=True, eq=False)
class ValidatedProgram:
    """A program that passed validation, with its resolved top-level block."""

    program: Program
    input_avals: tuple[AVal, ...]
    capture_avals: tuple[AVal, ...]
    constants: tuple[mx.array, ...]
    block: Block
    limits: Limits | None = None
    """The limits the program was validated under (None: the defaults); its
    loops run under their ``max_loop_seconds``."""

    @property
    def out_avals(self) -> list[AVal]:
        """Shapes and dtypes of the program's outputs."""
        return self.block.out_avals
