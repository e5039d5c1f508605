"""The fuzz worker: the subprocess that runs cases and classifies them.

Started by :class:`fuzzing.runner.Worker` as ``python -m fuzzing.worker``. It
reads one JSON request per line on stdin (a :class:`~fuzzing.case.Case`)
and answers one JSON line per case (an :class:`~fuzzing.case.Outcome`) on
a private copy of stdout; fd 1 itself is pointed at stderr first, so what
native code prints can never corrupt the answers. A crash or a hang ends the
process; the parent notices and blames the case it was running.

One case: read the text with ``mlxprog.Program.loads``, validate it, compile
it twice (compiled and ``eager=True``), call both with random inputs that
match the input specs, compare the results exactly (NaN positions, dtype and
shape included), check each output computed straight from inputs and
constants against the numpy reference of its op (:mod:`.reference`: compiled
and eager share one lowering, so this is what catches an op defined wrong
everywhere) and against the case's expected outputs, then call with
mismatched inputs, which must be refused.
Along the way it looks for silent coercions: the parsed document, the
validated attributes, the constants, and outputs that are inputs or
constants must all hold exactly what the text says.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import os
import sys
import traceback
from typing import Any, Callable

import numpy as np

from .case import Case, Outcome
from .document import is_axis_name
from .reference import compute as reference_result, mismatch as reference_mismatch
from .values import decode_nonfinite, difference, random_array, round_bfloat16, to_mx, to_numpy

_ALLOCATION_TEXTS = ("bad_alloc", "unable to allocate", "out of memory",
                     "cannot allocate memory", "[malloc]")
_DISGUISED_TEXTS = ("maximum recursion depth", "Traceback (most recent call last)")
MAX_INPUT_ELEMENTS = 1 << 22
"""Inputs larger than this are not generated (the call is skipped)."""


class Finding(Exception):
    """Ends a case with an outcome other than ok or an exception of its own."""

    def __init__(self, cls: str, error: str):
        super().__init__(error)
        self.cls = cls
        self.error = error


def classify(exc: BaseException) -> str:
    """The outcome class of an exception that escaped mlxprog."""
    import mlxprog as mp

    text = str(exc).lower()
    if isinstance(exc, MemoryError) or any(t in text for t in _ALLOCATION_TEXTS):
        return "memory"
    if isinstance(exc, mp.ProgramError):
        # A ProgramError that only wraps an internal failure is still a bug.
        return "other-exception" if any(t.lower() in text for t in _DISGUISED_TEXTS) \
            else "program-error"
    return "other-exception"


def describe(exc: BaseException) -> str:
    """``Type: message`` (shortened), with the innermost frame for a bug."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 600:
        text = text[:600] + "..."
    if classify(exc) != "program-error":
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if f"{os.sep}mlxprog{os.sep}" in f.filename] or frames
        if ours:
            last = ours[-1]
            text += f" [at {os.path.basename(last.filename)}:{last.lineno} in {last.name}]"
    return text


# -- the raw document ---------------------------------------------------------

class BigInt(str):
    """An integer literal too long for ``int()`` (kept as its digits)."""


def read_raw(text: str) -> tuple[Any, list[str]]:
    """The document as plain JSON data plus what a strict reader must refuse
    (duplicate keys, ``NaN``/``Infinity`` literals, numbers that overflow to
    infinity). ``(None, [])`` when the text is not JSON at all."""
    problems: list[str] = []

    def pairs(items):
        keys = [k for k, _ in items]
        for key in {k for k in keys if keys.count(k) > 1}:
            problems.append(f"duplicate key {key!r}")
        return dict(items)

    def constant(name):
        problems.append(f"non-finite literal {name}")
        return float(name.replace("Infinity", "inf"))

    def floating(literal):
        value = float(literal)
        if math.isinf(value):
            problems.append(f"number {literal[:20]} overflows to infinity")
        return value

    def integer(literal):
        return int(literal) if len(literal) < 4000 else BigInt(literal)

    try:
        data = json.loads(text, object_pairs_hook=pairs, parse_constant=constant,
                          parse_float=floating, parse_int=integer)
    except (ValueError, RecursionError):
        return None, []
    return data, problems


def json_difference(raw: Any, parsed: Any, path: str = "", expressions: bool = False) -> str | None:
    """Where ``parsed`` (a model dump) does not hold exactly the JSON value
    ``raw``: a wrong JSON type accepted and converted, a value changed, a
    key dropped. An integer read into a float field is fine (JSON has one
    number type); ``expressions`` allows a string (a dim expression) to
    become an integer."""
    where = path or "document"
    if isinstance(raw, BigInt):
        return None if str(parsed) == raw else f"{where}: a {len(raw)}-digit integer changed"
    if raw is None or isinstance(raw, bool):
        return None if type(parsed) is type(raw) and parsed == raw else \
            f"{where}: JSON {json.dumps(raw)} became {parsed!r}"
    if isinstance(raw, int):
        if type(parsed) is int and parsed == raw:
            return None
        if type(parsed) is float and _float_of(raw) == parsed:
            return None
        return f"{where}: JSON {raw} became {parsed!r}"
    if isinstance(raw, float):
        if type(parsed) is float and (parsed == raw or (math.isnan(raw) and math.isnan(parsed))):
            return None
        return f"{where}: JSON {raw!r} became {parsed!r}"
    if isinstance(raw, str):
        if type(parsed) is str and parsed == raw:
            return None
        if raw in ("nan", "inf", "-inf") and type(parsed) is float and \
                str(parsed) == str(float(raw)):
            return None
        if expressions and type(parsed) is int:
            return None
        return f"{where}: JSON {json.dumps(raw)[:40]} became {parsed!r:.40}"
    if isinstance(raw, list):
        if not isinstance(parsed, (list, tuple)) or len(parsed) != len(raw):
            return f"{where}: a JSON list of {len(raw)} became {parsed!r:.60}"
        for i, (r, p) in enumerate(zip(raw, parsed)):
            found = json_difference(r, p, f"{where}[{i}]", expressions)
            if found:
                return found
        return None
    if isinstance(raw, dict):
        if not isinstance(parsed, dict):
            return f"{where}: a JSON object became {parsed!r:.60}"
        for key, value in raw.items():
            if key not in parsed:
                return f"{where}: key {key!r} was dropped"
            found = json_difference(value, parsed[key], f"{where}.{key}", expressions)
            if found:
                return found
        return None
    return None


def _float_of(value: int) -> float | None:
    try:
        return float(value)
    except OverflowError:
        return None


def _is_axis_value(value: Any) -> bool:
    """An axis attribute holds an int (not a bool), null, or (nested) lists
    of ints (``tensordot``'s ``[[1], [0]]``)."""
    if isinstance(value, list):
        return all(type(v) is int or isinstance(v, list) and _is_axis_value(v) for v in value)
    return value is None or type(value) is int


# -- one case -----------------------------------------------------------------

class Trial:
    """Running one case; ``stage`` says how far it got."""

    def __init__(self, case: Case, memory_limit: int):
        import mlx.core as mx
        import mlxprog as mp

        self.mp, self.mx = mp, mx
        self.case = case
        self.options = case.options
        self.stage = ""
        self._enter("load")
        self.rng = np.random.default_rng(case.seed)
        self.limit_kwargs = _limit_kwargs(mp, memory_limit)

    def _enter(self, stage: str) -> None:
        """Note the stage, also on stderr (where the parent finds it after a crash)."""
        self.stage = stage
        sys.stderr.write(f"--- stage {stage}\n")
        sys.stderr.flush()

    def run(self) -> Outcome:
        try:
            self._run()
        except Finding as found:
            return Outcome(found.cls, self.stage, found.error)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # the point: anything that escapes is classified
            return Outcome(classify(exc), self.stage, describe(exc))
        return Outcome("ok", self.stage)

    def _run(self) -> None:
        mp = self.mp
        raw, problems = read_raw(self.case.text)
        program = mp.Program.loads(self.case.text)
        if problems:
            raise Finding("coercion", f"accepted a document with a {problems[0]}")
        if raw is not None:
            found = json_difference(raw, program.model_dump(warnings=False))
            if found:
                raise Finding("coercion", found)
        self._enter("validate")
        validated = mp.validate(program, **self.limit_kwargs)
        concrete = getattr(validated, "sample", validated)
        self.validated, self.concrete = validated, concrete
        symbolic = concrete is not validated
        self._check_attrs(raw, concrete.block, symbolic)
        self._check_constants(raw, concrete.constants)
        self._enter("compile")
        kwargs = {"captures": self._captures(program), "callbacks": self._callbacks(concrete),
                  "max_iterations": 100, **self.limit_kwargs, **self.options.get("compile", {})}
        compiled = mp.compile(validated, **kwargs)
        eager = mp.compile(validated, eager=True, **kwargs) \
            if self.options.get("eager", True) else None
        self._enter("call")
        expected = self._expected_outputs()
        for k, (args, refs) in enumerate(self._calls(program)):
            self._call(compiled, eager, args, refs, raw, expected.get(k))
            self._enter("bad-call")
            if self.options.get("bad_calls", True):
                self._bad_calls(compiled, args, symbolic)
            self._enter("call")
        self._enter("done")

    # -- coercion checks ------------------------------------------------------

    def _check_attrs(self, raw: Any, block, symbolic: bool) -> None:
        """Each validated instruction's attributes hold what the text says."""
        if not isinstance(raw, dict):
            return
        for step in block.walk():
            instruction = _raw_instruction(raw, step.path)
            given = instruction.get("attrs") if isinstance(instruction, dict) else None
            if not isinstance(given, dict):
                continue
            parsed = step.attrs.model_dump(warnings=False)
            axes = {name for name, _ in step.spec.axis_fields} | {
                name for name in given if is_axis_name(name)}
            for name, value in given.items():
                where = f"{step.location} ({step.spec.name}) attribute {name!r}"
                if name in axes:
                    if not _is_axis_value(value):
                        raise Finding("coercion", f"{where}: JSON {json.dumps(value)[:40]} "
                                      f"accepted as an axis ({parsed.get(name)!r})")
                    continue
                found = json_difference(value, parsed.get(name), where, expressions=symbolic)
                if found:
                    raise Finding("coercion", found)

    def _check_constants(self, raw: Any, constants) -> None:
        """Each constant array holds exactly the literal's values."""
        if not isinstance(raw, dict) or not isinstance(raw.get("constants"), list):
            return
        for i, (given, array) in enumerate(zip(raw["constants"], constants)):
            found = _constant_difference(given, array)
            if found:
                raise Finding("coercion", f"constant {i}: {found}")

    # -- compiling ------------------------------------------------------------

    def _captures(self, program) -> dict[str, Any]:
        captures = {}
        for spec in program.captures:
            if _elements(spec.shape) <= MAX_INPUT_ELEMENTS:
                captures[spec.name] = to_mx(random_array(self.rng, spec.shape, spec.dtype),
                                            spec.dtype)
        return captures

    def _callbacks(self, block_owner) -> dict[str, Callable]:
        """A callback for each ``runtime_call``: mostly one returning zeros of
        the declared outputs, sometimes one returning the wrong shape or
        raising (a CallbackError then)."""
        mx = self.mx

        def wrong_shape(*args, avals):
            return [mx.zeros((*a.shape, 2), a.dtype) for a in avals]

        def failing(*args, avals):
            raise ZeroDivisionError("the callback failed")

        def zeros(*args, avals):
            return [mx.zeros(a.shape, a.dtype) for a in avals]

        callbacks = {}
        for step in block_owner.block.walk():
            if step.spec.name == "runtime_call":
                behaviour = self.rng.choice([zeros] * 8 + [wrong_shape, failing])
                callbacks[step.attrs.callback] = functools.partial(
                    behaviour, avals=list(step.attrs.output_avals))
        return callbacks

    # -- calling --------------------------------------------------------------

    def _calls(self, program):
        """``(args, refs)`` per call: the arguments to pass and the numpy
        arrays they hold (None for a ``value_of`` input)."""
        specs = list(program.inputs)
        if "inputs" in self.options or "input_sets" in self.options:
            for given in self.options.get("input_sets") or [self.options["inputs"]]:
                yield self._explicit_inputs(specs, given)
            return
        for binding in _bindings(program, self.rng):
            shapes = [_shape_of(spec.shape, binding) for spec in specs]
            if any(s is None for s in shapes):
                continue
            if any(_elements(s) > MAX_INPUT_ELEMENTS for s in shapes):
                return
            form = self.options.get("input_form") or self.rng.choice(
                ["mx"] * 7 + ["numpy"] * 2 + ["list"])
            args, refs = [], []
            for spec, shape in zip(specs, shapes):
                if spec.value_of is not None:
                    refs.append(None)
                    continue
                array = random_array(self.rng, shape, spec.dtype)
                refs.append(array)
                args.append(_passed(array, spec.dtype, form))
            yield args, refs

    def _explicit_inputs(self, specs, given: list) -> tuple[list, list]:
        form = self.options.get("input_form", "mx")
        args, refs = [], []
        values = iter(given)
        for spec in specs:
            if spec.value_of is not None:
                refs.append(None)
                continue
            array = _given_array(next(values), _numpy_dtype(spec.dtype))
            refs.append(array)
            args.append(_passed(array, spec.dtype, form))
        return args, refs

    def _expected_outputs(self) -> dict[int, list]:
        """The expected outputs by call: ``outputs`` for the one call (with
        ``inputs``, or of a program without inputs), ``output_sets`` for
        each of ``input_sets``."""
        if "output_sets" in self.options:
            return dict(enumerate(self.options["output_sets"]))
        if "outputs" in self.options:
            return {0: self.options["outputs"]}
        return {}

    def _call(self, compiled, eager, args, refs, raw, expected: list | None) -> None:
        calls = self.options.get("calls", 3)
        results = [self._attempt(compiled, args) for _ in range(calls)]
        reference = self._attempt(eager, args) if eager is not None else results[0]
        for k, result in enumerate(results):
            _compare(result, reference, f"compiled call {k + 1}", "eager")
        if isinstance(reference, BaseException):
            raise reference
        self._check_reference(reference, refs)
        if expected is not None:
            self._check_expected(reference, expected)
        self._check_direct_outputs(reference, refs, raw)

    def _attempt(self, executable, args):
        """The call's outputs as ``(dtype, numpy)`` pairs, or the exception."""
        try:
            outs = executable(*args)
            self.mx.eval(outs)
            return [to_numpy(o) for o in outs]
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            return exc

    def _check_reference(self, outputs, refs) -> None:
        """Each output that an instruction of the program body computes
        straight from inputs and constants matches the numpy reference of
        its op, where :mod:`.reference` has one."""
        validated = self.concrete
        if validated is not self.validated:
            return  # a symbolic program: its sample's attributes are not this call's
        block = validated.block
        n_inputs, n_captures = len(validated.input_avals), len(validated.capture_avals)
        producers = {slot: step for step in block.steps for slot in step.results}

        def value(slot):
            if slot < n_inputs:
                return refs[slot] if slot < len(refs) else None
            if slot < n_inputs + n_captures:
                return None  # captures are drawn elsewhere
            return to_numpy(validated.constants[slot - n_inputs - n_captures])[1]

        for k, slot in enumerate(block.outputs):
            step = producers.get(slot)
            if step is None or step.n_out != 1 or step.blocks or \
                    any(a >= block.n_prefix for a in step.args):
                continue
            operands = [value(a) for a in step.args]
            if any(x is None for x in operands):
                continue
            reference = reference_result(step.spec.name, operands, step.attrs)
            if reference is None:
                continue
            dtype, got = outputs[k]
            want, scale = reference
            found = reference_mismatch(got, dtype, want, step.spec.name, scale)
            if found:
                raise Finding("mismatch", f"output {k} ({step.location}, {step.spec.name}): "
                              f"{found}")

    def _check_expected(self, outputs, expected: list) -> None:
        if len(outputs) != len(expected):
            raise Finding("mismatch", f"{len(outputs)} outputs, expected {len(expected)}")
        for k, ((dtype, got), want) in enumerate(zip(outputs, expected)):
            want = _given_array(want, got.dtype)
            found = difference((dtype, got), (dtype, want))
            if found:
                raise Finding("mismatch", f"output {k} differs from the expected "
                              f"{want.tolist()!r:.80}: {found}; got {got.tolist()!r:.80}")

    def _check_direct_outputs(self, outputs, refs, raw) -> None:
        """An output that is an input or a constant is exactly that value."""
        if not isinstance(raw, dict) or not isinstance(raw.get("outputs"), list):
            return
        constants = raw.get("constants") or []
        for k, (ref, (dtype, got)) in enumerate(zip(raw["outputs"], outputs)):
            if not isinstance(ref, dict) or len(ref) != 1:
                continue
            (kind, index), = ref.items()
            if kind == "input" and refs[index] is not None:
                want = refs[index]
            elif kind == "const":
                want = np.array(decode_nonfinite(constants[index]["value"]), dtype=got.dtype)
                if dtype == "bfloat16":
                    want = round_bfloat16(want)
            else:
                continue
            if want.dtype != got.dtype:
                want = want.astype(got.dtype)
            if difference((dtype, got), (dtype, want)):
                raise Finding("coercion", f"output {k} ({kind} {index}) is {got.tolist()!r:.80}, "
                              f"but the {kind} holds {want.tolist()!r:.80}")

    def _bad_calls(self, compiled, args, symbolic: bool) -> None:
        """Calls with a wrong input count, dtype or (static programs) shape
        must be refused with a ProgramError."""
        mx = self.mx
        bad = [("one input too many", [*args, mx.zeros((1,))])]
        arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, mx.array)]
        if arrays:
            i, a = arrays[0]
            other = mx.int16 if a.dtype != mx.int16 else mx.float32
            bad.append((f"input {i} as {other}", _replace(args, i, a.astype(other))))
            if not symbolic:
                bad.append((f"input {i} with an extra axis",
                            _replace(args, i, mx.zeros((*a.shape, 2), a.dtype))))
        for what, call_args in bad:
            result = self._attempt(compiled, call_args)
            if not isinstance(result, BaseException):
                raise Finding("coercion", f"a call with {what} was accepted")
            if classify(result) != "program-error":
                raise result


@functools.lru_cache(maxsize=None)
def _limit_kwargs(mp, memory_limit: int) -> dict[str, Any]:
    """``limits=`` sized for the worker's address-space limit, where this
    mlxprog takes one."""
    limits = getattr(mp, "Limits", None)
    if limits is None:
        try:
            from mlxprog.limits import Limits as limits
        except ImportError:
            return {}
    if "limits" not in inspect.signature(mp.compile).parameters or not memory_limit:
        return {}
    usable = max(memory_limit - (768 << 20), 64 << 20)
    return {"limits": limits(max_elements=usable // 16, max_total_elements=usable // 8)}


def _compare(result, reference, name: str, reference_name: str) -> None:
    """Raise a Finding when two call results (outputs or exceptions) differ."""
    import mlxprog as mp

    failed, ref_failed = isinstance(result, BaseException), isinstance(reference, BaseException)
    if failed or ref_failed:
        for exc in (result, reference):
            if isinstance(exc, BaseException) and classify(exc) != "program-error":
                raise exc
        if failed and ref_failed and type(result) is type(reference):
            return
        if failed and ref_failed and isinstance(result, mp.ProgramError) \
                and isinstance(reference, mp.ProgramError):
            raise Finding("mismatch", f"{name} raised {describe(result)}; "
                          f"{reference_name} raised {describe(reference)}")
        who, exc = (name, result) if failed else (reference_name, reference)
        raise Finding("mismatch", f"{who} raised {describe(exc)}; the other returned")
    if len(result) != len(reference):
        raise Finding("mismatch", f"{name}: {len(result)} outputs, {reference_name}: "
                      f"{len(reference)}")
    for k, (a, b) in enumerate(zip(result, reference)):
        found = difference(a, b)
        if found:
            raise Finding("mismatch", f"output {k}: {name} vs {reference_name}: {found}")


def _constant_difference(given: Any, array) -> str | None:
    if not isinstance(given, dict) or "value" not in given:
        return None
    dtype = given.get("dtype")
    value = decode_nonfinite(given["value"])
    if dtype == "bool":
        flat = np.array(value, dtype=object).ravel().tolist()
        if any(v not in (0, 1) for v in flat):
            return f"bool constant from {json.dumps(given['value'])[:40]}"
        return None
    if dtype in ("bfloat16", "complex64"):
        return None
    try:
        want = np.array(value, dtype=_numpy_dtype(dtype))
    except (OverflowError, ValueError, TypeError):
        return f"{json.dumps(given['value'])[:40]} does not fit {dtype} but was accepted"
    if want.dtype.kind in "iu" and np.array(value, dtype=object).ravel().tolist() \
            != want.ravel().tolist():
        return f"{json.dumps(given['value'])[:40]} changed to {want.tolist()!r:.40}"
    return difference(to_numpy(array), (dtype, want))


def _given_array(value: Any, dtype: np.dtype) -> np.ndarray:
    """An array written in a case: nested lists (``"nan"``, ``"inf"``,
    ``"-inf"`` allowed), ``{"zeros": shape}`` (a shape nested lists cannot
    spell, such as ``[0, 2]``) or ``{"full": shape, "value": v}`` (a large
    array of one value)."""
    if isinstance(value, dict) and "zeros" in value:
        return np.zeros(value["zeros"], dtype=dtype)
    if isinstance(value, dict) and "full" in value:
        return np.full(value["full"], decode_nonfinite(value["value"]), dtype=dtype)
    return np.array(decode_nonfinite(value), dtype=dtype)


def _raw_instruction(raw: dict, path: tuple) -> Any:
    """The JSON instruction at a step path like ``(3, "body", 0)``."""
    node: Any = raw
    items = list(path)
    try:
        node = node["instructions"][items.pop(0)]
        while items:
            node = node["subprograms"][items.pop(0)]["instructions"][items.pop(0)]
    except (KeyError, IndexError, TypeError):
        return None
    return node


def _bindings(program, rng) -> list[dict[str, int]]:
    """Dim bindings to call with, in order: none for a static program; for
    a symbolic one the minimum, one more, and a small random value (so one
    trace meets other sizes)."""
    if not program.dims:
        return [{}]
    bindings: list[dict[str, int]] = []
    for step in (0, 1, None):
        binding = {}
        for name, spec in program.dims.items():
            top = spec.min + 4 if spec.max is None else min(spec.max, spec.min + 4)
            value = int(rng.integers(spec.min, top + 1)) if step is None else spec.min + step
            binding[name] = min(value, top)
        if binding not in bindings:
            bindings.append(binding)
    return bindings


def _shape_of(shape, binding: dict[str, int]) -> tuple[int, ...] | None:
    """An input shape at a binding (None where an entry does not evaluate)."""
    sizes = []
    for entry in shape:
        value = entry if isinstance(entry, int) else _evaluate(entry, binding)
        if value is None or value < 0:
            return None
        sizes.append(value)
    return tuple(sizes)


def _evaluate(text: str, binding: dict[str, int]) -> int | None:
    """A dim expression's value (integers, names, + - * // %, parentheses)."""
    try:
        tree = ast.parse(text, mode="eval").body
        return _eval_node(tree, binding)
    except (SyntaxError, ValueError, ZeroDivisionError, KeyError, RecursionError, TypeError):
        return None


def _eval_node(node, binding):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return binding[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval_node(node.operand, binding)
    if isinstance(node, ast.BinOp):
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__,
               ast.FloorDiv: int.__floordiv__, ast.Mod: int.__mod__}
        if type(node.op) in ops:
            left, right = _eval_node(node.left, binding), _eval_node(node.right, binding)
            return ops[type(node.op)](left, right)
    raise ValueError("not a dim expression")


def _elements(shape) -> int:
    total = 1
    for d in shape:
        if not isinstance(d, int):
            return 0
        total *= d
    return total


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype({"bool": "bool", "bfloat16": "float32"}.get(name, name))


def _passed(array: np.ndarray, dtype: str, form: str):
    """What the caller passes for an input: an mx.array, the numpy array or a
    Python list."""
    if form == "numpy":
        return array
    if form == "list" and dtype != "complex64":
        return array.tolist()
    return to_mx(array, dtype)


def _replace(items: list, index: int, value) -> list:
    return [value if i == index else v for i, v in enumerate(items)]


def main() -> None:
    """Serve cases until stdin closes."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    memory_limit = int(os.environ.get("FUZZ_MEMORY_LIMIT", "0"))
    import mlxprog  # noqa: F401  (import once, before the first case's clock starts)

    channel.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        case = Case.from_dict(json.loads(line))
        sys.stderr.write(f"\n=== case {case.kind} seed {case.seed}\n")
        sys.stderr.flush()
        outcome = Trial(case, memory_limit).run()
        channel.write(json.dumps(outcome.__dict__) + "\n")


if __name__ == "__main__":
    main()
