"""What fusing a LoRA adapter into a quantized base costs in accuracy:
SmolLM2-135M-Instruct (Q4_1 GGUF) with a random rank-``--rank`` adapter on
every projection of every layer, its update ``--relative`` times the size
of the weights it changes (root mean square; trained adapters are usually
smaller), fused two ways, side by side in one run:

* ``requantized``: what ``load(..., adapter_path=...)`` does, the
  dequantized Q4_1 weight plus the update, quantized again to 4-bit groups
  of 32 (mlx-lm's ``LoRALinear.fuse`` does the same);
* ``float``: the dequantized weight plus the update, kept in float32 (the
  exact fused model: its error is the base's own quantization only).

Printed: the requantized weights' error against the float ones (max and
mean, absolute and in quantization steps, and relative to the update's
size); the perplexity of the base, of both fused models and their ratio on
the first ``--tokens`` tokens of a text (default
tests/data/declaration_constitution.txt), exact numerics; and how far
apart the two fused models put each token's log-probability.

    python benchmarks/adapter_requantization.py [--rank 8] [--relative 0.1]
                                                [--tokens 512] [--model PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

import mlxprog.llm
from mlxprog.llm.adapters import apply_adapter, load_adapter
from mlxprog.llm.perplexity import perplexity

DEFAULT_TEXT = Path(__file__).parent.parent / "tests" / "data" / "declaration_constitution.txt"
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def dense(checkpoint, name: str) -> mx.array:
    """Layer ``name``'s weight in float32 (dequantized where quantized)."""
    q = checkpoint.quantization.get(name)
    w = checkpoint.weights[f"{name}.weight"]
    if q is None:
        return w.astype(mx.float32)
    return mx.dequantize(w, checkpoint.weights[f"{name}.scales"],
                         checkpoint.weights[f"{name}.biases"], group_size=q.group_size,
                         bits=q.bits).astype(mx.float32)


def projection_names(checkpoint) -> list[str]:
    """The layer names of every projection of every layer."""
    return [f"layers.{i}.{p}" for i in range(checkpoint.config.num_layers) for p in PROJECTIONS]


def write_adapter(directory: Path, checkpoint, names: list[str], rank: int,
                  relative: float) -> None:
    """A random mlx-lm adapter of the projections ``names``."""
    rms = float(np.mean([mx.sqrt(mx.mean(dense(checkpoint, n) ** 2)).item() for n in names]))
    # scale * (A @ B) with standard normal A [in, r], B [r, out] has entries of
    # standard deviation scale * sqrt(r).
    scale = relative * rms / rank ** 0.5
    key = mx.random.key(0)
    tensors = {}
    for name in names:
        out_features, in_features = dense(checkpoint, name).shape
        key, a, b = mx.random.split(key, 3)
        tensors[f"model.{name}.lora_a"] = mx.random.normal((in_features, rank), key=a)
        tensors[f"model.{name}.lora_b"] = mx.random.normal((rank, out_features), key=b)
    mx.save_safetensors(str(directory / "adapters.safetensors"), tensors)
    (directory / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": -1,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None,
                        help="a quantized llama-family model, GGUF or MLX-quantized Hugging "
                        "Face directory (default: SmolLM2)")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="the text to score")
    parser.add_argument("--rank", type=int, default=8, help="the adapter's rank")
    parser.add_argument("--relative", type=float, default=0.1,
                        help="the update's size relative to the weights' (rms)")
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the text scored")
    args = parser.parse_args()

    base = mlxprog.llm.load_checkpoint(args.model)
    names = projection_names(base)
    missing = [n for n in names if f"{n}.weight" not in base.weights]
    if missing:
        parser.error(f"--model {base.path}: no {missing[0]} (a llama-family model has "
                     f"{', '.join(PROJECTIONS)} in every layer)")
    unquantized = [n for n in names if n not in base.quantization]
    if unquantized:
        parser.error(f"--model {base.path}: {unquantized[0]} is not quantized; the benchmark "
                     "measures requantizing a quantized base")
    # A llama GGUF file's q/k rows are permuted (see mlxprog.llm.adapters).
    source = "gguf" if Path(base.path).suffix.lower() == ".gguf" else "hf"
    print(f"{Path(base.path).name} | rank {args.rank}, update {args.relative:g} x the weights "
          f"(rms) | mlx {mx.__version__} ({mx.default_device()}) | {platform.machine()}, "
          f"{os.cpu_count()} CPUs | load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as directory:
        write_adapter(Path(directory), base, names, args.rank, args.relative)
        adapter = load_adapter(directory)
        requantized = apply_adapter(base, adapter, source)
        # The same fusion over the dequantized weights, kept in float32.
        weights, quantization = dict(base.weights), dict(base.quantization)
        for name in names:
            del weights[f"{name}.scales"], weights[f"{name}.biases"], quantization[name]
            weights[f"{name}.weight"] = dense(base, name)
        float_fused = apply_adapter(dataclasses.replace(base, weights=weights,
                                                        quantization=quantization),
                                    adapter, source)

    errors, steps, updates = [], [], []
    for name in names:
        exact = dense(float_fused, name)
        error = mx.abs(dense(requantized, name) - exact)
        q = requantized.quantization[name]
        step = mx.repeat(mx.abs(requantized.weights[f"{name}.scales"].astype(mx.float32)),
                         q.group_size, axis=1)
        errors.append(np.array(error).ravel())
        steps.append(np.array(error / step).ravel())
        updates.append(np.array(exact - dense(base, name)).ravel())
    error, in_steps, update = map(np.concatenate, (errors, steps, updates))
    print(f"requantized vs float fused weights: max {error.max():.4f}, mean {error.mean():.5f} "
          f"abs ({in_steps.max():.2f} and {in_steps.mean():.3f} quantization steps; mean "
          f"error / update rms {error.mean() / np.sqrt(np.mean(update ** 2)):.3f})")

    ids = base.tokenizer.encode(args.text.read_text(encoding="utf-8"))[:args.tokens]
    results = {}
    for label, checkpoint in (("base", base), ("float", float_fused),
                              ("requantized", requantized)):
        llm = mlxprog.llm.LLM(checkpoint, numerics="exact")
        results[label] = r = perplexity(llm, ids, window=len(ids))
        print(f"{label}: perplexity {r.perplexity:.4f} over {r.tokens} tokens "
              f"({r.seconds:.1f} s)")
    ratio = results["requantized"].perplexity / results["float"].perplexity
    apart = np.abs(np.subtract(results["requantized"].logprobs, results["float"].logprobs))
    moved = np.abs(np.subtract(results["float"].logprobs, results["base"].logprobs))
    print(f"requantized / float perplexity: {ratio:.4f} ({(ratio - 1) * 100:+.2f}%) | each "
          f"token's log-probability: requantized vs float max {apart.max():.3f}, mean "
          f"{apart.mean():.4f} apart (the adapter moves it {moved.mean():.4f} on average)")


if __name__ == "__main__":
    main()
