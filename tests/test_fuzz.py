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
with the outcome it must have.
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

from fuzzing import KINDS, Case, Outcome, Worker, generate, minimise  # noqa: E402
from fuzzing.choice import DataChooser  # noqa: E402

CASES = Path(__file__).parent / "fuzz_cases"
EXAMPLES = int(os.environ.get("MLXPROG_FUZZ_EXAMPLES", "400"))
TIMEOUT = 10.0
MEMORY_LIMIT = 4 << 30

# Open bugs the suite tolerates until they are fixed: (name, predicate on
# the case's text and its outcome). Remove an entry once its fix is in.
KNOWN_BUGS: list[tuple[str, object]] = []

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


def _known(case: Case, outcome: Outcome) -> str | None:
    return next((name for name, test in KNOWN_BUGS if test(case.text, outcome)), None)


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
    if not outcome.is_bug or _known(case, outcome):
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
    expected = entry["expect"] if isinstance(entry["expect"], list) else [entry["expect"]]
    outcome = workers(case.options.get("memory_limit", MEMORY_LIMIT)).run(case)
    assert outcome.cls in expected, (
        f"{entry['name']} ({entry.get('note', '')}): expected {' or '.join(expected)}, got "
        f"{outcome.describe()}")


def test_fuzz_cases_are_well_formed():
    """Every case names its expected outcome; names are unique per file."""
    for path in sorted(CASES.glob("*.json")):
        entries = json.loads(path.read_text())
        names = [e["name"] for e in entries]
        assert len(names) == len(set(names)), path.name
        for entry in entries:
            expected = entry["expect"] if isinstance(entry["expect"], list) else [entry["expect"]]
            assert set(expected) <= {"ok", "program-error"}, (path.name, entry["name"])
            assert ("program" in entry) != ("text" in entry), (path.name, entry["name"])
