"""Typing the argument values of the XML-style formats (Qwen3-Coder / Qwen3.5, GLM-4 MoE), whose templates
write a string argument as raw text, so that ``"75001"`` and ``75001`` look the same; only the tool's JSON
schema can tell them apart. Each family's own parser (vLLM's ``qwen3_coder`` and ``glm4_moe``) is followed:

- Qwen: with a schema, the parameter's type decides (``integer``, ``number``, ``boolean``, ``object``,
  ``array``; ``string`` and unknown types keep the text); without one every value is a string; ``null`` is
  `None` either way.
- GLM: a parameter typed ``string`` keeps its text; any other value is read as JSON, else as a Python
  literal, else kept as text.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable

from .literals import parse_literal

# A schema's type names, as Qwen's parser reads them (prefixes of C-like and Python-like names included).
_KINDS = (("int", "integer"), ("uint", "integer"), ("long", "integer"), ("short", "integer"), ("unsigned", "integer"),
          ("num", "number"), ("float", "number"), ("double", "number"), ("bool", "boolean"), ("binary", "boolean"),
          ("object", "object"), ("dict", "object"), ("arr", "array"), ("list", "array"), ("null", "null"))


def tool_properties(tools: Iterable[dict] | None, name: str | None) -> dict | None:
    """The ``properties`` of tool `name`'s parameters in `tools` (OpenAI-style schemas ``{"type": "function",
    "function": {...}}`` or bare ``{"name", "parameters"}``); `None` when there are no tools or no such tool."""
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            parameters = function.get("parameters") or {}
            properties = parameters.get("properties", parameters) if isinstance(parameters, dict) else {}
            return properties if isinstance(properties, dict) else {}
    return None


def _kinds(schema: Any) -> list[str]:
    """The JSON types a parameter schema allows (``type``, a list of them, ``anyOf`` / ``oneOf``), normalised."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    names = declared if isinstance(declared, list) else [declared] if isinstance(declared, str) else []
    kinds = [next((kind for prefix, kind in _KINDS if str(name).lower().startswith(prefix)), "string") for name in names]
    for union in ("anyOf", "oneOf"):
        for choice in schema.get(union) or []:
            kinds.extend(_kinds(choice))
    return kinds


def qwen_value(raw: str, schema: Any) -> Any:
    """A Qwen XML parameter value typed by its parameter's `schema` (`None`: no schema, the text is kept)."""
    if raw.lower() == "null":
        return None
    for kind in _kinds(schema):
        if kind == "string":
            return raw
        typed = _typed(raw, kind)
        if typed is not _NOT_TYPED:
            return typed
    return raw


def glm_value(raw: str, schema: Any) -> Any:
    """A GLM ``<arg_value>`` typed as GLM's parser does: text for a ``string`` parameter, else JSON, else a
    Python literal, else the text."""
    if _kinds(schema)[:1] == ["string"]:
        return raw
    value = _json_value(raw)
    return _literal_or(raw, raw) if value is _NOT_TYPED else value


_NOT_TYPED = object()


def _literal_or(text: str, default: Any) -> Any:
    """The Python literal `text` holds, else `default`."""
    value, error = parse_literal(text)
    return default if error is not None else value


def _json_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return _NOT_TYPED


def _typed(raw: str, kind: str) -> Any:
    """`raw` as a value of JSON type `kind`, or `_NOT_TYPED` when it is not one."""
    text = raw.strip()
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _NOT_TYPED
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return _NOT_TYPED
        return int(number) if math.isfinite(number) and number.is_integer() else number
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _NOT_TYPED)
    if kind in ("object", "array"):
        value = _json_value(text)
        if value is _NOT_TYPED:
            value = _literal_or(text, _NOT_TYPED)
        return value if isinstance(value, dict if kind == "object" else list) else _NOT_TYPED
    return None if kind == "null" and text.lower() in ("null", "none") else _NOT_TYPED
