"""One episode's conversation with the exact tokens behind every message.

Each message is kept as token segments: model turns hold the ids the model really generated, everything
else (system text, observations, chat-template scaffolding) holds template text tokenized once. A
context manager's rewrite keeps the unchanged leading messages as they are and re-renders the rest; a
re-rendered model turn is no longer trainable, because it now sits in a context it was not generated in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from textenv.environment.history import TextHistory
from textenv.gym.chat import ChatRenderer
from textenv.gym.env import Message, Messages
from textenv.engine.engine import Completion

LOSS_SCALES = ("last_round", "default", "all")


@dataclass
class Segment:
    """Text and its token ids; `generated` marks exact model output in the context it was generated in."""

    text: str
    tokens: torch.Tensor
    generated: bool = False


@dataclass
class Entry:
    """One message and the segments that render it."""

    message: Message
    segments: List[Segment] = field(default_factory=list)


def check_loss_scale(loss_scale: str) -> str:
    """`loss_scale` if supported. `default` and `all` train every assistant turn (observations and
    template tokens are never trained: the model did not write them); `last_round` trains the last one.

    Raises:
        ValueError: any other value.
    """
    if loss_scale not in LOSS_SCALES:
        raise ValueError(f"loss_scale must be one of {list(LOSS_SCALES)}, got {loss_scale!r}.")
    return loss_scale


class Transcript:
    """The conversation of one episode, message by message, with exact tokens.

    Args:
        renderer (`ChatRenderer`): renders and tokenizes template text.
        messages (`list[dict]`): the opening messages (system?, user).
    """

    def __init__(self, renderer: ChatRenderer, messages: Messages):
        self.renderer = renderer
        self.entries: List[Entry] = []
        for message in messages:
            self._append_rendered(message)

    @property
    def messages(self) -> Messages:
        """A copy of the conversation as message dicts."""
        return [copy.deepcopy(entry.message) for entry in self.entries]

    @property
    def num_tokens(self) -> int:
        return sum(len(segment.tokens) for entry in self.entries for segment in entry.segments)

    def apply_context(self, managed: Messages) -> None:
        """Make the conversation `managed` (a context manager's output), keeping the exact tokens of the
        unchanged leading messages. A trailing assistant message is dropped (ms-swift's
        `remove_response`)."""
        managed = list(managed)
        while managed and managed[-1].get("role") == "assistant":
            managed.pop()
        kept = 0
        while kept < min(len(managed), len(self.entries)) and self.entries[kept].message == managed[kept]:
            kept += 1
        del self.entries[kept:]
        for message in managed[kept:]:
            self._append_rendered(copy.deepcopy(message))

    def generation_context(self) -> tuple[torch.Tensor, Segment]:
        """`(context_ids, generation_prompt)`: the tokens to generate from (conversation + the
        assistant's generation prompt) and the prompt segment itself."""
        text = self.renderer.generation_prompt(self.messages)
        prompt = Segment(text, self.renderer.encode(text))
        tokens = [segment.tokens for entry in self.entries for segment in entry.segments]
        return torch.cat([*tokens, prompt.tokens]), prompt

    def add_reply(self, completion: Completion, prompt: Segment) -> Message:
        """Append the model's turn: its generation prompt, its exact ids (trainable) and the template's
        closing text (the part of it the model did not write itself). Returns the assistant message."""
        before = self.messages
        content, ended_by_eos = self._content(completion)
        closing = self.renderer.assistant_suffix(before)
        eos_text = self.renderer.eos_text or ""
        if ended_by_eos and eos_text and closing.startswith(eos_text):
            closing = closing[len(eos_text) :]
        message = {"role": "assistant", "content": content}
        generated_ids = completion.token_ids.detach().cpu().long()
        segments = [prompt, Segment(completion.text, generated_ids, generated=len(generated_ids) > 0)]
        if closing:
            segments.append(Segment(closing, self.renderer.encode(closing)))
        self.entries.append(Entry(message, segments))
        return copy.deepcopy(message)

    def add_message(self, message: Message) -> None:
        """Append a non-model message (an observation), rendered by the template."""
        self._append_rendered(message)

    def _append_rendered(self, message: Message) -> None:
        text = self.renderer.message_text(self.messages, message)
        self.entries.append(Entry(message, [Segment(text, self.renderer.encode(text))]))

    def _content(self, completion: Completion) -> tuple[str, bool]:
        eos_text = self.renderer.eos_text or ""
        ended_by_eos = completion.finish_reason == "eos"
        text = completion.text
        if ended_by_eos and eos_text and text.endswith(eos_text):
            text = text[: -len(eos_text)]
        return text, ended_by_eos

    def trained_segments(self, loss_scale: str) -> List[Segment]:
        """The model segments trained under `loss_scale`: every on-policy one, or only the last."""
        generated = [segment for entry in self.entries for segment in entry.segments if segment.generated]
        if check_loss_scale(loss_scale) == "last_round":
            return generated[-1:]
        return generated

    def to_history(self, loss_scale: str) -> Optional[TextHistory]:
        """The episode as a `TextHistory`: the first segment is everything before the first trained token,
        then the rest up to the last trained token, mask 1 exactly on trained tokens. `None` when nothing
        is trained (the model never replied)."""
        trained = self.trained_segments(loss_scale)
        if not trained:
            return None
        trained_ids = {id(segment) for segment in trained}
        segments = [segment for entry in self.entries for segment in entry.segments]
        last = max(index for index, segment in enumerate(segments) if id(segment) in trained_ids)
        history: Optional[TextHistory] = None
        pending_text, pending_tokens = "", []
        for segment in segments[: last + 1]:
            if id(segment) not in trained_ids:
                pending_text += segment.text
                pending_tokens.append(segment.tokens)
                continue
            history = _flush(history, pending_text, pending_tokens)
            pending_text, pending_tokens = "", []
            history.append_segment(segment.text, segment.tokens, system=False)
        return history


def _flush(history: Optional[TextHistory], text: str, tokens: List[torch.Tensor]) -> TextHistory:
    joined = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long)
    if history is None:
        return TextHistory(text, joined, system=True)
    if text and len(joined):
        history.append_segment(text, joined, system=True)
    return history
