"""Audit every integer attribute of every op against integer extremes.

For each op whose attributes hold an integer, find small valid programs
around it (registry programs that run ``ok``), covering each of its integer
fields; then set each integer leaf of their attributes, in turn, to each of
:data:`fuzzing.extremes.EXTREME_INTS` and run the program in a fuzz worker
(a subprocess under a memory limit and a timeout, so an abort or a hang is
seen). Anything but ``ok`` or ``program-error`` is a defect.

Run:  python tools/audit_int_attrs.py --jobs 2 --out /tmp/audit.json [--ops split,pad]
Exit status: 1 when any defect was found.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzzing import Case, Worker  # noqa: E402
from fuzzing.choice import RandomChooser  # noqa: E402
from fuzzing.document import Document  # noqa: E402
from fuzzing.extremes import EXTREME_INTS, int_attr_ops, int_paths, with_value  # noqa: E402
from fuzzing.registry_gen import registry_program  # noqa: E402

SEEDS = 120
"""Registry programs tried per op when looking for valid ones."""

# Written baselines for ops whose random programs are rarely valid, or
# rarely set some integer field: op -> (operand shapes and dtypes, attrs).
WRITTEN: dict[str, list[tuple[list[tuple[list[int], str]], dict]]] = {
    "conv_general": [([([1, 5, 5, 2], "float32"), ([3, 3, 3, 2], "float32")],
                      {"stride": [1, 1], "padding": [[0, 1], [1, 0]], "kernel_dilation": [1, 1],
                       "input_dilation": [1, 1], "groups": 1})],
    "conv_transpose": [([([1, 5, 2], "float32"), ([3, 3, 2], "float32")],
                        {"stride": [1], "padding": [0], "dilation": [1], "output_padding": [0],
                         "groups": 1})],
    "slice": [([([4, 4], "float32")], {"lengths": [2, 2], "starts": [1, 1], "strides": [1, 2]})],
    "put_slice": [([([4, 4], "float32"), ([2, 2], "float32")], {"starts": [1, 1]})],
    "gather": [([([4, 3], "float32"), ([2, 1], "int32")], {"axes": [0], "slice_sizes": [1, 3]})],
    "fast_rope": [([([1, 2, 4, 8], "float32")], {"dims": 8, "offset": 1})],
    "fast_rope_positions": [([([1, 2, 4, 8], "float32"), ([4], "int32")], {"dims": 8})],
    "fast_rope_with_freqs": [([([1, 2, 4, 8], "float32"), ([4], "float32")],
                              {"dims": 8, "offset": 1})],
    "window_scatter_max": [([([4, 4], "float32"), ([3, 3], "float32"), ([], "float32")],
                            {"window_dimensions": [2, 2], "window_strides": [1, 1],
                             "padding": [[0, 0], [0, 0]]})],
    "sample": [([([2, 8], "float32"), ([2], "uint32")], {"top_k": 2})],
    "top_k": [([([2, 8], "float32")], {"k": 2})],
    "argpartition": [([([2, 8], "float32")], {"kth": 2, "axis": -1})],
    "eye": [([], {"n": 3, "m": 4, "k": 1})],
    "split": [([([6], "float32")], {"indices_or_sections": [2, 4]}),
              ([([6], "float32")], {"indices_or_sections": 3})],
    "pad": [([([3, 3], "float32"), ([], "float32")], {"pad_width": [[1, -1], [0, 2]]})],
    "reshape": [([([2, 3], "float32")], {"shape": [3, -1]})],
    "random_split": [([([2], "uint32")], {"num": 3})],
    "random_categorical": [([([2], "uint32"), ([2, 4], "float32")], {"num_samples": 3})],
}


def written(op: str) -> list[dict]:
    """The written baselines of ``op`` as programs."""
    programs = []
    for operands, attrs in WRITTEN.get(op, []):
        doc = Document(f"audit_{op}")
        refs = [doc.input(shape, dtype) for shape, dtype in operands]
        n_out = 1 + (op in ("sample", "top_k")) + (2 if isinstance(
            attrs.get("indices_or_sections"), list) else 0)
        if op == "split" and isinstance(attrs["indices_or_sections"], int):
            n_out = attrs["indices_or_sections"]
        first = doc.add(op, refs, attrs, n_out)
        programs.append(doc.output(*[{"result": first["result"] + k}
                                     for k in range(n_out)]).data)
    return programs


class Pool:
    """One fuzz worker per thread."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.local = threading.local()
        self.all: list[Worker] = []
        self.lock = threading.Lock()

    def run(self, text: str):
        worker = getattr(self.local, "worker", None)
        if worker is None:
            worker = self.local.worker = Worker(timeout=self.timeout)
            with self.lock:
                self.all.append(worker)
        return worker.run(Case(text=text, kind="audit", options={"calls": 1}))

    def close(self) -> None:
        for worker in self.all:
            worker.close()


def _field_of(path: tuple) -> str:
    """A leaf's field, with list positions kept (``pad_width[0][1]``)."""
    head, *rest = path
    return str(head) + "".join(f"[{p}]" for p in rest)


def _form(path: tuple) -> tuple:
    """A leaf's field and nesting, list positions left out: an int
    ``indices_or_sections`` and an entry of a list of them differ."""
    return tuple(p if isinstance(p, str) else "*" for p in path)


def baselines(pool: Pool, op: str) -> list[dict]:
    """Valid programs around ``op`` that together reach every integer field
    the generator sets."""
    found, covered = [], set()
    for program in written(op):
        if pool.run(json.dumps(program)).cls == "ok":
            found.append(program)
            covered |= {_form(p) for p in int_paths(program["instructions"][0]["attrs"]) if p}
        else:
            print(f"note: the written baseline of {op} does not run", file=sys.stderr)
    for k in range(SEEDS):
        program = registry_program(RandomChooser(f"audit:{op}:{k}"), op)
        attrs = program["instructions"][0].get("attrs")
        fields = {_form(p) for p in int_paths(attrs) if p} if isinstance(attrs, dict) else set()
        if not fields - covered:
            continue
        if pool.run(json.dumps(program)).cls == "ok":
            found.append(program)
            covered |= fields
    return found


def audit_op(pool: Pool, op: str) -> dict:
    """Outcomes of every extreme in every integer leaf of ``op``'s baselines."""
    results, seen = [], set()  # leaf paths tried
    programs = baselines(pool, op)
    for program in programs:
        attrs = program["instructions"][0]["attrs"]
        for path in int_paths(attrs):
            if not path or path in seen:
                continue
            seen.add(path)
            for value in EXTREME_INTS:
                trial = json.loads(json.dumps(program))
                trial["instructions"][0]["attrs"] = with_value(attrs, path, value)
                text = json.dumps(trial)
                outcome = pool.run(text)
                results.append({"field": _field_of(path), "value": value, "cls": outcome.cls,
                                "error": outcome.error[:300],
                                **({"program": text} if outcome.is_bug else {})})
    return {"op": op, "baselines": len(programs), "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated ops (default: every op with integers)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--out", help="write every outcome here (JSON)")
    args = parser.parse_args(argv)
    ops = args.ops.split(",") if args.ops else sorted({*int_attr_ops(), *WRITTEN})
    pool = Pool(args.timeout)
    try:
        with ThreadPoolExecutor(args.jobs) as executor:
            reports = list(executor.map(lambda op: audit_op(pool, op), ops))
    finally:
        pool.close()
    defects = 0
    print(f"{'op':<32}{'base':>5}  fields: outcomes (ok/program-error/defects)")
    for report in reports:
        by_field = collections.defaultdict(collections.Counter)
        for r in report["results"]:
            by_field[r["field"].split("[")[0]][r["cls"]] += 1
        cells = []
        for name, counts in sorted(by_field.items()):
            bad = sum(n for cls, n in counts.items() if cls not in ("ok", "program-error"))
            defects += bad
            cells.append(f"{name} {counts['ok']}/{counts['program-error']}/{bad}")
        print(f"{report['op']:<32}{report['baselines']:>5}  {', '.join(cells) or '-'}")
    for report in reports:
        for r in report["results"]:
            if "program" in r:
                print(f"DEFECT {report['op']} {r['field']}={r['value']}: {r['cls']} "
                      f"{r['error'][:200]}\n  {r['program'][:600]}")
    if args.out:
        Path(args.out).write_text(json.dumps(reports, indent=1) + "\n")
    print(f"{defects} defects")
    return int(bool(defects))


if __name__ == "__main__":
    sys.exit(main())
