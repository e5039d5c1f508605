"""Embeddings: ``LLM.embed`` against mlx-lm's hidden states of the same tiny
random checkpoints (pooled and normalised in numpy), batches against one
input at a time, bad inputs, and ``POST /v1/embeddings`` through the
official ``openai`` client and plain HTTP, against ``LLM.embed`` of a second
copy of the model, beside chat completions running at the same time; the
``mlxprog embed`` command; the docs' examples.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import mlx.core as mx
import numpy as np
import openai
import pytest
from family_checks import TINY_CONFIG, mlx_lm_model, write_checkpoint
from llm_fixtures import mlx_lm_llama, tiny_gguf, write_hf

from mlxprog.cli import main as cli_main
from mlxprog.llm import LLM, ModelError, load
from mlxprog.llm.checkpoint import Quantization
from mlxprog.llm.generate import EMBED_BATCH, EmbeddingInputError
from mlxprog.llm.models import FAMILIES as MODEL_FAMILIES
from mlxprog.llm.server import Server
from mlxprog.llm.server.embeddings import Embedder, EmbeddingJob
from mlxprog.llm.server.errors import APIError
from mlxprog.llm.server.schemas import MAX_EMBEDDING_INPUTS

MAX_LENGTH = 64
KEY = "sk-embed"
TEXTS = ["the quick brown fox", "hi", "the the the the the the the the the the", "a b c d e"]


@pytest.fixture(scope="module")
def hf_paths(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embed-models")
    write_hf(root / "hf", tied=False)
    write_hf(root / "hf-q", quantize=Quantization(bits=4, group_size=32),
             quantize_embedding=Quantization(bits=8, group_size=32))
    return {"hf": root / "hf", "hf-q": root / "hf-q"}


@pytest.fixture(scope="module")
def llms(hf_paths) -> dict[str, LLM]:
    return {kind: load(path, max_length=MAX_LENGTH) for kind, path in hf_paths.items()}


def mlx_lm_hidden_states(llm: LLM, path: Path):
    """mlx-lm's llama model of the checkpoint at ``path``: a function from
    token ids to its final hidden states [T, hidden] (after the final norm)."""
    model = mlx_lm_llama(llm, sorted(path.glob("*.safetensors")))
    return lambda ids: np.array(model.model(mx.array([ids]))[0])


def pooled(hidden: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    vector = hidden.mean(axis=0) if pooling == "mean" else hidden[-1]
    return vector / np.linalg.norm(vector) if normalize else vector


# -- LLM.embed ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["hf", "hf-q"])
def test_embed_matches_mlx_lm_hidden_states(llms, hf_paths, kind):
    llm = llms[kind]
    hidden_states = mlx_lm_hidden_states(llm, hf_paths[kind])
    ids = [llm.tokenizer.encode(text) for text in TEXTS]
    for pooling in ("mean", "last"):
        for normalize in (True, False):
            got = np.array(llm.embed(TEXTS, pooling=pooling, normalize=normalize))
            expected = np.stack([pooled(hidden_states(i), pooling, normalize) for i in ids])
            assert got.shape == (len(TEXTS), llm.config.hidden_size)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert np.allclose(np.linalg.norm(np.array(llm.embed(TEXTS)), axis=-1), 1.0, atol=1e-5)


#: The other families, as their tests configure them (inputs shorter than
#: their sliding windows, which mlx-lm's Gemma 2 does not apply).
FAMILIES = {
    "qwen3": dict(TINY_CONFIG, model_type="qwen3", rope_theta=1e6, use_sliding_window=False,
                  sliding_window=32, hidden_act="silu"),
    "gemma2": dict(TINY_CONFIG, model_type="gemma2", hidden_size=96, tie_word_embeddings=True,
                   query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                   final_logit_softcapping=20.0, rope_theta=5000.0),
    "phi3": dict(TINY_CONFIG, model_type="phi3", rope_theta=10000.0, hidden_act="silu",
                 original_max_position_embeddings=128, sliding_window=16),
    "gemma3_text": dict(TINY_CONFIG, model_type="gemma3_text", hidden_size=96,
                        num_hidden_layers=4, sliding_window=8, sliding_window_pattern=3,
                        query_pre_attn_scalar=24, rope_theta=1e6, rope_local_base_freq=1e4),
    "qwen3_moe": dict(TINY_CONFIG, model_type="qwen3_moe", rope_theta=1e6, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[]),
    "qwen2_moe": dict(TINY_CONFIG, model_type="qwen2_moe", rope_theta=1e6, num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=64,
                      shared_expert_intermediate_size=96),
    "mixtral": dict(TINY_CONFIG, model_type="mixtral", rope_theta=1e6, num_local_experts=4,
                    num_experts_per_tok=2),
    "olmoe": dict(TINY_CONFIG, model_type="olmoe", num_experts=4, num_experts_per_tok=2,
                  rms_norm_eps=1e-5),
    "gpt_oss": dict(TINY_CONFIG, model_type="gpt_oss", num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=4, rope_theta=150000.0,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 128}),
}


def test_every_family_is_in_the_table():
    # A family added under mlxprog/llm/models/ fails here until it is in FAMILIES.
    assert {"llama", *FAMILIES} == set(MODEL_FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_embeds_as_mlx_lm(tmp_path, family):
    directory = write_checkpoint(tmp_path, FAMILIES[family])
    llm, model = load(directory, max_length=MAX_LENGTH), mlx_lm_model(directory)
    inputs = [[5, 9, 14, 20, 33, 40, 41], [7, 8], [100, 101, 102, 103, 104]]
    for pooling in ("mean", "last"):
        expected = [pooled(np.array(model.model(mx.array([ids]))[0].astype(mx.float32)),
                           pooling, True) for ids in inputs]
        np.testing.assert_allclose(np.array(llm.embed(inputs, pooling=pooling)),
                                   np.stack(expected), rtol=1e-4, atol=1e-5)


def test_a_batch_equals_its_inputs_one_by_one(llms):
    llm = llms["hf-q"]
    vocab = llm.config.vocab_size
    # More inputs than one batch runs, in no order of length, up to max_length.
    lengths = [1 + (11 * i) % MAX_LENGTH for i in range(EMBED_BATCH + 2)] + [MAX_LENGTH]
    inputs = [[(7 * i + 3 * j) % vocab for j in range(n)] for i, n in enumerate(lengths)]
    for pooling in ("mean", "last"):
        batch = np.array(llm.embed(inputs, pooling=pooling))
        alone = np.stack([np.array(llm.embed(ids, pooling=pooling)) for ids in inputs])
        np.testing.assert_allclose(batch, alone, rtol=1e-5, atol=1e-5)


def test_one_input_and_its_token_ids(llms):
    llm = llms["hf"]
    one = llm.embed(TEXTS[0])
    assert one.shape == (llm.config.hidden_size,) and one.dtype == mx.float32
    assert llm.embed([TEXTS[0]]).shape == (1, llm.config.hidden_size)
    np.testing.assert_array_equal(np.array(llm.embed(llm.tokenizer.encode(TEXTS[0]))),
                                  np.array(one))
    assert llm.embedding_ids(TEXTS[:2]) == [llm.tokenizer.encode(t) for t in TEXTS[:2]]


def test_bad_inputs_name_the_input(llms):
    llm = llms["hf"]
    vocab = llm.config.vocab_size
    for inputs, message in [
        ([], "the inputs must be a non-empty list"),
        (["hi", ""], "input 1 is empty"),
        (["hi", [1, vocab]], f"input 1 has token {vocab}, outside the vocabulary [0, {vocab})"),
        (["hi", [1, 2.5]], "input 1 is [1, 2.5]: an input is a text or a list of token ids"),
        (["hi", b"hi"], "input 1 is bytes: decode it to a text first"),
        (b"hi", "the inputs are bytes: decode them to a text first"),
        (["a\ud800"], "input 0 is not valid Unicode text: it holds '\\ud800' (an unpaired "
                      "surrogate) at character 1"),
        ([[1] * (MAX_LENGTH + 1)], f"input 0 has {MAX_LENGTH + 1} tokens, but the model embeds "
                                   f"at most {MAX_LENGTH} (max_length)"),
    ]:
        with pytest.raises(EmbeddingInputError) as raised:
            llm.embed(inputs)
        assert message in str(raised.value)
    assert raised.value.tokens == MAX_LENGTH + 1 and raised.value.index == 0
    with pytest.raises(ModelError, match="pooling must be one of 'mean', 'last', got 'max'"):
        llm.embed("hi", pooling="max")
    with pytest.raises(ModelError, match="normalize must be true or false"):
        llm.embed("hi", normalize="yes")


# -- POST /v1/embeddings -------------------------------------------------------------
@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory, "embed-serve")


@pytest.fixture(scope="module")
def reference(model_path) -> LLM:
    """The model the answers are checked against (not the server's copy)."""
    return load(model_path, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def server(model_path):
    srv = Server(load(model_path, max_length=MAX_LENGTH), model_id="tiny", max_batch=2,
                 api_key=KEY)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def post(server: Server, body: Any, key: str | None = KEY) -> tuple[int, dict]:
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request("POST", "/v1/embeddings", body=json.dumps(body).encode(), headers=headers)
    response = conn.getresponse()
    out = response.status, json.loads(response.read())
    conn.close()
    return out


def test_openai_client_embeddings(client, reference):
    answer = client.embeddings.create(model="tiny", input=TEXTS)  # base64, decoded by the client
    assert answer.model == "tiny" and answer.object == "list"
    assert [d.index for d in answer.data] == list(range(len(TEXTS)))
    np.testing.assert_allclose(np.array([d.embedding for d in answer.data]),
                               np.array(reference.embed(TEXTS)), rtol=1e-5, atol=1e-6)
    tokens = sum(len(reference.tokenizer.encode(t)) for t in TEXTS)
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (tokens, tokens)
    one = client.embeddings.create(model="tiny", input=TEXTS[1], encoding_format="float")
    np.testing.assert_allclose(one.data[0].embedding, np.array(reference.embed(TEXTS[1])),
                               rtol=1e-5, atol=1e-6)


def test_the_answer_in_openai_shape(server, reference):
    ids = [reference.tokenizer.encode(t) for t in TEXTS[:2]]
    status, answer = post(server, {"model": "x", "input": ids, "pooling": "last",
                                   "dimensions": reference.config.hidden_size})
    assert status == 200, answer
    assert set(answer) == {"object", "data", "model", "usage"}
    assert answer["usage"] == {"prompt_tokens": sum(map(len, ids)),
                               "total_tokens": sum(map(len, ids))}
    assert [set(d) for d in answer["data"]] == [{"object", "index", "embedding"}] * 2
    assert [d["object"] for d in answer["data"]] == ["embedding"] * 2
    np.testing.assert_allclose([d["embedding"] for d in answer["data"]],
                               np.array(reference.embed(ids, pooling="last")),
                               rtol=1e-5, atol=1e-6)
    status, answer = post(server, {"input": ids[0], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, np.array(reference.embed(ids[0])), rtol=1e-5, atol=1e-6)


def test_bad_requests_are_400s_naming_the_field(server, reference):
    vocab, hidden = reference.config.vocab_size, reference.config.hidden_size
    for body, param, message in [
        ({}, "input", "input is required"),
        ({"input": []}, "input", "input must be a string, a list of strings"),
        ({"input": ""}, "input", "input item 0 is empty"),
        ({"input": ["hi", ""]}, "input", "input item 1 is empty"),
        ({"input": [[1, 2.5]]}, "input", "input item 0 must be a string or a list of integer "
                                         "token ids"),
        ({"input": [1, True]}, "input", "input item 0 must be a string or a list of integer"),
        ({"input": [[1, vocab]]}, "input", f"input 0 has token {vocab}, outside the vocabulary"),
        # JSON's "\ud800" escape: a lone surrogate, which the tokenizer cannot take.
        ({"input": ["hi", "a\ud800"]}, "input",
         "input 1 is not valid Unicode text: it holds '\\ud800' (an unpaired surrogate) at "
         "character 1"),
        ({"input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, "input",
         f"input holds {MAX_EMBEDDING_INPUTS + 1} inputs; at most {MAX_EMBEDDING_INPUTS}"),
        ({"input": "hi", "encoding_format": "hex"}, "encoding_format",
         "encoding_format must be 'float' or 'base64', got \"hex\""),
        ({"input": "hi", "dimensions": 8}, "dimensions", f"dimensions must be {hidden}"),
        ({"input": "hi", "pooling": "max"}, "pooling", "pooling must be one of 'mean', 'last'"),
    ]:
        status, answer = post(server, body)
        assert status == 400, (body, answer)
        assert answer["error"]["param"] == param, answer
        assert message in answer["error"]["message"], answer
        assert answer["error"]["type"] == "invalid_request_error"
    status, answer = post(server, {"input": [[1] * (MAX_LENGTH + 1)]})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert f"input 0 has {MAX_LENGTH + 1} tokens" in answer["error"]["message"]
    status, answer = post(server, {"input": "hi"}, key=None)
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"


def test_embeddings_beside_chat_completions(server, client, reference):
    """Embeddings run on their own thread while the scheduler's thread
    generates: both answers are what each gives alone."""
    messages = [{"role": "user", "content": "hello"}]
    expected_text = reference.generate(messages, max_tokens=24).text
    expected = np.array(reference.embed(TEXTS))

    def chat() -> str:
        return client.chat.completions.create(model="tiny", messages=messages, max_tokens=24,
                                              temperature=0).choices[0].message.content

    def embed() -> np.ndarray:
        data = client.embeddings.create(model="tiny", input=TEXTS).data
        return np.array([d.embedding for d in data])

    with ThreadPoolExecutor(6) as pool:
        chats = [pool.submit(chat) for _ in range(2)]
        embeddings = [pool.submit(embed) for _ in range(4)]
        assert [c.result() for c in chats] == [expected_text] * 2
        for e in embeddings:
            np.testing.assert_allclose(e.result(), expected, rtol=1e-5, atol=1e-6)
    assert server.embedder.failures == 0 and server.embedder.requests >= 4


def test_the_queue_is_bounded_and_closes(reference):
    loop = asyncio.new_event_loop()
    try:
        embedder = Embedder(reference, max_waiting=1)  # not started: the jobs stay queued
        for _ in range(2):  # one for the idle thread, one waiting
            embedder.submit(EmbeddingJob(["hi"], "mean", loop))
        with pytest.raises(APIError) as raised:
            embedder.submit(EmbeddingJob(["hi"], "mean", loop))
        assert (raised.value.status, raised.value.code) == (503, "server_busy")
        assert raised.value.headers == {"Retry-After": "1"}
        embedder.close()
        with pytest.raises(APIError) as raised:
            embedder.submit(EmbeddingJob(["hi"], "mean", loop))
        assert (raised.value.status, raised.value.code) == (503, "server_shutting_down")
    finally:
        loop.close()


def test_a_cancelled_job_is_skipped_and_not_counted(reference):
    """A job whose client went away before its turn is never run nor
    counted among the requests answered; the next one is."""
    loop = asyncio.new_event_loop()
    try:
        embedder = Embedder(reference, max_waiting=2)
        gone, waited = EmbeddingJob(["hi"], "mean", loop), EmbeddingJob(["hi"], "mean", loop)
        embedder.submit(gone)
        embedder.submit(waited)
        gone.cancel()
        embedder.start()
        answer = loop.run_until_complete(asyncio.wait_for(waited.result(), 60))
        embedder.stop()
        np.testing.assert_allclose(answer.vectors[0], np.array(reference.embed("hi")),
                                   rtol=1e-5, atol=1e-6)
        assert (embedder.requests, embedder.tokens) == (1, answer.tokens)
        with pytest.raises(asyncio.TimeoutError):  # no answer, not even an error
            loop.run_until_complete(asyncio.wait_for(gone.result(), 0.2))
    finally:
        loop.close()


# -- the docs -----------------------------------------------------------------------
def doc_blocks(name: str, containing: str) -> list[str]:
    text = (Path(__file__).parents[2] / "docs" / name).read_text()
    return [b for b in re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
            if containing in b]


def test_docs_examples_work(llms, client):
    (example,) = doc_blocks("llm.md", "llm.embed(")
    exec(compile(example, "docs/llm.md", "exec"), {"llm": llms["hf"], "print": lambda *a: None})
    (example,) = doc_blocks("serving.md", "client.embeddings.create(")
    exec(compile(example, "docs/serving.md", "exec"), {"client": client,
                                                       "print": lambda *a: None})


# -- mlxprog embed --------------------------------------------------------------------
def test_the_embed_command(llms, hf_paths, tmp_path, capsys):
    path = str(hf_paths["hf"])
    assert cli_main(["embed", "-m", path, "--max-length", str(MAX_LENGTH), *TEXTS[:2]]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    np.testing.assert_allclose(printed, np.array(llms["hf"].embed(TEXTS[:2])), rtol=1e-6)
    lines = tmp_path / "texts.txt"
    lines.write_text(f"{TEXTS[0]}\n\n{TEXTS[2]}\n")
    assert cli_main(["embed", "-m", path, "--file", str(lines), "--pooling", "last",
                     "--no-normalize"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    np.testing.assert_allclose(printed, np.array(llms["hf"].embed(
        [TEXTS[0], TEXTS[2]], pooling="last", normalize=False)), rtol=1e-5, atol=1e-6)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    assert cli_main(["embed", "-m", path, "--file", str(blank)]) == 1
    assert f"error: --file {blank}: no line to embed" in capsys.readouterr().err
    assert cli_main(["embed", "-m", path, "--pooling", "max", "hi"]) == 2
    assert "argument --pooling: must be one of mean, last, got max" in capsys.readouterr().err
    assert cli_main(["embed", "-m", path, "--max-length", "4", TEXTS[0]]) == 1
    assert re.search(r"error: input 0 has \d+ tokens, but --max-length is 4",
                     capsys.readouterr().err)
