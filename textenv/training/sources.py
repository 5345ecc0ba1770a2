"""Where the training loop's episodes come from.

An episode source plays one PPO step's episodes with the policy and hands them over as an `EpisodeBatch`:
exactly what `PPOTrainer.step` takes, plus the texts `log_stats` logs and the episodes themselves.
`TextEnvironmentSource` plays task batches with a `TextEnvironment`; the Gym front end's source is
`textenv.gym.training.GymSource`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence

import torch

from textenv.environment import TextEnvironment, TextHistory
from textenv.episodes.driver import FINISH_MAX_LENGTH, FINISH_MAX_TURNS


@dataclass
class EpisodeBatch:
    """One PPO step's episodes.

    Attributes:
        queries (`list[torch.Tensor]`): query token ids (prompt and task), one per episode.
        responses (`list[torch.Tensor]`): response token ids (model and tool tokens interleaved).
        scores (`list[torch.Tensor]`): one scalar reward per episode.
        masks (`list[torch.Tensor]`): 1 where the model wrote the response token, 0 for tool/env tokens.
        query_texts (`list[str]`): the queries as text, for `PPOTrainer.log_stats`.
        response_texts (`list[str]`): the responses as text, for `PPOTrainer.log_stats`.
        episodes (`list`): the episodes (`TextHistory`s, or `GymEpisode`s from the Gym front end).
    """

    queries: list[torch.Tensor]
    responses: list[torch.Tensor]
    scores: list[torch.Tensor]
    masks: list[torch.Tensor]
    query_texts: list[str]
    response_texts: list[str]
    episodes: list[Any] = field(default_factory=list, repr=False)

    def rollout_logprobs(self) -> list[torch.Tensor]:
        """The inference engine's log-probability of every response token, one 1-D tensor per episode (NaN
        where the engine reported none), for `PPOTrainer.step(rollout_logprobs=...)`.

        Raises:
            ValueError: the batch does not hold one episode (with a `TextHistory`) per response.
        """
        histories = [getattr(episode, "history", episode) for episode in self.episodes]
        if len(histories) != len(self.responses) or not all(isinstance(h, TextHistory) for h in histories):
            raise ValueError("EpisodeBatch.rollout_logprobs needs the batch's episodes, one TextHistory per response.")
        return [history.response_logprobs() for history in histories]

    def truncated(self) -> list[bool]:
        """Per episode: did a limit (``max_length``, ``max_turns``, a turn's ``max_new_tokens``) end it rather than
        the model or the env? For `GRPOTrainer.step(truncated=...)`."""
        return [episode_truncated(episode) for episode in self.episodes]

    @property
    def reward_mean(self) -> float:
        """Mean score of the batch."""
        return sum(float(score) for score in self.scores) / len(self.scores)

    def markdown_table(self) -> str:
        """The episodes as a Markdown table (query, response, reward), as tensorboard's text tab shows it."""

        def cell(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", "<br>")

        rows = [f"| {cell(query)} | {cell(response)} | {float(score):.3f} |" for query, response, score in zip(self.query_texts, self.response_texts, self.scores)]
        return "\n".join(["| query | response | reward |", "|---|---|---|", *rows])


class EpisodeSource(Protocol):
    """Anything that plays one training step's episodes: ``collect(step) -> EpisodeBatch``. For GRPO the loop
    calls ``collect(step, num_generations=G)``: the batch is then whole groups, G consecutive episodes of the
    same task each. A source that can be resumed also has ``state_dict()`` and ``load_state_dict(state)``."""

    def collect(self, step: int, num_generations: int = 1) -> EpisodeBatch:
        """Play the episodes of training step `step` (0-based), `num_generations` of each task."""
        ...


def episode_truncated(episode: Any) -> bool:
    """A `TextHistory` that a limit ended, or a `GymEpisode` that ended at ``max_turns`` / ``max_length`` or whose
    last turn hit ``max_new_tokens``."""
    if isinstance(episode, TextHistory):
        return bool(episode.truncated)
    last_turn = episode.turn_finish_reasons[-1] if episode.turn_finish_reasons else None
    return episode.finish_reason in (FINISH_MAX_TURNS, FINISH_MAX_LENGTH) or last_turn == "length"


def repeat_each(items: Sequence[Any], num_generations: int, name: str) -> list[Any]:
    """The first ``len(items) / num_generations`` items, each repeated `num_generations` times in a row.

    Raises:
        ValueError: ``len(items)`` is not a multiple of `num_generations` (`name` says which batch).
    """
    if len(items) % num_generations:
        raise ValueError(f"{name} has {len(items)} tasks, not a multiple of num_generations ({num_generations}).")
    return [item for item in items[: len(items) // num_generations] for _ in range(num_generations)]


def split_text(history: TextHistory) -> tuple[str, str]:
    """`(query, response)` text of an episode: its first segment (prompt and task) and everything after."""
    end = history.text_spans[0][1]
    return history.text[:end], history.text[end:]


class TextEnvironmentSource:
    """Episodes from a `TextEnvironment`, one per task of each batch.

    Args:
        env (`TextEnvironment`): plays and scores the episodes; its reward function takes `answers=`.
        task_batches (`Iterator[tuple[list[str], Sequence]]`): yields `(queries, answers)` for every step.
    """

    def __init__(self, env: TextEnvironment, task_batches: Iterator[tuple[list[str], Sequence[Any]]]):
        self.env = env
        self.task_batches = task_batches
        self.batches_drawn = 0

    def state_dict(self) -> dict:
        """Where the task stream is: ``{"batches_drawn": N}``."""
        return {"batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict) -> None:
        """Skip to where `state` was, on a fresh stream built as the saved one was (it is replayed)."""
        for _ in range(int(state.get("batches_drawn", 0)) - self.batches_drawn):
            next(self.task_batches)
            self.batches_drawn += 1

    def collect(self, step: int, num_generations: int = 1) -> EpisodeBatch:
        """Run the next batch of tasks through the environment; the score is the episode's reward. With
        `num_generations` G > 1 the batch's first 1/G of the tasks are each played G times (GRPO's groups)."""
        queries, answers = next(self.task_batches)
        self.batches_drawn += 1
        if num_generations > 1:
            queries = repeat_each(queries, num_generations, "the task batch")
            answers = repeat_each(list(answers), num_generations, "the task batch")
        query_tokens, responses, masks, rewards, histories = self.env.run(queries, answers=answers)
        return EpisodeBatch(
            queries=query_tokens,
            responses=responses,
            scores=[torch.tensor(float(reward)) for reward in rewards],
            masks=masks,
            query_texts=list(queries),
            response_texts=[split_text(history)[1] for history in histories],
            episodes=histories,
        )
