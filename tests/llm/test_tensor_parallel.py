"""Tensor-parallel LLM programs: the split of heads and the MLP over ranks
(uneven at KV-head granularity), the captures sliced to each rank, the
rank programs' shapes, bad world sizes, and generation on several processes
against one.

Tiny random-weight checkpoints with 6 query heads over 3 KV heads (no even
split over 2 ranks), written once per module:

- ``gguf``: dense float32 GGUF, untied head, interleaved RoPE;
- ``hf-q``: Hugging Face checkpoint with 4-bit projections and an 8-bit
  tied embedding (quantization groups of 32).

The slicing is checked numerically in one process: a plain-MLX forward pass
that runs each rank's attention and MLP on its sliced weights and sums
their outputs (what ``all_sum`` does) gives the unsharded model's logits.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import mlx.core as mx
import pytest
from llm_fixtures import TINY, TINY_UNEVEN, smollm_path, write_gguf, write_hf
from llm_reference import KVCache, ReferenceModel

from mlxprog.cli import main
from mlxprog.llm import (
    Checkpoint, ModelError, build_decode, build_decode_loop, build_prefill, load,
    load_checkpoint, load_exported,
)
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.models import model_spec

MAX_LENGTH = 64
KINDS = ["gguf", "hf-q"]
BUILDERS = [build_prefill, build_decode, build_decode_loop]


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-tp-models")
    write_gguf(root / "tiny.gguf", tied=False, sizes=TINY_UNEVEN)
    write_hf(root / "hf-q", quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32), sizes=TINY_UNEVEN)
    return {"gguf": root / "tiny.gguf", "hf-q": root / "hf-q"}


@pytest.fixture(scope="module")
def checkpoints(model_paths) -> dict[str, Checkpoint]:
    return {kind: load_checkpoint(path) for kind, path in model_paths.items()}


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


# -- the split -----------------------------------------------------------------
def test_uneven_split_follows_kv_heads(checkpoints):
    spec = model_spec(checkpoints["hf-q"])
    # 3 KV heads over 2 ranks: 2 and 1, each with the 2 query heads of its groups;
    # the intermediate dim (128 = 4 groups of 32) evenly.
    shards = [spec.shard(2, r) for r in range(2)]
    assert [s.kv_heads for s in shards] == [(0, 2), (2, 3)]
    assert [s.heads for s in shards] == [(0, 4), (4, 6)]
    assert [s.intermediate for s in shards] == [(0, 64), (64, 128)]
    # Over 3 ranks: a KV head each; 4 groups of 32 give 2, 1, 1.
    shards = [spec.shard(3, r) for r in range(3)]
    assert [s.kv_heads for s in shards] == [(0, 1), (1, 2), (2, 3)]
    assert [s.heads for s in shards] == [(0, 2), (2, 4), (4, 6)]
    assert [s.intermediate for s in shards] == [(0, 64), (64, 96), (96, 128)]


def test_dense_intermediate_splits_by_element(checkpoints):
    shards = [model_spec(checkpoints["gguf"]).shard(3, r) for r in range(3)]
    assert [s.intermediate for s in shards] == [(0, 43), (43, 86), (86, 128)]


@pytest.mark.parametrize("world_size, rank, message", [
    (4, 0, "world_size 4: the model has 3 KV heads"),
    (0, 0, "world_size must be a positive integer"),
    (2, 2, "rank 2 is not in [0, world_size 2)"),
    (2, -1, "rank -1 is not in [0, world_size 2)"),
])
def test_bad_world_sizes(checkpoints, world_size, rank, message):
    spec = model_spec(checkpoints["gguf"])
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace(")", r"\)")):
        build_decode(spec, MAX_LENGTH, world_size=world_size, rank=rank)
    with pytest.raises(ModelError, match=message.replace("[", r"\[").replace(")", r"\)")):
        spec.captures(checkpoints["gguf"], world_size, rank)


def test_split_must_keep_whole_quantization_groups(checkpoints):
    # Over 3 ranks each holds 2 query heads of 16 columns: rank 1's start at
    # o_proj's column 32, a group boundary with groups of 32 but not of 64.
    spec = model_spec(checkpoints["hf-q"])
    coarse = dataclasses.replace(spec, quantization={
        n: Quantization(q.bits, 64) for n, q in spec.quantization.items()})
    coarse.shard(2, 1)  # 4 and 2 heads: columns 0 and 64
    with pytest.raises(ModelError, match="world_size 3: a rank's query heads would start "
                       "at column 32 of o_proj, inside a quantization group of 64"):
        coarse.shard(3, 0)
    # With 4 query heads per rank the heads fit, but the MLP's 128 columns
    # are 2 groups of 64: fewer than 3 ranks.
    config = dataclasses.replace(spec.config, num_heads=12)
    with pytest.raises(ModelError, match="world_size 3: the MLP's intermediate size 128 is 2 "
                       "quantization groups of 64"):
        dataclasses.replace(coarse, config=config).shard(3, 0)


# -- programs ------------------------------------------------------------------
@pytest.mark.parametrize("build", BUILDERS)
def test_world_size_one_is_the_unsharded_program(checkpoints, kind, build):
    spec = model_spec(checkpoints[kind])
    assert (build(spec, MAX_LENGTH, world_size=1, rank=0).model_dump_json()
            == build(spec, MAX_LENGTH).model_dump_json())
    assert spec.captures(checkpoints[kind], 1, 0).keys() == spec.captures(checkpoints[kind]).keys()


@pytest.mark.parametrize("world_size, kv_heads", [(2, [2, 1]), (3, [1, 1, 1])])
@pytest.mark.parametrize("build", BUILDERS)
def test_rank_programs(checkpoints, kind, build, world_size, kv_heads):
    checkpoint = checkpoints[kind]
    spec = model_spec(checkpoint)
    layers = checkpoint.config.num_layers
    for rank in range(world_size):
        program = build(spec, MAX_LENGTH, world_size=world_size, rank=rank)
        assert program.world_size == world_size
        # The caches hold the rank's KV heads.
        caches = [s.shape for s in program.inputs if "_cache." in s.name]
        assert caches == [["B", kv_heads[rank], "S", TINY["head_dim"]]] * (2 * layers)
        # The captures keep the file's names with the sliced weights' shapes.
        sliced = spec.captures(checkpoint, world_size, rank)
        assert {c.name: tuple(c.shape) for c in program.captures} == {
            c.name: tuple(sliced[c.name].shape) for c in program.captures}
        # One all_sum after each o and down projection (in the loop's body
        # for the decode loop).
        text = program.model_dump_json()
        assert text.count('"op":"all_sum"') == 2 * layers


# -- export --------------------------------------------------------------------
def test_export_writes_each_ranks_programs(model_paths, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export-llm", str(model_paths["hf-q"]), "-o", str(out),
                 "--max-length", str(MAX_LENGTH), "--world-size", "2",
                 "--numerics", "exact"]) == 0
    kinds = ["prefill.json", "decode.json", "decode_loop.json"]
    written = [str(out / f"rank{r}" / k) for r in range(2) for k in kinds]
    assert capsys.readouterr().out.split() == [*written, str(out / "manifest.json")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    checkpoint = load_checkpoint(model_paths["hf-q"])
    for rank in range(2):
        expected = build_decode(model_spec(checkpoint), MAX_LENGTH, None, world_size=2,
                                rank=rank)
        assert (out / f"rank{rank}" / "decode.json").read_text() == \
            expected.to_pretty_json() + "\n"
    # One process cannot run them.
    with pytest.raises(ModelError, match="exported for world_size 2; run them on that many"):
        load_exported(out)


def test_export_with_a_bad_world_size_is_an_error(model_paths, tmp_path, capsys):
    assert main(["export-llm", str(model_paths["gguf"]), "-o", str(tmp_path),
                 "--max-length", str(MAX_LENGTH), "--world-size", "4"]) == 1
    assert "world_size 4: the model has 3 KV heads" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_group_of_one_runs_the_whole_model(model_paths):
    # What mx.distributed.init() gives a process not started by mlx.launch.
    llm = load(model_paths["gguf"], max_length=MAX_LENGTH, group=mx.distributed.init())
    assert (llm.world_size, llm.rank, llm.group) == (1, 0, None)
    whole = load(model_paths["gguf"], max_length=MAX_LENGTH)
    assert llm.program("decode").model_dump_json() == whole.program("decode").model_dump_json()
    assert llm.cache_layout == whole.cache_layout


# -- the slicing, numerically --------------------------------------------------
def _rank_models(checkpoint: Checkpoint, world_size: int) -> list[ReferenceModel]:
    """Each rank's plain-MLX model: its sliced weights (by mlxprog name) and
    a config of its heads and intermediate size."""
    spec = model_spec(checkpoint)
    by_source = {source: name for name, source in spec.source_names.items()}
    models = []
    for rank in range(world_size):
        shard = spec.shard(world_size, rank)
        weights = {by_source[s]: w for s, w in spec.captures(checkpoint, world_size, rank).items()}
        config = dataclasses.replace(
            checkpoint.config, num_heads=shard.num_heads, num_kv_heads=shard.num_kv_heads,
            intermediate_size=shard.intermediate[1] - shard.intermediate[0])
        models.append(ReferenceModel(dataclasses.replace(checkpoint, config=config,
                                                         weights=weights)))
    return models


def _tensor_parallel_logits(whole: ReferenceModel, ranks: list[ReferenceModel],
                            ids: list[int]) -> mx.array:
    """The logits of ``ids`` with every layer's attention and MLP run per rank
    and their outputs summed (the replicated embedding, norms and head run
    once)."""
    caches = [KVCache.empty(whole.config.num_layers) for _ in ranks]
    h = whole.embed(mx.array(ids, dtype=mx.int32))[None]
    for i in range(whole.config.num_layers):
        x = whole.rms_norm(f"layers.{i}.input_layernorm.weight", h)
        h = h + sum(r.attention(i, x, c, 0) for r, c in zip(ranks, caches))
        x = whole.rms_norm(f"layers.{i}.post_attention_layernorm.weight", h)
        h = h + sum(r.mlp(i, x) for r in ranks)
    head = "embed_tokens" if whole.config.tie_embeddings else "lm_head"
    return whole.linear(head, whole.rms_norm("norm.weight", h))[0]


@pytest.mark.parametrize("world_size", [2, 3])
def test_sum_of_rank_outputs_is_the_whole_model(checkpoints, kind, world_size):
    checkpoint = checkpoints[kind]
    whole = ReferenceModel(checkpoint)
    ids = [5, 60, 7, 200, 31, 9]
    expected = whole(ids, KVCache.empty(checkpoint.config.num_layers))
    got = _tensor_parallel_logits(whole, _rank_models(checkpoint, world_size), ids)
    assert mx.allclose(got, expected, atol=1e-4, rtol=1e-4).item()


def test_captures_are_sliced_along_rows_and_whole_groups(checkpoints):
    checkpoint = checkpoints["hf-q"]
    spec = model_spec(checkpoint)
    w = checkpoint.weights
    ranks = [spec.captures(checkpoint, 3, r) for r in range(3)]
    q, o, down = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
                  "model.layers.0.mlp.down_proj")
    # Rows: 2 query heads of 16 per rank; packed 4-bit columns are 8 per word.
    assert [r[f"{q}.weight"].shape for r in ranks] == [(32, 8)] * 3
    assert mx.array_equal(ranks[1][f"{q}.scales"], w["layers.0.self_attn.q_proj.scales"][32:64])
    # Columns: o_proj's 96 inputs in groups of 32 (a group, 4 words, per rank);
    # down_proj's 128 in 2, 1 and 1 groups.
    assert [r[f"{o}.weight"].shape for r in ranks] == [(64, 4)] * 3
    assert [r[f"{down}.scales"].shape for r in ranks] == [(64, 2), (64, 1), (64, 1)]
    assert mx.array_equal(ranks[2][f"{down}.weight"], w["layers.0.mlp.down_proj.weight"][:, 12:])
    # Replicated: the embedding, the norms.
    for name in ("model.embed_tokens.weight", "model.norm.weight",
                 "model.layers.1.input_layernorm.weight"):
        assert all(r[name] is w[name.removeprefix("model.")] for r in ranks)


# -- several processes ---------------------------------------------------------
PROMPT = "the quick brown fox"
# Greedy, sampled (every rank draws from the same key), the in-program loop.
RUNS = {"greedy": dict(max_tokens=8, chat=False, logprobs=True),
        "sampled": dict(max_tokens=8, chat=False, temperature=0.8, seed=3, logprobs=True),
        "in_program": dict(max_tokens=8, chat=False)}

# Run on every rank: generate with the model split over the launched
# processes (one JSON line per model), run the exported programs, then the CLI.
RANK_SCRIPT = """
import json, sys
import mlx.core as mx
from mlxprog.cli import main
from mlxprog.llm import load, load_exported

group = mx.distributed.init()
models, runs, exported, argv = json.loads({spec!r})
for path in models:
    # Exact numerics: the ranks' results are compared within float rounding.
    llm = load(path, max_length=64, group=group, numerics="exact")
    # A rank keeps only its part of the weights (the sliced captures).
    out = {{"rank": llm.rank, "world_size": llm.world_size,
            "whole_weights": len(llm.checkpoint.weights)}}
    for name, options in runs.items():
        run = llm.generate_in_program if name == "in_program" else llm.generate
        result = run({prompt!r}, **options)
        out[name] = [result.tokens, result.logprobs]
    print(json.dumps(out), flush=True)
if exported:
    llm = load_exported(exported, group=group)
    print(json.dumps(llm.generate({prompt!r}, **runs["sampled"]).tokens), flush=True)
if argv:
    sys.exit(main(argv))
"""


def _run_ranks(n: int, models: list[Path], runs: dict = RUNS, exported: Path | None = None,
               argv: list[str] | None = None, timeout: float = 60) -> list:
    """Run RANK_SCRIPT on ``n`` ranks; every rank's result (checked to have
    succeeded)."""
    from distributed_helpers import run_ranks

    spec = json.dumps([[str(m) for m in models], runs, exported and str(exported), argv])
    results = run_ranks(RANK_SCRIPT.format(spec=spec, prompt=PROMPT), n, timeout=timeout)
    for r in results:
        assert r.returncode == 0, f"rank {r.rank} (status {r.returncode}):\n{r.stderr}"
    return results


def _expected(path: Path, runs: dict = RUNS) -> dict:
    """What one process generates with the whole model."""
    llm = load(path, max_length=MAX_LENGTH, numerics="exact")
    return {name: (llm.generate_in_program if name == "in_program" else llm.generate)(
        PROMPT, **options) for name, options in runs.items()}


def _check_same_generation(line: str, expected: dict, rank: int, world_size: int) -> None:
    got = json.loads(line)
    assert (got["rank"], got["world_size"], got["whole_weights"]) == (rank, world_size, 0)
    for name, want in expected.items():
        tokens, logprobs = got[name]
        assert tokens == want.tokens, name
        assert len(logprobs) == len(want.logprobs)
        assert all(abs(a - b) < 1e-3 for a, b in zip(logprobs, want.logprobs)), name


def test_two_ranks_generate_as_one_process(model_paths, tmp_path):
    """The tiny models split 2 and 1 KV heads: the same tokens (and nearly the
    same log-probabilities) on both ranks as in one process; the exported
    rank programs too; the CLI prints on rank 0 only."""
    exported = tmp_path / "exported"
    assert main(["export-llm", str(model_paths["hf-q"]), "-o", str(exported),
                 "--max-length", str(MAX_LENGTH), "--world-size", "2",
                 "--numerics", "exact"]) == 0
    argv = ["generate", "--model", str(model_paths["gguf"]), "--prompt", PROMPT,
            "--max-tokens", "8", "--no-chat", "--max-length", str(MAX_LENGTH)]
    results = _run_ranks(2, [model_paths[k] for k in KINDS], exported=exported, argv=argv)
    expected = {k: _expected(model_paths[k]) for k in KINDS}
    for r in results:
        lines = r.stdout.splitlines()
        for kind, line in zip(KINDS, lines):
            _check_same_generation(line, expected[kind], r.rank, 2)
        assert json.loads(lines[2]) == expected["hf-q"]["sampled"].tokens
        cli = r.stdout.split("\n", 3)[3]
        if r.rank == 0:
            assert cli == expected["gguf"]["greedy"].text + "\n"
            assert "finish:" in r.stderr
        else:
            assert cli == "" and r.stderr == ""


def test_three_ranks_generate_as_one_process(model_paths):
    """A KV head per rank, the MLP split in 2, 1 and 1 quantization groups."""
    results = _run_ranks(3, [model_paths["hf-q"]])
    expected = _expected(model_paths["hf-q"])
    for r in results:
        _check_same_generation(r.stdout.splitlines()[0], expected, r.rank, 3)


def test_smollm2_on_two_ranks_generates_as_one_process():
    """SmolLM2's 3 KV heads (9 query heads) split 2 and 1, which mlx-lm's even
    split cannot do: 8 greedy tokens."""
    path = smollm_path()
    runs = {"greedy": dict(max_tokens=8, chat=False, logprobs=True)}
    results = _run_ranks(2, [path], runs)
    expected = _expected(path, runs)
    assert len(expected["greedy"].tokens) == 8
    for r in results:
        _check_same_generation(r.stdout.splitlines()[0], expected, r.rank, 2)
