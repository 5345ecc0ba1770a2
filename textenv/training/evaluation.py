"""Measuring a policy on a fixed task set: `evaluate`, sampled (as it is trained) or greedy; `measure` both
ways before and after training, `log_before_after` the table every example and the demo print."""

from __future__ import annotations

import functools
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, Union

from textenv.environment import TextEnvironment, TextHistory

# Sampling exactly as the legacy examples: temperature 1, no top-k / top-p filtering.
SAMPLING_KWARGS = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0}
GREEDY_KWARGS = {"do_sample": False, "temperature": None, "top_k": None, "top_p": None}
MODES = {"sampled": True, "greedy": False}  # mode name -> sample
MODE_LABELS = {"sampled": "sampled (temperature 1)", "greedy": "greedy"}

logger = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """The result of `evaluate`.

    Attributes:
        accuracy (`float`): mean reward, in [0, 1] for a 0/1 reward (`textenv.gym.evaluate`: the fraction of
            episodes whose total reward reaches 1.0).
        rewards (`list[float]`): one per task.
        histories (`list`): the episodes, in task order: `TextHistory`s (`GymEpisode`s for a Gym evaluation).
        seconds (`float`): wall time.
    """

    accuracy: float
    rewards: list[float]
    histories: list[TextHistory]
    seconds: float


@contextmanager
def generation_mode(env: TextEnvironment, sample: bool) -> Iterator[TextEnvironment]:
    """Temporarily make `env` (a `TextEnvironment` or a `GymScheduler`) sample at temperature 1
    (`sample=True`) or decode greedily; its `generation_kwargs` are restored afterwards."""
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


def measure(
    evaluate_one: Callable[[bool], Evaluation],
    label: str,
    run_dir: Union[str, Path, None] = None,
    tokenizer=None,
    step: int = 0,
) -> dict[str, Evaluation]:
    """Evaluate a policy sampled (temperature 1, as it is trained) and greedy, log both accuracies and, with
    `run_dir`, record the episodes there for `textenv view` (phase ``f"eval-{label}"``).

    Args:
        evaluate_one (`Callable[[bool], Evaluation]`): one evaluation, given `sample`; for a TextEnvironment
            ``functools.partial(evaluate, env, queries, answers)``, for a Gym dataset
            ``functools.partial(textenv.gym.evaluate, scheduler, rows)``.
        label (`str`): e.g. ``"before"`` or ``"after"``.
        run_dir (`str` or `Path`, *optional*): the run directory of `train(run_dir=...)`.
        tokenizer (*optional*): spells the tokens of the recorded episodes.
        step (`int`, defaults to 0): the PPO steps done so far (where the page puts these episodes).

    Returns:
        ``{"sampled": Evaluation, "greedy": Evaluation}``.
    """
    results = {}
    for mode, sample in MODES.items():
        results[mode] = evaluation = evaluate_one(sample)
        logger.info(f"[{label}] held-out accuracy ({mode}): {evaluation.accuracy:.1%} ({evaluation.seconds:.0f} s)")
    if run_dir is not None:
        from textenv.view import RunRecorder

        with RunRecorder(run_dir, tokenizer) as recorder:
            for mode, evaluation in results.items():
                recorder.record_episodes(evaluation.histories, evaluation.rewards, step=step, phase=f"eval-{label}-{mode}")
    return results


def measure_environment(
    env: TextEnvironment,
    queries: Sequence[str],
    answers: Sequence[Any],
    label: str,
    run_dir: Union[str, Path, None] = None,
    step: int = 0,
    progress: bool = False,
) -> dict[str, Evaluation]:
    """`measure` a TextEnvironment's policy on fixed tasks, sampled and greedy, with a progress bar over the
    episodes if asked (`env.progress` is restored), recording the episodes in `run_dir`."""
    saved, env.progress = env.progress, progress
    try:
        return measure(functools.partial(evaluate, env, queries, answers), label, run_dir, env.tokenizer, step)
    finally:
        env.progress = saved


def show_episodes(evaluation: Evaluation, count: int, title: str) -> None:
    """Log `title` and print the first `count` episodes of an evaluation with `show_text`."""
    if count > 0:
        logger.info(f"\n--- {title} ---")
    for index, history in enumerate(evaluation.histories[:count]):
        history.show_text(show_legend=index == 0)


def log_before_after(title: str, before: dict[str, Evaluation], after: dict[str, Evaluation]) -> dict[str, float]:
    """Log the before -> after table of two `measure` results under `title`.

    Returns:
        ``{"sampled_before", "sampled_after", "greedy_before", "greedy_after"}`` accuracies.
    """
    logger.info(f"\n=== {title}, before -> after training ===")
    figures = {}
    for mode in MODES:
        change = 100 * (after[mode].accuracy - before[mode].accuracy)
        logger.info(f"{MODE_LABELS[mode]:<24} {before[mode].accuracy:6.1%} -> {after[mode].accuracy:6.1%}  ({change:+.1f} points)")
        figures[f"{mode}_before"], figures[f"{mode}_after"] = before[mode].accuracy, after[mode].accuracy
    return figures
