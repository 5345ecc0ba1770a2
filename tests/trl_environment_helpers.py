"""Shared by the TRL-environment test modules (tests/test_trl_environments_*.py): environments written as TRL
documents them (`CounterEnv`, `EchoEnv`), a standalone tool, a fresh instance list per test (the autouse fixture
`fresh_instances`, imported by each module), a scripted policy and a scheduler of them."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from textenv.gym import GymScheduler, ScriptedPolicy

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def call(name: str, **arguments) -> str:
    return CALL.format(name=name, arguments=json.dumps(arguments))


# ---------------------------------------------------------------- environments written as TRL documents them
class CounterEnv:
    """A counter the model raises with its `increment` tool; the reward is the final count."""

    instances: list = []

    def __init__(self):
        self.counter = 0
        self.reset_kwargs = None
        self.reward_calls = 0
        self.threads = {threading.get_ident()}
        CounterEnv.instances.append(self)

    def reset(self, **kwargs) -> str:
        self.threads.add(threading.get_ident())
        self.reset_kwargs = kwargs
        self.counter = kwargs.get("start", 0)
        return f" The counter is at {self.counter}."

    def increment(self, step: int) -> int:
        """Increment the counter by a given step.

        Args:
            step: The value to add to the counter.

        Returns:
            The new value of the counter.
        """
        self.threads.add(threading.get_ident())
        if step < 0:
            raise ValueError("step must be positive")
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        self.threads.add(threading.get_ident())
        self.reward_calls += 1
        return float(self.counter)

    def _helper(self) -> None:  # private: not a tool
        """Not offered."""

    @property
    def doubled(self) -> int:  # a property: not a tool, and never evaluated
        raise AssertionError("a property was evaluated")


class EchoEnv:
    """No `get_reward`: the reward comes from reward functions. One async tool."""

    def reset(self, **kwargs) -> None:
        self.said = []

    async def echo(self, text: str) -> str:
        """Say something back.

        Args:
            text: What to echo.
        """
        await asyncio.sleep(0)
        self.said.append(text)
        return text.upper()


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


@pytest.fixture(autouse=True)
def fresh_instances():
    CounterEnv.instances = []


def scripted(tokenizer, replies):
    """A policy whose k-th reply in an episode is ``replies[k]`` (the last one repeated)."""

    def reply(context: str) -> str:
        turn = context.count("<|im_start|>assistant") - 1
        return replies[min(turn, len(replies) - 1)]

    return ScriptedPolicy(tokenizer, reply)


def scheduler(tokenizer, replies, **kwargs):
    kwargs.setdefault("environment_factory", CounterEnv)
    return GymScheduler(None, tokenizer, policy=scripted(tokenizer, replies), max_turns=kwargs.pop("max_turns", 4), loss_scale="all", **kwargs)


ROW = {"prompt": [{"role": "system", "content": "Count carefully."}, {"role": "user", "content": "Raise the counter."}], "start": 2, "level": "easy"}
