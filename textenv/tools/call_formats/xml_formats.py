"""The XML-style formats, whose arguments are tagged text rather than JSON: Qwen3-Coder / Qwen3.5+ (and
Nemotron 3) ``<function=NAME><parameter=KEY>VALUE</parameter></function>`` and GLM-4 MoE (4.5, 4.6)
``NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>``, both inside ``<tool_call>...</tool_call>``.

Their values are typed as each family's own parser types them (see `argument_types`): pass the tools' JSON
schemas as `tools` for typed values; without them Qwen's values are strings and GLM's are read as JSON.
"""

from __future__ import annotations

from typing import Iterable

from .argument_types import glm_value, qwen_value, tool_properties
from .json_formats import HERMES_CLOSE, HERMES_OPEN, hermes_call
from .json_values import named_call
from .turn import Block, ParsedTurn, ToolCall, read_turn, split_blocks

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
ARG_KEY, ARG_KEY_CLOSE, ARG_VALUE, ARG_VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def parse_qwen3_coder(text: str, tools: Iterable[dict] | None = None) -> ParsedTurn:
    """Read Qwen3-Coder / Qwen3.5+ / Nemotron 3 tool calls:
    ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.

    One newline after ``<parameter=KEY>`` and one before ``</parameter>`` are not part of the value; a parameter
    whose ``</parameter>`` is missing ends at the next ``<parameter=`` or ``</function>`` (as Qwen's parser reads
    it). A block holding a JSON object is read as a Hermes call, and ``<function=...>...</function>`` written
    without ``<tool_call>`` is read too.

    Args:
        text (`str`): the model's turn.
        tools (`list[dict]`, *optional*): the tools' JSON schemas, to type the values; without them every value
            is a string (``null`` is `None`).

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per block; a call without ``</function>`` (cut off) has an error.
    """
    return read_turn(text, lambda rest: _qwen_calls(rest, tools))


def _qwen_calls(text: str, tools: Iterable[dict] | None) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, HERMES_OPEN, HERMES_CLOSE)
    if not blocks:
        content, blocks = split_blocks(text, FUNCTION_OPEN, FUNCTION_CLOSE)
        blocks = [Block(block.text, FUNCTION_OPEN + block.body + FUNCTION_CLOSE * block.closed, True) for block in blocks]
    return content, [_qwen_call(block, tools) for block in blocks]


def _qwen_call(block: Block, tools: Iterable[dict] | None) -> ToolCall:
    body = block.body.strip()
    if body.startswith("{"):
        return hermes_call(block)
    if not body.startswith(FUNCTION_OPEN):
        return ToolCall(None, None, block.text, f"expected {FUNCTION_OPEN}NAME> in the {HERMES_OPEN} block")
    name_end = body.find(">")
    name = body[len(FUNCTION_OPEN) : name_end if name_end != -1 else len(body)].strip() or None
    closing = body.find(FUNCTION_CLOSE, name_end)
    if name_end == -1 or closing == -1:
        return ToolCall(name, None, block.text, f"the call is cut off: no {FUNCTION_CLOSE}")
    properties = tool_properties(tools, name) or {}
    arguments = {key: qwen_value(raw, properties.get(key)) for key, raw in _qwen_parameters(body[name_end + 1 : closing])}
    return named_call(name, arguments, block.text)


def _qwen_parameters(text: str) -> list[tuple[str, str]]:
    """The `(key, raw value)` pairs of a function body."""
    pairs, pos = [], text.find(PARAMETER_OPEN)
    while pos != -1:
        key_end = text.find(">", pos)
        if key_end == -1:
            break
        start = key_end + 1
        ends = [at for at in (text.find(PARAMETER_CLOSE, start), text.find(PARAMETER_OPEN, start)) if at != -1]
        end = min(ends, default=len(text))
        value = text[start:end]
        value = value[1:] if value.startswith("\n") else value
        pairs.append((text[pos + len(PARAMETER_OPEN) : key_end].strip(), value[:-1] if value.endswith("\n") else value))
        pos = text.find(PARAMETER_OPEN, end)
    return pairs


def parse_glm4(text: str, tools: Iterable[dict] | None = None) -> ParsedTurn:
    """Read GLM-4 MoE (GLM-4.5, GLM-4.6) tool calls:
    ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n...</tool_call>``.

    Args:
        text (`str`): the model's turn.
        tools (`list[dict]`, *optional*): the tools' JSON schemas: a ``string`` parameter keeps its text; other
            values (all of them without schemas) are read as JSON, else as a Python literal, else kept as text.

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per block; a block without ``</tool_call>`` (cut off) or with an
        unclosed tag has an error.
    """
    return read_turn(text, lambda rest: _glm_calls(rest, tools))


def _glm_calls(text: str, tools: Iterable[dict] | None) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, HERMES_OPEN, HERMES_CLOSE)
    return content, [_glm_call(block, tools) for block in blocks]


def _glm_call(block: Block, tools: Iterable[dict] | None) -> ToolCall:
    body = block.body
    first_key = body.find(ARG_KEY)
    name = body[: first_key if first_key != -1 else len(body)].strip() or None
    if not block.closed:
        return ToolCall(name, None, block.text, f"the call is cut off: no {HERMES_CLOSE}")
    properties = tool_properties(tools, name) or {}
    arguments, pos = {}, first_key
    while pos != -1:
        key_end = body.find(ARG_KEY_CLOSE, pos)
        value_at = body.find(ARG_VALUE, key_end)
        value_end = body.find(ARG_VALUE_CLOSE, value_at)
        if -1 in (key_end, value_at, value_end) or body[key_end + len(ARG_KEY_CLOSE) : value_at].strip():
            return ToolCall(name, None, block.text, f"expected {ARG_KEY}KEY{ARG_KEY_CLOSE} then {ARG_VALUE}VALUE{ARG_VALUE_CLOSE}")
        key = body[pos + len(ARG_KEY) : key_end].strip()
        arguments[key] = glm_value(body[value_at + len(ARG_VALUE) : value_end].strip(), properties.get(key))
        pos = body.find(ARG_KEY, value_end)
    return named_call(name, arguments, block.text)
