"""Chat-template rendering, one message at a time.

Earlier turns are never re-rendered: the text a new message adds is the difference between the
template's rendering with and without it. This needs an append-only template (ChatML, Llama, Mistral
and most others); a template that rewrites earlier messages is refused with a clear error.
"""

from __future__ import annotations

import copy
import weakref
from typing import Iterable, Optional

import torch

from textenv.environment.syntax import neutralize
from textenv.gym.env import Message, Messages

_SENTINEL = "\u2063TEXTENV-CONTENT\u2063"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be rendered incrementally."""


class ChatRenderer:
    """Renders messages with a tokenizer's chat template and tokenizes the pieces.

    Args:
        tokenizer: a tokenizer with a chat template. A private copy is used for encoding, so the
            generation thread may use the original at the same time.
    """

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("the tokenizer has no chat template; gym episodes are conversations and need one.")
        self.tokenizer = _private_copy(tokenizer)
        self.special_tokens = list(tokenizer.all_special_tokens)
        self.eos_text: Optional[str] = tokenizer.eos_token

    def render(self, messages: Messages, add_generation_prompt: bool = False) -> str:
        """The template's text for `messages`."""
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of template text (special-token strings become their ids; no BOS is added)."""
        return torch.tensor(self.tokenizer(text, add_special_tokens=False).input_ids, dtype=torch.long)

    def message_text(self, before: Messages, message: Message) -> str:
        """The text `message` adds after `before`."""
        return self._added(self.render(before) if before else "", self.render([*before, message]), "a message")

    def generation_prompt(self, messages: Messages) -> str:
        """The text that opens the assistant's turn after `messages` (e.g. ``<|im_start|>assistant\\n``)."""
        return self._added(self.render(messages), self.render(messages, add_generation_prompt=True), "the generation prompt")

    def assistant_suffix(self, messages: Messages) -> str:
        """The text the template puts after an assistant reply's content (e.g. ``<|im_end|>\\n``)."""
        opened = self.render(messages, add_generation_prompt=True)
        closed = self.render([*messages, {"role": "assistant", "content": _SENTINEL}])
        if not closed.startswith(opened + _SENTINEL):
            raise ChatTemplateError(
                "the chat template does not render an assistant reply right after its generation prompt; "
                "textenv.gym needs an append-only template."
            )
        return closed[len(opened) + len(_SENTINEL) :]

    def neutralize(self, text: str, extra: Iterable[str] = ()) -> str:
        """`text` with the tokenizer's special tokens (and `extra` strings) defused."""
        return neutralize(text, [*self.special_tokens, *extra])

    @staticmethod
    def _added(before: str, after: str, what: str) -> str:
        if not after.startswith(before):
            raise ChatTemplateError(
                f"the chat template rewrites earlier messages when {what} is added; textenv.gym renders "
                "turns incrementally (to keep the exact generated tokens) and needs an append-only template."
            )
        return after[len(before) :]


_private_copies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _private_copy(tokenizer):
    """One copy per tokenizer (copying takes ~0.5 s), shared by every renderer of that tokenizer; they
    all run on event-loop threads, while the original is used by the generation thread."""
    try:
        if tokenizer not in _private_copies:
            _private_copies[tokenizer] = copy.deepcopy(tokenizer)
        return _private_copies[tokenizer]
    except Exception:  # noqa: BLE001 - an uncopyable tokenizer is shared (encode/decode are read-only)
        return tokenizer
