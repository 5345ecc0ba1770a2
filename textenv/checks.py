"""Argument checks shared by the front ends, with messages that name the argument and the fix."""

from __future__ import annotations

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
