"""Pythonic tool calls: a Python list of keyword-argument calls, ``[get_weather(city='Paris', days=3), ping()]``.

LFM2 writes the list between ``<|tool_call_start|>`` and ``<|tool_call_end|>``; Llama 3.2 and Llama 4, prompted
with Meta's pythonic instructions, write it as the whole turn (Llama 4 maybe inside ``<|python_start|>`` ...
``<|python_end|>``). The list is read from its syntax tree (`ast`), its values as literals: nothing is evaluated.
"""

from __future__ import annotations

import ast
import re

from .json_values import named_call
from .literals import literal_value
from .turn import ParsedTurn, ToolCall, read_turn, split_blocks

BLOCK_MARKERS = (("<|tool_call_start|>", "<|tool_call_end|>"), ("<|python_start|>", "<|python_end|>"))
_BARE_LIST = re.compile(r"\s*\[\s*[^\W\d][\w.]*\s*\(")
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def parse_pythonic(text: str) -> ParsedTurn:
    """Read pythonic tool calls: ``<|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>`` (LFM2), or a turn
    that is such a list (Llama 3.2 / Llama 4 pythonic).

    Args:
        text (`str`): the model's turn.

    Returns:
        [`ParsedTurn`]: one [`ToolCall`] per call of the list, the text outside it as content. Positional
        arguments, ``**kwargs`` and values that are not literals (names, calls, operations) make an error; a
        list that is not valid Python (cut off, say) is one call with an error.
    """
    return read_turn(text, _calls)


def _calls(text: str) -> tuple[str, list[ToolCall]]:
    for open_marker, close_marker in BLOCK_MARKERS:
        if open_marker in text:
            content, blocks = split_blocks(text, open_marker, close_marker)
            return content, [call for block in blocks for call in call_list(block.body, block.text)]
    if _BARE_LIST.match(text) is None:
        return text, []
    start = text.index("[")
    end = _list_end(text, start)
    return text[:start] + text[end:], call_list(text[start:end], text[start:end])


def _list_end(text: str, start: int) -> int:
    """The index after the bracket closing the one at `text[start]` (strings skipped); `len(text)` if unclosed."""
    return _scan(text, start)[0]


def _scan(text: str, start: int) -> tuple[int, list[str]]:
    """`(end, elements)` of the bracket at `text[start]`: the index after its closing bracket (`len(text)` if
    unclosed) and the texts between its top-level commas. Strings are skipped."""
    expected, pos, quote, elements, element_start = [], start, None, [], start + 1
    while pos < len(text):
        char = text[pos]
        if quote is not None:
            pos += 2 if char == "\\" else 1
            quote = None if char == quote else quote
            continue
        if char in "'\"":
            quote = char
        elif char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif char == "," and len(expected) == 1:
            elements.append(text[element_start:pos])
            element_start = pos + 1
        elif expected and char == expected[-1]:
            expected.pop()
            if not expected:
                return pos + 1, [*elements, text[element_start:pos]]
        pos += 1
    return len(text), [*elements, text[element_start:]]


def call_list(source: str, text: str) -> list[ToolCall]:
    """The calls of `source`, a Python list of calls (or one call); `text` is what an unreadable list reports.
    A list that is not valid Python is read call by call, so that one cut or malformed call hides no other."""
    source = source.strip()
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        elements = [element.strip() for element in _scan(source, 0)[1] if element.strip()] if source.startswith("[") else []
        if len(elements) > 1:
            return [_element_call(element) for element in elements]
        return [ToolCall(None, None, text, f"not a Python list of calls ({_reason(exc)}); write [name(key=value, ...)]")]
    if isinstance(tree, ast.Call):
        return [_call(tree, source)]
    if not isinstance(tree, (ast.List, ast.Tuple)):
        return [ToolCall(None, None, text, "expected a list of calls: [name(key=value, ...)]")]
    return [_call(element, source) for element in tree.elts]


def _reason(exc: Exception) -> str:
    return exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__


def _element_call(element: str) -> ToolCall:
    """One element of a list that is not valid Python, read on its own."""
    try:
        return _call(ast.parse(element, mode="eval").body, element)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return ToolCall(None, None, element, f"not a Python call ({_reason(exc)}); write name(key=value, ...)")


def _call(node: ast.AST, source: str) -> ToolCall:
    text = ast.get_source_segment(source, node) or source
    text = text if text in source else source
    if not isinstance(node, ast.Call):
        return ToolCall(None, None, text, "expected a call name(key=value, ...)")
    name = _dotted_name(node.func)
    if name is None:
        return ToolCall(None, None, text, "the called function must be a name")
    if node.args or any(keyword.arg is None for keyword in node.keywords):
        return ToolCall(name, None, text, "only keyword arguments are supported: name(key=value, ...)")
    try:
        arguments = {keyword.arg: literal_value(keyword.value) for keyword in node.keywords}
    except (ValueError, RecursionError) as exc:
        return ToolCall(name, None, text, f"an argument is not a literal value: {exc}")
    return named_call(name, arguments, text)


def _dotted_name(node: ast.AST) -> str | None:
    """``a.b.c`` for a name or an attribute chain, else `None`."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted_name(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None
