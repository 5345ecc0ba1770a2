"""Shared by the GymScheduler test modules (tests/test_gym_scheduler_*.py): a scripted env (`EchoEnv`, failures
on request), its registration (the autouse fixture `registered`, imported by each module), a numbered-replies
policy and a scheduler of them."""

import asyncio
from pathlib import Path

import pytest

from textenv.gym import Env, GymScheduler, ScriptedPolicy, envs

PLUGIN = Path(__file__).parent / "plugins" / "gym_guess_plugin.py"


# ---------------------------------------------------------------- test envs
class EchoEnv(Env):
    """Observation "obs N"; reward 0.25 per step; done after env_config["turns"] steps (default never).
    env_config["fail"] in {"reset", "step", "close", "hang", "malformed", "init"} injects a failure."""

    created = []

    def __init__(self, env_config):
        if env_config.get("fail") == "init":
            raise RuntimeError("cannot build")
        super().__init__(env_config)
        self.closed = False
        self.steps = 0
        EchoEnv.created.append(self)

    async def reset(self, config):
        if self.env_config.get("fail") == "reset":
            raise RuntimeError("reset exploded")
        return f"task {config.data_dict.get('task', 0)}", {"reset": True}, "Be brief."

    async def step(self, action):
        self.steps += 1
        fail = self.env_config.get("fail")
        if fail == "step":
            raise ValueError("step exploded")
        if fail == "hang":
            await asyncio.Event().wait()
        if fail == "malformed":
            return "obs", 1.0
        await asyncio.sleep(self.env_config.get("delay", 0))
        done = self.steps >= self.env_config.get("turns", 10**9)
        return f"obs {self.steps}", 0.25, done, {"step": self.steps}

    async def close(self):
        self.closed = True
        if self.env_config.get("fail") == "close":
            raise OSError("close exploded")


@pytest.fixture(autouse=True)
def registered():
    envs["echo"] = EchoEnv
    EchoEnv.created = []
    yield
    envs.pop("echo", None)


def numbered_replies(tokenizer):
    """A policy whose k-th reply in an episode is "reply k" (k = assistant turns already in context + 1)."""
    return ScriptedPolicy(tokenizer, lambda context: f"reply {context.count('<|im_start|>assistant') }")


def scheduler(tokenizer, policy=None, **kwargs):
    kwargs.setdefault("gym_env", "echo")
    return GymScheduler(tokenizer=tokenizer, policy=policy or numbered_replies(tokenizer), **kwargs)
