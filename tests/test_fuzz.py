"""Fuzzing: no program may crash, hang or exhaust the process, raise anything
but a ``ProgramError``, change a value silently or run differently compiled
and eager.

``test_fuzz`` draws programs with Hypothesis (derandomized, so every run
tries the same ones) from the three generators of ``tools/fuzzing``: random
registry ops, mutated examples and targeted attacks. Each runs in a worker
subprocess under a 4 GiB address-space limit and a timeout, so a crash fails
the test with the program that caused it; Hypothesis then shrinks it.
``MLXPROG_FUZZ_EXAMPLES`` sets the number of programs (``tools/fuzz.py``
does long runs).

``test_fuzz_case`` runs the kept regression cases, ``tests/fuzz_cases/*.json``:
the minimal programs of every bug found (the issue's and the fuzzer's), each
pinning one outcome: ``"expect": "ok"`` with the expected output values
(``options.outputs`` for the call with ``options.inputs``, or of a program
without inputs; ``options.output_sets``, one per ``options.input_sets``), or
``"expect": "program-error"`` with ``"error"``, a fragment of the message
(where it is: instruction and op, and what is wrong) that the error must
contain. The expected values come from an independent reference (numpy, or
the op reference's definition), never from running mlxprog.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from fuzzing import KINDS, Case, Worker, generate, minimise  # noqa: E402
from fuzzing.choice import DataChooser  # noqa: E402

CASES = Path(__file__).parent / "fuzz_cases"
EXAMPLES = int(os.environ.get("MLXPROG_FUZZ_EXAMPLES", "400"))
TIMEOUT = 10.0
MEMORY_LIMIT = 4 << 30

# Regression cases that fail today: "file/case" -> why. Remove an entry
# once its fix is in (the test then holds the fix in place).
KNOWN_FAILING: dict[str, str] = {
    **dict.fromkeys(
        ["fuzz_complex_nan_constant/complex64_nan_constant_fused_add",
         "fuzz_complex_nan_constant/complex64_nan_constant_fused_max"],
        "MLX inlines a complex64 NaN constant into fused C++ that does not compile"),
}


@pytest.fixture(scope="module")
def workers():
    """Workers by memory limit, started when first needed."""
    started: dict[int, Worker] = {}

    def get(memory_limit: int = MEMORY_LIMIT) -> Worker:
        if memory_limit not in started:
            started[memory_limit] = Worker(timeout=TIMEOUT, memory_limit=memory_limit)
        return started[memory_limit]

    yield get
    for w in started.values():
        w.close()


@pytest.fixture(scope="module")
def worker(workers):
    return workers()


# No Hypothesis shrinking: a hang costs a full timeout per attempt. A bug's
# program is minimised by tools/fuzzing's own (bounded) minimiser instead.
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
@given(data=st.data())
def _check_generated(worker, data):
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    case = generate(DataChooser(data), kind)
    assume(not case.options.get("timeout"))  # the slow ones are for tools/fuzz.py
    outcome = worker.run(case)
    if not outcome.is_bug:
        return
    if outcome.cls != "hang":
        case = minimise(case, outcome, worker.run, budget=60, seconds=60)
    pytest.fail(f"{outcome.describe()}\nprogram ({kind}, minimised): {case.text[:4000]}\n"
                f"case (for tools/fuzz.py --replay): {json.dumps(case.to_dict())[:6000]}",
                pytrace=False)


def test_fuzz(worker):
    _check_generated(worker)


def _regression_cases() -> list:
    params = []
    for path in sorted(CASES.glob("*.json")):
        for entry in json.loads(path.read_text()):
            key = f"{path.stem}/{entry['name']}"
            marks = [pytest.mark.xfail(reason=KNOWN_FAILING[key], strict=True)] \
                if key in KNOWN_FAILING else []
            params.append(pytest.param(entry, id=key, marks=marks))
    return params


@pytest.mark.parametrize("entry", _regression_cases())
def test_fuzz_case(workers, entry):
    case = Case.from_dict({**entry, "kind": "regression"})
    outcome = workers(case.options.get("memory_limit", MEMORY_LIMIT)).run(case)
    assert outcome.cls == entry["expect"], (
        f"{entry['name']} ({entry.get('note', '')}): expected {entry['expect']}, got "
        f"{outcome.describe()}")
    if entry["expect"] == "program-error":
        assert entry["error"] in outcome.error, (
            f"{entry['name']}: the error should contain {entry['error']!r}; got "
            f"{outcome.error}")


def well_formed(entry: dict) -> str | None:
    """Why a kept case does not pin exactly one outcome, or None: one
    ``expect``; expected values for every call of an ``ok`` case; an error
    fragment for a ``program-error`` one."""
    if "name" not in entry or ("program" in entry) == ("text" in entry):
        return "a case has a name and exactly one of program or text"
    expect, options = entry.get("expect"), entry.get("options", {})
    if expect == "program-error":
        if not isinstance(entry.get("error"), str) or not entry["error"].strip():
            return "a program-error case gives the error fragment it must raise ('error')"
        return None
    if expect != "ok":
        return f"expect is 'ok' or 'program-error', found {expect!r}"
    if "input_sets" in options:
        sets = options.get("output_sets")
        if not isinstance(sets, list) or len(sets) != len(options["input_sets"]):
            return "an ok case with input_sets gives output_sets, one per input set"
        return None
    if not isinstance(options.get("outputs"), list):
        return "an ok case gives its expected outputs (options.outputs)"
    program = entry.get("program") or json.loads(entry["text"])
    if any(i.get("value_of") is None for i in program.get("inputs", [])) \
            and "inputs" not in options:
        return "an ok case with inputs gives them (options.inputs), so its outputs are fixed"
    return None


def test_fuzz_cases_are_well_formed():
    """Every case pins one outcome (see :func:`well_formed`); names are
    unique per file."""
    for path in sorted(CASES.glob("*.json")):
        entries = json.loads(path.read_text())
        names = [e["name"] for e in entries]
        assert len(names) == len(set(names)), path.name
        for entry in entries:
            problem = well_formed(entry)
            assert problem is None, (path.name, entry.get("name"), problem)


@pytest.mark.parametrize("entry, problem", [
    ({"name": "a", "expect": ["ok", "program-error"], "program": {}}, "expect is"),
    ({"name": "a", "expect": "ok", "program": {}}, "expected outputs"),
    ({"name": "a", "expect": "ok", "options": {"outputs": [1]},
      "program": {"inputs": [{"name": "x", "shape": [], "dtype": "float32"}]}}, "gives them"),
    ({"name": "a", "expect": "ok", "options": {"input_sets": [[1], [2]], "output_sets": [[1]]},
      "program": {}}, "one per input set"),
    ({"name": "a", "expect": "program-error", "program": {}}, "error fragment"),
])
def test_a_case_without_one_outcome_is_refused(entry, problem):
    assert problem in (well_formed(entry) or "")
