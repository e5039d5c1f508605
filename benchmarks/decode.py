"""Greedy generation on SmolLM2-135M-Instruct (Q4_1 GGUF), side by side.

- ``mlxprog``: ``mlxprog.llm.load(...).generate(...)``: the prefill and decode
  programs, compiled, driven by the LLM's pipelined host loop, with
  mlxprog's native CPU kernels (quantized matmul, RMS norm, RoPE, attention),
  in the exact numerics (``numerics="exact"``: MLX's float products);
- ``mlxprog-int8``: the same with ``numerics="int8"`` (llama.cpp's numerics:
  activations quantized to 8 bits per weight group, integer dot products;
  the LLM layer's default on the CPU);
- ``mlxprog-mlx-ops``: the same with ``native=False``: MLX's own CPU ops;
- ``hand``:    the same model and loop written directly in MLX: a compiled
  decode step over a KV cache that grows in chunks (fixed shape within a
  chunk), ``mx.fast`` norms, RoPE and attention, quantized matmuls, and the
  same greedy loop with ``mx.async_eval`` pipelining; the "how fast can this
  go" yardstick;
- ``mlx-lm``:  ``mlx_lm.generate.generate_step`` driving mlx-lm's llama model
  loaded with the same weights (skipped when ``mlx_lm`` is not importable);
- ``llama.cpp``: ``llama_cpp.Llama`` (llama-cpp-python, a benchmark-only
  extra: ``pip install llama-cpp-python``, built from source) on the same
  GGUF file with one thread per core, fed the same prompt ids, greedy
  (skipped when ``llama_cpp`` is not importable).

All start from the same prompt ids (the chat template applied), decode
greedily and stop at EOS or ``--max-tokens``; the script checks that they
produce the same tokens (llama.cpp's own kernels, and mlxprog's int8
numerics, round differently, so their tokens may part from the others' after a
while; the script says where, and where mlxprog-int8's part from llama.cpp's). The
cold time to first token is each
implementation's first call in a fresh process of its own (programs built and
traced; MLX's fused CPU kernels loaded from ``$TMPDIR/mlx``, or compiled with
the system C++ compiler if not cached there). In this process each
implementation is then called once to warm up (and to check its tokens), and
``--runs`` rounds call each implementation once, rotating the order. The
table shows medians; the mlxprog / other ratios are medians of the per-round
ratios (calls made moments apart, so load from other processes mostly cancels),
for both numerics modes. Prefill tok/s is prompt tokens over the time to first
token; decode tok/s counts the tokens after the first over the time from the
first token to the last. GB/s is the weight bytes a decode step reads (every
linear layer's packed weights, scales and biases, the norms, and the whole
LM head; the tied 8-bit embedding counts once, as the head) times decode tok/s.

    python benchmarks/decode.py [--max-tokens 32] [--prompt TEXT] [--runs 3]
                                [--max-length 2048] [--cache-step 128]
                                [--only mlxprog-int8,mlx-lm,llama.cpp,mlxprog-mlx-ops,hand]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import mlx.core as mx

import mlxprog.llm
import mlxprog.native
from mlxprog.llm import Checkpoint

DEFAULT_PROMPT = "Write a short story about a robot who learns to paint."


@dataclass
class Run:
    """One generation: its tokens (EOS excluded) and timings in seconds."""

    tokens: list[int]
    prompt_tokens: int
    ttft: float
    decode_seconds: float
    decode_steps: int  # tokens after the first, EOS included

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.ttft

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds else 0.0


def timed_run(tokens: Iterator[int], prompt_tokens: int, eos: set[int], max_tokens: int,
              start: float) -> Run:
    """Drain a token stream begun at ``start`` until EOS or ``max_tokens``,
    timing the first token and the ones after it."""
    kept, steps, first_at = [], 0, None
    for token in tokens:
        if first_at is None:
            first_at = time.perf_counter()
        else:
            steps += 1
        if token in eos:
            break
        kept.append(token)
        if len(kept) >= max_tokens:
            break
    return Run(kept, prompt_tokens, first_at - start, time.perf_counter() - first_at, steps)


# -- (a) mlxprog ----------------------------------------------------------------


class MlxprogImpl:
    """``LLM.generate`` with its own stats (prompt ids from the chat template),
    native CPU kernels on, exact numerics."""

    name = "mlxprog"
    native = True
    numerics = "exact"

    def __init__(self, checkpoint: Checkpoint, max_length: int, cache_step: int):
        self.llm = mlxprog.llm.LLM(checkpoint, max_length=max_length, cache_step=cache_step,
                                   native=self.native, numerics=self.numerics)

    def generate(self, prompt: str, ids: list[int], max_tokens: int) -> Run:
        out = self.llm.generate(prompt, max_tokens=max_tokens)
        s = out.stats
        return Run(out.tokens, s.prompt_tokens, s.ttft, s.decode_seconds,
                   max(s.generated_tokens - 1, 0))


class MlxprogInt8Impl(MlxprogImpl):
    """``LLM.generate`` in the int8 numerics (8-bit activations, integer dot
    products in the native quantized matmul)."""

    name = "mlxprog-int8"
    numerics = "int8"


class MlxprogMlxOpsImpl(MlxprogImpl):
    """``LLM.generate`` on MLX's own CPU ops (``native=False``)."""

    name = "mlxprog-mlx-ops"
    native = False


# -- (b) hand-written MLX ---------------------------------------------------------


class HandImpl:
    """The model written directly in MLX. Weights are the checkpoint's arrays;
    the caches are ``[1, kv_heads, S, head_dim]`` and grow by ``cache_step``
    slots; the prefill is compiled per (prompt length, S) and the decode step
    per S, with offsets passed as arrays so nothing retraces per token."""

    name = "hand"

    def __init__(self, checkpoint: Checkpoint, max_length: int, cache_step: int):
        self.c = checkpoint.config
        self.w = checkpoint.weights
        self.q = checkpoint.quantization
        self.eos = set(checkpoint.tokenizer.eos_token_ids)
        self.max_length, self.cache_step = max_length, cache_step
        self.freqs = None if self.c.rope_freqs is None else mx.array(self.c.rope_freqs)
        self.prefill = mx.compile(self._prefill)
        self.decode = mx.compile(self._decode)

    def linear(self, name: str, x: mx.array) -> mx.array:
        w = self.w
        if name in self.q:
            q = self.q[name]
            y = mx.quantized_matmul(x, w[f"{name}.weight"], w[f"{name}.scales"],
                                    w[f"{name}.biases"], transpose=True,
                                    group_size=q.group_size, bits=q.bits)
        else:
            y = x @ w[f"{name}.weight"].astype(mx.float32).T
        return y + w[f"{name}.bias"] if f"{name}.bias" in w else y

    def rope(self, x: mx.array, offset: mx.array) -> mx.array:
        c = self.c
        return mx.fast.rope(x, c.head_dim, traditional=c.rope_traditional,
                            base=None if self.freqs is not None else c.rope_theta,
                            scale=c.rope_scale, offset=offset, freqs=self.freqs)

    def forward(self, tokens: mx.array, offset: mx.array, caches: list[mx.array]):
        """Logits after the last of ``tokens`` [1, T] written at ``offset``,
        and the new caches."""
        c, w = self.c, self.w
        T, S, D = tokens.shape[1], caches[0].shape[2], c.head_dim
        if "embed_tokens" in self.q:
            q = self.q["embed_tokens"]
            h = mx.dequantize(*(w[f"embed_tokens.{p}"][tokens] for p in
                                ("weight", "scales", "biases")),
                              group_size=q.group_size, bits=q.bits)
        else:
            h = w["embed_tokens.weight"][tokens]
        h = h.astype(mx.float32)
        mask = mx.arange(S) <= mx.arange(T)[:, None] + offset
        start = offset.reshape(1)
        new = []
        for i in range(c.num_layers):
            p = f"layers.{i}"
            x = mx.fast.rms_norm(h, w[f"{p}.input_layernorm.weight"], c.norm_eps)
            q, k, v = (self.linear(f"{p}.self_attn.{n}_proj", x).reshape(1, T, -1, D)
                       .transpose(0, 2, 1, 3) for n in "qkv")
            kc = mx.slice_update(caches[2 * i], self.rope(k, offset), start, axes=(2,))
            vc = mx.slice_update(caches[2 * i + 1], v, start, axes=(2,))
            new += [kc, vc]
            o = mx.fast.scaled_dot_product_attention(self.rope(q, offset), kc, vc,
                                                     scale=D ** -0.5, mask=mask)
            h = h + self.linear(f"{p}.self_attn.o_proj", o.transpose(0, 2, 1, 3).reshape(1, T, -1))
            x = mx.fast.rms_norm(h, w[f"{p}.post_attention_layernorm.weight"], c.norm_eps)
            gate = self.linear(f"{p}.mlp.gate_proj", x)
            h = h + self.linear(f"{p}.mlp.down_proj",
                                gate * mx.sigmoid(gate) * self.linear(f"{p}.mlp.up_proj", x))
        h = mx.fast.rms_norm(h[:, -1], w["norm.weight"], c.norm_eps)
        return self.linear("embed_tokens" if c.tie_embeddings else "lm_head", h), new

    def _prefill(self, tokens, *caches):
        logits, new = self.forward(tokens, mx.array(0), list(caches))
        return [mx.argmax(logits, axis=-1).astype(mx.int32), *new]

    def _decode(self, token, offset, *caches):
        logits, new = self.forward(token[None], offset, list(caches))
        return [mx.argmax(logits, axis=-1).astype(mx.int32), *new]

    def grow(self, caches: list[mx.array], slots: int) -> list[mx.array]:
        """Caches of at least ``slots`` slots (next multiple of cache_step)."""
        size = caches[0].shape[2]
        if slots <= size:
            return caches
        new_size = min(-(-slots // self.cache_step) * self.cache_step, self.max_length)
        return [mx.pad(x, [(0, 0), (0, 0), (0, new_size - size), (0, 0)]) for x in caches]

    def generate(self, prompt: str, ids: list[int], max_tokens: int) -> Run:
        c = self.c
        start = time.perf_counter()
        caches = [mx.zeros((1, c.num_kv_heads, 0, c.head_dim)) for _ in range(2 * c.num_layers)]
        caches = self.grow(caches, len(ids) + 1)
        token, *caches = self.prefill(mx.array([ids], dtype=mx.int32), *caches)
        max_new = min(max_tokens - 1, self.max_length - len(ids))
        tokens, steps, first_at = [], 0, None
        for step in range(max_new + 1):
            pending = None
            if step < max_new:
                caches = self.grow(caches, len(ids) + step + 1)
                pending, *caches = self.decode(token, mx.array(len(ids) + step), *caches)
                mx.async_eval(pending, caches)
            value = token.item()
            if first_at is None:
                first_at = time.perf_counter()
            else:
                steps += 1
            if value in self.eos:
                break
            tokens.append(value)
            if pending is None:
                break
            token = pending
        return Run(tokens, len(ids), first_at - start, time.perf_counter() - first_at, steps)


# -- (c) mlx-lm -----------------------------------------------------------------


class MlxLmImpl:
    """mlx-lm's llama model with the checkpoint's weights, driven by
    ``generate_step`` (its own stream, ``mx.async_eval`` pipelining)."""

    name = "mlx-lm"

    def __init__(self, checkpoint: Checkpoint, max_length: int, cache_step: int):
        import mlx.nn as nn
        from mlx_lm.models import llama

        self.generate_step = importlib.import_module("mlx_lm.generate").generate_step
        c, quant = checkpoint.config, checkpoint.quantization
        self.model = llama.Model(llama.ModelArgs(
            model_type="llama", hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
            intermediate_size=c.intermediate_size, num_attention_heads=c.num_heads,
            rms_norm_eps=c.norm_eps, vocab_size=c.vocab_size, num_key_value_heads=c.num_kv_heads,
            head_dim=c.head_dim, rope_theta=c.rope_theta, rope_traditional=c.rope_traditional,
            tie_word_embeddings=c.tie_embeddings, max_position_embeddings=c.context_length,
            attention_bias=c.attention_bias))

        def quantized(path: str, module) -> dict | bool:
            q = quant.get(path.removeprefix("model."))
            return {"group_size": q.group_size, "bits": q.bits} if q else False

        nn.quantize(self.model, class_predicate=quantized)
        self.model.load_weights([("model." + k, v) for k, v in checkpoint.weights.items()],
                                strict=True)
        mx.eval(self.model.parameters())
        self.eos = set(checkpoint.tokenizer.eos_token_ids)

    def generate(self, prompt: str, ids: list[int], max_tokens: int) -> Run:
        start = time.perf_counter()
        steps = self.generate_step(mx.array(ids), self.model, max_tokens=max_tokens)
        return timed_run((int(token) for token, _ in steps), len(ids), self.eos, max_tokens,
                         start)


# -- (d) llama.cpp ---------------------------------------------------------------


class LlamaCppImpl:
    """llama.cpp through llama-cpp-python on the same GGUF file: greedy
    (``top_k=1``, no penalties), one thread per usable core."""

    name = "llama.cpp"

    def __init__(self, checkpoint: Checkpoint, max_length: int, cache_step: int):
        import llama_cpp

        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count()
        self.llm = llama_cpp.Llama(model_path=str(mlxprog.llm.model_files.default_model_path()),
                                   n_ctx=max_length, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.eos = set(checkpoint.tokenizer.eos_token_ids)

    def generate(self, prompt: str, ids: list[int], max_tokens: int) -> Run:
        # Forget the previous call's tokens: llama-cpp-python would otherwise
        # reuse the KV cache of the prompt prefix they share, and skip the prefill.
        self.llm.reset()
        start = time.perf_counter()
        tokens = self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                   repeat_penalty=1.0, reset=True)
        return timed_run(tokens, len(ids), self.eos, max_tokens, start)


# -- the benchmark ----------------------------------------------------------------


def decode_weight_bytes(checkpoint: Checkpoint) -> int:
    """Bytes of the weights one decode step reads: all of them, except that an
    untied embedding table contributes one row (the head is read in full)."""
    total = 0
    for name, w in checkpoint.weights.items():
        if name.startswith("embed_tokens.") and not checkpoint.config.tie_embeddings:
            total += w.nbytes // w.shape[0]
        else:
            total += w.nbytes
    return total


def round_ratio(ours: list[Run], theirs: list[Run], key: str) -> float:
    """Median over rounds of ``ours.key / theirs.key``: the two ran moments
    apart in each round, so load from other processes mostly cancels out."""
    return statistics.median(getattr(a, key) / getattr(b, key) for a, b in zip(ours, theirs))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (or length difference); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def cold_ttft(name: str, args: argparse.Namespace) -> float:
    """Time to first token of implementation ``name``'s first call, in a fresh
    process."""
    command = [sys.executable, __file__, "--cold", name, "--prompt", args.prompt,
               "--max-length", str(args.max_length), "--cache-step", str(args.cache_step)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT,
                        help="user message (wrapped in the chat template)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=2048,
                        help="KV-cache limit for mlxprog and the hand-written loop")
    parser.add_argument("--cache-step", type=int, default=mlxprog.llm.options.DEFAULT_CACHE_STEP,
                        help="KV-cache growth step for mlxprog and the hand-written loop "
                             "(>= --max-length: a fixed-size cache)")
    parser.add_argument("--only", help="comma-separated implementations to run besides mlxprog")
    parser.add_argument("--cold", help=argparse.SUPPRESS)  # internal: one cold call
    args = parser.parse_args()

    checkpoint = mlxprog.llm.load_checkpoint()
    kinds: list[Callable] = [MlxprogImpl, MlxprogInt8Impl, MlxprogMlxOpsImpl, HandImpl]
    for module, kind in (("mlx_lm", MlxLmImpl), ("llama_cpp", LlamaCppImpl)):
        try:
            importlib.import_module(module)
            kinds.append(kind)
        except ImportError:
            print(f"{module} is not importable: skipping the {kind.name} column")
    if args.only:
        kinds = [k for k in kinds if k.name in args.only.split(",") or k is MlxprogImpl]
    if args.cold:
        kind = next(k for k in kinds if k.name == args.cold)
        impl = kind(checkpoint, args.max_length, args.cache_step)
        ids = mlxprog.llm.LLM(checkpoint).prompt_ids(args.prompt)
        print(impl.generate(args.prompt, ids, 1).ttft)
        return
    cold_ttfts = {kind.name: cold_ttft(kind.name, args) for kind in kinds}
    impls = [kind(checkpoint, args.max_length, args.cache_step) for kind in kinds]
    ids = impls[0].llm.prompt_ids(args.prompt)

    warmup = {impl.name: impl.generate(args.prompt, ids, args.max_tokens) for impl in impls}
    runs: dict[str, list[Run]] = {impl.name: [] for impl in impls}
    for r in range(args.runs):
        order = impls[r % len(impls):] + impls[: r % len(impls)]
        for impl in order:
            runs[impl.name].append(impl.generate(args.prompt, ids, args.max_tokens))

    weight_bytes = decode_weight_bytes(checkpoint)
    reference = warmup["mlxprog"].tokens
    print(f"SmolLM2-135M-Instruct Q4_1 | mlx {mx.__version__} ({mx.default_device()}) | "
          f"native kernels: {mlxprog.native.status()} | "
          f"{platform.machine()}, {os.cpu_count()} CPUs | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"prompt {len(ids)} tokens, up to {args.max_tokens} new | max_length "
          f"{args.max_length}, cache_step {args.cache_step} | {args.runs} runs (medians) | "
          f"weights read per decoded token {weight_bytes / 1e6:.1f} MB")
    print()
    print("| implementation | prefill tok/s | decode tok/s | TTFT cold (s) | TTFT warm (s) "
          "| GB/s | tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for impl in impls:
        name, rs = impl.name, runs[impl.name]
        med = {k: statistics.median(getattr(r, k) for r in rs)
               for k in ("prefill_tps", "decode_tps", "ttft")}
        print(f"| {name} | {med['prefill_tps']:.1f} | {med['decode_tps']:.2f} | "
              f"{cold_ttfts[name]:.2f} | {med['ttft']:.2f} | "
              f"{weight_bytes * med['decode_tps'] / 1e9:.2f} | {len(warmup[name].tokens)} |")
    print()
    for impl in impls:
        rs = runs[impl.name]
        print(f"{impl.name} per run: decode tok/s {' '.join(f'{r.decode_tps:.2f}' for r in rs)}"
              f" | TTFT s {' '.join(f'{r.ttft:.2f}' for r in rs)}")
    for impl in impls:
        for run in [warmup[impl.name], *runs[impl.name]]:
            diff = first_difference(reference, run.tokens)
            if diff is not None:
                print(f"TOKENS DIFFER: {impl.name} from token {diff}")
                break
        else:
            print(f"{impl.name}: same greedy tokens as mlxprog's first run")
    if "mlxprog-int8" in warmup and "llama.cpp" in warmup:
        # Both quantize the activations to 8 bits: how long their tokens agree.
        diff = first_difference(warmup["mlxprog-int8"].tokens, warmup["llama.cpp"].tokens)
        print("mlxprog-int8 / llama.cpp tokens: " +
              ("the same" if diff is None else f"part from token {diff}"))
    print(f"text: {checkpoint.tokenizer.decode(reference)!r}")
    for ours in ("mlxprog", "mlxprog-int8"):
        for other in ("llama.cpp", "mlx-lm", "mlxprog-mlx-ops", "hand", "mlxprog"):
            if ours not in runs or other not in runs or other == ours:
                continue
            decode, prefill, ttft = (round_ratio(runs[ours], runs[other], key)
                                     for key in ("decode_tps", "prefill_tps", "ttft"))
            print(f"{ours} / {other} (median of per-round ratios): decode tok/s {decode:.2f}x, "
                  f"prefill tok/s {prefill:.2f}x (above 1: {ours} faster), TTFT warm "
                  f"{ttft:.2f}x, TTFT cold {cold_ttfts[ours] / cold_ttfts[other]:.2f}x "
                  f"(below 1: {ours} faster)")
    if "llama.cpp" in runs:
        print()
        print("| mlxprog numerics | decode tok/s / llama.cpp | prefill tok/s / llama.cpp "
              "| TTFT warm / llama.cpp | TTFT cold / llama.cpp |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for ours, numerics in (("mlxprog", "exact"), ("mlxprog-int8", "int8")):
            if ours not in runs:
                continue
            decode, prefill, ttft = (round_ratio(runs[ours], runs["llama.cpp"], key)
                                     for key in ("decode_tps", "prefill_tps", "ttft"))
            print(f"| {numerics} | {decode:.2f}x | {prefill:.2f}x | {ttft:.2f}x | "
                  f"{cold_ttfts[ours] / cold_ttfts['llama.cpp']:.2f}x |")


if __name__ == "__main__":
    main()
