"""SentencePiece-vocabulary GGUF tokenizers (``tokenizer.ggml.model`` "llama":
Gemma, Llama 2) rebuilt by ``Tokenizer.from_gguf_metadata``, on the tiny
vocabulary of :func:`gguf_writer.spm_tokenizer_metadata` (``<pad>``,
``<eos>``, ``<bos>``, ``<unk>`` as Gemma orders them, 256 byte tokens, a few
score-ranked pieces).

The expected pieces below are llama.cpp's: the same vocabulary in a GGUF file
tokenized by llama.cpp (llama-cpp-python 0.3.36) gives the same ids on these
strings and on random ones, with and without the space prefix
(``tests/data/tokenizer_parity/spm_fixture*.json``, checked by
``test_tokenizer_parity.py``), and Hugging Face's ``GemmaTokenizer`` built
from the vocabulary gives them too (the last test)."""

from __future__ import annotations

import random

import pytest
from gguf_writer import SPM_PIECES, spm_tokenizer_metadata
from llm_fixtures import TINY, write_hf
from transformers.models.gemma.tokenization_gemma import GemmaTokenizer
from transformers.tokenization_utils_base import generate_merges

from mlxprog.llm import ModelError, Tokenizer, load

TURN = "<start_of_turn>"
ROUND_TRIPS = ["hello world", " the and", "Hello", "héllo 日本 🦙", "a", "  two  spaces ",
               "line\nbreaks\n\n", "tab\there", "the and the world is hell", "½ — ok", "  "]


def tokenizer(**options) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(spm_tokenizer_metadata(user_defined=[TURN], **options))


def pieces(tok: Tokenizer, text: str, add_special_tokens: bool = False) -> list[str]:
    return [tok.id_to_token(i) for i in tok.encode(text, add_special_tokens=add_special_tokens)]


def test_merges_follow_the_scores():
    tok = tokenizer()
    # Best score first: "o▁" (a space captured by the o) outranks "lo", so no "▁world".
    assert pieces(tok, "hello world") == ["hell", "o▁", "w", "or", "l", "d"]
    assert pieces(tok, " the and") == ["▁the", "▁and"]
    assert pieces(tok, "  is") == ["▁▁", "is"]
    # With "an" scored above "▁a", " and" merges "an" first and "▁and" never forms.
    meta = spm_tokenizer_metadata()
    tokens, scores = meta["tokenizer.ggml.tokens"], list(meta["tokenizer.ggml.scores"])
    a, b = tokens.index("an"), tokens.index("▁a")
    scores[a], scores[b] = scores[b], scores[a]
    swapped = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.scores": scores})
    assert pieces(swapped, " and") == ["▁", "an", "d"]


def test_byte_fallback_for_characters_outside_the_vocabulary():
    tok = tokenizer()
    assert pieces(tok, "日") == ["<0xE6>", "<0x97>", "<0xA5>"]
    assert pieces(tok, "Hello") == ["<0x48>", "e", "ll", "o"]
    assert tok.decode(tok.encode("日Hello", add_special_tokens=False)) == "日Hello"
    # Bytes that are not a whole character decode to U+FFFD, as invalid UTF-8.
    assert tok.decode(tok.encode("日", add_special_tokens=False)[:2]) == "\ufffd\ufffd"


@pytest.mark.parametrize("space_prefix", [False, True])
def test_round_trips(space_prefix):
    tok = tokenizer(add_space_prefix=space_prefix)
    for text in ROUND_TRIPS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text, (text, ids)
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_bos_and_eos():
    meta = spm_tokenizer_metadata()
    bos, eos = meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]
    tok = Tokenizer.from_gguf_metadata(meta)
    assert (tok.bos_token_id, tok.eos_token_ids) == (bos, (eos,))
    assert tok.encode("the")[0] == bos and tok.encode("the", add_special_tokens=False)[0] != bos
    # llama.cpp's default for SentencePiece vocabularies is to add BOS.
    del meta["tokenizer.ggml.add_bos_token"]
    assert Tokenizer.from_gguf_metadata(meta).encode("the")[0] == bos
    meta["tokenizer.ggml.add_bos_token"] = False
    assert pieces(Tokenizer.from_gguf_metadata(meta), "the", True) == ["t", "he"]
    meta["tokenizer.ggml.add_eos_token"] = True
    assert Tokenizer.from_gguf_metadata(meta).encode("the")[-1] == eos
    assert tokenizer().decode([bos] + tokenizer().encode("the", False),
                              skip_special_tokens=True) == "the"


@pytest.mark.parametrize("harmony", [False, True])
def test_generation_ends_at_tokens_named_by_their_text(harmony):
    """As llama.cpp: tokens whose text ends a generation (``<|end|>``,
    ``<|endoftext|>``, ...) end it beside the file's EOS; a harmony
    vocabulary (``<|return|>`` and ``<|call|>``) keeps ``<|end|>``, which
    closes one channel of its reply."""
    ends = ["<|end|>", "<|endoftext|>"] + (["<|return|>", "<|call|>"] if harmony else [])
    meta = spm_tokenizer_metadata(user_defined=ends + ["<|channel|>"])
    tok = Tokenizer.from_gguf_metadata(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    named = {tokens[i] for i in tok.eos_token_ids[1:]}
    assert tok.eos_token_ids[0] == meta["tokenizer.ggml.eos_token_id"]
    assert named == ({"<|endoftext|>", "<|return|>", "<|call|>"} if harmony
                     else {"<|end|>", "<|endoftext|>"})


def test_space_prefix():
    tok = tokenizer(add_space_prefix=True)
    assert pieces(tok, "the and") == ["▁the", "▁and"]
    # As llama.cpp: the prefix goes before the text after a special token too,
    # and decoding drops the first one only.
    assert pieces(tok, f"the{TURN}the") == ["▁the", TURN, "▁the"]
    assert tok.decode(tok.encode(f"the{TURN}the", add_special_tokens=False)) == \
        f"the{TURN} the"
    assert pieces(tokenizer(), f"the{TURN}the") == ["t", "he", TURN, "t", "he"]


def test_special_tokens_written_in_the_text():
    tok = tokenizer()
    meta = spm_tokenizer_metadata(user_defined=[TURN])
    tokens = meta["tokenizer.ggml.tokens"]
    assert tok.encode(f"<bos>{TURN}<eos>", add_special_tokens=False) == [
        tokens.index("<bos>"), tokens.index(TURN), tokens.index("<eos>")]
    ids = tok.encode(f"{TURN}the<eos>")
    assert tok.decode(ids) == f"<bos>{TURN}the<eos>"
    # Control tokens are special (skipped on request); user-defined ones are text.
    assert tok.decode(ids, skip_special_tokens=True) == f"{TURN}the"


def test_streaming_decoder_holds_back_byte_tokens():
    tok = tokenizer()
    text = "the 日本 and 🦙"
    ids = tok.encode(text, add_special_tokens=False)
    stream = tok.stream_decoder()
    out = [stream.add(i) for i in ids]
    assert "".join(out) + stream.flush() == text
    assert "\ufffd" not in "".join(out)
    assert out.count("") >= 4  # bytes of 日, 本 and 🦙 held back until whole


def test_unknown_tokenizer_models_are_errors():
    meta = spm_tokenizer_metadata()
    for model in ("bert", None):
        meta["tokenizer.ggml.model"] = model
        with pytest.raises(ModelError, match=r"tokenizer model .* \(tokenizer\.ggml\.model\) "
                                             r"is not supported; supported: 'gpt2'"):
            Tokenizer.from_gguf_metadata(meta)
    meta = spm_tokenizer_metadata()
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:-1]
    with pytest.raises(ModelError, match="scores for"):
        Tokenizer.from_gguf_metadata(meta)


def test_gguf_file_with_a_sentencepiece_vocabulary(tmp_path):
    """A Llama-2-style file (llama architecture, SentencePiece vocabulary)
    written by llama.cpp's gguf package and read back by ``mx.load``:
    float scores, bool flags and the vocabulary come through."""
    from gguf_writer import write_gguf_from_hf

    vocab = len(spm_tokenizer_metadata()["tokenizer.ggml.tokens"])
    write_hf(tmp_path / "hf", sizes=dict(TINY, vocab_size=vocab))
    path = write_gguf_from_hf(tmp_path / "hf", tmp_path / "spm.gguf", tokenizer="spm")
    llm = load(path, max_length=32)
    tok = llm.tokenizer
    assert tok.vocab_size == llm.config.vocab_size == vocab
    assert (llm.config.bos_token_id, tok.bos_token_id) == (1, 1)  # the config's ids
    # No add_space_prefix key (the llama converter writes none): llama.cpp's default, a prefix.
    assert pieces(tok, "the and", True) == ["<bos>", "▁the", "▁and"]
    assert tok.decode(tok.encode("the and"), skip_special_tokens=True) == "the and"
    out = llm.generate("hello 日本", max_tokens=3, chat=False)
    assert len(out.tokens) == 3 or out.finish_reason == "eos"


def random_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` random strings of the vocabulary's pieces, byte-fallback
    characters and special-token text (``tools/tokenizer_parity.py`` stores
    llama.cpp's ids for 400 of them)."""
    rng = random.Random(seed)
    alphabet = list("thean dolwris\n") + ["é", "日", "🦙", "  ", TURN, "<bos>"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def test_matches_hugging_face_gemma_tokenizer():
    """Hugging Face's ``GemmaTokenizer`` (transformers comes with mlx-lm, a
    test dependency) built from the same vocabulary (merges by its own
    ``generate_merges`` from the scores) gives the same ids and text."""
    meta = spm_tokenizer_metadata()
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    vocab = {t: i for i, t in enumerate(tokens)}
    hf = GemmaTokenizer(vocab=vocab, merges=generate_merges(vocab, dict(zip(tokens, scores))))
    ours = Tokenizer.from_gguf_metadata(meta)
    assert len(SPM_PIECES) < len(tokens)
    for text in ROUND_TRIPS + [t.replace(TURN, "").replace("<bos>", "")
                               for t in random_texts(400, seed=1)]:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == hf(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == hf.decode(ids), text
