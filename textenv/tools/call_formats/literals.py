"""Python literals read from their syntax tree, never evaluated: the values of pythonic calls
(``f(a=1, b='x', c=[1, {"k": None}])``) and of XML-style arguments that are not plain text.

Strings, numbers (with a sign), ``True``/``False``/``None`` (and JSON's ``true``/``false``/``null``), lists,
tuples (as lists) and dicts with string keys are literals; anything else (names, calls, operators, sets,
bytes, f-strings) is refused with a `ValueError`.
"""

from __future__ import annotations

import ast
from typing import Any

_CONSTANT_NAMES = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def literal_value(node: ast.AST) -> Any:
    """The JSON value of a literal's syntax tree.

    Raises:
        ValueError: `node` is not a literal (a name, a call, an operation, a set, bytes, ...).
    """
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = literal_value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.Name) and node.id in _CONSTANT_NAMES:
        return _CONSTANT_NAMES[node.id]
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [literal_value(element) for element in node.elts]
    elif isinstance(node, ast.Dict):
        return _dict_value(node)
    raise ValueError(f"{_describe(node)} is not a literal")


def _dict_value(node: ast.Dict) -> dict:
    result = {}
    for key, value in zip(node.keys, node.values):
        key_value = None if key is None else literal_value(key)
        if not isinstance(key_value, str):
            raise ValueError("a dict key must be a string")
        result[key_value] = literal_value(value)
    return result


def _describe(node: ast.AST) -> str:
    """A short name for a node, for errors: ``"the name 'x'"``, ``"a Call"``."""
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    return f"a {type(node).__name__}"


def parse_literal(text: str) -> tuple[Any, str | None]:
    """`(value, None)` when `text` is one Python literal, else `(None, error)`."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return literal_value(tree.body), None
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return None, f"not a literal: {exc}"
