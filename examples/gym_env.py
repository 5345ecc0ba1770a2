"""Teach a language model a multi-turn game with PPO through the Gym interface: guess the number.

The env (`guess_number`, from the plugin file `examples/gym_plugin.py`, loaded with the same options as
the gym task of ``textenv train``) thinks of a number from 1 to 10 and answers every guess with "Higher." or
"Lower."; the model has `--max_turns` (4) guesses. The rewards come from the env's `step`: 1.0 for the hit,
0.2 for a miss the hints still allow. The bundled SmolLM2-135M-Instruct starts by chatting about the game
instead of guessing (it wins 7% of the games sampled, 0% greedy); PPO on every reply of 16 games per step
teaches it to answer with numbers the hints allow.

The example measures the games it wins on a fixed set of held-out games (seeded secrets; the same 1-10 range
as training) before and after training, sampled at temperature 1 and greedy, and writes its run directory
(`--output_dir`, default `outputs/gym_env`: episodes.jsonl, steps.jsonl, completions.jsonl; see it with
``textenv view outputs/gym_env``). A smoke test: ``--model tiny --ppo_steps 1 --batch_size 2 --eval_tasks 2``.
The same training from the command line, on rows like ``{"secret": 7}`` (``examples/data/guess_number.jsonl``):

    textenv train --task gym --dataset examples/data/guess_number.jsonl --external_plugins examples/gym_plugin.py \\
        --gym_env guess_number --max_turns 4 --max_new_tokens 8 --loss_scale default
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from textenv import options, training
from textenv.gym import GymSource, evaluate
from textenv.logs import setup_logging
from textenv.reporting import report_run
from textenv.view import set_aside_previous_run

PLUGIN = Path(__file__).with_name("gym_plugin.py")


@dataclass
class GameArguments:
    output_dir: str = field(default="outputs/gym_env", metadata={"help": "the run directory (textenv view shows it)"})
    low: int = field(default=1, metadata={"help": "smallest secret number"})
    high: int = field(default=10, metadata={"help": "largest secret number"})


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, gym options, game options, command options)`; the defaults are the CPU run whose figures the
    README shows (``--loss_scale default``: every reply is trained, not only the last as in ms-swift's default)."""
    defaults = dict(max_turns=4, max_new_tokens=8, eval_tasks=40, eval_seed=7,
                    gym_env="guess_number", external_plugins=[str(PLUGIN)], loss_scale="default")
    classes = (training.Settings, options.GymArguments, GameArguments, options.CommandArguments)
    return options.parse_options(classes, argv, description=__doc__, defaults=defaults)


def game_rows(count: int, seed: int, game: GameArguments) -> list[dict]:
    """`count` dataset rows: games with seeded secrets."""
    rng = random.Random(seed)
    return [{"secret": rng.randint(game.low, game.high), "low": game.low, "high": game.high} for _ in range(count)]


def main(argv: list[str] | None = None) -> dict:
    """Measure, train, measure again; returns the before/after figures, the rewards per step and the wall time."""
    settings, gym, game, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)
    set_aside_previous_run(game.output_dir)

    model, tokenizer = training.build_policy(settings)
    trainer = training.build_trainer(model, tokenizer, settings, name="gym_env")
    scheduler = gym.scheduler(trainer.model, tokenizer, settings)  # loads the plugin: registers "guess_number"
    held_out = game_rows(settings.eval_tasks, settings.eval_seed, game)
    evaluate_held_out = functools.partial(evaluate, scheduler, held_out)

    before = training.measure(evaluate_held_out, "before", game.output_dir, tokenizer)
    games = GymSource(scheduler, game_rows(settings.batch_size * settings.ppo_steps, settings.seed, game), settings.batch_size,
                      completions_path=Path(game.output_dir) / "completions.jsonl")
    logs = training.train(trainer, games, settings.ppo_steps, progress=not command.no_progress, run_dir=game.output_dir, max_staleness=settings.max_staleness)
    after = training.measure(evaluate_held_out, "after", game.output_dir, tokenizer, step=len(logs))

    return report_run(f"Guess the number: held-out games won of {len(held_out)}", before, after, logs, settings, game.output_dir,
                      started, unit="games")


if __name__ == "__main__":
    main()
