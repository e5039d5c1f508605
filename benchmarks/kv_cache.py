"""KV-cache memory, quality and decode speed of SmolLM2-135M-Instruct (Q4_1
GGUF): the float32 cache side by side with the 8- and 4-bit quantized ones,
at 1k and 4k tokens of context, in one run.

Quality is the perplexity of tests/data/declaration_constitution.txt (2,185
tokens, scored in one window: every token attends to every one before it
through the cache of that layout, as in a generation), and its ratio to the
float cache's (the targets: within 0.5% with 8 bits, 3% with 4).

For each context length the prompt (the start of
tests/data/declaration_constitution.txt, repeated) is prefilled once with the
float cache; each layout then decodes ``--tokens`` greedy tokens after it
from that cache converted to its layout (:meth:`PromptCache.converted
<mlxprog.llm.PromptCache.converted>`: the keys and values quantized as that
layout stores them), so only the decode steps differ. Prints, per layout,
the bytes one token takes in the cache, the cache's size at each context,
decode tokens/s and the ratio to the float cache's.

    python benchmarks/kv_cache.py [--contexts 1024 4096] [--tokens 32]
                                  [--group-size N] [--model PATH] [--no-perplexity]
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import mlx.core as mx

import mlxprog.llm
import mlxprog.native
from mlxprog.llm.perplexity import perplexity

TEXT = Path(__file__).parent.parent / "tests" / "data" / "declaration_constitution.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096],
                        help="tokens of context before decoding")
    parser.add_argument("--tokens", type=int, default=32, help="tokens to decode")
    parser.add_argument("--group-size", type=int, default=None,
                        help="the quantized caches' kv_group_size (default: each width's, "
                        "32 with 4 bits and 64 with 8)")
    parser.add_argument("--model", default=None, help="model file (default: SmolLM2)")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="skip the perplexity (quality) column")
    args = parser.parse_args()

    checkpoint = mlxprog.llm.load_checkpoint(args.model)
    max_length = max(args.contexts) + args.tokens + 8
    print(f"{Path(checkpoint.path).name} | mlx {mx.__version__} ({mx.default_device()}) | "
          f"native kernels: {mlxprog.native.status()} | {platform.machine()}, "
          f"{os.cpu_count()} CPUs | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    layouts = {"float32": {}, "8-bit": dict(kv_bits=8, kv_group_size=args.group_size),
               "4-bit": dict(kv_bits=4, kv_group_size=args.group_size)}
    llms = {name: mlxprog.llm.LLM(checkpoint, max_length=max_length, **kv)
            for name, kv in layouts.items()}
    words = TEXT.read_text(encoding="utf-8")
    speeds: dict[str, dict[int, float]] = {name: {} for name in layouts}
    for context in args.contexts:
        plain = llms["float32"]
        ids = plain.tokenizer.encode(words)
        ids = (ids * (context // len(ids) + 1))[:context]
        prefilled = plain.cache_prompt(ids[:-1], chat=False)
        for name, llm in llms.items():
            # A first run traces the steps at this cache length; the second is timed.
            for _ in range(2):
                out = llm.generate(ids, max_tokens=args.tokens, chat=False,
                                   prompt_cache=prefilled.converted(llm.cache_layout))
            speeds[name][context] = out.stats.decode_tps
    scores = {} if args.no_perplexity else {
        name: perplexity(llm, words).perplexity for name, llm in llms.items()}
    base = speeds["float32"]
    header = " | ".join(f"{c} ctx tok/s (x float)" for c in args.contexts)
    quality = "" if args.no_perplexity else " | perplexity (x float)"
    print(f"{'layout':<8} | bytes/token | " + " | ".join(f"MB at {c}" for c in args.contexts)
          + f" | {header}{quality}")
    for name, llm in llms.items():
        per_token = llm.cache_layout.bytes_per_token()
        sizes = " | ".join(f"{per_token * c / 1e6:8.1f}" for c in args.contexts)
        tps = " | ".join(f"{speeds[name][c]:7.1f} ({speeds[name][c] / base[c]:.2f}x)"
                         for c in args.contexts)
        ppl = "" if args.no_perplexity else (
            f" | {scores[name]:.4f} ({scores[name] / scores['float32']:.4f}x)")
        print(f"{name:<8} | {per_token:11d} | {sizes} | {tps}{ppl}")


if __name__ == "__main__":
    main()
