"""Argument checks shared by the front ends, with messages that name the argument and the fix."""

from __future__ import annotations

import warnings
from typing import Any


def check_positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    """Raise `ValueError` unless `value` is an int >= 1 (>= 0 with `allow_zero`); bools are refused.

    Args:
        name: the argument's name, for the message.
        value: its value.
        allow_zero: accept 0 as well.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}.")


def check_prompt(prompt: Any, tool_format: str) -> None:
    """Raise unless `prompt` is None or a string (or, with `tool_format="json"`, a list of messages)."""
    if prompt is None or isinstance(prompt, str):
        return
    if tool_format == "json" and isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return
    expected = "a string (the system message) or a list of message dicts" if tool_format == "json" else "a string"
    raise TypeError(f"prompt must be {expected}, got {type(prompt).__name__}.")


def check_queries(queries: Any) -> None:
    """Raise unless `queries` is a non-empty list of strings."""
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise TypeError(f"queries must be a list of strings, got {type(queries).__name__}. Wrap one query as [query].")
    if len(queries) == 0:
        raise ValueError("queries is empty: pass at least one query string.")
    for index, query in enumerate(queries):
        if not isinstance(query, str):
            raise TypeError(f"queries[{index}] must be a string, got {type(query).__name__}.")


DEFAULT_MAX_TOOL_RESPONSE = 100


def resolve_max_tool_response(legacy_value: int | None, value: int | None) -> int:
    """TextEnvironment's longest tool response from its legacy spelling `max_tool_reponse` and `max_tool_response`."""
    if legacy_value is not None and value is not None and legacy_value != value:
        raise ValueError(
            f"max_tool_reponse={legacy_value} and max_tool_response={value} disagree; pass only one "
            "(max_tool_reponse is the legacy spelling of max_tool_response)."
        )
    chosen = value if value is not None else legacy_value
    if chosen is None:
        return DEFAULT_MAX_TOOL_RESPONSE
    check_positive_int("max_tool_response", chosen)
    if chosen < 4:
        warnings.warn("max_tool_response < 4 leaves no room for the '...' truncation mark.", stacklevel=3)
    return chosen
