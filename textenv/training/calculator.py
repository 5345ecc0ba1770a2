"""The calculator job of the demo and `examples/calculator.py`: its environment and its training tasks."""

from __future__ import annotations

import random
from typing import Iterator, Sequence

from textenv.environment import TextEnvironment
from textenv.tasks import calculator as task
from textenv.tools import Calculator
from textenv.options import EpisodeArguments, log_generation_path


def build_calculator_environment(model, tokenizer, settings: EpisodeArguments) -> TextEnvironment:
    """The calculator `TextEnvironment`: the 2-shot prompt, the `Calculator` tool and the exact-match
    reward, sampling at `settings.temperature` with `settings.max_new_tokens` per turn and `settings.max_turns`
    turns (in `settings.mixed_precision`).

    Raises:
        ValueError: ``max_turns`` 0, which means no limit for Gym episodes (their env ends them) but would play no
            turn here (legacy `TextEnvironment`'s meaning). With `settings.tool_format="json"` the same two examples are
    chat messages with JSON tool calls, and the reward wants a final reply `Result=N`."""
    if settings.max_turns == 0:
        raise ValueError("--max_turns 0 (no limit) is for Gym and verifiers episodes, which their env ends; the calculator task needs "
                         "a limit (its TextEnvironment would play no turn): give --max_turns N, e.g. 3.")
    json_calls = settings.tool_format == "json"
    env = TextEnvironment(
        model,
        tokenizer,
        {task.TOOL_NAME: Calculator()},
        task.json_exact_match_reward if json_calls else task.exact_match_reward,
        task.JSON_PROMPT if json_calls else task.PROMPT,
        max_turns=settings.max_turns,
        generation_kwargs=settings.generation_kwargs(),
        batch_size=settings.generation_batch_size,
        tool_format=settings.tool_format,
        tool_parser=settings.tool_parser,
        chat_template=settings.chat_template_text,
        **settings.engine_options(model),
    )
    log_generation_path(env)
    return env


def calculator_tasks(count: int, seed: int, settings: EpisodeArguments) -> tuple[list[str], list[float]]:
    """`count` seeded calculator tasks, formatted for `settings.tool_format` (bare questions for JSON)."""
    return task.generate_tasks(count, seed=seed, plain=settings.tool_format == "json")


def calculator_task_batches(
    batch_size: int, seed: int, exclude: Sequence[str] = (), plain: bool = False
) -> Iterator[tuple[list[str], list[float]]]:
    """An endless stream of `(queries, answers)` batches of random calculator tasks, never one of
    `exclude` (the held-out queries); bare questions with `plain` (JSON tool calls)."""
    held_out = set(exclude)
    rng = random.Random(seed)
    while True:
        queries, answers = [], []
        while len(queries) < batch_size:
            query, answer = task.random_task(rng, plain)
            if query not in held_out:
                queries.append(query)
                answers.append(answer)
        yield queries, answers
