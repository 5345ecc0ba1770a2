"""The formats whose calls are JSON objects ``{"name": ..., "arguments": {...}}``: Hermes (Qwen2.5, Qwen3,
Hermes), Llama 3.x / Llama 4 JSON tool calling, and Phi-4-mini."""

from __future__ import annotations

from .json_values import call_from_json, decode_json, json_call_at, json_call_list
from .turn import Block, ParsedTurn, ToolCall, read_turn, skip, split_blocks

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA_PYTHON_TAG = "<|python_tag|>"
LLAMA4_PYTHON_START, LLAMA4_PYTHON_END = "<|python_start|>", "<|python_end|>"
PHI4_OPEN, PHI4_CLOSE = "<|tool_call|>", "<|/tool_call|>"
PHI4_FUNCTOOLS = "functools["


def parse_hermes(text: str) -> ParsedTurn:
    """Read Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: the text outside the blocks and one [`ToolCall`] per block, in order. A block whose
        ``</tool_call>`` is missing runs to the end of the turn. Blocks inside ``<think>...</think>`` are not read.
    """
    return read_turn(text, _hermes_calls)


def _hermes_calls(text: str) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, HERMES_OPEN, HERMES_CLOSE)
    return content, [hermes_call(block) for block in blocks]


def hermes_call(block: Block) -> ToolCall:
    """The call of one ``<tool_call>`` block holding a JSON object."""
    body = block.body.strip()
    if not block.closed:  # cut off, or a mistyped close such as "</tool_call": keep the JSON before it
        body = _without_partial_close(body)
    value, error = decode_json(body)
    if error is not None:
        return ToolCall(None, None, block.text, error)
    return call_from_json(value, block.text)


def _without_partial_close(body: str) -> str:
    """`body` without a trailing beginning of ``</tool_call>`` (``</tool_call``, ``</tool``, ``</``)."""
    for length in range(len(HERMES_CLOSE) - 1, 1, -1):
        if body.endswith(HERMES_CLOSE[:length]):
            return body[:-length].rstrip()
    return body


def parse_llama3(text: str) -> ParsedTurn:
    """Read Llama 3.1/3.2/3.3 and Llama 4 JSON tool calls: ``[<|python_tag|>]{"name": ..., "parameters": {...}}``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: no calls when the turn (after whitespace, a Llama 4 ``<|python_start|>...<|python_end|>``
        block, which is content, and ``<|python_tag|>``) does not start with ``{``; otherwise one [`ToolCall`]
        per JSON object (separated by ``;``, whitespace or nothing), an invalid one taking the rest of the turn
        as one malformed call. Text after the last object is content.
    """
    return read_turn(text, _llama3_calls)


def _llama3_calls(text: str) -> tuple[str, list[ToolCall]]:
    pos, before = skip(text, 0), ""
    if text.startswith(LLAMA4_PYTHON_START, pos) and (end := text.find(LLAMA4_PYTHON_END, pos)) != -1:
        before, pos = text[pos + len(LLAMA4_PYTHON_START) : end], skip(text, end + len(LLAMA4_PYTHON_END))
    if text.startswith(LLAMA_PYTHON_TAG, pos):
        pos = skip(text, pos + len(LLAMA_PYTHON_TAG))
    if not text.startswith("{", pos):
        return text, []
    calls = []
    while text.startswith("{", pos):
        call, end = json_call_at(text, pos)
        calls.append(call)
        pos = skip(text, end, " \t\r\n;")
    return f"{before}\n{text[pos:]}", calls


def parse_phi4_mini(text: str) -> ParsedTurn:
    """Read Phi-4-mini tool calls: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>``.

    A block may hold one object instead of a list; vLLM's Phi-4-mini template's ``functools[{...}, ...]`` (no
    closing marker) is read too.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per list element, the text outside the blocks as content. A block whose
        ``<|/tool_call|>`` is missing runs to the end of the turn.
    """
    return read_turn(text, _phi4_calls)


def _phi4_calls(text: str) -> tuple[str, list[ToolCall]]:
    content, blocks = split_blocks(text, PHI4_OPEN, PHI4_CLOSE)
    if not blocks and (start := text.find(PHI4_FUNCTOOLS)) != -1:
        content, blocks = text[:start], [Block(text[start:], text[start + len(PHI4_FUNCTOOLS) - 1 :], False)]
    calls, leftovers = [], []
    for block in blocks:
        pos = skip(block.body, 0)
        if not block.body.startswith(("[", "{"), pos):
            calls.append(ToolCall(None, None, block.text, f"expected a JSON list of calls after {PHI4_OPEN}"))
            continue
        found, end = json_call_list(block.body, pos)
        calls.extend(found)
        leftovers.append(block.body[end:])
    return content + "".join(leftovers), calls
