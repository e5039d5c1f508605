"""Perplexity (:mod:`mlxprog.llm.perplexity`): the scoring program against the
plain-MLX reference model on tiny checkpoints (whole texts, chunks, strided
segments, bad arguments), then SmolLM2 on the shipped public-domain text in
both numerics modes (skipped when the model cannot be had)."""

from __future__ import annotations

import math
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from llm_fixtures import smollm_path, write_gguf, write_hf
from llm_reference import KVCache, ReferenceModel

from mlxprog import native
from mlxprog.cli import main
from mlxprog.llm import LLM, ModelError, load
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.perplexity import perplexity

TEXT_FILE = Path(__file__).parent.parent / "data" / "declaration_constitution.txt"
TEXT = TEXT_FILE.read_text(encoding="utf-8")
SHORT = " ".join(TEXT.split()[:40])


@pytest.fixture(scope="module", params=["gguf", "hf-q"])
def tiny(request, tmp_path_factory) -> LLM:
    root = tmp_path_factory.mktemp("tiny")
    if request.param == "gguf":
        write_gguf(root / "tiny.gguf", tied=False)
        return load(root / "tiny.gguf", numerics="exact")
    write_hf(root / "hf-q", quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32))
    return load(root / "hf-q", numerics="exact")


def reference_logprobs(llm: LLM, ids: list[int]) -> list[float]:
    """The log-probability of each of ``ids[1:]`` after the ones before it,
    from the plain-MLX reference model run over ``ids`` at once."""
    logits = ReferenceModel(llm.checkpoint)(ids[:-1], KVCache.empty(llm.config.num_layers))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return np.array(logprobs)[np.arange(len(ids) - 1), ids[1:]].tolist()


@pytest.mark.parametrize("chunk", [256, 7])
def test_whole_text_matches_the_reference(tiny, chunk):
    ids = tiny.tokenizer.encode(SHORT)
    assert len(ids) > 3 * 7  # several chunks, the last one padded
    result = perplexity(tiny, SHORT, chunk=chunk)
    expected = reference_logprobs(tiny, ids)
    np.testing.assert_allclose(result.logprobs, expected, rtol=1e-4, atol=1e-4)
    assert (result.tokens, result.segment_length, result.numerics) == (len(ids) - 1, len(ids),
                                                                   "exact")
    assert result.nll == pytest.approx(-sum(expected) / len(expected), rel=1e-4)
    assert result.perplexity == pytest.approx(math.exp(result.nll))
    # Token ids score the same as the text they encode.
    assert perplexity(tiny, ids, chunk=chunk).logprobs == result.logprobs


@pytest.mark.parametrize("length, stride", [(16, 8), (16, 5), (12, 12)])
def test_strided_segments_score_each_token_once_after_its_segment(tiny, length, stride):
    ids = tiny.tokenizer.encode(SHORT)
    expected, scored_to = [], 1
    for begin in range(0, len(ids), stride):
        end = min(begin + length, len(ids))
        first = max(scored_to, begin + 1)
        # Token p is predicted from the segment's tokens before it only.
        expected += reference_logprobs(tiny, ids[begin:end])[first - begin - 1:]
        scored_to = end
        if end == len(ids):
            break
    result = perplexity(tiny, ids, segment_length=length, stride=stride, chunk=5)
    np.testing.assert_allclose(result.logprobs, expected, rtol=1e-4, atol=1e-4)
    # Non-overlapping segments cannot score their first token.
    segments = -(-(len(ids) - length) // stride) + 1
    skipped = segments - 1 if stride == length else 0
    assert result.tokens == len(ids) - 1 - skipped
    assert (result.segment_length, result.stride) == (length, stride)


def test_the_default_stride_is_half_the_segment_length(tiny):
    assert perplexity(tiny, SHORT, segment_length=10).stride == 5


def test_window_is_segment_length_s_deprecated_name(tiny):
    with pytest.warns(DeprecationWarning, match="pass segment_length"):
        assert perplexity(tiny, SHORT, window=10).segment_length == 10
    with pytest.raises(ModelError, match="give segment_length only"):
        perplexity(tiny, SHORT, window=10, segment_length=10)


@pytest.mark.parametrize("kwargs, message", [
    ({"segment_length": 1}, "segment_length must be an integer in [2, "),
    ({"segment_length": 10**6}, "(the model's context length), got 1000000"),
    ({"stride": 0}, "stride must be an integer in [1, segment_length "),
    ({"segment_length": 8, "stride": 9},
     "stride must be an integer in [1, segment_length 8], got 9"),
    ({"chunk": 0}, "chunk must be a positive integer, got 0"),
    ({"numerics": "fp8"}, "numerics must be one of"),
])
def test_bad_arguments_are_errors_naming_them(tiny, kwargs, message):
    with pytest.raises(ModelError) as info:
        perplexity(tiny, SHORT, **kwargs)
    assert message in str(info.value)


def test_a_text_of_one_token_is_an_error(tiny):
    with pytest.raises(ModelError, match="at least 2 tokens, got 1"):
        perplexity(tiny, tiny.tokenizer.encode(SHORT)[:1])


def test_the_cli_prints_the_perplexity(tiny, tmp_path, capsys):
    path = tmp_path / "text.txt"
    path.write_text(SHORT, encoding="utf-8")
    expected = perplexity(tiny, SHORT, segment_length=16)
    assert main(["perplexity", "-m", str(tiny.checkpoint.path), str(path),
                 "--segment-length", "16", "--numerics", "exact"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"perplexity {expected.perplexity:.4f} over {expected.tokens} tokens")
    assert "numerics exact, segment length 16, stride 8, chunk 15" in out
    # --window, the flag's name before segments had their own, still sets it.
    assert main(["perplexity", "-m", str(tiny.checkpoint.path), str(path), "--window", "16",
                 "--numerics", "exact"]) == 0
    assert "segment length 16, stride 8" in capsys.readouterr().out


def test_the_cli_names_an_unreadable_file(tmp_path, capsys):
    missing = tmp_path / "missing.txt"
    assert main(["perplexity", str(missing)]) == 1
    assert capsys.readouterr().err.startswith(
        f"error: cannot read the text from file '{missing}': No such file or directory")


# ---------------------------------------------------------------------------
# SmolLM2 on the shipped text (tests/data/README.md)

#: The exact-mode perplexity of SmolLM2-135M-Instruct Q4_1 on the shipped
#: text, measured with mlxprog's native kernels (one segment, chunks of 256).
MEASURED_EXACT = 15.55


@pytest.fixture(scope="module")
def smollm() -> LLM:
    return load(smollm_path(), max_length=256, numerics="exact")


def test_smollm_int8_perplexity_is_within_one_percent_of_exact(smollm):
    if not native.default_enabled():
        # int8 runs only on the native kernels (it would compute exactly), and
        # 2 x 2,184 tokens through MLX's scalar quantized matmul take minutes.
        pytest.skip("int8 numerics need the native kernels (MLXPROG_NATIVE=0)")
    exact = perplexity(smollm, TEXT, numerics="exact")
    int8 = perplexity(smollm, TEXT, numerics="int8")
    assert exact.tokens == int8.tokens >= 2000
    assert (exact.numerics, int8.numerics) == ("exact", "int8")
    # The measured value, within 20%: the text, its tokenization and the model.
    assert MEASURED_EXACT / 1.2 <= exact.perplexity <= MEASURED_EXACT * 1.2, exact
    assert int8.perplexity <= exact.perplexity * 1.01, (int8, exact)


def test_smollm_greedy_answer_in_int8_mode():
    llm = load(smollm_path(), max_length=256, numerics="int8")
    assert llm.numerics == "int8"
    out = llm.generate("What is the capital of France?", max_tokens=16)
    assert "Paris" in out.text, out.text
