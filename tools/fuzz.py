"""Fuzz mlxprog with hostile programs and report the outcomes by class.

Generates programs three ways (random registry ops with random attributes,
structural mutations of ``examples/*.json``, targeted attacks; see
``tools/fuzzing``), runs each in a worker subprocess under an address-space
limit and a wall timeout (load, validate, compile, call compiled and eager
with random inputs, compare, call with mismatched inputs) and classifies it:
ok, program-error (expected), or a bug: other-exception, crash, hang,
mismatch, memory, coercion. Each bug's program is written to ``--out``,
minimised (the first few of each kind of failure).

Run:  python tools/fuzz.py --count 10000 --seed 1 --jobs 2 --out /tmp/fuzz
      python tools/fuzz.py --replay /tmp/fuzz/bug-00042-crash.json
Exit status: 1 when any bug was found.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzzing import (  # noqa: E402  (tools/ is on the path only from here)
    BUG_CLASSES, KINDS, OUTCOMES, Case, Outcome, Worker, generate, minimise)
from fuzzing.choice import RandomChooser  # noqa: E402

MINIMISE_PER_GROUP = 2
"""Bugs of one group (class, stage, error type, first op) that get minimised."""


def parse_size(text: str) -> int:
    """``4G``, ``512M``, ``0`` (no limit) or a byte count."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def case_for(seed: int, index: int, kinds: list[str]) -> Case:
    """Case ``index`` of a run: a pure function of the seed and the index."""
    case = generate(RandomChooser(f"{seed}:{index}"), kinds[index % len(kinds)])
    case.note = f"seed {seed} index {index}"
    return case


def first_op(case: Case) -> str:
    """The first instruction's op, for grouping bugs."""
    try:
        instructions = json.loads(case.text).get("instructions") or [{}]
        return str(instructions[0].get("op", "?"))
    except (ValueError, AttributeError, TypeError, RecursionError, IndexError):
        return "?"


class Run:
    """A fuzz run: cases handed to ``jobs`` workers, outcomes collected."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.kinds = args.kinds.split(",")
        self.counts: collections.Counter = collections.Counter()
        self.by_kind: collections.Counter = collections.Counter()
        self.groups: dict[tuple, list[int]] = collections.defaultdict(list)
        self.rejections: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.next_index = 0
        self.done = 0
        self.started = time.monotonic()
        self.out = Path(args.out) if args.out else None
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)

    def worker(self) -> Worker:
        return Worker(timeout=self.args.timeout, memory_limit=self.args.memory_limit)

    def take(self) -> int | None:
        with self.lock:
            if self.next_index >= self.args.count:
                return None
            self.next_index += 1
            return self.next_index - 1

    def job(self) -> None:
        with self.worker() as worker:
            while (index := self.take()) is not None:
                case = case_for(self.args.seed, index, self.kinds)
                self.record(index, case, worker.run(case))

    def record(self, index: int, case: Case, outcome: Outcome) -> None:
        with self.lock:
            self.counts[outcome.cls] += 1
            self.by_kind[case.kind, outcome.cls] += 1
            self.done += 1
            if outcome.cls == "program-error":
                self.rejections[outcome.error.split(":", 1)[0][:60]] += 1
            if outcome.is_bug:
                group = (*outcome.signature, first_op(case))
                self.groups[group].append(index)
                self.save(index, case, outcome)
            if self.done % self.args.progress == 0:
                rate = self.done / (time.monotonic() - self.started)
                bugs = sum(self.counts[c] for c in BUG_CLASSES)
                print(f"[{self.done}/{self.args.count}] {rate:.1f} cases/s, {bugs} bugs",
                      file=sys.stderr, flush=True)

    def save(self, index: int, case: Case, outcome: Outcome) -> None:
        if self.out:
            path = self.out / f"bug-{index:05d}-{outcome.cls}.json"
            path.write_text(json.dumps({"case": case.to_dict(), "outcome": outcome.__dict__},
                                       indent=1) + "\n")

    def minimise_bugs(self) -> None:
        """Shrink the first bugs of each group (and save them beside the originals)."""
        if not self.out or not self.args.minimise:
            return
        with self.worker() as worker:
            for group, indices in sorted(self.groups.items()):
                for index in indices[:MINIMISE_PER_GROUP]:
                    path = self.out / f"bug-{index:05d}-{group[0]}.json"
                    saved = json.loads(path.read_text())
                    case, outcome = Case.from_dict(saved["case"]), Outcome(**saved["outcome"])
                    small = minimise(case, outcome, worker.run)
                    saved["minimised"] = small.text
                    path.write_text(json.dumps(saved, indent=1) + "\n")

    def report(self) -> dict:
        elapsed = time.monotonic() - self.started
        print(f"\n{self.done} programs in {elapsed:.0f} s (seed {self.args.seed}, timeout "
              f"{self.args.timeout:g} s, memory limit {self.args.memory_limit >> 20} MiB)")
        print("\noutcome            " + "".join(f"{k:>10}" for k in self.kinds) + "     total")
        for cls in OUTCOMES:
            row = "".join(f"{self.by_kind[k, cls]:>10}" for k in self.kinds)
            print(f"{cls:<19}{row}{self.counts[cls]:>10}")
        if self.groups:
            print("\nbugs by class, stage, error and first op (indices):")
            for group, indices in sorted(self.groups.items(), key=lambda g: -len(g[1])):
                shown = ", ".join(map(str, indices[:8])) + (" ..." if len(indices) > 8 else "")
                print(f"  {len(indices):>5}  {' | '.join(g or '-' for g in group)}  [{shown}]")
        if self.args.verbose:
            print("\nmost common program errors:")
            for text, n in self.rejections.most_common(25):
                print(f"  {n:>5}  {text}")
        summary = {"programs": self.done, "seconds": round(elapsed, 1), "counts": dict(self.counts),
                   "by_kind": {f"{k}/{c}": n for (k, c), n in self.by_kind.items()},
                   "bugs": [{"group": list(g), "indices": i} for g, i in self.groups.items()]}
        if self.out:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary


def replay(args: argparse.Namespace) -> int:
    """Run saved cases (a bug file written by a run, or a case JSON) again."""
    status = 0
    workers: dict[int, Worker] = {}
    for name in args.replay:
        saved = json.loads(Path(name).read_text())
        cases = saved if isinstance(saved, list) else [saved.get("case", saved)]
        for entry in cases:  # a bug file, a case, or a tests/fuzz_cases file
            case = Case.from_dict(entry)
            if "minimised" in saved and not args.original:
                case.text = saved["minimised"]
            limit = case.options.get("memory_limit", args.memory_limit)
            if limit not in workers:
                workers[limit] = Worker(timeout=args.timeout, memory_limit=limit)
            outcome = workers[limit].run(case)
            print(f"{name} {entry.get('name', '')}: {outcome.describe()}\n"
                  f"  program: {case.text[:2000]}")
            status |= outcome.is_bug
    for worker in workers.values():
        worker.close()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="programs to run")
    parser.add_argument("--seed", type=int, default=0, help="run seed")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per program")
    parser.add_argument("--memory-limit", type=parse_size, default=4 << 30,
                        help="RLIMIT_AS of the workers (e.g. 4G; 0: none)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", help="directory for the failing programs and summary.json")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"generators, comma-separated ({', '.join(KINDS)})")
    parser.add_argument("--no-minimise", dest="minimise", action="store_false",
                        help="keep the bugs' programs as generated")
    parser.add_argument("--progress", type=int, default=500, help="report every N programs")
    parser.add_argument("--verbose", action="store_true", help="also list common program errors")
    parser.add_argument("--replay", nargs="+", metavar="FILE", help="rerun saved cases instead")
    parser.add_argument("--original", action="store_true",
                        help="with --replay: run the original, not the minimised program")
    args = parser.parse_args(argv)
    if args.replay:
        return replay(args)
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; one of {', '.join(KINDS)}")
    run = Run(args)
    threads = [threading.Thread(target=run.job) for _ in range(max(args.jobs, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    run.minimise_bugs()
    summary = run.report()
    return int(any(summary["counts"].get(c) for c in BUG_CLASSES))


if __name__ == "__main__":
    sys.exit(main())
