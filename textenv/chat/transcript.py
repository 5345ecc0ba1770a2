"""One episode's conversation with the exact tokens behind every message.

Each message is kept as token segments: model turns hold the ids the model really generated, everything
else (system text, observations, chat-template scaffolding) holds template text tokenized once. A
context manager's rewrite keeps the unchanged leading messages as they are and re-renders the rest; a
re-rendered model turn is no longer trainable, because it now sits in a context it was not generated in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

from textenv.chat.renderer import ChatRenderer, Message, Messages, tool_call_message
from textenv.engine.engine import Completion
from textenv.environment.history import TextHistory
from textenv.tools.json_calls import openai_tool_calls

LOSS_SCALES = ("last_round", "default", "all")


@dataclass
class Segment:
    """Text and its token ids; `generated` marks exact model output in the context it was generated in, and
    `logprobs` are the engine's log-probabilities of those ids (`None`: not reported), `policy_version` the
    version of the weights that generated them (`Completion.policy_version`)."""

    text: str
    tokens: torch.Tensor
    generated: bool = False
    logprobs: Optional[torch.Tensor] = None
    policy_version: Optional[int] = None


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
        renderer (`ChatRenderer`): renders and tokenizes template text (and describes its tools).
        messages (`list[dict]`): the opening messages (system?, user).
        tool_parser (`Callable`, *optional*): ``tool_parser(text) -> ParsedTurn``; when given, a reply's
            tool calls are read into the assistant message's `tool_calls` (OpenAI form) and its `content`
            keeps the text around them.
    """

    def __init__(self, renderer: ChatRenderer, messages: Messages, tool_parser: Optional[Callable] = None):
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.entries: List[Entry] = []
        self.calls_made = 0
        self._overlap = ""  # what the last reply wrote past its message, which the template writes next (`add_reply`)
        for group in opening_groups(messages):
            self._append_rendered(group)

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
        while 0 < kept < len(self.entries) and not self.entries[kept].segments:
            kept -= 1  # messages rendered together are kept or re-rendered together
        if kept < len(self.entries):
            self._overlap = ""
        del self.entries[kept:]
        for turn in turns_of(copy.deepcopy(managed[kept:])):
            self._append_rendered(turn)

    def generation_context(self) -> tuple[torch.Tensor, Segment]:
        """`(context_ids, generation_prompt)`: the tokens to generate from (conversation + the
        assistant's generation prompt) and the prompt segment itself."""
        text = self.renderer.generation_prompt(self.messages)
        prompt = Segment(text, self.renderer.encode(text))
        tokens = [segment.tokens for entry in self.entries for segment in entry.segments]
        return torch.cat([*tokens, prompt.tokens]), prompt

    def add_reply(self, completion: Completion, prompt: Segment) -> Message:
        """Append the model's turn: its generation prompt, its exact ids (trainable) and the template's
        closing text (the part of it the model did not write itself). Returns the assistant message.

        Where the template writes the reply as the model did, the closing is what the template writes after the model's
        text (Gemma 4 opens the tool response after a call), and text the model wrote past the template's reply (GLM
        ends a turn at the next role token, ``<|observation|>``) is not written again by the next message's delta."""
        before = self.messages
        content, stop = self._content(completion)
        message = self._assistant_message(content)
        continued = self.renderer.reply_continuation(before, message, completion.text, prompt.text)
        if continued is not None:
            closing, self._overlap = continued
        else:
            closing = self.renderer.assistant_suffix(before)
            self._overlap = stop if stop and not closing.startswith(stop) else ""
            eos_text = self.renderer.eos_text or ""
            if stop and eos_text and closing.startswith(eos_text):
                closing = closing[len(eos_text) :]
        generated_ids = completion.token_ids.detach().cpu().long()
        logprobs = _turn_logprobs(completion, len(generated_ids))
        reply = Segment(completion.text, generated_ids, generated=len(generated_ids) > 0, logprobs=logprobs, policy_version=completion.policy_version)
        segments = [prompt, reply]
        if closing:
            segments.append(Segment(closing, self.renderer.encode(closing)))
        self.entries.append(Entry(message, segments))
        return copy.deepcopy(message)

    def _assistant_message(self, content: str) -> Message:
        if self.tool_parser is None:
            return {"role": "assistant", "content": content}
        parsed = self.tool_parser(content)
        calls = openai_tool_calls(parsed.calls, first_index=self.calls_made)
        self.calls_made += len(calls)
        return tool_call_message(parsed.content, calls)

    def add_messages(self, messages: Messages) -> None:
        """Append non-model messages (an observation, tool results) rendered together, as the template
        groups them."""
        self._append_rendered(list(messages))

    def _append_rendered(self, messages: Messages) -> None:
        """One entry per message; their text (one delta) goes with the first, the others hold none."""
        if not messages:
            return
        text = self.renderer.added_text(self.messages, messages)
        if self._overlap and text.startswith(self._overlap):
            text = text[len(self._overlap) :]
        self._overlap = ""
        self.entries.append(Entry(messages[0], [Segment(text, self.renderer.encode(text))]))
        self.entries.extend(Entry(message) for message in messages[1:])

    def _content(self, completion: Completion) -> tuple[str, str]:
        """`(content, stop)`: the reply's text without the token that ended it (an eos id: the tokenizer's eos, or
        another end-of-turn token of the model's generation config), and that token's text ("" if none did)."""
        text = completion.text
        if completion.finish_reason != "eos" or len(completion.token_ids) == 0:
            return text, ""
        stop = self.renderer.tokenizer.decode([int(completion.token_ids[-1])], skip_special_tokens=False)
        return (text[: -len(stop)] if stop and text.endswith(stop) else text), stop

    def trained_segments(self, loss_scale: str) -> List[Segment]:
        """The model segments trained under `loss_scale`: every on-policy one, or only the last."""
        generated = [segment for entry in self.entries for segment in entry.segments if segment.generated]
        if check_loss_scale(loss_scale) == "last_round":
            return generated[-1:]
        return generated

    def completion_ids(self) -> List[int]:
        """The token ids from the model's first generated token on (its turns, tool results and template text
        between them): TRL's ``completion_ids``. Empty before the first reply."""
        segments = [segment for entry in self.entries for segment in entry.segments]
        first = next((index for index, segment in enumerate(segments) if segment.generated), len(segments))
        return [int(token) for segment in segments[first:] for token in segment.tokens.tolist()]

    def to_history(self, loss_scale: str, keep_trailing: bool = False) -> Optional[TextHistory]:
        """The episode as a `TextHistory`: the first segment is everything before the first trained token,
        then the rest up to the last trained token (to the end with `keep_trailing`, the closing text of
        the last reply excepted), mask 1 exactly on trained tokens. `None` when nothing is trained (the
        model never replied)."""
        trained = self.trained_segments(loss_scale)
        if not trained:
            return None
        trained_ids = {id(segment) for segment in trained}
        segments = [segment for entry in self.entries for segment in entry.segments]
        last = max(index for index, segment in enumerate(segments) if id(segment) in trained_ids)
        if keep_trailing and self.entries[-1].message.get("role") != "assistant":
            last = len(segments) - 1
        history: Optional[TextHistory] = None
        pending_text, pending_tokens = "", []
        for segment in segments[: last + 1]:
            if id(segment) not in trained_ids:
                pending_text += segment.text
                pending_tokens.append(segment.tokens)
                continue
            history = _flush(history, pending_text, pending_tokens)
            pending_text, pending_tokens = "", []
            history.append_segment(segment.text, segment.tokens, system=False, logprobs=segment.logprobs, policy_version=segment.policy_version)
        return _flush(history, pending_text, pending_tokens) if pending_tokens else history


def opening_groups(messages: Messages) -> List[Messages]:
    """The opening messages in the pieces they are rendered in: each on its own, except leading system messages,
    which go with the first message after them (Llama 3.1 and Qwen3.5's templates refuse a system message alone when
    tools are described: the tools go into the first user message, or need one)."""
    opening, rest = _split_opening(messages)
    return ([opening] if opening else []) + [[message] for message in rest]


def rendering_pieces(messages: Messages) -> List[Messages]:
    """The pieces a `Transcript` renders a whole conversation in: the opening (leading system messages with the first
    message after them), then `turns_of` the rest."""
    opening, rest = _split_opening(messages)
    return ([opening] if opening else []) + turns_of(rest)


def _split_opening(messages: Messages) -> tuple[Messages, Messages]:
    """`(leading system messages and the message after them, the rest)`."""
    messages = list(messages)
    lead = 0
    while lead < len(messages) - 1 and messages[lead].get("role") == "system":
        lead += 1
    return messages[: lead + 1], messages[lead + 1 :]


def turns_of(messages: Messages) -> List[Messages]:
    """`messages` split into what is rendered in one piece: each message, but consecutive tool results
    together (templates put them in one turn)."""
    turns: List[Messages] = []
    for message in messages:
        if turns and message.get("role") == "tool" and turns[-1][-1].get("role") == "tool":
            turns[-1].append(message)
        else:
            turns.append([message])
    return turns


def _turn_logprobs(completion: Completion, num_tokens: int) -> Optional[torch.Tensor]:
    """The completion's per-token log-probabilities on the CPU (`None` if the engine gave none).

    Raises:
        ValueError: they are not one per generated token.
    """
    if completion.logprobs is None:
        return None
    logprobs = completion.logprobs.detach().cpu().float().reshape(-1)
    if len(logprobs) != num_tokens:
        raise ValueError(f"completion.logprobs has {len(logprobs)} values for {num_tokens} token ids.")
    return logprobs


def _flush(history: Optional[TextHistory], text: str, tokens: List[torch.Tensor]) -> TextHistory:
    joined = torch.cat(tokens) if tokens else torch.empty(0, dtype=torch.long)
    if history is None:
        return TextHistory(text, joined, system=True)
    if text and len(joined):
        history.append_segment(text, joined, system=True)
    return history
