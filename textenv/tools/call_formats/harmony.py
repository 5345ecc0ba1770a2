"""GPT-OSS's harmony format: a turn is a series of messages ``[<|start|>assistant]HEADER<|message|>BODY<|end|>``.

The header names the channel (``<|channel|>analysis``, ``commentary`` or ``final``) and, for a tool call, the
recipient ``to=functions.NAME``, before or after the channel, optionally with ``<|constrain|>json``; a call's
body is its JSON arguments and it ends with ``<|call|>``. The analysis channel is reasoning; final and
commentary messages without a recipient are content.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .json_values import decode_json, named_call
from .turn import ParsedTurn, ToolCall, strip_end_of_turn

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
MESSAGE_ENDS = ("<|end|>", "<|call|>", "<|return|>")
FUNCTIONS_PREFIX = "functions."
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]+)")


class Message(NamedTuple):
    """One harmony message: its whole `text`, its `header` and `body`, and the `stray` text before its header."""

    text: str
    header: str
    body: str
    stray: str


def parse_gpt_oss(text: str) -> ParsedTurn:
    """Read GPT-OSS (harmony) tool calls:
    ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>commentary to=functions.NAME
    <|constrain|>json<|message|>{...}<|call|>`` (the recipient may also come before ``<|channel|>``).

    Args:
        text (`str`): the model's turn (after the prompt's ``<|start|>assistant``).

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per message with a recipient (``functions.`` dropped from its name), the
        analysis messages as `reasoning`, the other messages' text as content. A turn without ``<|message|>`` is
        plain content; a message whose end marker is missing runs to the end of the turn.
    """
    text = strip_end_of_turn(text)
    if MESSAGE not in text:
        return ParsedTurn(text.strip(), [])
    content, reasoning, calls = [], [], []
    for message in _messages(text):
        content.append(message.stray.strip())
        recipient, channel = _RECIPIENT.search(message.header), _CHANNEL.search(message.header)
        if recipient is not None:
            calls.append(_call(recipient.group(1), message))
        elif channel is not None and channel.group(1) == "analysis":
            reasoning.append(message.body.strip())
        else:
            content.append(message.body.strip())
    return ParsedTurn("\n".join(part for part in content if part), calls, "\n".join(part for part in reasoning if part))


def _messages(text: str) -> list[Message]:
    messages, pos = [], 0
    while (header_end := text.find(MESSAGE, pos)) != -1:
        header = text[pos:header_end]
        recipient = _RECIPIENT.search(header)  # may open the header when the prompt ended with <|start|>assistant
        starts = (header.find(START), header.find(CHANNEL), recipient.start() if recipient else -1)
        first_marker = min((at for at in starts if at != -1), default=0)
        body_start = header_end + len(MESSAGE)
        ends = [(at, marker) for marker in (*MESSAGE_ENDS, START) if (at := text.find(marker, body_start)) != -1]
        end_at, marker = min(ends, default=(len(text), ""))
        end = end_at + len(marker) if marker in MESSAGE_ENDS else end_at
        messages.append(Message(text[pos + first_marker : end], header[first_marker:], text[body_start:end_at], header[:first_marker]))
        pos = end
    if text[pos:].strip():
        messages.append(Message(text[pos:], "", "", text[pos:]))
    return messages


def _call(recipient: str, message: Message) -> ToolCall:
    name = recipient[len(FUNCTIONS_PREFIX) :] if recipient.startswith(FUNCTIONS_PREFIX) else recipient
    arguments, error = decode_json(message.body.strip())
    if error is not None:
        return ToolCall(name or None, None, message.text, error)
    return named_call(name, arguments, message.text)
