"""Perplexity of SmolLM2-135M-Instruct (Q4_1 GGUF) in both numerics modes.

Scores a text (default: tests/data/declaration_constitution.txt, the
Declaration of Independence and the start of the US Constitution, 2,185
tokens) with :func:`mlxprog.llm.perplexity.perplexity`, once with
``numerics="exact"`` (MLX's float products) and once with ``numerics="int8"``
(activations quantized to 8 bits per weight group, integer dot products), and
prints both perplexities, their ratio (int8 / exact; the issue's bound is
1.01) and how long each took.

    python benchmarks/perplexity.py [--text FILE] [--segment-length N] [--stride N]
                                    [--chunk 256] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import mlx.core as mx

import mlxprog.llm
import mlxprog.native
from mlxprog.llm.perplexity import DEFAULT_CHUNK, perplexity

DEFAULT_TEXT = Path(__file__).parent.parent / "tests" / "data" / "declaration_constitution.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="the text to score")
    parser.add_argument("--model", default=None, help="model file (default: SmolLM2)")
    parser.add_argument("--segment-length", type=int, default=None,
                        help="tokens of context per segment (default: the whole text)")
    parser.add_argument("--stride", type=int, default=None,
                        help="how far segments start apart (default: half the segment length)")
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                        help="tokens per program call")
    args = parser.parse_args()

    checkpoint = mlxprog.llm.load_checkpoint(args.model)
    text = args.text.read_text(encoding="utf-8")
    print(f"{Path(checkpoint.path).name} | {args.text.name} | mlx {mx.__version__} "
          f"({mx.default_device()}) | native kernels: {mlxprog.native.status()} | "
          f"{platform.machine()}, {os.cpu_count()} CPUs | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results = {}
    for numerics in ("exact", "int8"):
        llm = mlxprog.llm.LLM(checkpoint, numerics=numerics)
        results[numerics] = r = perplexity(llm, text, segment_length=args.segment_length,
                                           stride=args.stride, chunk=args.chunk)
        print(f"{numerics}: perplexity {r.perplexity:.4f} (nll {r.nll:.5f} nats/token) over "
              f"{r.tokens} tokens | segment length {r.segment_length}, stride {r.stride}, "
              f"chunk {r.chunk} | "
              f"{r.seconds:.1f} s, {r.tokens / r.seconds:.1f} tok/s")
    exact, int8 = results["exact"], results["int8"]
    ratio = int8.perplexity / exact.perplexity
    print(f"int8 / exact perplexity: {ratio:.4f} ({(ratio - 1) * 100:+.2f}%; the bound is "
          f"+1.00%: {'met' if ratio <= 1.01 else 'NOT met'})")


if __name__ == "__main__":
    main()
