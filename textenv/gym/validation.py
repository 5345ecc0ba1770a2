"""Checks on what envs and context managers return, with errors that say what was wrong."""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Optional, Tuple, Union

from textenv.gym.env import Messages


OPENING_ROLES = ("system", "user", "assistant", "tool")


class EnvContractError(TypeError):
    """An env or context manager returned something that breaks the contract in `textenv.gym.env`."""


def check_reset_result(result: Any, env_name: str) -> Tuple[Union[str, Messages], Dict[str, Any], Optional[str]]:
    """`(observation, info, system_message)` from `reset`, with `info=None` read as ``{}``. The observation is
    a string (the first user message) or a list of messages (the whole opening conversation).

    Raises:
        EnvContractError: not a 3-tuple, an observation that is neither a string nor a valid opening (see
            `check_opening_messages`), a non-string system message, a system message given twice, a
            non-dict info.
    """
    where = f"{env_name}.reset"
    observation, info, system = _unpack(result, 3, where, "(observation, info, system_message)")
    if isinstance(observation, list):
        observation = check_opening_messages(observation, where)
        if system and observation[0]["role"] == "system":
            raise EnvContractError(f"{where} returned a system_message and an opening that starts with a system message; give one of them.")
    elif not isinstance(observation, str):
        raise EnvContractError(
            f"{where} returned an observation of type {type(observation).__name__}; expected str (or a list of messages: the opening)."
        )
    if system is not None and not isinstance(system, str):
        raise EnvContractError(f"{where} returned a system_message of type {type(system).__name__}; expected str or None.")
    return observation, _check_info(info, where), system or None


def check_opening_messages(messages: Any, where: str) -> Messages:
    """An opening conversation returned by `reset`: a non-empty list of ``{"role", "content": str}`` dicts
    (roles system, user, assistant or tool) that does not end with an assistant message.

    Raises:
        EnvContractError: anything else (the message says which message is wrong).
    """
    if not isinstance(messages, list) or not messages:
        raise EnvContractError(f"{where} returned an empty opening; expected at least one message.")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in OPENING_ROLES or not isinstance(message.get("content"), str):
            raise EnvContractError(
                f"{where} returned opening[{index}]={_describe(message)}; expected {{'role': one of {list(OPENING_ROLES)}, 'content': str}}."
            )
    if messages[-1]["role"] == "assistant":
        raise EnvContractError(f"{where} returned an opening that ends with an assistant message; the model replies after the last message.")
    return messages


def check_step_result(result: Any, env_name: str) -> Tuple[Any, float, bool, Dict[str, Any]]:
    """`(next_observation, reward, done, info)` from `step`, with the reward as a float and done as a bool.
    The observation is a string (the next user message) or a list of messages (tool results).

    Raises:
        EnvContractError: not a 4-tuple, a reward that is not a finite real number, a done that is not
            a bool (or 0/1), a non-dict info, or a non-string observation while the episode goes on.
    """
    where = f"{env_name}.step"
    observation, reward, done, info = _unpack(result, 4, where, "(next_observation, reward, done, info)")
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise EnvContractError(f"{where} returned reward={reward!r}; expected a finite float.")
    if type(done).__name__ not in ("bool", "bool_") and done not in (0, 1):
        raise EnvContractError(f"{where} returned done={done!r}; expected a bool.")
    done = bool(done)
    if not done and not (isinstance(observation, str) or _is_tool_messages(observation)):
        raise EnvContractError(
            f"{where} returned next_observation={_describe(observation)} with done=False; expected a str (the next "
            "user message) or a non-empty list of {'role': 'tool' or 'user', 'content': str} messages."
        )
    return observation, float(reward), done, _check_info(info, where)


def check_final_reward(result: Any, env_name: str) -> Optional[float]:
    """The value of `final_reward` as a float, or `None` (no final reward).

    Raises:
        EnvContractError: a value that is not a finite real number.
    """
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, numbers.Real) or not math.isfinite(float(result)):
        raise EnvContractError(f"{env_name}.final_reward returned {result!r}; expected a finite float or None.")
    return float(result)


def check_managed_messages(messages: Any, name: str) -> Messages:
    """The list a context manager returned, checked to be non-empty message dicts.

    Raises:
        EnvContractError: not a list of ``{"role": str, "content": str}`` dicts, or empty.
    """
    where = f"{name}.manage_context"
    if not isinstance(messages, list) or not messages:
        raise EnvContractError(f"{where} must return a non-empty list of messages, got {_describe(messages)}.")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise EnvContractError(f"{where} returned messages[{index}]={_describe(message)}; expected {{'role': str, 'content': str}}.")
    return messages


def _is_tool_messages(observation: Any) -> bool:
    return isinstance(observation, list) and bool(observation) and all(
        isinstance(message, dict) and message.get("role") in ("tool", "user") and isinstance(message.get("content"), str)
        for message in observation
    )


def _unpack(result: Any, size: int, where: str, shape: str) -> tuple:
    if not isinstance(result, (tuple, list)) or len(result) != size:
        raise EnvContractError(f"{where} must return a {size}-tuple {shape}, got {_describe(result)}.")
    return tuple(result)


def _check_info(info: Any, where: str) -> Dict[str, Any]:
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise EnvContractError(f"{where} returned info of type {type(info).__name__}; expected dict.")
    return info


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"
