"""Speculative decoding on SmolLM2-135M-Instruct (Q4_1 GGUF), side by side
with plain decoding, on copy-heavy prompts (completions that copy a
function with a change and a paragraph with the names changed; a chat
request for a code edit, which the 135M model mostly rewrites rather than
copies) and an open-ended one.

- ``plain``: greedy decoding, one decode step a token (``draft="none"``);
- ``prompt-lookup``: drafts from the sequence's own n-grams
  (``draft="prompt-lookup"``), verified ``--num-draft-tokens`` at a time;
- ``draft-model``: drafts from ``--draft-model`` (default: SmolLM2 itself,
  which checks correctness and measures the overhead: a model drafting for
  itself is never faster), skipped with ``--no-draft-model``.

Every mode decodes greedily from the same prompt, so each must produce the
plain tokens (the script checks). Each mode is called once to warm up, then
``--runs`` rounds call each once, rotating the order; the table shows the
median decode tok/s (tokens after the first over the time from the first to
the last), the median of the per-round ratios to plain (calls made moments
apart, so load from other processes mostly cancels) and the acceptance rate
(accepted / drafted tokens). Before that it times one verify step of T
tokens against one decode step, at the copy-code prompt's cache length.

    python benchmarks/speculative.py [--max-tokens 128] [--runs 3]
                                     [--num-draft-tokens 3] [--draft-model PATH]
                                     [--no-draft-model]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx

import mlxprog.llm
from mlxprog.llm.engine import Engine
from mlxprog.llm.programs import DecodeInputs, VerifyInputs

PARAGRAPH = (
    "Alice met Bob at the old library on Main Street one rainy Tuesday in October. Alice told "
    "Bob that the library would close for good at the end of the month, because the city had "
    "sold the building to a company that wanted to turn it into offices. Bob said he would "
    "miss the quiet reading room on the second floor, where Alice and he had first met ten "
    "years before, and the tall windows that looked out over the park.")
CODE = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order["status"] == "paid":
            total += order["amount"]
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
"""
#: name -> (prompt, chat): whether the chat template wraps it.
PROMPTS = {
    # A completion the model writes by copying the function above it.
    "copy-code": (f"# version 1\n{CODE}\n# version 2: the same function, with total renamed to "
                  "revenue\n", False),
    # A completion that repeats a paragraph with the names changed (as far as
    # the 135M model does: it copies the start, then goes its own way).
    "names": (f"Original:\n{PARAGRAPH}\n\nThe same paragraph with Alice renamed to Carol "
              "and Bob renamed to Dave:\n", False),
    # A chat request to copy with a change: SmolLM2-135M rewrites more than it copies.
    "chat-code": ("Rename the variable `total` to `revenue` in this Python function and show "
                  f"the whole function:\n\n```python\n{CODE}```", True),
    "open-ended": ("Write a short story about a lighthouse keeper who finds a message in a "
                   "bottle.", True),
}


def time_verify(llm: mlxprog.llm.LLM, prompt: str, chat: bool, repeats: int = 20
                ) -> dict[int, float]:
    """Milliseconds of one decode step (key 0) and of one verify step of T
    tokens (T = 1..6), over the prompt's caches; each timed as ``repeats``
    calls dispatched back to back (as the decode loop dispatches its
    steps), so the host's share overlaps the device's."""
    engine = Engine(llm)
    engine.add(llm.request(prompt, mlxprog.llm.GenerationOptions(max_tokens=8, chat=chat)))
    offset = engine.offset
    room = [(0, 0), (0, 0), (0, 8), (0, 0)]   # slots for the verify's tokens
    caches = tuple(mx.pad(x, room) for x in engine.caches)
    common = dict(rope_offset=mx.array([offset], dtype=mx.int32),
                  cache_offset=mx.array(offset, dtype=mx.int32),
                  key_mask=mx.ones((1, caches[0].shape[2]), dtype=mx.bool_), caches=caches)
    decode, verify = llm.executable("decode"), llm.executable("verify")
    calls = {0: lambda: decode(**DecodeInputs(tokens=mx.array([1], dtype=mx.int32),
                                              key=mx.random.key(0),
                                              **common).by_name(llm.cache_layout))}
    for t in range(1, 7):
        calls[t] = (lambda t=t: verify(**VerifyInputs(
            tokens=mx.ones((1, t), dtype=mx.int32), **common).by_name(llm.cache_layout)))
    out = {}
    for measured in (False, True):   # a first pass warms every call up
        for t, call in calls.items():
            start = time.perf_counter()
            outputs = []
            for _ in range(repeats):
                outputs.append(call())
                mx.async_eval(outputs[-1])
            mx.eval(outputs)
            if measured:
                out[t] = (time.perf_counter() - start) / repeats * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-draft-tokens", type=int, default=3)
    parser.add_argument("--draft-model", default=None,
                        help="the draft model (default: SmolLM2 drafting for itself)")
    parser.add_argument("--no-draft-model", action="store_true")
    args = parser.parse_args()

    llm = mlxprog.llm.load(
        draft_model=None if args.no_draft_model
        else args.draft_model or mlxprog.llm.model_files.default_model_path())
    costs = time_verify(llm, *PROMPTS["copy-code"])
    print("verify step cost (ms; T tokens, vs one decode step "
          f"{costs[0]:.1f} ms): " + ", ".join(f"T={t}: {ms:.1f} ({ms / costs[0]:.2f}x)"
                                            for t, ms in costs.items() if t))
    modes = ["plain", "prompt-lookup"] + ([] if args.no_draft_model else ["draft-model"])
    drafts = {"plain": "none", "prompt-lookup": "prompt-lookup", "draft-model": "model"}
    print(f"\n{'prompt':<12} {'mode':<14} {'tokens':>6} {'decode tok/s':>12} "
          f"{'vs plain':>9} {'acceptance':>10}  same tokens")
    for name, (prompt, chat) in PROMPTS.items():
        def generate(mode: str):
            return llm.generate(prompt, max_tokens=args.max_tokens, draft=drafts[mode],
                                num_draft_tokens=args.num_draft_tokens, chat=chat)
        reference = {mode: generate(mode) for mode in modes}   # warm up
        speeds: dict[str, list[float]] = {mode: [] for mode in modes}
        ratios: dict[str, list[float]] = {mode: [] for mode in modes}
        for run in range(args.runs):
            order = modes[run % len(modes):] + modes[:run % len(modes)]
            results = {mode: generate(mode) for mode in order}
            for mode in modes:
                speeds[mode].append(results[mode].stats.decode_tps)
                ratios[mode].append(results[mode].stats.decode_tps
                                    / results["plain"].stats.decode_tps)
                reference[mode] = results[mode]
        for mode in modes:
            stats = reference[mode].stats
            same = reference[mode].tokens == reference["plain"].tokens
            acceptance = f"{stats.acceptance:.0%}" if stats.drafted_tokens else "-"
            print(f"{name:<12} {mode:<14} {stats.generated_tokens:>6} "
                  f"{statistics.median(speeds[mode]):>12.1f} "
                  f"{statistics.median(ratios[mode]):>8.2f}x {acceptance:>10}  {same}")


if __name__ == "__main__":
    main()
