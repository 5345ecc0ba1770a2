"""`textenv rollout`: play Gym, MCP, verifiers or OpenEnv episodes with a model and append them to completions.jsonl (no training).

Options are the ones `textenv train` takes for its episodes (`EpisodeArguments`, `GymArguments`, TRL's
`ModelConfig` for the model, `CommandArguments`), plus `RolloutArguments`; ``--config run.yaml`` works here too.

    textenv rollout --model bundled --dataset examples/data/guess_number.jsonl --external_plugins examples/gym_plugin.py \\
        --gym_env guess_number --max_turns 4 --output completions.jsonl
    textenv rollout --model bundled --dataset examples/data/counter.jsonl --environment_factory examples/counter_env.py:CounterEnv
    PYTHONPATH=examples/verifiers textenv rollout --model bundled --task verifiers --env_id arithmetic --env_args '{"num_eval_examples": 8}'
    PYTHONPATH=examples/openenv textenv rollout --model bundled --task openenv --env_id guess_game:app --dataset examples/data/guess_number.jsonl \\
        --max_concurrency 4
    textenv rollout --model bundled --dataset examples/data/notes.jsonl --reward_funcs examples/mcp_servers/rewards.py:saved_the_note \\
        --mcp_server "python examples/mcp_servers/notes_server.py --notes {episode_dir}/notes.json"
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from textenv.logs import setup_logging
from textenv.options import CommandArguments, EpisodeArguments, GymArguments
from textenv.parsing import parse_options, settings_phase

logger = logging.getLogger(__name__)

TASKS = ("gym", "verifiers", "openenv")


@dataclass
class RolloutArguments:
    """What `textenv rollout` adds to the episode options."""

    output: str = field(default="completions.jsonl", metadata={"help": "the completions.jsonl to append the episodes to"})
    num_generations: int = field(default=1, metadata={"help": "episodes per dataset row"})
    seed: int = field(default=0, metadata={"help": "seed of torch (sampling) and of a tiny model's weights"})
    task: str = field(
        default="gym",
        metadata={"help": "gym (rows of --dataset played by --gym_env, --environment_factory or --mcp_server), verifiers (the verifiers "
                          "environment --env_id: its eval rows, or --dataset) or openenv (rows of --dataset played by the OpenEnv environment --env_id)"},
    )


def summarize(episodes) -> dict[str, Any]:
    """Episode count, mean reward, mean turns and errors of finished `GymEpisode`s."""
    count = len(episodes)
    return {
        "episodes": count,
        "mean_reward": sum(episode.total_reward for episode in episodes) / count if count else 0.0,
        "mean_turns": sum(episode.num_turns for episode in episodes) / count if count else 0.0,
        "errors": sum(1 for episode in episodes if episode.error),
    }


def parse(argv: Optional[Sequence[str]] = None) -> tuple:
    """The options of the command line (and its ``--config`` file), checked together; nothing is loaded.

    Returns:
        ``(episode, gym, rollout, model_config, command)``: `EpisodeArguments`, `GymArguments`, `RolloutArguments`,
        TRL's `ModelConfig`, `CommandArguments`.

    Raises:
        ValueError: an unknown option or task, no rows to play, or values that do not go together.
    """
    from trl import ModelConfig

    classes = (EpisodeArguments, GymArguments, RolloutArguments, ModelConfig, CommandArguments)
    episode, gym, rollout, model_config, command = parse_options(classes, argv, prog="textenv rollout", description=__doc__)
    if rollout.task not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {rollout.task!r}.")
    gym.check_task(rollout.task)
    if not gym.dataset and rollout.task == "openenv":
        raise ValueError("--task openenv needs --dataset (a .jsonl file of rows, a datasets folder or a hub dataset id): each row's "
                         "columns go to the environment's reset; give a file of {} lines for an environment that takes none.")
    if not gym.dataset and not gym.env_id:
        raise ValueError("no rows to play: give --dataset (a .jsonl file of rows, a datasets folder or a hub dataset id), "
                         "or --task verifiers --env_id ID.")
    if rollout.num_generations < 1:
        raise ValueError(f"--num_generations must be >= 1, got {rollout.num_generations}.")
    return episode, gym, rollout, model_config, command


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run `textenv rollout` and return its summary (episodes, mean reward, mean turns, errors, output)."""
    with settings_phase():
        episode, gym, rollout, model_config, command = parse(argv)
    try:
        return _rollout(episode, gym, rollout, model_config, command)
    finally:
        gym.close()  # the environment servers it keeps for the run (--task openenv)


def _rollout(episode, gym, rollout, model_config, command) -> dict[str, Any]:
    import torch

    from textenv.training.policy import load_policy

    with settings_phase():
        setup_logging(command.log_level)
        rows = gym.prepare(split="eval")
        torch.manual_seed(rollout.seed)
        model, tokenizer = load_policy(
            model_config.model_name_or_path or "bundled", device=episode.device, value_head=False, dtype=model_config.dtype, seed=rollout.seed
        )
        scheduler = gym.scheduler(model, tokenizer, episode)
    episodes = scheduler.run(rows, num_generations=rollout.num_generations, completions_path=rollout.output, progress=not command.no_progress)
    summary = {**summarize(episodes), "output": str(rollout.output)}
    logger.info(" ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}" for key, value in summary.items()))
    return summary
