"""Calls written as JSON: decoding without raising, checking a decoded call object, reading JSON lists of calls.

Everywhere ``"arguments"`` and ``"parameters"`` are synonyms, arguments given as a JSON string holding an object
are decoded, missing (or null) arguments are ``{}``, and an OpenAI-shaped object ``{"type": "function",
"function": {"name", "arguments"}}`` is read as its ``"function"``.
"""

from __future__ import annotations

import json
from typing import Any

from .turn import ToolCall, skip


def json_error(exc: Exception) -> str:
    """The `error` of a call whose JSON could not be decoded."""
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON: {exc.msg}: line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "malformed JSON: nested too deeply"
    return f"malformed JSON: {exc}"


def decode_json(text: str) -> tuple[Any, str | None]:
    """`(value, None)` for valid JSON text, else `(None, error)`."""
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as exc:
        return None, json_error(exc)


def _read_arguments(call: dict) -> tuple[dict | None, str | None]:
    """The arguments of a decoded call object and an error (or `None`)."""
    key = "arguments" if "arguments" in call else "parameters"
    arguments = call.get(key)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, str):
        decoded, error = decode_json(arguments)
        if error is not None:
            return None, f"'{key}' is a string that is not valid JSON ({error})"
        if not isinstance(decoded, dict):
            return None, f"'{key}' must be a JSON object, got a string holding {type(decoded).__name__}"
        return decoded, None
    if not isinstance(arguments, dict):
        return None, f"'{key}' must be a JSON object, got {type(arguments).__name__}"
    return arguments, None


def call_from_json(value: Any, text: str) -> ToolCall:
    """Check a decoded call object ``{"name": ..., "arguments": ...}`` (``"id"`` optional) and make it a `ToolCall`."""
    if not isinstance(value, dict):
        return ToolCall(None, None, text, f"the call must be a JSON object, got {type(value).__name__}")
    if "name" not in value and isinstance(value.get("function"), dict):
        value = {**value["function"], "id": value.get("id")}
    call_id = value.get("id") if isinstance(value.get("id"), str) else None
    arguments, error = _read_arguments(value)
    name = value.get("name")
    if name is None:
        name, error = None, "the call has no 'name'"
    elif not isinstance(name, str) or not name.strip():
        got = "an empty string" if isinstance(name, str) else type(name).__name__
        name, error = None, f"'name' must be a non-empty string, got {got}"
    return ToolCall(name, arguments, text, error, call_id)


def named_call(name: str | None, arguments: Any, text: str, call_id: str | None = None) -> ToolCall:
    """A call whose name and arguments were read separately (the formats that write the name outside JSON)."""
    return call_from_json({"name": name or None, "arguments": arguments, "id": call_id}, text)


def json_call_at(text: str, pos: int) -> tuple[ToolCall, int]:
    """The call whose JSON starts at `text[pos]` and the index after it; an undecodable call takes the rest."""
    try:
        value, length = json.JSONDecoder().raw_decode(text[pos:])
    except (ValueError, RecursionError) as exc:
        return ToolCall(None, None, text[pos:], json_error(exc)), len(text)
    return call_from_json(value, text[pos : pos + length]), pos + length


def json_call_list(text: str, pos: int) -> tuple[list[ToolCall], int]:
    """The calls of a JSON list (or one object) starting at `text[pos]` (``[`` or ``{``) and the index after
    them; the calls read before an undecodable element are kept, that element taking the rest of `text`."""
    if text[pos] == "{":
        call, end = json_call_at(text, pos)
        return [call], end
    calls = []
    pos = skip(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        call, end = json_call_at(text, pos)
        calls.append(call)
        pos = skip(text, end)
        if not text.startswith(",", pos):
            break  # "]" ends the list; anything else (or a cut-off turn) too
        pos = skip(text, pos + 1)
    return calls, (pos + 1 if text.startswith("]", pos) else pos)
