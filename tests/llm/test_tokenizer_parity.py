"""mlxprog's GGUF tokenizers give llama.cpp's token ids.

``tests/data/tokenizer_parity/*.json`` hold llama.cpp's ids (llama-cpp-python
0.3.36, ``tokenize`` with ``parse_special``, with and without the BOS/EOS
the vocabulary asks for) and its detokenization of them, written by
``tools/tokenizer_parity.py``, for multilingual texts with emoji, digits,
code, whitespace runs and special-token text, on:

- the real SmolLM2-135M-Instruct file (byte-level BPE, pre-tokenizer
  "smollm"), found as the other tests find it;
- tiny vocabulary-only GGUF files, rebuilt here from the recipe each data
  file holds (a vocabulary of ``vocabularies.json`` and changes to its
  metadata): a byte-level BPE for every ``tokenizer.ggml.pre`` mlxprog
  supports (and one without ``add_bos_token``, whose default is the
  pre-tokenizer's, and one without ``tokenizer.ggml.pre``), SentencePiece
  vocabularies with and without the space prefix, and one with Phi-3's
  special tokens and name;
- the SentencePiece vocabulary of ``test_tokenizer_spm.py``, with and
  without the space prefix, on that test's strings and 400 random strings
  of its pieces, byte-fallback characters and special-token text.

Each file is read back with mlxprog's GGUF reader; the tokenizer
``Tokenizer.from_gguf_metadata`` builds from it must give llama.cpp's ids,
and decode each text's ids to llama.cpp's text but for two things mlxprog
does not copy: the "clean-up" of spaces before punctuation of llama.cpp's
detokenizer for some byte-level vocabularies (a stream of decoded pieces
could not take back a space already sent), and its rendering of special
and user-defined SentencePiece tokens with their ``▁`` left in (mlxprog
writes every ``▁`` as a space).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf_writer import add_tokenizer
from llm_fixtures import smollm_path

from mlxprog.ggml.gguf_file import open_gguf
from mlxprog.llm import Tokenizer
from mlxprog.llm.tokenizer import _PRE_TOKENIZER_ALIASES, _PRE_TOKENIZERS

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer_parity"
#: The tiny vocabularies' metadata, which the data files' recipes change.
VOCABULARIES = "vocabularies.json"
FILES = sorted(p.stem for p in DATA.glob("*.json") if p.name != VOCABULARIES)


def vocabulary_metadata(recipe: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a tiny vocabulary file: the vocabulary ``recipe``
    names, with its changes (a None value removes the key)."""
    vocabularies = json.loads((DATA / VOCABULARIES).read_text(encoding="utf-8"))
    meta = dict(vocabularies[recipe["vocabulary"]])
    for key, value in recipe["changes"].items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return meta


def write_vocabulary_gguf(path: Path, metadata: dict[str, Any]) -> Path:
    """A GGUF file at ``path`` holding a vocabulary and no tensors: llama
    architecture (llama.cpp loads the vocabulary alone of such a file; it
    asks for no hyperparameters then), ``general.name`` when ``metadata``
    has one and its ``tokenizer.*`` keys (plain Python, typed as llama.cpp's
    converter writes them)."""
    writer = gguf.GGUFWriter(path, "llama")
    if metadata.get("general.name") is not None:
        writer.add_name(metadata["general.name"])
    add_tokenizer(writer, metadata)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def clean_spaces(text: str) -> str:
    """``text`` without the spaces llama.cpp's detokenizer removes for
    byte-level vocabularies with ``clean_spaces``: before ``?!.,``, around a
    lone apostrophe and before the contractions 's, 'm, 're and 've."""
    text = re.sub(r" (?=[?!.,])", "", text)
    text = re.sub(r" ' ", "'", text)
    return re.sub(r" '(?=[sm]|re|ve)", "'", text)


def load_data(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def gguf_file(data: dict[str, Any], tmp_path: Path) -> Path:
    """The GGUF file ``data`` was made from: the installed SmolLM2 file, or
    the tiny file rebuilt from its recipe."""
    if "recipe" in data:
        return write_vocabulary_gguf(tmp_path / "vocabulary.gguf",
                                     vocabulary_metadata(data["recipe"]))
    path, made_from = smollm_path(), data["model_file"]
    if (path.name, path.stat().st_size) != (made_from["name"], made_from["bytes"]):
        pytest.fail(f"{path} is not the file the ids were made from ({made_from}); "
                    "run tools/tokenizer_parity.py")
    return path


@pytest.fixture(params=FILES)
def parity(request, tmp_path) -> tuple[dict[str, Any], Tokenizer, str]:
    """A data file, the tokenizer of its GGUF file and its tokenizer model."""
    data = load_data(request.param)
    with open_gguf(gguf_file(data, tmp_path)) as model:
        return (data, Tokenizer.from_gguf_metadata(model.metadata),
                model.metadata["tokenizer.ggml.model"])


def test_data_covers_every_vocabulary_kind():
    data = [load_data(name) for name in FILES]
    metadata = [vocabulary_metadata(d["recipe"]) for d in data if "recipe" in d]
    # Every name mlxprog takes, and a file that names none.
    assert {m.get("tokenizer.ggml.pre") for m in metadata if m["tokenizer.ggml.model"] == "gpt2"
            } == {*_PRE_TOKENIZERS, *_PRE_TOKENIZER_ALIASES, None}
    assert {m.get("tokenizer.ggml.add_space_prefix", True) for m in metadata
            if m["tokenizer.ggml.model"] == "llama"} == {False, True}
    assert any("phi-3" in m.get("general.name", "").lower() for m in metadata)
    assert "smollm2" in FILES


def test_ids_match_llama_cpp(parity):
    data, tok, _ = parity
    wrong = []
    for case in data["cases"]:
        for add_special, key in ((False, "ids"), (True, "ids_add_special")):
            ours = tok.encode(case["text"], add_special_tokens=add_special)
            if ours != case[key]:
                wrong.append((case["text"], add_special, ours, case[key]))
    assert not wrong, "\n".join(
        f"{text!r} (add_special_tokens={add}):\n  mlxprog   {_pieces(tok, ours)}\n"
        f"  llama.cpp {_pieces(tok, theirs)}" for text, add, ours, theirs in wrong[:3])


def test_decoding_matches_llama_cpp(parity):
    data, tok, model = parity
    wrong = []
    for case in data["cases"]:
        ours = tok.decode(case["ids"])
        theirs = case["detokenized"]
        if data["clean_spaces"]:
            ours = clean_spaces(ours)
        if model == "llama":
            theirs = theirs.replace("\u2581", " ")
        if ours != theirs:
            wrong.append((case["text"], ours, theirs))
    assert not wrong, "\n".join(f"{text!r}:\n  mlxprog   {ours!r}\n  llama.cpp {theirs!r}"
                                for text, ours, theirs in wrong[:3])


def _pieces(tok: Tokenizer, ids: list[int]) -> list[str | None]:
    return [tok.id_to_token(i) for i in ids]
