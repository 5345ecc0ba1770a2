"""Measuring a policy on a fixed task set: `evaluate`, sampled (as it is trained) or greedy."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from textenv.environment import TextEnvironment, TextHistory

# Sampling exactly as the legacy examples: temperature 1, no top-k / top-p filtering.
SAMPLING_KWARGS = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
GREEDY_KWARGS = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}


@dataclass
class Evaluation:
    """The result of `evaluate`.

    Attributes:
        accuracy (`float`): mean reward, in [0, 1] for a 0/1 reward.
        rewards (`list[float]`): one per task.
        histories (`list[TextHistory]`): the episodes, in task order.
        seconds (`float`): wall time.
    """

    accuracy: float
    rewards: list[float]
    histories: list[TextHistory]
    seconds: float


@contextmanager
def generation_mode(env: TextEnvironment, sample: bool) -> Iterator[TextEnvironment]:
    """Temporarily make `env` sample at temperature 1 (`sample=True`) or decode greedily; its
    `generation_kwargs` are restored afterwards."""
    saved = env.generation_kwargs
    mode = SAMPLING_KWARGS if sample else GREEDY_KWARGS
    env.generation_kwargs = {**saved, **mode}
    try:
        yield env
    finally:
        env.generation_kwargs = saved


def evaluate(env: TextEnvironment, queries: Sequence[str], answers: Sequence[Any], sample: bool) -> Evaluation:
    """Accuracy of the environment's model on `queries`, sampled at temperature 1 or greedy.

    Args:
        env (`TextEnvironment`): its reward function takes `answers=`.
        queries (`Sequence[str]`): the tasks, e.g. from `textenv.tasks.calculator.generate_tasks`.
        answers (`Sequence`): what the reward function compares each episode with.
        sample (`bool`): sample at temperature 1 (the policy as it is trained) instead of greedy decoding.

    Returns:
        An `Evaluation`.
    """
    env.model.eval()
    started = time.perf_counter()
    with generation_mode(env, sample):
        *_, rewards, histories = env.run(list(queries), answers=list(answers))
    rewards = [float(reward) for reward in rewards]
    return Evaluation(sum(rewards) / len(rewards), rewards, histories, time.perf_counter() - started)
