"""The qwen3_moe family against mlx-lm, from tiny checkpoints mlx-lm writes
and loads itself (a dense layer among the experts, renormalized routing or
not): logits, greedy tokens, batches and prompt caches; the per-expert,
quantized and GGUF layouts of the experts; the expert files and configs it
refuses at load; and the rest of the library on a mixture of experts
(speculative decoding, a quantized KV cache, export-llm, the server, tensor
parallelism)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from family_checks import (MAX_LENGTH, PROMPT_IDS, TINY_CONFIG, MlxLmParity, MoEChecks,
                           check_two_ranks_generate_as_one_process, load_tiny,
                           write_checkpoint)

from mlxprog import native
from mlxprog.llm import ModelError, load
from mlxprog.llm.hf import config_from_hf
from mlxprog.llm.models import model_spec

QWEN3_MOE = dict(TINY_CONFIG, model_type="qwen3_moe", rope_theta=1e6, head_dim=32,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
CONFIGS = {
    "qwen3_moe": QWEN3_MOE,
    # Layer 1 dense (an MLP of intermediate_size); the kept weights not
    # renormalized; tied embeddings.
    "qwen3_moe-dense-layer": dict(QWEN3_MOE, mlp_only_layers=[1], norm_topk_prob=False,
                                  num_experts_per_tok=3, tie_word_embeddings=True),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp(request.param), CONFIGS[request.param])


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("plain"), QWEN3_MOE)


class TestMlxLmParity(MlxLmParity):
    """Logits, greedy tokens, batches and prompt caches against mlx-lm."""


class TestExperts(MoEChecks):
    """The experts' layouts: per expert, quantized, GGUF."""


def test_config_settings(checkpoint):
    c = load_tiny(checkpoint).config
    assert (c.family, c.num_experts, c.router) == ("qwen3_moe", 8, "softmax_topk")
    dense = CONFIGS["qwen3_moe-dense-layer"]
    c = config_from_hf(dense)
    assert (c.dense_layers, c.expert_layers(), c.experts_per_token, c.renormalize) == (
        (1,), [0, 2], 3, False)
    # decoder_sparse_step 2: layers 1, 3, ... have experts.
    c = config_from_hf(dict(QWEN3_MOE, decoder_sparse_step=2))
    assert c.dense_layers == (0, 2)


@pytest.mark.parametrize("changes, message", [
    (dict(num_experts_per_tok=9),
     "config.json: num_experts_per_tok 9 is more than the 8 experts of config.json: "
     "num_experts"),
    (dict(num_experts_per_tok=0), "config.json: num_experts_per_tok must be a positive "
                                  "integer, got 0"),
    (dict(num_experts=0), "config.json: num_experts must be a positive integer, got 0"),
    (dict(moe_intermediate_size=None), "config.json lacks 'moe_intermediate_size'"),
    (dict(mlp_only_layers=[7]), "mlp_only_layers \\[7\\] must list layers of the 3"),
    (dict(decoder_sparse_step=0), "decoder_sparse_step must be at least 1"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported by the qwen3_moe family"),
])
def test_bad_configs_name_the_key(changes, message):
    with pytest.raises(ModelError, match=message):
        config_from_hf(dict(QWEN3_MOE, **changes))


def _rewrite(directory, change) -> None:
    weights = mx.load(str(directory / "model.safetensors"))
    change(weights)
    mx.save_safetensors(str(directory / "model.safetensors"), weights)


@pytest.mark.parametrize("change, message", [
    # The expert count of the stacks disagrees with num_experts.
    (lambda w: w.update({"model.layers.1.mlp.switch_mlp.up_proj.weight":
                         w["model.layers.1.mlp.switch_mlp.up_proj.weight"][:6]}),
     r"model\.layers\.1\.mlp\.switch_mlp\.up_proj\.weight has shape \(6, 64, 64\), expected "
     r"\(8, 64, 64\) for layers\.1\.mlp\.switch_mlp\.up_proj \(8 experts of \(64, 64\)\)"),
    # An expert stack of the wrong rank.
    (lambda w: w.update({"model.layers.0.mlp.switch_mlp.down_proj.weight":
                         w["model.layers.0.mlp.switch_mlp.down_proj.weight"][0]}),
     r"model\.layers\.0\.mlp\.switch_mlp\.down_proj\.weight has shape \(64, 64\), expected "
     r"\(8, 64, 64\)"),
    # No router.
    (lambda w: w.pop("model.layers.2.mlp.gate.weight"),
     r"missing weight\(s\) model\.layers\.2\.mlp\.gate\.weight that the qwen3_moe config"),
    # A router that would pick experts by NaN.
    (lambda w: w.update({"model.layers.1.mlp.gate.weight":
                         w["model.layers.1.mlp.gate.weight"].at[3, 5].add(float("nan"))}),
     r"model\.layers\.1\.mlp\.gate\.weight holds NaN or infinite values "
     r"\(layers\.1\.mlp\.gate would route tokens by them\)"),
])
def test_bad_expert_files_name_the_tensor(tmp_path, change, message):
    directory = write_checkpoint(tmp_path / "ckpt", QWEN3_MOE)
    _rewrite(directory, change)
    with pytest.raises(ModelError, match=message):
        load(directory)


def test_per_expert_tensors_missing_or_extra_are_refused(tmp_path):
    from family_checks import write_per_expert_checkpoint

    base = write_checkpoint(tmp_path / "ckpt", QWEN3_MOE)
    missing = write_per_expert_checkpoint(base, tmp_path / "missing")
    _rewrite(missing, lambda w: w.pop("model.layers.0.mlp.experts.5.gate_proj.weight"))
    with pytest.raises(ModelError, match=r"missing weight\(s\) model\.layers\.0\.mlp\.experts"
                       r"\.5\.gate_proj\.weight of layers\.0\.mlp\.switch_mlp\.gate_proj's 8 "
                       "experts"):
        load(missing)
    extra = write_per_expert_checkpoint(base, tmp_path / "extra")
    _rewrite(extra, lambda w: w.update({"model.layers.0.mlp.experts.8.up_proj.weight":
                                        w["model.layers.0.mlp.experts.0.up_proj.weight"]}))
    with pytest.raises(ModelError, match=r"unexpected weight\(s\) model\.layers\.0\.mlp\."
                       r"experts\.8\.up_proj\.weight"):
        load(extra)
    unlike = write_per_expert_checkpoint(base, tmp_path / "unlike")
    _rewrite(unlike, lambda w: w.update({"model.layers.0.mlp.experts.3.up_proj.weight":
                                         w["model.layers.0.mlp.experts.3.up_proj.weight"][:9]}))
    with pytest.raises(ModelError, match=r"experts\.3\.up_proj\.weight is \(9, 64\) .*unlike "
                       r".*experts\.0\.up_proj\.weight .*must be alike"):
        load(unlike)


def test_gguf_expert_count_disagreeing_with_its_tensors_is_refused(plain, tmp_path):
    """expert_count 6 in the metadata of a file whose router and *_exps
    hold 8: the first tensor read that disagrees is named."""
    import gguf
    from gguf_writer import write_gguf_from_hf

    path = write_gguf_from_hf(plain, tmp_path / "model.gguf")
    reader = gguf.GGUFReader(path, "r+")
    reader.fields["qwen3moe.expert_count"].parts[-1][0] = 6
    del reader
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_gate_inp\.weight has shape \(8, 64\), "
                       r"expected \(6, 64\) for layers\.0\.mlp\.gate"):
        load(path)


def test_speculative_decoding_keeps_the_greedy_tokens(plain):
    """The model drafting for itself, and prompt lookup: token for token
    the plain greedy decode."""
    llm = load(plain, max_length=MAX_LENGTH, numerics="exact", draft_model=plain)
    want = llm.generate(PROMPT_IDS, draft="none", max_tokens=20, chat=False)
    for draft in ("model", "prompt-lookup"):
        got = llm.generate(PROMPT_IDS, draft=draft, num_draft_tokens=4, max_tokens=20,
                           chat=False)
        assert got.tokens == want.tokens
    assert llm.generate(PROMPT_IDS, max_tokens=20, chat=False).stats.accepted_tokens > 0


def test_quantized_kv_cache_stays_close(plain):
    """An 8-bit KV cache: the prefill's logits near the float cache's."""
    float_cache = load_tiny(plain)
    quantized = load_tiny(plain, kv_bits=8, kv_group_size=32)
    want = float_cache.generate(PROMPT_IDS, max_tokens=1, chat=False, logprobs=True,
                                top_logprobs=5)
    got = quantized.generate(PROMPT_IDS, max_tokens=1, chat=False, logprobs=True,
                             top_logprobs=5)
    assert got.tokens == want.tokens
    assert abs(got.logprobs[0] - want.logprobs[0]) < 0.05
    assert len(quantized.generate(PROMPT_IDS, max_tokens=8, chat=False).tokens) == 8


def test_exported_programs_reproduce_generation(plain, tmp_path):
    from mlxprog.llm import load_exported
    from mlxprog.llm.exported import export

    llm = load_tiny(plain)
    export(llm, tmp_path / "exported")
    want = llm.generate(PROMPT_IDS, max_tokens=10, chat=False).tokens
    assert load_exported(tmp_path / "exported").generate(PROMPT_IDS, max_tokens=10,
                                                         chat=False).tokens == want


def test_server_batches_requests(plain):
    import openai

    from mlxprog.llm.server import Server

    llm = load_tiny(plain)
    prompts = [PROMPT_IDS, PROMPT_IDS[:12]]
    alone = [llm.generate(p, max_tokens=8, chat=False).text for p in prompts]
    server = Server(llm, model_id="tiny", max_batch=2)
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                               timeout=60)
        from concurrent.futures import ThreadPoolExecutor

        def complete(prompt):
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=8,
                                             temperature=0).choices[0].text

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(complete, prompts)) == alone
    finally:
        server.stop()


def test_two_ranks_split_the_experts(tmp_path):
    """The dense layer's MLP and the experts split; 4-bit quantized stacks
    (groups of 32 of 64 features: one group a rank) too."""
    from family_checks import write_quantized_checkpoint

    path = write_checkpoint(tmp_path / "float", CONFIGS["qwen3_moe-dense-layer"])
    spec = model_spec(load_tiny(path).checkpoint)
    assert spec.local_shape("layers.0.mlp.switch_mlp.down_proj.weight", spec.shard(2, 1)) == (
        8, 64, 32)
    check_two_ranks_generate_as_one_process(path)
    check_two_ranks_generate_as_one_process(write_quantized_checkpoint(path, tmp_path / "q4"))


def test_a_split_finer_than_the_experts_groups_is_refused(tmp_path):
    from family_checks import write_quantized_checkpoint

    path = write_quantized_checkpoint(write_checkpoint(tmp_path / "float", QWEN3_MOE),
                                      tmp_path / "q4", group_size=64)
    spec = model_spec(load_tiny(path).checkpoint)
    with pytest.raises(ModelError, match="world_size 2: each expert's intermediate size 64 is "
                       "1 quantization groups of 64"):
        spec.shard(2, 0)


def test_int8_numerics_stay_close_on_quantized_experts(plain, tmp_path):
    """mlx-lm's 4-bit experts in int8 numerics (``gather_quantized_matmul``'s
    integer dot products on the CPU): the logits near exact numerics'."""
    from family_checks import program_logits, write_quantized_checkpoint

    if mx.default_device() != mx.cpu or not native.default_enabled():
        pytest.skip("int8 numerics run on the CPU's native kernels (elsewhere: exact)")
    directory = write_quantized_checkpoint(plain, tmp_path / "q4")
    continuation = [5, 77, 200]
    want = program_logits(load_tiny(directory, numerics="exact"), PROMPT_IDS, continuation)
    got = program_logits(load_tiny(directory, numerics="int8"), PROMPT_IDS, continuation)
    assert np.abs(got - want).mean() <= 0.08 * np.abs(want).mean()
    # Every step ran another kernel: the decode steps' matmuls and the
    # prefill's experts (program_numerics).
    assert not np.array_equal(got[0], want[0])
    assert not np.array_equal(got[1:], want[1:])


def test_a_prefill_runs_its_experts_in_the_models_numerics(plain, tmp_path):
    """An int8 model's prefill: the gathered expert matmuls int8, the dense
    projections (attention, router, head) exact; exact models carry no
    numerics attribute at all."""
    from family_checks import write_quantized_checkpoint

    directory = write_quantized_checkpoint(plain, tmp_path / "q4")

    def numerics_by_op(llm) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for instruction in llm.program("prefill").to_dict()["instructions"]:
            if instruction["op"] in ("quantized_matmul", "gather_quantized_matmul"):
                found.setdefault(instruction["op"], set()).add(
                    instruction["attrs"].get("numerics", "exact"))
        return found

    assert numerics_by_op(load_tiny(directory, numerics="int8")) == {
        "quantized_matmul": {"exact"}, "gather_quantized_matmul": {"int8"}}
    assert numerics_by_op(load_tiny(directory, numerics="exact")) == {
        "quantized_matmul": {"exact"}, "gather_quantized_matmul": {"exact"}}


def test_expert_stacks_a_table_does_not_split_are_refused(plain):
    """A family whose table gives its expert stacks no split (gpt-oss's)
    cannot be run split: the stacks are named."""
    import dataclasses

    spec = model_spec(load_tiny(plain).checkpoint)
    unsplit = dataclasses.replace(spec, splits={n: s for n, s in spec.splits.items()
                                                if "switch_mlp" not in n})
    assert unsplit.shard(1, 0).world_size == 1
    with pytest.raises(ModelError, match=r"world_size 2: tensor parallelism does not split a "
                       r"mixture of experts' expert stacks \(layers\.0\.mlp\.switch_mlp\."
                       r"down_proj\.weight and 8 more\): the qwen3_moe family's weight table "
                       "gives them no split"):
        unsplit.shard(2, 0)
