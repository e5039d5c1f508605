"""A generation's pieces as OpenAI's API reports them: the text, each
token's text and bytes, log-probabilities (chat and completion shapes), the
finish reason and the usage."""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from ..engine import GenerationStats, Piece
from ..tokenizer import Tokenizer
from ..tool_calls import Reading, ToolCall, ToolPrompt

#: The engine's finish reasons as OpenAI's.
_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}
#: OpenAI's stand-in for a log-probability of -inf.
LOWEST_LOGPROB = -9999.0


def finite_logprob(value: float) -> float:
    """``value``, or :data:`LOWEST_LOGPROB` for anything lower (NaN too)."""
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB


def _byte_symbols() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the byte each vocabulary character stands for."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            symbols[chr(byte)] = byte
        else:
            symbols[chr(256 + extra)] = byte
            extra += 1
    return symbols


class TokenText:
    """Each token's text and UTF-8 bytes, as OpenAI's log-probabilities show
    them. The bytes come from the vocabulary entry (byte-level symbols, or a
    ``<0xNN>`` byte token), so a token holding part of a character has its
    own bytes; otherwise they are those of the decoded text."""

    _BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._symbols = _byte_symbols()
        self._known: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        """``(text, bytes)`` of ``token``."""
        if token not in self._known:
            text = self.tokenizer.decode([token])
            entry = self.tokenizer.id_to_token(token) or ""
            byte = self._BYTE_TOKEN.fullmatch(entry)
            if byte:
                raw = [int(byte.group(1), 16)]
            elif entry and all(c in self._symbols for c in entry):
                raw = [self._symbols[c] for c in entry]
            else:
                raw = list(text.encode("utf-8"))
            self._known[token] = (text, raw)
        return self._known[token]


#: A generated token's log-probability entry: the token, its log-probability,
#: and the alternatives ``(token, logprob)``.
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


class Output:
    """A generation's pieces as OpenAI reports them: the text, the generated
    tokens' log-probabilities (the end-of-sequence token is no part of the
    answer), the finish reason and the usage (so far, until it finishes)."""

    def __init__(self, token_text: TokenText, logprobs: bool):
        self.token_text = token_text
        self.logprobs = logprobs
        self.text = ""
        self.tokens: list[TokenLogprob] = []
        self.finish_reason: str | None = None
        self.stats: GenerationStats | None = None  # the latest piece's
        self._offset = 0  # text offset of the next token, for completions' logprobs

    def add(self, piece: Piece) -> list[TokenLogprob]:
        """Take a piece; its token's log-probability entry (none for the EOS,
        or without logprobs)."""
        self.text += piece.text
        self.stats = piece.stats
        new = []
        if self.logprobs and piece.logprob is not None and piece.finish_reason != "eos":
            new.append((piece.token, piece.logprob, piece.top_logprobs))
            self.tokens += new
        if piece.finish_reason is not None:
            self.finish_reason = _FINISH[piece.finish_reason]
        return new

    def cut_short(self) -> None:
        """The answer ends before its generation did (an error after its
        stream started): its finish reason is ``"length"``, as for an answer
        that ``max_tokens`` cut."""
        self.finish_reason = "length"

    @property
    def usage(self) -> dict[str, Any] | None:
        """OpenAI's usage of the pieces so far (None before the first)."""
        s = self.stats
        return None if s is None else usage(s.prompt_tokens, s.cached_tokens,
                                             s.generated_tokens)

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text, raw = self.token_text(token)
        return {"token": text, "logprob": finite_logprob(logprob), "bytes": raw}

    def chat_logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        """``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
        if not self.logprobs:
            return None
        return {"content": [{**self._entry(t, lp),
                             "top_logprobs": [self._entry(a, alp) for a, alp in top]}
                            for t, lp, top in tokens]}

    def completion_logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        """``{tokens, token_logprobs, top_logprobs, text_offset}``; the offsets
        count the tokens' texts from the start of the completion."""
        if not self.logprobs:
            return None
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                     "text_offset": []}
        for token, logprob, top in tokens:
            text = self.token_text(token)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(finite_logprob(logprob))
            out["top_logprobs"].append({self.token_text(a)[0]: finite_logprob(alp)
                                        for a, alp in top})
            out["text_offset"].append(self._offset)
            self._offset += len(text)
        return out


class ChatReply:
    """A chat reply's message as it streams: when the prompt's reply is
    read (:attr:`~mlxprog.llm.tool_calls.ToolPrompt.reads_reply`: tools
    offered, or a harmony model's channels), its text (decoded with the
    special tokens ``special_texts``) is read for tool calls and reasoning
    (see :class:`~mlxprog.llm.tool_calls.ToolCallStream`), which come out
    as OpenAI's ``tool_calls`` and as ``reasoning_content`` (as vLLM and
    DeepSeek's API name it); otherwise the text is the content.
    :meth:`feed` and :meth:`finish` return the deltas to stream (as OpenAI
    streams a call: its ``id``, ``type`` and ``name`` with empty
    ``arguments``, then the arguments); :meth:`message` is the whole
    message once it has finished."""

    def __init__(self, prompt: ToolPrompt, special_texts: Collection[str] = ()):
        self._stream = prompt.stream(special_texts) if prompt.reads_reply else None
        self.content = ""
        self.reasoning = ""
        self.calls: list[ToolCall] = []

    @property
    def reads(self) -> bool:
        """Whether the reply is read (for tool calls or reasoning), not
        taken as its text."""
        return self._stream is not None

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas to send after the reply's next ``text``."""
        if self._stream is None:
            return self._deltas(Reading(text, []))
        return self._deltas(self._stream.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        """The deltas held until the reply's end."""
        return [] if self._stream is None else self._deltas(self._stream.finish())

    def _deltas(self, reading: Reading) -> list[dict[str, Any]]:
        self.content += reading.content
        self.reasoning += reading.reasoning
        deltas: list[dict[str, Any]] = []
        if reading.reasoning:
            deltas.append({"reasoning_content": reading.reasoning})
        if reading.content:
            deltas.append({"content": reading.content})
        for call in reading.calls:
            index = len(self.calls)
            self.calls.append(call)
            deltas.append({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index,
                                           "function": {"arguments": call.arguments}}]})
        return deltas

    def message(self) -> dict[str, Any]:
        """The assistant message: ``content`` (null when only calls came),
        ``reasoning_content`` if there was reasoning, and ``tool_calls``, if
        any."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["content"] = self.content or None
            message["tool_calls"] = [call.as_openai() for call in self.calls]
        return message

    def finish_reason(self, generation: str | None) -> str | None:
        """``"tool_calls"`` when the reply called tools, else the generation's reason."""
        return "tool_calls" if self.calls else generation


def usage(prompt_tokens: int, cached_tokens: int, generated_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated_tokens,
            "total_tokens": prompt_tokens + generated_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
