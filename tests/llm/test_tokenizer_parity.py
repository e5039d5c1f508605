"""mlxprog's GGUF tokenizers give llama.cpp's token ids.

``tests/data/tokenizer_parity/*.json`` hold llama.cpp's ids (llama-cpp-python
0.3.36, ``tokenize`` with ``parse_special``, with and without the BOS/EOS
the vocabulary asks for) and its detokenization of them, written by
``tools/tokenizer_parity.py``, for multilingual texts with emoji, digits,
code, whitespace runs and special-token text, on:

- the real SmolLM2-135M-Instruct file (byte-level BPE, pre-tokenizer
  "smollm"), found as the other tests find it;
- tiny vocabulary-only GGUF files, rebuilt here from the tokenizer metadata
  each data file holds: a byte-level BPE for every ``tokenizer.ggml.pre``
  mlxprog supports (also without ``add_bos_token``, whose default is the
  pre-tokenizer's) and SentencePiece vocabularies with and without the space
  prefix.

Each file is read back with mlxprog's GGUF reader, and its tokenizer built
by ``Tokenizer.from_gguf_metadata`` must give llama.cpp's ids, and decode
the ids of each text to llama.cpp's text: exactly, but for llama.cpp's
"clean-up" of spaces before punctuation, which mlxprog does not do (a
stream of decoded pieces could not take back a space already emitted), so
that mlxprog's text is the one llama.cpp cleans up.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from llm_fixtures import smollm_path

from mlxprog.ggml.gguf_file import open_gguf
from mlxprog.llm import Tokenizer
from mlxprog.llm.tokenizer import _PRE_TOKENIZERS

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer_parity"
#: The tiny vocabularies' metadata, which each data file's recipe changes.
VOCABULARIES = "vocabularies.json"
FILES = sorted(p.stem for p in DATA.glob("*.json") if p.name != VOCABULARIES)


def tokenizer_metadata(recipe: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer metadata of a tiny vocabulary file: the vocabulary
    ``recipe`` names, with its changes (a None value removes the key)."""
    vocabularies = json.loads((DATA / VOCABULARIES).read_text(encoding="utf-8"))
    meta = dict(vocabularies[recipe["vocabulary"]])
    for key, value in recipe["changes"].items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


def write_vocabulary_gguf(path: Path, tokenizer_metadata: dict[str, Any]) -> Path:
    """A GGUF file at ``path`` holding a vocabulary and no tensors: llama
    architecture, the hyperparameters llama.cpp reads even when it loads
    the vocabulary only, and ``tokenizer_metadata`` (``tokenizer.ggml.*``
    keys as plain Python, written as llama.cpp's converter types them)."""
    import gguf
    from gguf_writer import add_tokenizer

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    add_tokenizer(writer, tokenizer_metadata)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def clean_spaces(text: str) -> str:
    """``text`` with the spaces llama.cpp's detokenizer removes for BPE
    vocabularies with ``clean_spaces``: before ``?!.,``, around a lone
    apostrophe and before the contractions 's, 'm, 're and 've."""
    text = re.sub(r" (?=[?!.,])", "", text)
    text = re.sub(r" ' ", "'", text)
    return re.sub(r" '(?=[sm]|re|ve)", "'", text)


def load_case_file(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def gguf_file(data: dict[str, Any], tmp_path: Path) -> Path:
    """The GGUF file ``data`` was made from: the installed SmolLM2 file, or
    the tiny file rebuilt from its tokenizer metadata."""
    if data.get("model_file") is None:
        return write_vocabulary_gguf(tmp_path / "vocabulary.gguf",
                                     tokenizer_metadata(data["recipe"]))
    path = smollm_path()
    if path.name != data["model_file"]["name"] or path.stat().st_size != data["model_file"]["bytes"]:
        pytest.fail(f"{path} is not the file the ids were made from ({data['model_file']}); "
                    "run tools/tokenizer_parity.py")
    return path


@pytest.fixture(params=FILES)
def parity(request, tmp_path) -> tuple[dict[str, Any], Tokenizer]:
    data = load_case_file(request.param)
    with open_gguf(gguf_file(data, tmp_path)) as model:
        return data, Tokenizer.from_gguf_metadata(model.metadata)


def test_data_covers_every_vocabulary_kind():
    assert FILES, f"no data in {DATA}"
    metadata = [tokenizer_metadata(d["recipe"]) for d in map(load_case_file, FILES)
                if d.get("model_file") is None]
    kinds = {(m["tokenizer.ggml.model"], m.get("tokenizer.ggml.pre")) for m in metadata}
    assert {pre for model, pre in kinds if model == "gpt2"} >= set(_PRE_TOKENIZERS)
    assert {m.get("tokenizer.ggml.add_space_prefix", True) for m in metadata
            if m["tokenizer.ggml.model"] == "llama"} == {False, True}


def test_ids_match_llama_cpp(parity):
    data, tok = parity
    wrong = []
    for case in data["cases"]:
        for add_special, key in ((False, "ids"), (True, "ids_add_special")):
            ours = tok.encode(case["text"], add_special_tokens=add_special)
            if ours != case[key]:
                wrong.append((case["text"], add_special, ours, case[key]))
    assert not wrong, "\n".join(
        f"{text!r} (add_special={add}):\n  mlxprog   {_pieces(tok, ours)}\n"
        f"  llama.cpp {_pieces(tok, theirs)}" for text, add, ours, theirs in wrong[:5])


def test_decoding_matches_llama_cpp(parity):
    data, tok = parity
    wrong = []
    for case in data["cases"]:
        ours = tok.decode(case["ids"])
        cleaned = clean_spaces(ours) if data["clean_spaces"] else ours
        if cleaned != case["detokenized"]:
            wrong.append((case["text"], ours, case["detokenized"]))
    assert not wrong, "\n".join(f"{text!r}:\n  mlxprog   {ours!r}\n  llama.cpp {theirs!r}"
                                for text, ours, theirs in wrong[:5])


def _pieces(tok: Tokenizer, ids: list[int]) -> list[str | None]:
    return [tok.id_to_token(i) for i in ids]
