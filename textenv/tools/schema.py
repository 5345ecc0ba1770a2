"""JSON schemas of tools for the chat template's `tools=`, and checking a call's arguments against them.

A schema is built the way transformers' `get_json_schema` builds one, from the function's signature
(type hints) and its Google-style docstring (the summary and the ``Args:`` section), but without refusing
a function whose docstring is missing or incomplete:

* a plain function or method: its own signature and docstring;
* a callable object (`Calculator()`): its `__call__`, described by `__call__`'s docstring or the class's;
* a smolagents-style tool: its `description` and `inputs`;
* any tool with a `json_schema` attribute (a dict in the OpenAI function form): that schema.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Optional, Union

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array", dict: "object", type(None): "null"}
_SMOLAGENTS_TYPES = {"any": None, "image": "string", "audio": "string"}
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Raises|Example|Examples|Yields|Note|Notes)\s*:\s*$")


def tool_schema(name: str, tool: Any) -> dict:
    """The OpenAI-style function schema of `tool` under `name`:
    ``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    given = getattr(tool, "json_schema", None)
    if isinstance(given, dict):
        function = dict(given.get("function", given))
        return {"type": "function", "function": {**function, "name": name}}
    if _is_smolagents_style(tool):
        return _function_schema(name, str(getattr(tool, "description", "") or ""), _smolagents_parameters(tool.inputs))
    summary, argument_docs = _read_docstring(_docstring(tool))
    return _function_schema(name, summary, _signature_parameters(tool, argument_docs))


def argument_error(tool: Any, arguments: dict) -> Optional[str]:
    """Why `arguments` cannot be passed to `tool` as keyword arguments (missing, unexpected), or `None`."""
    if _is_smolagents_style(tool):
        inputs = dict(getattr(tool, "inputs", {}) or {})
        unexpected = sorted(set(arguments) - set(inputs))
        missing = sorted(key for key in required_inputs(inputs) if key not in arguments)
        if unexpected or missing:
            return _describe_mismatch(missing, unexpected, list(inputs))
        return None
    try:
        signature = inspect.signature(tool)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**arguments)
    except TypeError as error:
        parameters = signature.parameters.values()
        if any(parameter.kind == parameter.VAR_KEYWORD for parameter in parameters):
            return f"{error}; the arguments are {_parameter_names(signature)}"
        names = [parameter.name for parameter in parameters if parameter.name != "self"]
        missing = [p.name for p in parameters if p.default is p.empty and p.kind != p.VAR_POSITIONAL and p.name not in arguments]
        return _describe_mismatch(missing, sorted(set(arguments) - set(names)), names)
    return None


def required_inputs(inputs: dict) -> list[str]:
    """The inputs of a smolagents-style tool that a call must give: those not marked ``"nullable"``."""
    return [name for name, spec in inputs.items() if not (isinstance(spec, dict) and spec.get("nullable"))]


def _is_smolagents_style(tool: Any) -> bool:
    return isinstance(getattr(tool, "inputs", None), dict) and callable(getattr(tool, "forward", None))


def _function_schema(name: str, description: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _smolagents_parameters(inputs: dict) -> dict:
    properties = {}
    for key, spec in inputs.items():
        spec = dict(spec or {})
        kind = _SMOLAGENTS_TYPES.get(spec.get("type"), spec.get("type"))
        properties[key] = {**({"type": kind} if kind else {}), "description": str(spec.get("description", ""))}
    return {"type": "object", "properties": properties, "required": required_inputs(inputs)}


def _signature_parameters(tool: Callable, argument_docs: dict[str, str]) -> dict:
    signature = inspect.signature(tool)
    try:
        hints = typing.get_type_hints(tool if inspect.isroutine(tool) else type(tool).__call__)
    except Exception:  # noqa: BLE001 - unresolvable annotations describe nothing
        hints = {}
    properties, required = {}, []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD) or parameter.name == "self":
            continue
        spec = _type_schema(hints.get(parameter.name, parameter.annotation))
        if parameter.name in argument_docs:
            spec["description"] = argument_docs[parameter.name]
        properties[parameter.name] = spec
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    return {"type": "object", "properties": properties, "required": required}


def _type_schema(hint: Any) -> dict:
    """The JSON schema of a type hint (unknown or missing hints give ``{}``: any value)."""
    if hint in (inspect.Parameter.empty, Any) or isinstance(hint, str):
        return {}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [_type_schema(arg) for arg in args if arg is not type(None)]
        nullable = type(None) in args
        if len(options) == 1 and "type" in options[0]:
            schema = dict(options[0])
            if nullable:
                schema["nullable"] = True
            return schema
        return {"anyOf": options + ([{"type": "null"}] if nullable else [])}
    if origin in (list, tuple, set, frozenset):
        schema = {"type": "array"}
        if args and origin is not tuple:
            schema["items"] = _type_schema(args[0])
        return schema
    if origin is dict:
        return {"type": "object"}
    return {}


def _docstring(tool: Any) -> str:
    if inspect.isroutine(tool):
        return inspect.getdoc(tool) or ""
    call_doc = inspect.getdoc(type(tool).__call__) if "__call__" in vars(type(tool)) else None
    return call_doc or inspect.getdoc(type(tool)) or ""


def _read_docstring(docstring: str) -> tuple[str, dict[str, str]]:
    """The summary (first paragraph) and the ``Args:`` descriptions of a Google-style docstring."""
    summary = docstring.strip().split("\n\n")[0].strip() if docstring.strip() else ""
    if _SECTION.match(summary.splitlines()[0] if summary else ""):
        summary = ""
    argument_docs: dict[str, str] = {}
    section, current = None, None
    for line in docstring.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section not in ("Args", "Arguments", "Parameters"):
            continue
        match = _ARG_LINE.match(line)
        if match and (len(line) - len(line.lstrip())) <= _indent_of_args(docstring):
            current = match.group(1).lstrip("*")
            argument_docs[current] = match.group(2).strip()
        elif current and line.strip():
            argument_docs[current] = f"{argument_docs[current]} {line.strip()}".strip()
    return " ".join(summary.split()), argument_docs


def _indent_of_args(docstring: str) -> int:
    lines = docstring.splitlines()
    for index, line in enumerate(lines):
        if _SECTION.match(line) and index + 1 < len(lines):
            following = lines[index + 1]
            return len(following) - len(following.lstrip())
    return 0


def _parameter_names(signature: inspect.Signature) -> str:
    names = [name for name in signature.parameters if name != "self"]
    return ", ".join(names) if names else "none"


def _describe_mismatch(missing: list[str], unexpected: list[str], names: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing {', '.join(repr(name) for name in missing)}")
    if unexpected:
        parts.append(f"unexpected {', '.join(repr(name) for name in unexpected)}")
    return f"{'; '.join(parts)}; the arguments are {', '.join(names) or 'none'}"
