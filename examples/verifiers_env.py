"""Train a language model on a verifiers environment with GRPO: the environment runs unchanged, textenv plays it.

The default environment is `arithmetic` (``examples/verifiers/arithmetic.py``, a `vf.SingleTurnEnv` written as
verifiers documents them): one-digit additions and subtractions, and its rubric gives 1.0 when the reply ends
with the right number. verifiers' own code builds the prompts and scores the episodes; textenv generates the
turns on its engine, keeps their exact token ids and trains them with GRPO. (The environments of verifiers'
repository that run offline ask for an XML answer format or tool calls the bundled 135M model never produces
before training, so GRPO has no reward to learn from there; they are played in the tests.)

The example measures the tasks solved on the environment's held-out rows (`get_eval_dataset`) before and after
training, sampled at temperature 1 and greedy, and writes its run directory (``--output_dir``, default
``outputs/verifiers_env``; see it with ``textenv view outputs/verifiers_env``). Any installed verifiers
environment works: ``--env_id ID --env_args '{...}'`` (``--env_path`` puts a folder holding its module on the
import path). A smoke test: ``--model tiny --ppo_steps 1 --batch_size 4 --num_generations 2 --eval_tasks 2``. The same training
from the command line:

    PYTHONPATH=examples/verifiers textenv train --task verifiers --env_id arithmetic \\
        --env_args '{"num_train_examples": 1024}' --algorithm grpo --num_generations 8 --use_peft --lora_r 16 --lora_layers 8 \\
        --learning_rate 3e-4 --max_new_tokens 48 --ppo_steps 40
"""

from __future__ import annotations

import functools
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from textenv import options, training
from textenv.gym import GymSource, evaluate
from textenv.logs import setup_logging
from textenv.reporting import report_run
from textenv.view import set_aside_previous_run

ENVIRONMENTS = Path(__file__).resolve().parent / "verifiers"  # arithmetic.py: a verifiers environment


@dataclass
class VerifiersExampleArguments:
    output_dir: str = field(default="outputs/verifiers_env", metadata={"help": "the run directory (textenv view shows it)"})
    env_path: str = field(default=str(ENVIRONMENTS), metadata={"help": "a folder put first on the import path (holding the environment's module)"})


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, gym options, example options, command options)`; the defaults are the CPU run docs/guides/examples.md shows."""
    defaults = dict(env_id="arithmetic", env_args=json.dumps({"num_train_examples": 1024, "num_eval_examples": 64}),
                    algorithm="grpo", num_generations=8, batch_size=16, mini_batch_size=8, ppo_steps=40, learning_rate=3e-4,
                    max_new_tokens=48, eval_tasks=64, loss_scale="all")
    classes = (training.Settings, options.GymArguments, VerifiersExampleArguments, options.CommandArguments)
    return options.parse_options(classes, argv, description=__doc__, defaults=defaults)


def main(argv: list[str] | None = None) -> dict:
    """Measure, train, measure again; returns the before/after figures, the rewards per step and the wall time."""
    settings, gym, example, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    sys.path.insert(0, example.env_path)
    training.seed_everything(settings.seed, settings.threads)
    set_aside_previous_run(example.output_dir)

    model, tokenizer = training.build_policy(settings)
    trainer = training.build_trainer(model, tokenizer, settings, name="verifiers_env")
    scheduler = gym.scheduler(trainer.model, tokenizer, settings)
    held_out = gym.rows(split="eval")[: settings.eval_tasks]
    evaluate_held_out = functools.partial(evaluate, scheduler, held_out)

    before = training.measure(evaluate_held_out, "before", example.output_dir, tokenizer)
    tasks = GymSource(scheduler, gym.rows(), settings.batch_size, completions_path=Path(example.output_dir) / "completions.jsonl")
    logs = training.train(trainer, tasks, settings.ppo_steps, progress=not command.no_progress, run_dir=example.output_dir,
                          max_staleness=settings.max_staleness)
    after = training.measure(evaluate_held_out, "after", example.output_dir, tokenizer, step=len(logs))

    return report_run(f"{gym.env_id}: held-out tasks solved of {len(held_out)}", before, after, logs, settings, example.output_dir, started)


if __name__ == "__main__":
    main()
