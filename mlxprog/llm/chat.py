"""A conversation that keeps its KV cache across turns.

Each turn renders the whole conversation with the chat template, but only the
tokens after what the prompt cache already holds are prefilled: the time to
the first token depends on the new message, not on the history. After a turn
the cache holds its prompt and reply (an interrupted reply as far as it
got) and the conversation records the reply's text as it was shown, so the
next turn's prompt extends what is cached wherever the reply's text
tokenizes back to its tokens (as a trained model's text does).

Every reply has ``max_tokens`` (the option) reserved in the cache: before a
reply starts, the oldest exchanges are dropped (the system prompt stays)
until the prompt leaves room for ``max_tokens`` generated tokens within
``max_length``, so a reply stops at the cache limit only when no older
exchange is left to drop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ..errors import ModelError
from .engine import Piece, PromptTooLongError
from .options import GenerationOptions

if TYPE_CHECKING:
    from .generate import LLM


class Chat:
    """A chat with ``llm``: :meth:`send` a user message, stream the reply.

    Options are :class:`~mlxprog.llm.GenerationOptions` (as ``options=`` and/or
    keyword arguments; ``system_prompt`` starts the conversation); each reply
    gets ``max_tokens`` slots of the KV cache, so a long ``max_tokens`` leaves
    less of the cache to the history. After each :meth:`send`,
    :attr:`dropped` says how many of the oldest exchanges (a user message and
    its reply) were dropped to make room."""

    def __init__(self, llm: LLM, *, options: GenerationOptions | None = None,
                 **overrides: Any):
        self.llm = llm
        self.options = GenerationOptions.given(options, overrides)
        #: The user and assistant messages so far (the system prompt apart).
        self.messages: list[dict[str, str]] = []
        self.cache = llm.prompt_cache()
        self.dropped = 0

    def reset(self) -> None:
        """Start over: no messages, nothing cached."""
        self.messages.clear()
        self.cache.clear()
        self.dropped = 0

    def conversation(self) -> list[dict[str, str]]:
        """The messages the model sees: the system prompt, if any, then the turns."""
        return self._system() + self.messages

    def _system(self) -> list[dict[str, str]]:
        system = self.options.system_prompt
        return [{"role": "system", "content": system}] if system else []

    def send(self, text: str) -> Iterator[Piece]:
        """Add the user message ``text`` and return an iterator over the
        reply's pieces (see :meth:`LLM.stream <mlxprog.llm.LLM.stream>`;
        ``llm.last_generation`` holds the reply once the iterator is
        exhausted).

        Before it returns, the oldest exchanges are dropped until the prompt
        leaves room for ``max_tokens`` generated tokens (:attr:`dropped`); a
        message too long even alone raises :class:`~mlxprog.llm.ModelError` and
        is not added (:class:`~mlxprog.llm.engine.PromptTooLongError`). The
        reply joins the conversation when the iterator ends, or with the text
        so far when it is closed early or interrupted (Ctrl-C): the prompt
        cache then keeps the tokens generated so far, which the next turn
        reuses."""
        if not text:
            raise ModelError("the message is empty")
        ids, dropped = self._fit([*self.messages, {"role": "user", "content": text}])
        self.messages = self.messages[2 * dropped:] + [{"role": "user", "content": text}]
        self.dropped = dropped
        return self._reply(ids)

    def _fit(self, messages: list[dict[str, str]]) -> tuple[list[int], int]:
        """The prompt ids of the conversation with ``messages``, after
        dropping the oldest exchanges until it leaves room for a reply of
        ``max_tokens``, and how many were dropped."""
        llm = self.llm
        rotating = llm.cache_layout.max_kv_size
        for dropped in range(0, len(messages) // 2 + 1):
            ids = llm.prompt_ids(self._system() + messages[2 * dropped:], chat=True)
            if rotating is not None:
                # A rotating cache takes any reply after a prompt that fits it.
                if len(ids) <= rotating:
                    return ids, dropped
            # A prompt of n tokens leaves room for max_length - n + 1 generated
            # tokens (the last one is never written to the cache).
            elif len(ids) + self.options.max_tokens <= llm.max_length + 1:
                return ids, dropped
        # Only the new message is left: its reply may stop at the cache limit.
        if rotating is None and len(ids) < llm.max_length:
            return ids, len(messages) // 2
        if rotating is not None:
            raise PromptTooLongError(len(ids), rotating, "max_kv_size")
        raise PromptTooLongError(len(ids), llm.max_length)

    def _reply(self, ids: list[int]) -> Iterator[Piece]:
        """Generate the reply to the prompt ``ids`` (reusing and refilling
        the prompt cache) and record it; an interrupted reply stays cached
        (see :func:`~mlxprog.llm.engine.run`)."""
        text = ""
        try:
            for piece in self.llm.stream(ids, prompt_cache=self.cache, options=self.options):
                text += piece.text
                yield piece
        finally:
            self.messages.append({"role": "assistant", "content": text})
