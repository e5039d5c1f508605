"""Tokenizers for llama-family models, built with the ``tokenizers`` library.

:meth:`Tokenizer.from_gguf_metadata` rebuilds the tokenizer a GGUF file's
``tokenizer.ggml.*`` metadata describes, tokenizing as llama.cpp does (the
same ids: ``tests/llm/test_tokenizer_parity.py``): byte-level BPE
(``tokenizer.ggml.model`` "gpt2"; the pre-tokenizer is chosen by
``tokenizer.ggml.pre``) or a SentencePiece vocabulary ("llama": Gemma, Llama 2;
see :func:`_sentencepiece_backend`); :meth:`Tokenizer.from_hf` reads a Hugging
Face ``tokenizer.json``. Chat templates are rendered with a
sandboxed jinja2 environment, and :class:`StreamingDecoder` turns a stream of
token ids into text pieces that never split a UTF-8 character.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from ..errors import ModelError, SettingError
from ..ggml.gguf_file import metadata_field, metadata_value

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
#: SentencePiece's whitespace symbol (U+2581).
_SPM_SPACE = "\u2581"

# The contractions spelt out in both cases, as llama.cpp does, rather than
# the tokenizer.json's (?i:'s|...): Oniguruma's case folding also takes the
# long s (U+017F) for an s, so "x'ſa" would split after "'ſ".
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# The parts llama.cpp's expressions share: at most one character that is no
# letter, digit or line break before a word's letters, a word (a contraction
# or such letters), a run of other characters after at most one space (each
# expression then says which line breaks it takes), and the whitespace rules
# that end each expression.
_LEAD = r"[^\r\n\p{L}\p{N}]?"
_WORD = _CONTRACTIONS + "|" + _LEAD + r"\p{L}+"
_OTHERS = r"| ?[^\s\p{L}\p{N}]+"
_SPACES = r"|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = _WORD + r"|\p{N}{1,3}" + _OTHERS + r"[\r\n]*" + _SPACES
_QWEN2_SPLIT = _WORD + r"|\p{N}" + _OTHERS + r"[\r\n]*" + _SPACES
_SEED_CODER_SPLIT = _WORD + r"|\p{N}| ?[^\s\p{L}\p{N}\r\n]+" + _SPACES
# Words split where lower case turns to upper (o200k and Tekken), as
# llama.cpp spells it: a letter outside a-z counts as upper case and one
# outside A-Z as lower case, so every letter beyond ASCII is both (its
# expression runs on text whose non-ASCII letters are one stand-in byte):
# "ÉCOLE" splits after its É, which the tokenizer.json's Lu/Ll classes
# keep in the word.
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"


def _cased_words(suffix: str) -> str:
    """A word of letters, lower case after any upper case or upper case
    then lower, after at most one character that is no letter, digit or
    line break, then ``suffix``."""
    return f"{_LEAD}{_UPPER}*{_LOWER}+{suffix}|{_LEAD}{_UPPER}+{_LOWER}*{suffix}"


_GPT4O_SPLIT = _cased_words(_CONTRACTIONS + "?") + r"|\p{N}{1,3}" + _OTHERS + r"[\r\n/]*" + _SPACES
_TEKKEN_SPLIT = _cased_words("") + r"|\p{N}" + _OTHERS + r"[\r\n/]*" + _SPACES
#: GPT-2's expression (the ``ByteLevel`` pre-tokenizer's).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


# DeepSeek LLM's letters (llama.cpp's "deepseek-llm" lists them as ranges:
# most scripts' cased letters, not CJK's, Hangul's or other scripts' uncased ones).
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293"
    "\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A"
    "\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556"
    "\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B"
    "\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D"
    "\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE"
    "\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4"
    "\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128"
    "\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184"
    "\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B"
    "\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17"
    "\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3"
    "\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF"
    "\U0001E900-\U0001E943"
)
# Runs of CJK ideographs, of everything from U+0800 to them, and of Hangul:
# DeepSeek's, less whitespace (`&&\S`). llama.cpp runs its expressions that
# list characters on text whose non-ASCII whitespace is one stand-in control
# character, so the whitespace inside these ranges (U+2000-U+200A, U+3000, ...)
# never matches them there.
_DEEPSEEK_CJK = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF&&\\S]+"


def _deepseek_llm() -> pre_tokenizers.PreTokenizer:
    """llama.cpp's "deepseek-llm" list: line breaks alone, words of the
    listed letters, runs of ASCII, full-width and CJK punctuation, trailing
    whitespace, CJK and Hangul runs, then runs of digits."""
    return _split_then_bytes(
        "[\r\n]", "\\s?[" + _DEEPSEEK_LETTERS + "]+",
        "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002&&\\S]+",
        "\\s+$", _DEEPSEEK_CJK, "\\p{N}+")


def _deepseek_coder() -> pre_tokenizers.PreTokenizer:
    """llama.cpp's "deepseek-coder" list: line breaks alone, words, runs of
    punctuation, CJK and Hangul runs, then single digits."""
    return _split_then_bytes("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _DEEPSEEK_CJK,
                             "\\p{N}")


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _split_then_bytes(*patterns: str) -> pre_tokenizers.PreTokenizer:
    """Each pattern splits the pieces the ones before it made (a stretch no
    match covers stays a piece), as llama.cpp applies a pre-tokenizer's
    list of expressions; then the pieces' bytes as GPT-2's characters."""
    return pre_tokenizers.Sequence([
        *(pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _default_splits() -> pre_tokenizers.PreTokenizer:
    """llama.cpp's rules for a byte-level BPE file that names no
    pre-tokenizer: runs of punctuation and of ``$+<=>^~|`` first, then GPT-2's
    expression, then runs of digits cut in threes from the left."""
    return _split_then_bytes(r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", "[0-9]{3}")


@dataclass(frozen=True)
class _PreTokenizer:
    """What llama.cpp does for a ``tokenizer.ggml.pre`` of a byte-level BPE:
    how it splits text before merging, whether a piece that is a vocabulary
    entry skips the merges, and whether BOS is added when the file has no
    ``tokenizer.ggml.add_bos_token`` (Llama 3's files have none)."""

    make: Callable[[], pre_tokenizers.PreTokenizer]
    ignore_merges: bool = False
    add_bos: bool = False


_PRE_TOKENIZERS = {
    "default": _PreTokenizer(_default_splits),
    "gpt-2": _PreTokenizer(_gpt2),
    "smollm": _PreTokenizer(_digits_then_gpt2),
    "starcoder": _PreTokenizer(_digits_then_gpt2),
    "refact": _PreTokenizer(_digits_then_gpt2),
    "llama-bpe": _PreTokenizer(lambda: _split_then_bytes(_LLAMA3_SPLIT), ignore_merges=True,
                               add_bos=True),
    "dbrx": _PreTokenizer(lambda: _split_then_bytes(_LLAMA3_SPLIT)),
    "qwen2": _PreTokenizer(lambda: _split_then_bytes(_QWEN2_SPLIT)),
    "seed-coder": _PreTokenizer(lambda: _split_then_bytes(_SEED_CODER_SPLIT)),
    "gpt-4o": _PreTokenizer(lambda: _split_then_bytes(_GPT4O_SPLIT)),
    "tekken": _PreTokenizer(lambda: _split_then_bytes(_TEKKEN_SPLIT), ignore_merges=True,
                            add_bos=True),
    "deepseek-llm": _PreTokenizer(_deepseek_llm),
    "deepseek-coder": _PreTokenizer(_deepseek_coder),
}

#: Other ``tokenizer.ggml.pre`` names llama.cpp gives the same rules (the
#: files of Llama 3 and Falcon 3, OLMoE, Phi-4, DeepSeek-R1's Qwen
#: distillations, ...), with the name whose rules they are.
_PRE_TOKENIZER_ALIASES = {
    "llama3": "llama-bpe", "llama-v3": "llama-bpe", "falcon3": "llama-bpe",
    "pixtral": "llama-bpe", "midm-2.0": "llama-bpe",
    "olmo": "gpt-2", "mpt": "gpt-2", "trillion": "gpt-2",
    "minerva-7b": "starcoder",
    "smaug-bpe": "dbrx",
    "deepseek-r1-qwen": "qwen2", "megrez": "qwen2",
    "llama4": "gpt-4o",
}


def _byte_level_backend(metadata: Mapping[str, Any], tokens: list[str],
                        token_types: list[int]) -> Backend:
    """``tokenizer.ggml.model`` "gpt2": byte-level BPE with the merges of
    ``tokenizer.ggml.merges`` and llama.cpp's pre-tokenizer for
    ``tokenizer.ggml.pre``."""
    pre = _pre_tokenizer(metadata)
    merges = [tuple(m.split(" ")) for m in
              metadata_field(metadata, "tokenizer.ggml.merges", "strings")]
    if set(map(len, merges)) - {2}:
        index = next(i for i, m in enumerate(merges) if len(m) != 2)
        raise ModelError(f"GGUF metadata key tokenizer.ggml.merges: entry {index} "
                         f"({' '.join(merges[index])!r}) is not two tokens joined by a space")
    backend = Backend(_bpe(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                           ignore_merges=pre.ignore_merges))
    backend.pre_tokenizer = pre.make()
    backend.decoder = decoders.ByteLevel()
    return backend


def _bpe(**kwargs: Any) -> models.BPE:
    """tokenizers' BPE model of ``kwargs``; what it refuses (a merge of a
    token the vocabulary lacks, ...) is a :class:`ModelError`."""
    try:
        return models.BPE(**kwargs)
    except Exception as e:  # tokenizers raises a bare Exception
        raise ModelError(f"GGUF tokenizer metadata: the tokens and merges make no BPE "
                         f"tokenizer ({e})") from None


def _pre_tokenizer(metadata: Mapping[str, Any]) -> _PreTokenizer:
    """The rules of a byte-level BPE's ``tokenizer.ggml.pre``: one mlxprog
    supports, or llama.cpp's default ones when the file names none."""
    pre = metadata_value(metadata.get("tokenizer.ggml.pre", "default"))
    if not isinstance(pre, str):
        raise ModelError(f"GGUF key tokenizer.ggml.pre holds {type(pre).__name__} {pre!r:.60}, "
                         "not a pre-tokenizer name")
    pre = _PRE_TOKENIZER_ALIASES.get(pre, pre)
    if pre not in _PRE_TOKENIZERS:
        raise ModelError(f"GGUF pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
                         "supported: " + ", ".join(sorted([*_PRE_TOKENIZERS,
                                                           *_PRE_TOKENIZER_ALIASES])))
    return _PRE_TOKENIZERS[pre]


def _sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce llama.cpp's SentencePiece tokenizer: it
    repeatedly merges the adjacent pair whose concatenation is the
    best-scored vocabulary token (leftmost on ties). Every split of a token
    into two vocabulary pieces is a merge, ranked by the token's score;
    ties as Hugging Face's converter orders them (``generate_merges``:
    longer left, then longer right piece, then token and piece ids).
    Tokens of every type are merge results, as in llama.cpp, which merges
    into whatever vocabulary entry a pair spells: a user-defined "▁▁▁"
    forms from three spaces (written text, with spaces for ``▁``, never
    matches it whole)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    candidates = []
    for i, token in enumerate(tokens):
        if len(token) < 2 or vocab[token] != i:
            continue
        local = [(vocab[token[:k]], vocab[token[k:]], token[:k], token[k:])
                 for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab]
        if len(local) > 1:
            local.sort()
        candidates += [(scores[i], left, right) for _, _, left, right in local]
    candidates.sort(key=lambda m: (-m[0], -len(m[1]), -len(m[2])))
    return [(left, right) for _, left, right in candidates]


def _sentencepiece_backend(metadata: Mapping[str, Any], tokens: list[str],
                           token_types: list[int]) -> Backend:
    """``tokenizer.ggml.model`` "llama": a SentencePiece vocabulary (tokens
    with ``\u2581`` for spaces, ``tokenizer.ggml.scores``, byte-fallback
    tokens ``<0xNN>``) tokenized as llama.cpp's SPM tokenizer and Hugging
    Face's ``GemmaTokenizerFast`` / ``LlamaTokenizerFast`` do: spaces become
    ``\u2581`` (after a ``\u2581`` prefix when
    ``tokenizer.ggml.add_space_prefix``, llama.cpp's default; Gemma's files
    turn it off), no pre-tokenization, a score-ranked BPE
    (:func:`_sentencepiece_merges`) and characters outside the vocabulary as
    their UTF-8 byte tokens. Decoding turns ``\u2581`` back into spaces (less
    the prefix space) and byte tokens into bytes."""
    scores = metadata_field(metadata, "tokenizer.ggml.scores", "numbers", None)
    scores = [0.0] * len(tokens) if scores is None else [float(x) for x in scores]
    if len(scores) != len(tokens):
        raise ModelError(f"GGUF tokenizer metadata: {len(scores)} scores for "
                         f"{len(tokens)} tokens")
    unk_id = _token_id(metadata, "unknown_token_id", len(tokens))
    if unk_id is None:
        unk_id = next(iter(_indices_of(token_types, (_UNKNOWN,))), None)
    unk = None if unk_id is None else tokens[unk_id]
    backend = Backend(_bpe(vocab={t: i for i, t in enumerate(tokens)},
                           merges=_sentencepiece_merges(tokens, scores),
                           unk_token=unk, fuse_unk=True, byte_fallback=True))
    space_prefix = metadata_field(metadata, "tokenizer.ggml.add_space_prefix", "flag", True)
    replace = normalizers.Replace(" ", _SPM_SPACE)
    backend.normalizer = (normalizers.Sequence([normalizers.Prepend(_SPM_SPACE), replace])
                          if space_prefix else replace)
    steps = [decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    return backend


_GGUF_MODELS = {"gpt2": _byte_level_backend, "llama": _sentencepiece_backend}

#: Token texts llama.cpp takes for control tokens whatever their type (it
#: finds the end-of-generation tokens by their text).
_END_OF_GENERATION_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
})
#: Fill-in-the-middle token texts llama.cpp takes for control tokens when
#: the file names no token of that role: key suffixes -> texts.
_FILL_IN_THE_MIDDLE_TEXTS = {
    ("fim_pre_token_id", "prefix_token_id"): frozenset({
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
        "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"}),
    ("fim_suf_token_id", "suffix_token_id"): frozenset({
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
        "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"}),
    ("fim_mid_token_id", "middle_token_id"): frozenset({
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
        "\u2581<MID>", "<|code_middle|>", "<|middle|>"}),
    ("fim_pad_token_id",): frozenset({"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}),
    ("fim_rep_token_id",): frozenset({"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                      "<reponame>"}),
    ("fim_sep_token_id",): frozenset({"<|file_sep|>"}),
}
#: Token texts llama.cpp takes for user-defined tokens whatever their type
#: (gpt-oss's, which it always renders).
_USER_DEFINED_TEXTS = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})
#: Phi-3's special tokens that keep the whitespace after them (the others
#: take it: ASCII whitespace in llama.cpp, any Unicode whitespace here).
_PHI3_KEEP_SPACE = frozenset({"<unk>", "<s>", "<|endoftext|>"})


def _tokens_found_whole(metadata: Mapping[str, Any], tokens: list[str],
                        token_types: list[int]) -> dict[int, bool]:
    """The tokens llama.cpp finds whole in a text before tokenizing the rest
    (id -> whether special, that is, left out when decoding without special
    tokens): control and unknown tokens (special), user-defined ones, and
    tokens it takes for either by their text."""
    control_texts = set(_END_OF_GENERATION_TEXTS)
    for keys, texts in _FILL_IN_THE_MIDDLE_TEXTS.items():
        if all(metadata.get(f"tokenizer.ggml.{key}") is None for key in keys):
            control_texts |= texts
    # Only the tokens of a special kind or text are visited: a vocabulary
    # has tens of thousands of tokens, and the load waits on this loop.
    candidates = {*_indices_of(token_types, (_UNKNOWN, _CONTROL, _USER_DEFINED)),
                  *_indices_of(tokens, (control_texts | _USER_DEFINED_TEXTS).intersection(tokens))}
    found = {}
    for i in sorted(candidates):
        text, kind = tokens[i], token_types[i]
        if text in _USER_DEFINED_TEXTS:
            found[i] = False
        elif kind in (_UNKNOWN, _CONTROL) or text in control_texts:
            found[i] = True
        elif kind == _USER_DEFINED:
            found[i] = False
    return found


def _token_id(metadata: Mapping[str, Any], key: str, vocab_size: int) -> int | None:
    """Token id ``tokenizer.ggml.<key>`` (None when absent). An id outside
    the vocabulary is left out with a notice, as llama.cpp does ("bad
    special token"): its files are not refused for it."""
    value = metadata_field(metadata, f"tokenizer.ggml.{key}", "integer", None)
    if value is not None and not 0 <= value < vocab_size:
        print(f"mlxprog: GGUF metadata key tokenizer.ggml.{key} is {value}, outside the "
              f"vocabulary of {vocab_size} tokens; ignored", file=sys.stderr)
        return None
    return value


def _indices_of(items: list[Any], values: Iterable[Any]) -> list[int]:
    """The indices of the items equal to one of ``values``, ascending: one
    list search (in C) per value, where a Python loop over a vocabulary of
    tens of thousands of tokens would cost the load milliseconds."""
    indices = []
    for value in values:
        start = 0
        while True:
            try:
                start = items.index(value, start)
            except ValueError:
                break
            indices.append(start)
            start += 1
    return sorted(indices)


def _ends_by_text(tokens: list[str]) -> list[int]:
    """The tokens that end a generation by their text, as llama.cpp takes
    them whatever the file's EOS keys say (a Qwen file's ``<|im_end|>``
    beside its ``<|endoftext|>``). Harmony vocabularies (gpt-oss) end a
    reply at ``<|return|>`` or ``<|call|>``: their ``<|end|>`` closes one
    channel of the reply, not the reply."""
    ends = _indices_of(tokens, _END_OF_GENERATION_TEXTS.intersection(tokens))
    texts = {tokens[i] for i in ends}
    if {"<|return|>", "<|call|>"} <= texts:
        ends = [i for i in ends if tokens[i] != "<|end|>"]
    return ends


#: The conversation a chat template given to :func:`~mlxprog.llm.load` must
#: render (with ``add_generation_prompt``): a system message, then user and
#: assistant turns alternating, ending on the user's, as Mistral-style
#: templates demand.
SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
)


def unicode_problem(text: str) -> str:
    """Why ``text`` is no valid Unicode text ("" when it is): ``holds
    '\\ud800' (an unpaired surrogate) at character 3``. Python strings can
    hold lone surrogates (invalid UTF-8 on the command line decodes to
    them); tokenizers refuse them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds {text[e.start]!r} (an unpaired surrogate) at character {e.start}"
    return ""


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template given in place of the model's: its Jinja ``text``
    and ``source``, where it came from (a file's path, or "the inline
    template"), which errors name."""

    text: str
    source: str

    @classmethod
    def of(cls, value: str | Path | ChatTemplate) -> ChatTemplate:
        """The template ``value`` gives: a :class:`pathlib.Path` is a file;
        a string holding ``{{`` or ``{%`` is the template itself, any other
        string a file's path (a template without either tag would render
        the same text for every conversation). The template is compiled
        here, so a syntax error is a :class:`~mlxprog.llm.SettingError`
        (``chat_template``) naming the file, before any model loads."""
        if isinstance(value, ChatTemplate):
            return value
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            template = cls(value, "the inline template")
        elif isinstance(value, (str, Path)):
            try:
                text = Path(value).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise SettingError("chat_template", f"cannot read the template file "
                                   f"{str(value)!r}: {reason}") from None
            template = cls(text, f"the template file {str(value)!r}")
        else:
            raise SettingError("chat_template", "expected a template string or a file path, "
                               f"got {type(value).__name__}")
        template.compile()
        return template

    def compile(self) -> jinja2.Template:
        """The compiled template; a syntax error is a
        :class:`~mlxprog.llm.SettingError` naming :attr:`source`."""
        try:
            return _template_environment().from_string(self.text)
        except jinja2.TemplateSyntaxError as exc:
            raise SettingError("chat_template", f"{self.source} does not compile: "
                               f"line {exc.lineno}: {exc.message}") from None


class Tokenizer:
    """Text <-> token ids, chat templates and streaming detokenization.

    ``backend`` is the ``tokenizers.Tokenizer`` doing the work; ``eos_token_ids``
    are all ids that end a generation (EOS, end-of-turn).
    """

    def __init__(self, backend: Backend, *, bos_token_id: int | None,
                 eos_token_ids: Iterable[int], chat_template: str | None = None):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer described by a GGUF file's metadata (as
        :func:`mlxprog.ggml.gguf_file.open_gguf` reads it, or ``mx.load(path,
        return_metadata=True)``): ``tokenizer.ggml.model`` "gpt2"
        (byte-level BPE) or "llama" (SentencePiece)."""
        model = metadata_field(metadata, "tokenizer.ggml.model", "string", None)
        if model not in _GGUF_MODELS:
            raise ModelError(f"GGUF tokenizer model {model!r} (tokenizer.ggml.model) is not "
                             "supported; supported: 'gpt2' (byte-level BPE), 'llama' "
                             "(SentencePiece)")
        tokens = metadata_field(metadata, "tokenizer.ggml.tokens", "strings")
        token_types = metadata_field(metadata, "tokenizer.ggml.token_type", "integers", None)
        token_types = [_NORMAL] * len(tokens) if token_types is None else token_types
        if len(token_types) != len(tokens):
            raise ModelError(f"GGUF tokenizer metadata: {len(token_types)} token types for "
                             f"{len(tokens)} tokens")
        backend = _GGUF_MODELS[model](metadata, tokens, token_types)
        # Phi-3's special tokens take the whitespace after them, as its Hugging
        # Face tokenizer marks them; llama.cpp knows Phi-3 by the file's name.
        name = str(metadata_value(metadata.get("general.name")) or "").lower()
        phi3 = "phi-3" in name or "phi3" in name
        added = [AddedToken(tokens[i], special=special, normalized=False,
                            rstrip=phi3 and tokens[i] not in _PHI3_KEEP_SPACE)
                 for i, special in _tokens_found_whole(metadata, tokens, token_types).items()]
        backend.add_special_tokens([t for t in added if t.special])
        backend.add_tokens([t for t in added if not t.special])

        def token_id(key: str) -> int | None:
            return _token_id(metadata, key, len(tokens))

        def flag(key: str, default: bool) -> bool:
            return metadata_field(metadata, f"tokenizer.ggml.{key}", "flag", default)

        bos, eos = token_id("bos_token_id"), token_id("eos_token_id")
        # llama.cpp's defaults: SentencePiece vocabularies add BOS, BPE ones
        # only for some pre-tokenizers (Llama 3's).
        add_bos = model == "llama" or _pre_tokenizer(metadata).add_bos
        prefix = [bos] if bos is not None and flag("add_bos_token", add_bos) else []
        suffix = [eos] if eos is not None and flag("add_eos_token", False) else []
        if prefix or suffix:
            backend.post_processor = processors.TemplateProcessing(
                single=" ".join([tokens[i] for i in prefix] + ["$A"] + [tokens[i] for i in suffix]),
                special_tokens=[(tokens[i], i) for i in set(prefix + suffix)])
        eos_ids = [i for i in (eos, token_id("eot_token_id"), token_id("eom_token_id"))
                   if i is not None] + _ends_by_text(tokens)
        return cls(backend, bos_token_id=bos, eos_token_ids=eos_ids,
                   chat_template=metadata_field(metadata, "tokenizer.chat_template", "string",
                                                None))

    @classmethod
    def from_hf(cls, directory: str | Path) -> Tokenizer:
        """Load ``tokenizer.json`` from a Hugging Face model directory, with the
        BOS/EOS tokens and chat template of ``tokenizer_config.json`` (or
        ``chat_template.jinja``) when present."""
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{directory}: no tokenizer.json")
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise ModelError(f"{path}: cannot read tokenizer: {e}") from e
        config_path = directory / "tokenizer_config.json"
        config = _read_json(config_path) or {}

        def token_id(key: str) -> int | None:
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if token is not None and not isinstance(token, str):
                raise ModelError(f"{config_path}: {key} must be a token's text, got {token!r:.80}")
            return None if token is None else backend.token_to_id(token)

        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: use the default one
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        if template is not None and not isinstance(template, str):
            raise ModelError(f"{config_path}: chat_template must be a template's text (or a "
                             f"list of named ones), got {template!r:.80}")
        template_file = directory / "chat_template.jinja"
        if template_file.is_file():
            try:
                template = template_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise ModelError(f"{template_file}: cannot read the chat template: {e}") from None
        eos = token_id("eos_token")
        return cls(backend, bos_token_id=token_id("bos_token"),
                   eos_token_ids=([] if eos is None else [eos]) + _generation_ends(directory),
                   chat_template=template)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Control tokens written in the text (such as
        ``<|im_start|>``) become their ids; ``add_special_tokens`` adds the BOS/EOS
        the model asks for (none for SmolLM2). A text that is not valid
        Unicode (an unpaired surrogate, as Python decodes invalid UTF-8 from
        the command line) is a :class:`~mlxprog.llm.ModelError`."""
        problem = unicode_problem(text)
        if problem:
            raise ModelError(f"the text is not valid Unicode: it {problem}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 becomes U+FFFD."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @functools.cached_property
    def special_texts(self) -> frozenset[str]:
        """The texts of the special tokens: those that decoding without
        special tokens leaves out (control tokens, EOS, ``[TOOL_CALLS]``
        where the vocabulary marks it special, ...)."""
        return frozenset(token.content for token in
                         self.backend.get_added_tokens_decoder().values()
                         if token.special and token.content)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id`` (byte-level form), or None."""
        return self.backend.id_to_token(token_id)

    def token_id(self, text: str) -> int | None:
        """The id of the one token ``text`` stands for: a vocabulary entry as
        written (``<|im_end|>``, or a byte-level form such as ``Ġthe``), else
        a text that encodes to exactly one token; None when it is neither."""
        exact = self.backend.token_to_id(text)
        if exact is not None:
            return exact
        ids = self.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def with_extra_eos_tokens(self, texts: Sequence[str]) -> Tokenizer:
        """A copy of this tokenizer whose :attr:`eos_token_ids` also hold the
        tokens ``texts`` name (see :meth:`token_id`), so that generation
        ends at them too; a text that is not one token is a
        :class:`~mlxprog.llm.SettingError` (``extra_eos_tokens``)."""
        if isinstance(texts, str):  # one token text, not one per character
            texts = [texts]
        ids = []
        for text in texts:
            if not isinstance(text, str) or not text:
                raise SettingError("extra_eos_tokens", f"expected token texts, got {text!r}")
            token = self.token_id(text)
            if token is None:
                count = len(self.encode(text, add_special_tokens=False))
                raise SettingError("extra_eos_tokens", f"{text!r} is not one token of this "
                                   f"model's vocabulary (it encodes to {count} tokens)")
            ids.append(token)
        tokenizer = copy.copy(self)
        tokenizer.eos_token_ids = tuple(dict.fromkeys([*self.eos_token_ids, *ids]))
        return tokenizer

    def with_chat_template(self, template: str | Path | ChatTemplate) -> Tokenizer:
        """A copy of this tokenizer with ``template`` (see
        :meth:`ChatTemplate.of`) in place of the model's chat template,
        checked to render :data:`SAMPLE_CONVERSATION` with this tokenizer's
        BOS and EOS: a template that fails is a
        :class:`~mlxprog.llm.SettingError` (``chat_template``) naming
        where it came from, raised now rather than at the first request."""
        template = ChatTemplate.of(template)
        tokenizer = copy.copy(self)
        tokenizer.chat_template = template.text
        tokenizer._template = template.compile()
        try:
            tokenizer.render_sample()
        except Exception as exc:  # a template bug can raise anything (TypeError, ...)
            # The jinja2 error, not apply_chat_template's wrapping of it.
            reason = exc.__cause__ if isinstance(exc, ModelError) and exc.__cause__ else exc
            raise SettingError("chat_template", f"{template.source} fails on a sample "
                               f"conversation: {reason}") from None
        return tokenizer

    def render_sample(self) -> str:
        """:data:`SAMPLE_CONVERSATION` rendered with the chat template. A
        template that refuses system messages (``raise_exception``, as
        Gemma's does) renders it without the system message."""
        try:
            return self.apply_chat_template(SAMPLE_CONVERSATION)
        except ModelError as exc:
            if not isinstance(exc.__cause__, _TemplateRefusal):
                raise
        return self.apply_chat_template(SAMPLE_CONVERSATION[1:])

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) with the model's
        chat template; ``kwargs`` become extra template variables."""
        if self.chat_template is None:
            raise ModelError("this model has no chat template")
        if self._template is None:
            try:
                self._template = _template_environment().from_string(self.chat_template)
            except jinja2.TemplateError as e:
                raise ModelError(f"invalid chat template: {e}") from e
        variables = {
            "bos_token": self._token_text(self.bos_token_id),
            "eos_token": self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
            **kwargs,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**variables)
        except jinja2.TemplateError as e:
            raise ModelError(f"chat template failed: {e}") from e

    def stream_decoder(self, skip_special_tokens: bool = False) -> StreamingDecoder:
        """A :class:`StreamingDecoder` over this tokenizer."""
        return StreamingDecoder(self, skip_special_tokens=skip_special_tokens)

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.decode([token_id],
                                                               skip_special_tokens=False)


class StreamingDecoder:
    """Incremental detokenization: feed token ids one at a time, get the newly
    completed text.

    A piece is only emitted once its text is complete, so a character whose
    UTF-8 bytes span several tokens comes out whole, never as U+FFFD halves.
    The pieces joined with :meth:`flush` equal ``tokenizer.decode`` of all ids.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []  # ids from the last emitted token on
        self._emitted = 0          # how many of self._ids have had their text emitted

    def add(self, token_id: int) -> str:
        """Take one token id; return the text it completes ("" if it ends inside
        a character)."""
        self._ids.append(int(token_id))
        before = self._decode(self._ids[:self._emitted])
        text = self._decode(self._ids)
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        # The tokens of this piece start on a character boundary; they stay as
        # context for the next piece, since some decoders (sentencepiece's
        # leading-space rule) treat the first token of a sequence differently.
        self._ids = self._ids[self._emitted:]
        self._emitted = len(self._ids)
        return text[len(before):]

    def flush(self) -> str:
        """Return what is still held back (an incomplete character becomes
        U+FFFD) and start over."""
        before = self._decode(self._ids[:self._emitted])
        text = self._decode(self._ids)
        self._ids, self._emitted = [], 0
        return text[len(before):]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""


class _TemplateRefusal(jinja2.TemplateError):
    """A chat template's own ``raise_exception``: it refuses the messages
    (a role it does not take), as opposed to failing."""


def _template_environment() -> ImmutableSandboxedEnvironment:
    """The jinja2 environment chat templates expect (as in ``transformers``)."""

    def raise_exception(message: str) -> None:
        raise _TemplateRefusal(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _generation_ends(directory: Path) -> list[int]:
    """The ``eos_token_id`` ids of ``generation_config.json`` (one or a
    list), which end a generation as Hugging Face's ``generate`` ends it:
    gpt-oss's ``<|call|>`` is named only there."""
    path = directory / "generation_config.json"
    value = (_read_json(path) or {}).get("eos_token_id")
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ModelError(f"{path}: eos_token_id must be a token id or a list of them, "
                         f"got {value!r}")
    return ids


def _read_json(path: Path) -> dict | None:
    """The JSON object in ``path`` (None when there is no such file); a file
    that is not a JSON object is a :class:`ModelError`."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read JSON: {e}") from e
    if not isinstance(value, dict):
        raise ModelError(f"{path}: not a JSON object (a {type(value).__name__})")
    return value
