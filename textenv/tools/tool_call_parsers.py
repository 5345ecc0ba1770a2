"""Read the JSON tool calls out of a model's turn, in the formats chat templates teach models to write.

Three formats are understood:

- **Hermes** (Hermes 2/3, Qwen2.5, Qwen3; parser names ``"hermes"`` and ``"qwen"``): any number of blocks
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` anywhere in the turn; the text around
  them is the turn's content. A ``<tool_call>`` never closed (the turn was cut off) runs to the end of the turn.
- **Llama 3.1/3.2/3.3** JSON tool calling (``"llama3"``): the whole turn, optionally after
  ``<|python_tag|>``, is one JSON object ``{"name": ..., "parameters": {...}}``, or several separated by ``;``
  or newlines. A turn that does not start with ``{`` is plain content.
- **Mistral** (``"mistral"``): ``[TOOL_CALLS]`` followed either by a JSON list
  ``[{"name": ..., "arguments": {...}, "id": "..."}, ...]`` (v3 tokenizers) or by ``name[ARGS]{...}``
  (newer tokenizers; the marker is repeated before each call). The text before the first marker is the content.

Everywhere ``"arguments"`` and ``"parameters"`` are synonyms, arguments given as a JSON string holding an
object are decoded, and missing (or null) arguments are ``{}``. A call that cannot be read is still returned,
with ``name`` and/or ``arguments`` `None`, an ``error`` saying why and the model's raw ``text``, so the caller
can tell the model what went wrong. The parsers never raise. They receive the turn without its end-of-turn
token but tolerate trailing whitespace and ``<|im_end|>``, ``<|eot_id|>``, ``<|eom_id|>`` or ``</s>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

END_OF_TURN_STRINGS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA_PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
WHITESPACE = " \t\r\n"


@dataclass
class ToolCall:
    """One tool call as read from a model's turn.

    Args:
        name (`str`, *optional*): the tool's name; `None` when the call could not be read or has no valid name.
        arguments (`dict`, *optional*): the arguments (`{}` when the call gives none); `None` if unreadable.
        text (`str`): the call exactly as the model wrote it: a Hermes ``<tool_call>...</tool_call>`` block,
            a Llama JSON object, a Mistral list element or ``[TOOL_CALLS]name[ARGS]{...}``.
        error (`str`, *optional*): why the call could not be read; `None` for a well-formed call.
        id (`str`, *optional*): the call id when the model wrote one (Mistral's ``"id"``).
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
        content (`str`): the turn's text outside the call blocks, stripped.
        calls (`list[ToolCall]`): the calls in the order written; empty when the turn calls no tool.
    """

    content: str
    calls: list[ToolCall]


def _strip_end_of_turn(text: str) -> str:
    """`text` without trailing whitespace and trailing end-of-turn strings (any number of them)."""
    while True:
        text = text.rstrip()
        token = next((token for token in END_OF_TURN_STRINGS if text.endswith(token)), None)
        if token is None:
            return text
        text = text[: -len(token)]


def _json_error(exc: Exception) -> str:
    """The `error` of a call whose JSON could not be decoded."""
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON: {exc.msg}: line {exc.lineno} column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "malformed JSON: nested too deeply"
    return f"malformed JSON: {exc}"


def _read_arguments(call: dict) -> tuple[dict | None, str | None]:
    """The arguments of a decoded call object and an error (or `None`)."""
    key = "arguments" if "arguments" in call else "parameters"
    arguments = call.get(key)
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}, None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            return None, f"'{key}' is a string that is not valid JSON ({_json_error(exc)})"
        if not isinstance(arguments, dict):
            return None, f"'{key}' must be a JSON object, got a string holding {type(arguments).__name__}"
        return arguments, None
    if not isinstance(arguments, dict):
        return None, f"'{key}' must be a JSON object, got {type(arguments).__name__}"
    return arguments, None


def _call_from_json(value: Any, text: str) -> ToolCall:
    """Check a decoded call object ``{"name": ..., "arguments": ...}`` and make it a `ToolCall`."""
    if not isinstance(value, dict):
        return ToolCall(None, None, text, f"the call must be a JSON object, got {type(value).__name__}")
    call_id = value.get("id") if isinstance(value.get("id"), str) else None
    arguments, error = _read_arguments(value)
    name = value.get("name")
    if "name" not in value or name is None:
        name, error = None, "the call has no 'name'"
    elif not isinstance(name, str) or not name.strip():
        got = "an empty string" if isinstance(name, str) else type(name).__name__
        name, error = None, f"'name' must be a non-empty string, got {got}"
    return ToolCall(name, arguments, text, error, call_id)


def _json_call_at(text: str, pos: int) -> tuple[ToolCall, int]:
    """The call whose JSON starts at `text[pos]` and the index after it; an undecodable call takes the rest."""
    try:
        value, length = json.JSONDecoder().raw_decode(text[pos:])
    except (ValueError, RecursionError) as exc:
        return ToolCall(None, None, text[pos:], _json_error(exc)), len(text)
    return _call_from_json(value, text[pos : pos + length]), pos + length


def parse_hermes(text: str) -> ParsedTurn:
    """Read Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: the text outside the blocks and one [`ToolCall`] per block, in order. A block whose
        ``</tool_call>`` is missing runs to the end of the turn.
    """
    text = _strip_end_of_turn(text)
    content, calls, pos = [], [], 0
    while (start := text.find(HERMES_OPEN, pos)) != -1:
        content.append(text[pos:start])
        body_start = start + len(HERMES_OPEN)
        close = text.find(HERMES_CLOSE, body_start)
        body_end, pos = (len(text), len(text)) if close == -1 else (close, close + len(HERMES_CLOSE))
        body = text[body_start:body_end].strip()
        if close == -1:  # cut off, or a mistyped close such as "</tool_call": keep the JSON before it
            body = _without_partial_close(body)
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as exc:
            calls.append(ToolCall(None, None, text[start:pos], _json_error(exc)))
            continue
        calls.append(_call_from_json(value, text[start:pos]))
    content.append(text[pos:])
    return ParsedTurn("".join(content).strip(), calls)


def _without_partial_close(body: str) -> str:
    """`body` without a trailing beginning of ``</tool_call>`` (``</tool_call``, ``</tool``, ``</``)."""
    for length in range(len(HERMES_CLOSE) - 1, 1, -1):
        if body.endswith(HERMES_CLOSE[:length]):
            return body[:-length].rstrip()
    return body


def _skip(text: str, pos: int, chars: str) -> int:
    """The first index from `pos` whose character is not in `chars`."""
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def parse_llama3(text: str) -> ParsedTurn:
    """Read Llama 3.1/3.2/3.3 JSON tool calls: ``[<|python_tag|>]{"name": ..., "parameters": {...}}``.

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: no calls when the turn (after whitespace and ``<|python_tag|>``) does not start with
        ``{``; otherwise one [`ToolCall`] per JSON object (separated by ``;`` or whitespace), an invalid one
        taking the rest of the turn as one malformed call. Text after the last object is the content.
    """
    text = _strip_end_of_turn(text)
    pos = _skip(text, 0, WHITESPACE)
    if text.startswith(LLAMA_PYTHON_TAG, pos):
        pos = _skip(text, pos + len(LLAMA_PYTHON_TAG), WHITESPACE)
    if not text.startswith("{", pos):
        return ParsedTurn(text.strip(), [])
    calls = []
    while text.startswith("{", pos):
        call, end = _json_call_at(text, pos)
        calls.append(call)
        pos = _skip(text, end, WHITESPACE + ";")
    return ParsedTurn(text[pos:].strip(), calls)


def _mistral_json_calls(text: str, pos: int) -> tuple[list[ToolCall], int]:
    """Calls of the v3 format starting at `text[pos]` (``[`` or ``{``); returns them and the end index."""
    if text[pos] == "{":
        call, end = _json_call_at(text, pos)
        return [call], end
    calls = []
    pos = _skip(text, pos + 1, WHITESPACE)
    while pos < len(text) and text[pos] != "]":
        call, end = _json_call_at(text, pos)
        calls.append(call)
        pos = _skip(text, end, WHITESPACE)
        if not text.startswith(",", pos):
            break  # "]" ends the list; anything else (or a cut-off turn) too
        pos = _skip(text, pos + 1, WHITESPACE)
    return calls, (pos + 1 if text.startswith("]", pos) else pos)


def _mistral_args_call(text: str, start: int, pos: int) -> tuple[ToolCall, int]:
    """The ``[TOOL_CALLS]name[ARGS]{...}`` call whose marker is at `start`; returns it and the end index."""
    next_marker = text.find(MISTRAL_CALLS, pos)
    limit = len(text) if next_marker == -1 else next_marker
    args_at = text.find(MISTRAL_ARGS, pos, limit)
    if args_at == -1:
        error = f"expected a JSON list or 'name{MISTRAL_ARGS}{{...}}' after {MISTRAL_CALLS}"
        return ToolCall(None, None, text[start:limit].rstrip(), error), limit
    body = _skip(text, args_at + len(MISTRAL_ARGS), WHITESPACE)
    try:
        arguments, length = json.JSONDecoder().raw_decode(text[body:])
    except (ValueError, RecursionError) as exc:
        return ToolCall(None, None, text[start:limit].rstrip(), _json_error(exc)), limit
    name = text[pos:args_at].strip() or None
    return _call_from_json({"name": name, "arguments": arguments}, text[start : body + length]), body + length


def parse_mistral(text: str) -> ParsedTurn:
    """Read Mistral tool calls: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": ...}]`` or
    ``[TOOL_CALLS]name[ARGS]{...}`` (repeated for several calls).

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: the content is the text before the first ``[TOOL_CALLS]`` (plus any text after the
        calls); one [`ToolCall`] per list element or ``name[ARGS]{...}``, an ``"id"`` kept in `ToolCall.id`.
    """
    text = _strip_end_of_turn(text)
    start = text.find(MISTRAL_CALLS)
    content = [text if start == -1 else text[:start]]
    calls: list[ToolCall] = []
    while start != -1:
        pos = _skip(text, start + len(MISTRAL_CALLS), WHITESPACE)
        if text.startswith(("[", "{"), pos) and not text.startswith((MISTRAL_CALLS, MISTRAL_ARGS), pos):
            found, end = _mistral_json_calls(text, pos)
            calls.extend(found)
        else:
            call, end = _mistral_args_call(text, start, pos)
            calls.append(call)
        start = text.find(MISTRAL_CALLS, end)
        content.append(text[end : len(text) if start == -1 else start])
    return ParsedTurn("".join(content).strip(), calls)


TOOL_CALL_PARSERS: dict[str, Callable[[str], ParsedTurn]] = {
    "hermes": parse_hermes, "qwen": parse_hermes, "llama3": parse_llama3, "mistral": parse_mistral
}


def parser_for_template(chat_template: str | None) -> str:
    """Name (a key of `TOOL_CALL_PARSERS`) of the parser for the tool-call format a chat template writes.

    Args:
        chat_template (`str`, *optional*): the Jinja chat template; `None` when the tokenizer has none.

    Returns:
        `str`: ``"mistral"`` when it mentions ``[TOOL_CALLS]``, ``"hermes"`` when it mentions ``<tool_call>``,
        ``"llama3"`` when it mentions ``<|python_tag|>`` or both ``<|start_header_id|>`` and ``parameters``;
        otherwise ``"hermes"``, the format of textenv's own tool template.
    """
    template = chat_template or ""
    if MISTRAL_CALLS in template:
        return "mistral"
    if HERMES_OPEN in template:
        return "hermes"
    if LLAMA_PYTHON_TAG in template or ("<|start_header_id|>" in template and "parameters" in template):
        return "llama3"
    return "hermes"


def get_tool_call_parser(parser: str | Callable[[str], ParsedTurn]) -> Callable[[str], ParsedTurn]:
    """Resolve a ``tool_parser`` argument.

    Args:
        parser (`str` or `Callable`): a key of `TOOL_CALL_PARSERS`, or a callable ``text -> ParsedTurn``.

    Returns:
        The parser function (a callable `parser` itself).

    Raises:
        ValueError: `parser` is a string that names no parser.
        TypeError: `parser` is neither a string nor callable.
    """
    if isinstance(parser, str):
        if parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_parser={parser!r} is not a known tool-call parser; use one of "
                f"{', '.join(repr(name) for name in TOOL_CALL_PARSERS)} or a callable text -> ParsedTurn"
            )
        return TOOL_CALL_PARSERS[parser]
    if callable(parser):
        return parser
    raise TypeError(f"tool_parser must be a parser name or a callable, got {type(parser).__name__}")
