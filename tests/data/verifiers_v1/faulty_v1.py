"""faulty: textenv's own test taskset (not verifiers'), for failures that must stay in their episode.

Each task echoes a phrase, like verifiers' `echo-v1`; its `mode` picks what goes wrong: nothing (``ok``), the
reward function raises (``reward_raises``) or hangs (``reward_hangs``), or the env's `run` raises after the
model's turn (``run_raises``), as a scripted user whose game server crashed would."""

import asyncio

import verifiers.v1 as vf

MODES = ["ok", "reward_raises", "reward_hangs", "run_raises"]


class FaultyData(vf.TaskData):
    mode: str


class FaultyTask(vf.Task[FaultyData, vf.State, vf.TaskConfig]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def echoed(self, trace: vf.Trace) -> float:
        if self.data.mode == "reward_raises":
            raise RuntimeError("the grader crashed")
        if self.data.mode == "reward_hangs":
            await asyncio.sleep(3600)
        reply = trace.assistant_messages[-1].content if trace.assistant_messages else ""
        return float(self.data.mode in (reply or ""))


class FaultyEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        await super().run(task, agents)
        if task.data.mode == "run_raises":
            raise RuntimeError("the game server crashed")


class FaultyTaskset(vf.Taskset[FaultyTask, vf.TasksetConfig]):
    def load(self) -> list[FaultyTask]:
        return [FaultyTask(FaultyData(idx=i, prompt=f"Say {mode}.", mode=mode)) for i, mode in enumerate(MODES)]


__all__ = ["FaultyEnv", "FaultyTaskset"]
