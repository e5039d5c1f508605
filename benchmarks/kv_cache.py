"""KV-cache memory, quality and decode speed of SmolLM2-135M-Instruct (Q4_1
GGUF): the float32 cache side by side with the 8- and 4-bit quantized ones
(each with its default recent ring of the last 16 tokens, ``kv_recent``)
and the 4-bit one without that window ("4-bit/0"), at 1k and 4k tokens of
context, in one run.

Quality is the perplexity of tests/data/declaration_constitution.txt (2,185
tokens, scored in one window: every token attends to every one before it
through the cache of that layout, as in a generation), and its ratio to the
float cache's (the targets: within 0.5% with 8 bits, 3% with 4). ``--texts``
scores other texts too (each its first ``--score-tokens``), then prints each
ratio and their mean: one text's ratio moves by a few percent with any
change to the rounding, so a few texts say more than one. ``--llama-cpp``
scores the same texts with llama.cpp (llama-cpp-python, benchmark only) on
the same GGUF file with its f16, q8_0 and q4_0 caches (``type_k`` and
``type_v``; flash attention, which its quantized value caches need), each
text tokenized by llama.cpp and cut to the same length, its ratios to its
own f16 cache printed in a second table: the peer's cost of the same cache
widths.

For each context length the prompt (the start of
tests/data/declaration_constitution.txt, repeated) is prefilled once with the
float cache; each layout then decodes ``--tokens`` greedy tokens after it
from that cache converted to its layout (:meth:`PromptCache.converted
<mlxprog.llm.PromptCache.converted>`: the keys and values quantized as that
layout stores them), so only the decode steps differ. Prints, per layout,
the bytes one token takes in the cache, the cache's size at each context,
decode tokens/s and the ratio to the float cache's.

    python benchmarks/kv_cache.py [--contexts [N ...]] [--tokens 32]
                                  [--group-size N] [--model PATH] [--no-perplexity]
                                  [--texts FILE ...] [--score-tokens N] [--llama-cpp]

``--contexts`` with no lengths skips the speed columns.
"""

from __future__ import annotations

import argparse
import os
import platform
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlxprog.llm
import mlxprog.native
from mlxprog.errors import ModelError
from mlxprog.llm.perplexity import perplexity

TEXT = Path(__file__).parent.parent / "tests" / "data" / "declaration_constitution.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="*", default=[1024, 4096],
                        help="tokens of context before decoding (none: skip the speed columns)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens to decode")
    parser.add_argument("--group-size", type=int, default=None,
                        help="the quantized caches' kv_group_size (default: each width's, "
                        "32 with 4 bits and 64 with 8)")
    parser.add_argument("--model", default=None, help="model file (default: SmolLM2)")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="skip the perplexity (quality) columns")
    parser.add_argument("--texts", type=Path, nargs="+", default=[TEXT],
                        help="texts to score (default: tests/data/declaration_constitution.txt)")
    parser.add_argument("--score-tokens", type=int, default=None,
                        help="score each text's first N tokens (default: all of it)")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also score the texts with llama.cpp's f16, q8_0 and q4_0 caches")
    args = parser.parse_args()
    if any(context < 2 for context in args.contexts):
        parser.error(f"--contexts: each must be at least 2 tokens, got {args.contexts}")
    if args.score_tokens is not None and args.score_tokens < 2:
        parser.error(f"--score-tokens must be at least 2, got {args.score_tokens}")
    for text in args.texts:
        if not text.is_file():
            parser.error(f"--texts: {text} is not a file")
    if args.llama_cpp:
        if args.no_perplexity:
            parser.error("--llama-cpp scores perplexity: drop --no-perplexity")
        try:
            import llama_cpp  # noqa: F401  (checked before the long mlxprog runs)
        except ImportError:
            parser.error("--llama-cpp needs llama-cpp-python (pip install llama-cpp-python)")

    try:
        checkpoint = mlxprog.llm.load_checkpoint(args.model)
    except ModelError as error:
        parser.error(f"--model: {error}")
    if args.llama_cpp and Path(checkpoint.path).suffix != ".gguf":
        parser.error(f"--llama-cpp: llama.cpp reads GGUF files, not {checkpoint.path}")
    max_length = max(args.contexts, default=0) + args.tokens + 8
    print(f"{Path(checkpoint.path).name} | mlx {mx.__version__} ({mx.default_device()}) | "
          f"native kernels: {mlxprog.native.status()} | {platform.machine()}, "
          f"{os.cpu_count()} CPUs | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    # The quantized layouts keep the last 16 tokens in float (the default
    # kv_recent); "4-bit/0" is the 4-bit cache without that window.
    layouts = {"float32": {}, "8-bit": dict(kv_bits=8, kv_group_size=args.group_size),
               "4-bit": dict(kv_bits=4, kv_group_size=args.group_size),
               "4-bit/0": dict(kv_bits=4, kv_group_size=args.group_size, kv_recent=0)}
    llms = {name: mlxprog.llm.LLM(checkpoint, max_length=max_length, **kv)
            for name, kv in layouts.items()}
    speeds: dict[str, dict[int, float]] = {name: {} for name in layouts}
    for context in args.contexts:
        plain = llms["float32"]
        ids = plain.tokenizer.encode(TEXT.read_text(encoding="utf-8"))
        ids = (ids * (context // len(ids) + 1))[:context]
        prefilled = plain.cache_prompt(ids[:-1], chat=False)
        for name, llm in llms.items():
            # A first run traces the steps at this cache length; the second is timed.
            for _ in range(2):
                out = llm.generate(ids, max_tokens=args.tokens, chat=False,
                                   prompt_cache=prefilled.converted(llm.cache_layout))
            speeds[name][context] = out.stats.decode_tps
    texts = [] if args.no_perplexity else args.texts
    scores = {name: [] for name in layouts}
    for text in texts:
        ids = llms["float32"].tokenizer.encode(text.read_text(encoding="utf-8"))
        ids = ids[:args.score_tokens]
        for name, llm in llms.items():
            scores[name].append(perplexity(llm, ids).perplexity)
        print(f"scored {text.name}: {len(ids)} tokens")
    base = speeds["float32"]
    columns = ["layout  ", "bytes/token"] + [f"MB at {c}" for c in args.contexts]
    columns += [f"{c} ctx tok/s (x float)" for c in args.contexts]
    columns += [f"{text.name} perplexity (x float)" for text in texts]
    columns += ["mean x float"] if len(texts) > 1 else []
    print(" | ".join(columns))
    for name, llm in llms.items():
        per_token = llm.cache_layout.bytes_per_token()
        row = [f"{name:<8}", f"{per_token:11d}"]
        row += [f"{per_token * c / 1e6:8.1f}" for c in args.contexts]
        row += [f"{speeds[name][c]:7.1f} ({speeds[name][c] / base[c]:.2f}x)"
                for c in args.contexts]
        ratios = [score / plain for score, plain in zip(scores[name], scores["float32"])]
        row += [f"{score:.4f} ({ratio:.4f}x)" for score, ratio in zip(scores[name], ratios)]
        row += [f"{sum(ratios) / len(ratios):.4f}x"] if len(texts) > 1 else []
        print(" | ".join(row))
    if args.llama_cpp:
        print_llama_cpp(checkpoint, texts, args.score_tokens)


#: llama.cpp's cache types (ggml type ids) and the bytes one element takes:
#: q8_0 and q4_0 store 32 values as 32 or 16 bytes plus one float16 scale.
LLAMA_CPP_CACHES = {"f16": (1, 2.0), "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32)}


def llama_cpp_perplexity(llm, ids: list[int]) -> float:
    """The perplexity of ``ids`` under a llama-cpp-python model built with
    ``logits_all``: every token after the first scored, as
    :func:`~mlxprog.llm.perplexity.perplexity` scores them."""
    llm.reset()
    llm.eval(ids)
    logits = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    logprobs = logits[np.arange(len(ids) - 1), ids[1:]] - log_norm
    return float(np.exp(-logprobs.mean()))


def print_llama_cpp(checkpoint, texts: list[Path], score_tokens: int | None) -> None:
    """The perplexity of each text under llama.cpp with each cache type of
    :data:`LLAMA_CPP_CACHES`, as a table of ratios to its f16 cache."""
    import llama_cpp

    config = checkpoint.config
    elements = 2 * config.num_layers * config.num_kv_heads * config.head_dim
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    vocabulary = llama_cpp.Llama(model_path=str(checkpoint.path), vocab_only=True,
                                 verbose=False)
    texts_ids = [vocabulary.tokenize(text.read_bytes(), add_bos=False)[:score_tokens]
                 for text in texts]
    context = max(len(ids) for ids in texts_ids)
    scores: dict[str, list[float]] = {}
    for name, (ggml_type, _) in LLAMA_CPP_CACHES.items():
        llm = llama_cpp.Llama(model_path=str(checkpoint.path), n_ctx=context,
                              n_batch=context, logits_all=True, flash_attn=True,
                              type_k=ggml_type, type_v=ggml_type, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
        scores[name] = [llama_cpp_perplexity(llm, ids) for ids in texts_ids]
        del llm  # its context's memory, before the next one's
    columns = ["llama.cpp cache", "bytes/token"]
    columns += [f"{text.name} perplexity (x f16)" for text in texts]
    columns += ["mean x f16"] if len(texts) > 1 else []
    print(" | ".join(columns))
    for name, (_, size) in LLAMA_CPP_CACHES.items():
        ratios = [score / base for score, base in zip(scores[name], scores["f16"])]
        row = [f"{name:<15}", f"{round(elements * size):11d}"]
        row += [f"{score:.4f} ({ratio:.4f}x)" for score, ratio in zip(scores[name], ratios)]
        row += [f"{sum(ratios) / len(ratios):.4f}x"] if len(texts) > 1 else []
        print(" | ".join(row))


if __name__ == "__main__":
    main()
