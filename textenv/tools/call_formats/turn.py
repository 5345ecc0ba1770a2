"""What every call format shares: the parsed turn and its calls, end-of-turn strings, thinking blocks, and
finding ``OPEN ... CLOSE`` blocks in a turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

# The strings a family ends a turn with, tolerated (any number of them) at the end of a turn.
END_OF_TURN_STRINGS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|eot|>", "<|eom|>", "</s>", "<end_of_turn>",
    "<turn|>", "<eos>", "<|tool_response>", "<|return|>", "<|call|>", "<|end|>", "<｜end▁of▁sentence｜>",
    "<|user|>", "<|observation|>",
)
WHITESPACE = " \t\r\n"


@dataclass
class ToolCall:
    """One tool call as read from a model's turn.

    Args:
        name (`str`, *optional*): the tool's name; `None` when the call could not be read or has no valid name.
        arguments (`dict`, *optional*): the arguments (`{}` when the call gives none); `None` if unreadable.
        text (`str`): the call exactly as the model wrote it (a part of the turn), e.g. a Hermes
            ``<tool_call>...</tool_call>`` block, a Llama JSON object, a Mistral list element.
        error (`str`, *optional*): why the call could not be read; `None` for a well-formed call.
        id (`str`, *optional*): the call id when the model wrote one (Mistral's ``"id"`` or ``[CALL_ID]``).
    """

    name: str | None
    arguments: dict | None
    text: str
    error: str | None = None
    id: str | None = None


@dataclass
class ParsedTurn:
    """A model's turn split into its text and its tool calls.

    Args:
        content (`str`): the turn's text outside the calls, stripped; a thinking block stays in it as written
            (GPT-OSS, whose turn is all messages: the text of its final and commentary messages).
        calls (`list[ToolCall]`): the calls in the order written; empty when the turn calls no tool.
        reasoning (`str`): the text of the turn's thinking (``<think>``, ``[THINK]``, Gemma 4's thought channel,
            GPT-OSS's analysis channel), stripped; ``""`` when there is none. Calls written there are not read.
    """

    content: str
    calls: list[ToolCall]
    reasoning: str = ""


@dataclass(frozen=True)
class Thinking:
    """The markers around a family's thinking block."""

    open: str
    close: str


THINK = Thinking("<think>", "</think>")


class Block(NamedTuple):
    """An ``OPEN body CLOSE`` block of a turn: its whole `text`, its `body`, and whether CLOSE was found."""

    text: str
    body: str
    closed: bool


def strip_end_of_turn(text: str) -> str:
    """`text` without trailing whitespace and trailing end-of-turn strings (any number of them)."""
    while True:
        text = text.rstrip()
        token = next((token for token in END_OF_TURN_STRINGS if text.endswith(token)), None)
        if token is None:
            return text
        text = text[: -len(token)]


def skip(text: str, pos: int, chars: str = WHITESPACE) -> int:
    """The first index from `pos` whose character is not in `chars`."""
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def split_thinking(text: str, thinking: Thinking) -> tuple[str, str, str]:
    """`(head, reasoning, rest)`: `head` is the turn up to the end of its thinking block as written, `reasoning`
    the block's inside (stripped), `rest` the text after it. A closing marker with no opening one before it ends
    a block the prompt opened; an opening marker never closed (the turn was cut while thinking) runs to the end."""
    opened, closed = text.find(thinking.open), text.find(thinking.close)
    if closed != -1:
        inside = opened + len(thinking.open) if -1 < opened < closed else 0
        end = closed + len(thinking.close)
        return text[:end], text[inside:closed].strip(), text[end:]
    if opened != -1:
        return text, text[opened + len(thinking.open):].strip(), ""
    return "", "", text


def read_turn(text: str, read_calls: Callable[[str], tuple[str, list[ToolCall]]], thinking: Thinking = THINK) -> ParsedTurn:
    """Parse a turn: strip its end-of-turn strings, set its thinking block aside and read the calls after it.

    Args:
        text (`str`): the model's turn.
        read_calls (`Callable`): ``text -> (content, calls)`` for the text after the thinking block.
        thinking ([`Thinking`]): the family's thinking markers.
    """
    head, reasoning, rest = split_thinking(strip_end_of_turn(text), thinking)
    content, calls = read_calls(rest)
    return ParsedTurn((head + content).strip(), calls, reasoning)


def split_blocks(text: str, open_marker: str, close_marker: str) -> tuple[str, list[Block]]:
    """`(content, blocks)`: every ``open_marker ... close_marker`` block of `text` and the text around them.
    A block whose closing marker is missing runs to the end of `text`."""
    content, blocks, pos = [], [], 0
    while (start := text.find(open_marker, pos)) != -1:
        content.append(text[pos:start])
        body_start = start + len(open_marker)
        close = text.find(close_marker, body_start)
        if close == -1:
            blocks.append(Block(text[start:], text[body_start:], False))
            pos = len(text)
        else:
            pos = close + len(close_marker)
            blocks.append(Block(text[start:pos], text[body_start:close], True))
    content.append(text[pos:])
    return "".join(content), blocks
