"""Fuzzing mlxprog with hostile programs: the generators, the subprocess
runner and the minimiser shared by ``tools/fuzz.py`` (long runs) and
``tests/test_fuzz.py`` (the seeded test in the suite).

Import it with ``tools/`` on ``sys.path``; it is not part of the ``mlxprog``
package. The pieces:

- :mod:`.choice`: every random decision goes through a :class:`Chooser`, backed
  by ``random.Random`` for long runs or by Hypothesis (which can then shrink);
- :mod:`.registry_gen`, :mod:`.mutate`, :mod:`.attacks`: the three program
  generators (random registry ops, mutated examples, targeted attacks),
  selected by name through :func:`generate`;
- :mod:`.extremes`: integer extremes put into attributes (the
  ``integer_attributes`` attack and ``tools/audit_int_attrs.py``);
- :mod:`.worker`: what runs in the subprocess (load, validate, compile, call
  compiled and eager, compare, classify);
- :mod:`.reference`: the numpy reference of the ops where one is cheap, the
  worker's oracle beside the compiled-against-eager comparison;
- :mod:`.runner`: the parent side (one persistent worker process per job,
  resource limits, timeouts, crash attribution);
- :mod:`.minimise`: shrinking a bug's program while it keeps failing the
  same way.
"""

from .case import BUG_CLASSES, OUTCOMES, Case, Outcome
from .generate import KINDS, generate
from .minimise import minimise
from .runner import Worker

__all__ = ["BUG_CLASSES", "KINDS", "OUTCOMES", "Case", "Outcome", "Worker", "generate", "minimise"]
