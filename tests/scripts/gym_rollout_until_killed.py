"""Runs slow gym episodes forever-ish, logging to completions.jsonl; the test kills it with SIGKILL."""

import asyncio
import sys

from textenv.gym import Env, GymScheduler, ScriptedPolicy, envs
from textenv.models import load_tokenizer


class SlowEnv(Env):
    async def reset(self, request):
        return "go " + "x" * 5000, {"row": request.data_dict.get("row")}, None  # long lines: big writes

    async def step(self, messages):
        await asyncio.sleep(0.01)
        return "more", 1.0, True, {"payload": "y" * 20000}

    async def close(self):
        pass


envs["slow"] = SlowEnv
scheduler = GymScheduler(
    tokenizer=load_tokenizer(), policy=ScriptedPolicy(load_tokenizer(), lambda context: "ok"),
    gym_env="slow", max_turns=1, max_concurrency=8,
)
print("ready", flush=True)
scheduler.run(({"row": i} for i in range(10**6)), completions_path=sys.argv[1], keep_episodes=False)
