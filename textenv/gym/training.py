"""From gym episodes to `PPOTrainer.step`: the batch it takes (`ppo_batch`), `GymSource`, the Gym front
end's episode source for the one training loop (`textenv.training.train`), and `evaluate`, a policy's
success rate on fixed rows (for `textenv.training.measure`)."""

from __future__ import annotations

import collections
import itertools
import time
from pathlib import Path
from typing import Any, List, Mapping, Sequence, Tuple, Union

import torch

from textenv.gym.episode import GymEpisode
from textenv.gym.scheduler import GymScheduler
from textenv.training.evaluation import Evaluation, generation_mode
from textenv.training.sources import EpisodeBatch, split_text
from textenv.view.record import SOLVED_REWARD


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


class GymSource:
    """Episodes of dataset rows run by a `GymScheduler`, for `textenv.training.train`.

    Each step takes the next rows (cycling through `rows`) until `batch_size` trainable episodes are
    collected: an episode that failed is logged but not trained on, and another row is run in its place. For
    GRPO (``collect(step, num_generations=G)``) each row is played G times in a row and whole groups are
    collected: a group with a failed episode is logged, not trained on, and another row is played instead.

    Args:
        scheduler (`GymScheduler`): runs the episodes; its model must be the policy being trained.
        rows (`Sequence[Mapping]`): dataset rows, used in order and cycled.
        batch_size (`int`): trainable episodes per step (the trainer's `config.batch_size`).
        completions_path (`str` or `Path`, *optional*): `completions.jsonl` to append every episode to, with
            its step.
        max_rounds (`int`, defaults to 4): scheduler runs per step before giving up.

    Raises:
        ValueError: `rows` is empty.
    """

    def __init__(
        self,
        scheduler: GymScheduler,
        rows: Sequence[Mapping[str, Any]],
        batch_size: int,
        *,
        completions_path: Union[str, Path, None] = None,
        max_rounds: int = 4,
    ):
        if not rows:
            raise ValueError("GymSource needs at least one dataset row.")
        self.scheduler = scheduler
        self.batch_size = batch_size
        self.completions_path = completions_path
        self.max_rounds = max_rounds
        self._rows = itertools.cycle(rows)
        self.rows_used = 0

    def state_dict(self) -> dict:
        """Where the row cycle is: ``{"rows_used": N}``."""
        return {"rows_used": self.rows_used}

    def load_state_dict(self, state: dict) -> None:
        """Skip the rows a saved run had used (on a source built from the same rows)."""
        skip = int(state.get("rows_used", 0)) - self.rows_used
        for _ in itertools.islice(self._rows, max(0, skip)):
            self.rows_used += 1

    def collect(self, step: int, num_generations: int = 1) -> EpisodeBatch:
        """Run rows until `batch_size` trainable episodes of step `step` are collected, in whole groups of
        `num_generations` episodes of the same row.

        Raises:
            ValueError: `batch_size` is not a multiple of `num_generations`.
            RuntimeError: `max_rounds` runs gave fewer than `batch_size` trainable episodes.
        """
        if self.batch_size % num_generations:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of num_generations ({num_generations}).")
        trainable: List[GymEpisode] = []
        failures: collections.Counter = collections.Counter()
        for _ in range(self.max_rounds):
            rows = list(itertools.islice(self._rows, (self.batch_size - len(trainable)) // num_generations))
            self.rows_used += len(rows)
            episodes = self.scheduler.run(rows, step=step, num_generations=num_generations, completions_path=self.completions_path)
            for start in range(0, len(episodes), num_generations):
                group = episodes[start : start + num_generations]
                if all(episode.trainable for episode in group):
                    trainable.extend(group)
            failures.update(f"{error['type']} at {error['stage']}: {error['message']}" for episode in episodes if (error := episode.error))
            if len(trainable) == self.batch_size:
                return _episode_batch(trainable)
        groups = f" (in whole groups of {num_generations})" if num_generations > 1 else ""
        common = f" The most common error ({failures.most_common(1)[0][1]} episodes): {failures.most_common(1)[0][0]}." if failures else ""
        raise RuntimeError(
            f"only {len(trainable)} of {self.batch_size} episodes were trainable{groups} after {self.max_rounds} rounds; "
            f"see the errors in completions.jsonl.{common}"
        )


def evaluate(scheduler: GymScheduler, rows: Sequence[Mapping[str, Any]], sample: bool) -> Evaluation:
    """The scheduler's policy on fixed dataset rows, one episode each, sampled at temperature 1 or greedy.

    Args:
        scheduler (`GymScheduler`): runs the episodes (its `generation_kwargs` are restored afterwards).
        rows (`Sequence[Mapping]`): the held-out rows.
        sample (`bool`): sample at temperature 1 (the policy as it is trained) instead of greedy decoding.

    Returns:
        An `Evaluation` whose `rewards` are the episodes' total rewards, whose `accuracy` is the fraction of
        episodes solved (total reward >= 1.0, as `textenv view` counts them; a failed episode is unsolved)
        and whose `histories` are the `GymEpisode`s.
    """
    if scheduler.model is not None:
        scheduler.model.eval()
    started = time.perf_counter()
    with generation_mode(scheduler, sample):
        episodes = scheduler.run(list(rows))
    rewards = [float(episode.total_reward) for episode in episodes]
    accuracy = sum(reward >= SOLVED_REWARD for reward in rewards) / len(rewards)
    return Evaluation(accuracy, rewards, episodes, time.perf_counter() - started)


def _episode_batch(episodes: List[GymEpisode]) -> EpisodeBatch:
    queries, responses, scores, masks = ppo_batch(episodes)
    texts = [split_text(episode.history) for episode in episodes]
    return EpisodeBatch(
        queries=queries,
        responses=responses,
        scores=scores,
        masks=masks,
        query_texts=[query for query, _ in texts],
        response_texts=[response for _, response in texts],
        episodes=episodes,
    )
