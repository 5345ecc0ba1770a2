"""From gym episodes to `PPOTrainer.step`: the batch it takes, and a training loop over dataset rows."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from textenv.gym.completions import CompletionsLog
from textenv.gym.episode import GymEpisode
from textenv.gym.scheduler import GymScheduler


def ppo_batch(episodes: Sequence[GymEpisode]) -> Tuple[List[torch.Tensor], List[torch.Tensor], List[torch.Tensor], List[torch.Tensor]]:
    """`(queries, responses, scores, masks)` for `PPOTrainer.step`, from the trainable episodes (model
    tokens and no error), in order. The score is the episode's total reward."""
    queries, responses, scores, masks = [], [], [], []
    for episode in episodes:
        if not episode.trainable:
            continue
        query, response, mask = episode.history.split_query_response_tokens()
        queries.append(query)
        responses.append(response)
        masks.append(mask)
        scores.append(torch.tensor(float(episode.total_reward)))
    return queries, responses, scores, masks


def collect_trainable(
    scheduler: GymScheduler,
    rows: Iterator[Mapping[str, Any]],
    count: int,
    *,
    step: int = 0,
    log: Optional[CompletionsLog] = None,
    max_rounds: int = 4,
) -> List[GymEpisode]:
    """Run rows from `rows` until `count` trainable episodes are collected (episodes that failed are
    logged but not trained on). Returns exactly `count` episodes.

    Raises:
        RuntimeError: `max_rounds` rounds of rows gave fewer than `count` trainable episodes.
    """
    trainable: List[GymEpisode] = []
    for _ in range(max_rounds):
        needed = count - len(trainable)
        batch = list(itertools.islice(rows, needed))
        episodes = scheduler.run(batch, step=step, completions_path=log)
        trainable.extend(episode for episode in episodes if episode.trainable)
        if len(trainable) >= count:
            return trainable[:count]
    raise RuntimeError(
        f"only {len(trainable)} of {count} episodes were trainable after {max_rounds} rounds; see the errors "
        "in completions.jsonl."
    )


def train_on_gym(
    trainer,
    scheduler: GymScheduler,
    rows: Sequence[Mapping[str, Any]],
    steps: int,
    *,
    completions_path: Union[str, Path, None] = None,
    progress: bool = False,
    on_step: Optional[Callable[[int, Dict[str, Any], List[GymEpisode]], None]] = None,
) -> List[Dict[str, Any]]:
    """PPO on gym episodes: each step runs `trainer.config.batch_size` trainable episodes from `rows`
    (cycled) and calls `trainer.step` on them.

    Args:
        trainer (`PPOTrainer`): its model must be the scheduler's model (the policy being trained).
        scheduler (`GymScheduler`): runs the episodes.
        rows: dataset rows, used in order and cycled.
        steps (`int`): PPO steps.
        completions_path: `completions.jsonl` to append every episode to (with its step).
        progress (`bool`): show a tqdm bar over steps.
        on_step: called as ``on_step(step, stats, episodes)`` after every step.

    Returns:
        The stats of every step, with `env/reward_mean` added.
    """
    from tqdm import tqdm

    if not rows:
        raise ValueError("train_on_gym needs at least one dataset row.")
    batch_size = trainer.config.batch_size
    row_iter = itertools.cycle(rows)
    all_stats = []
    log = CompletionsLog(completions_path) if completions_path is not None else None
    try:
        for step in tqdm(range(steps), desc="PPO steps") if progress else range(steps):
            episodes = collect_trainable(scheduler, row_iter, batch_size, step=step, log=log)
            queries, responses, scores, masks = ppo_batch(episodes)
            stats = trainer.step(queries, responses, scores, masks)
            stats["env/reward_mean"] = float(torch.stack(scores).mean())
            all_stats.append(stats)
            if on_step is not None:
                on_step(step, stats, episodes)
    finally:
        if log is not None:
            log.close()
    return all_stats
