"""Gemma 4's tool calls: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, one block per call.

The arguments are Gemma's JSON dialect, as its template writes them: keys are bare (or quoted), strings are
delimited by ``<|"|>``, and the rest (numbers, ``true``/``false``, lists, objects) is JSON; ``None`` (what the
template writes for a null) is read as null. The thought channel ``<|channel>thought\\n...<channel|>`` is
thinking.
"""

from __future__ import annotations

import json

from .json_values import decode_json, named_call
from .turn import Block, ParsedTurn, Thinking, ToolCall, read_turn, skip, split_blocks

CALL_OPEN, CALL_CLOSE, CALL_PREFIX = "<|tool_call>", "<tool_call|>", "call:"
STRING_DELIMITER = '<|"|>'
GEMMA_THOUGHT = Thinking("<|channel>thought", "<channel|>")
_WORD_ENDS = ',:{}[]"'
_BARE_WORDS = {"None": "null", "True": "true", "False": "false"}


def parse_gemma4(text: str) -> ParsedTurn:
    """Read Gemma 4 tool calls: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per block, the text outside the blocks as content. A block whose
        ``<tool_call|>`` is missing runs to the end of the turn (read when its arguments are complete).
    """
    return read_turn(text, _calls, GEMMA_THOUGHT)


def _calls(text: str) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, CALL_OPEN, CALL_CLOSE)
    return content, [_call(block) for block in blocks]


def _call(block: Block) -> ToolCall:
    body = block.body.strip()
    brace = body.find("{")
    if not body.startswith(CALL_PREFIX) or brace == -1:
        return ToolCall(None, None, block.text, f"expected {CALL_PREFIX}NAME{{...}} after {CALL_OPEN}")
    name = body[len(CALL_PREFIX) : brace].strip()
    try:
        arguments_json, end = dialect_to_json(body, brace)
    except ValueError as exc:
        return ToolCall(name or None, None, block.text, f"malformed arguments: {exc}")
    arguments, error = decode_json(arguments_json)
    if error is None and skip(body, end) < len(body):
        error = f"unexpected text after the arguments: {body[end:].strip()[:40]!r}"
    if error is not None:
        return ToolCall(name or None, None, block.text, error)
    return named_call(name, arguments, block.text)


def dialect_to_json(text: str, start: int) -> tuple[str, int]:
    """The JSON of the Gemma-dialect value opened by the brace or bracket at `text[start]`, and the index after it.

    Raises:
        ValueError: the value is cut off (unbalanced brackets, an unterminated string).
    """
    out, open_brackets, pos, key_expected = [], [], start, False
    while pos < len(text):
        char = text[pos]
        if text.startswith(STRING_DELIMITER, pos):
            close = text.find(STRING_DELIMITER, pos + len(STRING_DELIMITER))
            if close == -1:
                raise ValueError(f"unterminated {STRING_DELIMITER} string")
            out.append(json.dumps(text[pos + len(STRING_DELIMITER) : close], ensure_ascii=False))
            pos = close + len(STRING_DELIMITER)
            continue
        if char == '"':
            end = _json_string_end(text, pos)
            out.append(text[pos:end])
            pos = end
            continue
        if char in "{[":
            open_brackets.append(char)
        elif char in "}]":
            if not open_brackets:
                raise ValueError(f"unbalanced {char!r}")
            open_brackets.pop()
            if not open_brackets:
                return "".join(out) + char, pos + 1
        if char in _WORD_ENDS or char.isspace():
            key_expected = char in "{," and open_brackets[-1:] == ["{"] or (key_expected and char.isspace())
            out.append(char)
            pos += 1
            continue
        word_end = _word_end(text, pos)
        word = text[pos:word_end]
        out.append(json.dumps(word, ensure_ascii=False) if key_expected else _BARE_WORDS.get(word, word))
        pos = word_end
    raise ValueError("cut off: unbalanced brackets")


def _json_string_end(text: str, pos: int) -> int:
    """The index after the JSON string starting at `text[pos]`."""
    pos += 1
    while pos < len(text) and text[pos] != '"':
        pos += 2 if text[pos] == "\\" else 1
    if pos >= len(text):
        raise ValueError("unterminated string")
    return pos + 1


def _word_end(text: str, pos: int) -> int:
    """The index after the bare word (key, number, true/false/None) starting at `text[pos]`."""
    while pos < len(text) and text[pos] not in _WORD_ENDS and not text[pos].isspace() and not text.startswith(STRING_DELIMITER, pos):
        pos += 1
    return pos
