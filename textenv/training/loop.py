"""The one training loop of the demo, the CLI and the examples.

Every PPO step, top to bottom:

1. the episode source plays a batch of episodes with the policy (in eval mode) and scores them;
2. `PPOTrainer.step` optimises on the query tokens, response tokens, scores and masks;
3. `PPOTrainer.log_stats` sends the step's statistics to the trainer's trackers (tensorboard, wandb), and
   the episodes go there as a table (wandb: `game_log`, as in legacy TRL; tensorboard: a text `episodes`);
4. a `StepLog` records the step and `on_step(log)` is called with it.

Printing, plotting and argument parsing belong to the callers (`textenv.demo`, `textenv.cli`, the examples).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from textenv.training.sources import EpisodeBatch, EpisodeSource


@dataclass
class StepLog:
    """What one PPO step did.

    Attributes:
        step (`int`): the step, counted from 0.
        reward_mean (`float`): mean score of the step's episodes.
        kl (`float`): `objective/kl`, the KL of the policy to the reference.
        kl_coef (`float`): `objective/kl_coef`, the KL penalty's weight in this step.
        episode_seconds (`float`): wall time of playing the episodes.
        ppo_seconds (`float`): wall time of `PPOTrainer.step`.
        stats (`dict`): every statistic `PPOTrainer.step` returned.
        batch (`EpisodeBatch`): the episodes trained on, with their tokens, scores, masks and texts.
    """

    step: int
    reward_mean: float
    kl: float
    kl_coef: float
    episode_seconds: float
    ppo_seconds: float
    stats: dict[str, Any] = field(repr=False)
    batch: EpisodeBatch = field(repr=False)


def train(
    trainer,
    episodes: EpisodeSource,
    steps: int,
    *,
    on_step: Callable[[StepLog], None] | None = None,
    deadline: float | None = None,
    progress: bool = True,
    start_step: int = 0,
) -> list[StepLog]:
    """Run `steps` PPO steps on episodes from `episodes`.

    Args:
        trainer (`PPOTrainer`): optimises the policy that `episodes` plays with.
        episodes (`EpisodeSource`): `collect(step)` plays each step's episodes, e.g. a
            `TextEnvironmentSource` or a `textenv.gym.training.GymSource`.
        steps (`int`): PPO steps to run.
        on_step (`Callable[[StepLog], None]`, *optional*): called after every step with its `StepLog`.
        deadline (`float`, *optional*): a `time.perf_counter()` value; no step is started that would, at the
            mean speed of the steps so far, end after it (the first step always runs). `None`: run all `steps`.
        progress (`bool`, defaults to `True`): show a tqdm progress bar with the reward and the KL.
        start_step (`int`, defaults to 0): the first step to run (a resumed run's steps already done).

    Returns:
        One `StepLog` per step that ran.
    """
    from tqdm.auto import tqdm

    logs: list[StepLog] = []
    started = time.perf_counter()
    bar = tqdm(range(start_step, steps), desc="PPO", unit="step", disable=not progress, initial=start_step, total=steps)
    for step in bar:
        if deadline is not None and logs:
            mean_step_seconds = (time.perf_counter() - started) / len(logs)
            if time.perf_counter() + mean_step_seconds > deadline:
                break

        trainer.model.eval()  # the PPO step leaves the policy in train mode
        episodes_started = time.perf_counter()
        batch = episodes.collect(step)
        ppo_started = time.perf_counter()
        stats = trainer.step(batch.queries, batch.responses, batch.scores, batch.masks)
        ppo_seconds = time.perf_counter() - ppo_started
        trainer.log_stats(stats, {"query": batch.query_texts, "response": batch.response_texts}, batch.scores)
        if trainer.config.log_with == "tensorboard":
            trainer.accelerator.log({"episodes": batch.markdown_table()}, step=trainer.current_step)

        log = StepLog(
            step=step,
            reward_mean=batch.reward_mean,
            kl=float(stats["objective/kl"]),
            kl_coef=float(stats["objective/kl_coef"]),
            episode_seconds=ppo_started - episodes_started,
            ppo_seconds=ppo_seconds,
            stats=stats,
            batch=batch,
        )
        logs.append(log)
        bar.set_postfix(reward=f"{log.reward_mean:.2f}", kl=f"{log.kl:.2f}")
        if on_step is not None:
            on_step(log)
    bar.close()
    return logs
