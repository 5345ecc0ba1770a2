"""The calculator job of the demo and `examples/calculator.py`: its environment and its training tasks."""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from textenv.environment import TextEnvironment
from textenv.tasks import calculator as task
from textenv.tools import Calculator
from textenv.training.evaluation import SAMPLING_KWARGS
from textenv.training.settings import Settings


def build_calculator_environment(model, tokenizer, settings: Settings) -> TextEnvironment:
    """The calculator `TextEnvironment`: the 2-shot prompt, the `Calculator` tool and the exact-match
    reward, sampling at temperature 1 with `settings.max_new_tokens` per turn and `settings.max_turns`
    turns (in `settings.mixed_precision`)."""
    return TextEnvironment(
        model,
        tokenizer,
        {task.TOOL_NAME: Calculator()},
        task.exact_match_reward,
        task.PROMPT,
        max_turns=settings.max_turns,
        generation_kwargs={**SAMPLING_KWARGS, "max_new_tokens": settings.max_new_tokens},
        batch_size=settings.generation_batch_size,
        mixed_precision=settings.mixed_precision,
    )


def calculator_task_batches(batch_size: int, seed: int, exclude: Sequence[str] = ()) -> Iterator[tuple[list[str], list[float]]]:
    """An endless stream of `(queries, answers)` batches of random calculator tasks, never one of
    `exclude` (the held-out queries)."""
    held_out = set(exclude)
    rng = random.Random(seed)
    while True:
        queries, answers = [], []
        while len(queries) < batch_size:
            query, answer = task.random_task(rng)
            if query not in held_out:
                queries.append(query)
                answers.append(answer)
        yield queries, answers
