"""Mistral's ``[TOOL_CALLS]`` format, in its three forms (mistral-common's tokenizer versions):

- v2 to v7: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": "..."}, ...]`` (one JSON list);
- v11 and later: ``[TOOL_CALLS]name[ARGS]{...}``, the marker repeated before each call;
- v11 with call ids: ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``.

Magistral's ``[THINK]...[/THINK]`` is thinking.
"""

from __future__ import annotations

import json

from .json_values import json_call_list, json_error, named_call
from .turn import ParsedTurn, Thinking, ToolCall, read_turn, skip

MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
MISTRAL_THINK = Thinking("[THINK]", "[/THINK]")


def parse_mistral(text: str) -> ParsedTurn:
    """Read Mistral tool calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]``, or
    ``[TOOL_CALLS]name[ARGS]{...}`` / ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` (repeated for several calls).

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: the content is the text before the first ``[TOOL_CALLS]`` (plus any text after the
        calls); one [`ToolCall`] per list element or ``name[ARGS]{...}``, an ``"id"`` or ``[CALL_ID]`` kept in
        `ToolCall.id`.
    """
    return read_turn(text, _mistral_calls, MISTRAL_THINK)


def _mistral_calls(text: str) -> tuple[str, list[ToolCall]]:
    start = text.find(MISTRAL_CALLS)
    content = [text if start == -1 else text[:start]]
    calls: list[ToolCall] = []
    while start != -1:
        pos = skip(text, start + len(MISTRAL_CALLS))
        if text.startswith(("[", "{"), pos) and not text.startswith((MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID), pos):
            found, end = json_call_list(text, pos)
            calls.extend(found)
        else:
            call, end = _args_call(text, start, pos)
            calls.append(call)
        start = text.find(MISTRAL_CALLS, end)
        content.append(text[end : len(text) if start == -1 else start])
    return "".join(content), calls


def _args_call(text: str, start: int, pos: int) -> tuple[ToolCall, int]:
    """The ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` call whose marker is at `start`; returns it and the end index."""
    next_marker = text.find(MISTRAL_CALLS, pos)
    limit = len(text) if next_marker == -1 else next_marker
    args_at = text.find(MISTRAL_ARGS, pos, limit)
    if args_at == -1:
        error = f"expected a JSON list or 'name{MISTRAL_ARGS}{{...}}' after {MISTRAL_CALLS}"
        return ToolCall(None, None, text[start:limit].rstrip(), error), limit
    name, call_id = text[pos:args_at], None
    if (id_at := name.find(MISTRAL_CALL_ID)) != -1:
        name, call_id = name[:id_at], name[id_at + len(MISTRAL_CALL_ID) :].strip() or None
    body = skip(text, args_at + len(MISTRAL_ARGS))
    try:
        arguments, length = json.JSONDecoder().raw_decode(text[body:])
    except (ValueError, RecursionError) as exc:
        return ToolCall(None, None, text[start:limit].rstrip(), json_error(exc), call_id), limit
    return named_call(name.strip(), arguments, text[start : body + length], call_id), body + length
