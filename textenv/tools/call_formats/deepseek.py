"""DeepSeek's call tokens (fullwidth bars U+FF5C and U+2581 word separators, one token each):

- V3 (and the R1 distills' template): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
  \\n```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>``;
- V3.1 and later: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
  <｜tool▁calls▁end｜>``.
"""

from __future__ import annotations

from typing import Callable

from .json_values import decode_json, named_call
from .turn import Block, ParsedTurn, ToolCall, read_turn, split_blocks

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEPARATOR = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def parse_deepseek_v3(text: str) -> ParsedTurn:
    """Read DeepSeek-V3 tool calls:
    ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`` inside
    ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>`` (the fence may be missing).

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per call, the text outside the calls section as content. A call whose
        end token is missing runs to the end of the turn (read when its JSON is complete).
    """
    return read_turn(text, lambda rest: _calls(rest, _v3_call))


def parse_deepseek_v31(text: str) -> ParsedTurn:
    """Read DeepSeek-V3.1+ tool calls: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` inside
    ``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: as [`parse_deepseek_v3`].
    """
    return read_turn(text, lambda rest: _calls(rest, _v31_call))


def _calls(text: str, read_call: Callable[[Block], ToolCall]) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, CALL_BEGIN, CALL_END)
    return content.replace(CALLS_BEGIN, "").replace(CALLS_END, ""), [read_call(_without_section_end(block)) for block in blocks]


def _without_section_end(block: Block) -> Block:
    """An unclosed call's body without the ``<｜tool▁calls▁end｜>`` after it (the model skipped the call's end)."""
    body = block.body.rstrip()
    return block._replace(body=body[: -len(CALLS_END)]) if not block.closed and body.endswith(CALLS_END) else block


def _v3_call(block: Block) -> ToolCall:
    at = block.body.find(SEPARATOR)
    if at == -1:
        return ToolCall(None, None, block.text, f"expected TYPE{SEPARATOR}NAME in the call")
    name, _, arguments = block.body[at + len(SEPARATOR) :].partition("\n")
    return _call(name.strip(), arguments, block.text)


def _v31_call(block: Block) -> ToolCall:
    name, separator, arguments = block.body.partition(SEPARATOR)
    if not separator:
        return ToolCall(None, None, block.text, f"expected NAME{SEPARATOR}{{...}} in the call")
    return _call(name.strip(), arguments, block.text)


def _call(name: str, arguments: str, text: str) -> ToolCall:
    """The call `name` with `arguments` JSON, optionally in a ```` ```json ```` fence."""
    arguments = arguments.strip()
    if arguments.startswith("```"):
        arguments = arguments[3:].removeprefix("json").strip()
        arguments = arguments[:-3].rstrip() if arguments.endswith("```") else arguments
    value, error = decode_json(arguments)
    if error is not None:
        return ToolCall(name or None, None, text, error)
    return named_call(name, value, text)
