"""Teach a language model to solve word problems with a Python interpreter and PPO (the legacy TRL
`python_interpreter.py` example, offline).

The script generates arithmetic word problems (apples in bags, a bakery, sharing marbles, a train, library
books, change from a note). From a 6-shot prompt the model learns to write a one-line program in the call,
`<request><PythonInterpreter>print(...)<call>`, read what it printed, and answer `Result = N <submit>`. The
code runs in the sandboxed `PythonInterpreter` (separate process, no network, resource limits). Episodes have
at most 2 model turns, as in the legacy example. The reward is 1 when N is within 0.1 of the answer and 0
otherwise. Each PPO step plays `--batch-size` episodes with TextEnvironment (sampling at temperature 1) and
optimises on them with `PPOTrainer.step`.

What changed from the legacy example, and why (see `textenv.tasks.word_problems`): its 1-shot prompt with a
six-line program left the bundled SmolLM2-135M-Instruct at 0% (it wrote long, broken programs), so PPO had
nothing to reinforce. Every problem is now solved by one line `print(expression)` of its numbers, the prompt
shows one such worked example for each of the six templates, the templates that needed a third operation or
a constant are gone or simpler, and the numbers are large enough (two-digit factors, four-digit differences)
that the model cannot do the arithmetic without the tool. Turns are short (`--max-new-tokens` 40).

Like the demo, the example

1. measures the accuracy on a fixed set of held-out problems (`--eval_tasks`, seeded by `--eval_seed`, never
   used for training), sampling at temperature 1 (the policy as it is trained) and greedy;
2. trains with PPO on fresh random problems (the defaults: the demo's `training.Settings`, LoRA on the bundled
   model, but 15 steps x 16 episodes);
3. measures again and prints the before -> after table, the wall time and the peak memory.

Every episode (training and held-out) and every step goes to the run directory (`--output_dir`, default
`outputs/python_interpreter`: episodes.jsonl, steps.jsonl; `textenv view outputs/python_interpreter` shows
them); a new run moves the previous run's files to `previous/<time>/` there. Statistics also go to
tensorboard (`tensorboard --logdir runs/python_interpreter`).

A smoke test runs in seconds with `--model tiny --ppo_steps 1 --batch-size 2 --eval-tasks 1`; for a
GPU-size run, e.g.:

    python examples/python_interpreter.py --device cuda --ppo_steps 200 --batch-size 32 --mini-batch-size 8 --threads 0
"""


import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from textenv import TextEnvironment, options, reporting, training
from textenv.logs import setup_logging
from textenv.tasks import word_problems as task
from textenv.tools import PythonInterpreter
from textenv.view import set_aside_previous_run

logger = logging.getLogger("textenv.examples.python_interpreter")  # printed by setup_logging (__main__ would not be)

# Changes to the demo's `training.Settings`: short turns (a one-line call, then the answer), two turns per
# episode as in the legacy example, 48 held-out problems and 15 PPO steps, so that the whole run (both
# evaluations, before and after) fits in 20 minutes on one CPU core (the 6-shot prompt makes a step about
# a minute there; 20 steps took 22 minutes).
DEFAULTS = dict(ppo_steps=15, max_new_tokens=40, max_turns=2, eval_tasks=48)


@dataclass
class InterpreterArguments:
    """What the word-problem example adds to the example options."""

    tool_timeout: float = field(default=5.0, metadata={"help": "seconds a program may run in the sandbox"})
    output_dir: str = field(
        default="outputs/python_interpreter",
        metadata={"help": "the run directory: episodes.jsonl and steps.jsonl (textenv view shows them)"},
    )


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, example options, interpreter options, command options)`; the defaults are the recipe that
    learns on a CPU with the bundled model (`DEFAULTS` on top of the demo's settings)."""
    classes = (training.Settings, options.ExampleArguments, InterpreterArguments, options.CommandArguments)
    parsed = options.parse_options(classes, argv, description=__doc__, defaults=DEFAULTS)
    if parsed[0].eval_tasks < 1:
        raise ValueError(f"--eval_tasks must be at least 1 (the example measures before and after training), got {parsed[0].eval_tasks}.")
    return parsed


def build_environment(model, tokenizer, settings: training.Settings, tool_timeout: float) -> TextEnvironment:
    """The word-problem TextEnvironment: the 6-shot prompt, the sandboxed `PythonInterpreter` (named by
    its class, as in the legacy example) and the answer-match reward, sampling at temperature 1."""
    return TextEnvironment(
        model,
        tokenizer,
        [PythonInterpreter(timeout=tool_timeout)],
        task.answer_match_reward,
        task.PROMPT,
        max_turns=settings.max_turns,
        generation_kwargs=settings.generation_kwargs(),
        batch_size=settings.generation_batch_size,
    )


def task_batches(batch_size: int, seed: int, exclude: set[str]) -> Iterator[tuple[list[str], list[float]]]:
    """An endless stream of `(queries, answers)` batches of random word problems, never one of `exclude`
    (the held-out problems)."""
    rng = random.Random(seed)
    while True:
        queries, answers = task.generate_tasks(batch_size, seed=rng.randrange(2**32))
        kept = [(query, answer) for query, answer in zip(queries, answers) if query not in exclude]
        if len(kept) == batch_size:
            yield [query for query, _ in kept], [answer for _, answer in kept]


def main(argv: list[str] | None = None) -> dict:
    """Measure on held-out problems, train, measure again and print a summary.

    Args:
        argv: command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The summary: `steps`, mean reward over the first and last steps, final KL, held-out accuracies (sampled
        and greedy, before and after; `held_out_accuracy` is the greedy one after training), seconds in all,
        in the evaluations and in training, peak memory and the run directory.
    """
    settings, args, interpreter, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)
    previous = set_aside_previous_run(interpreter.output_dir)
    if previous is not None:
        logger.info(f"the previous run's episodes and steps moved to {previous}")

    model, tokenizer = training.build_policy(settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings, args.log_dir, name="python_interpreter")
    env = build_environment(model, tokenizer, settings, interpreter.tool_timeout)
    eval_queries, eval_answers = task.generate_tasks(settings.eval_tasks, seed=settings.eval_seed)
    batches = task_batches(settings.batch_size, settings.seed, exclude=set(eval_queries))
    progress = not command.no_progress

    before = training.measure_environment(env, eval_queries, eval_answers, "before", interpreter.output_dir, progress=progress)
    training.show_episodes(before["sampled"], args.show, "held-out episodes before training (sampled)")
    training_started = time.perf_counter()
    episodes = training.TextEnvironmentSource(env, batches)
    logs = training.train(ppo_trainer, episodes, settings.ppo_steps, progress=progress, run_dir=interpreter.output_dir, max_staleness=settings.max_staleness)
    training_seconds = time.perf_counter() - training_started
    ppo_trainer.accelerator.end_training()
    if args.save_dir:
        ppo_trainer.save_pretrained(args.save_dir)
    after = training.measure_environment(env, eval_queries, eval_answers, "after", interpreter.output_dir, step=len(logs), progress=progress)
    training.show_episodes(after["sampled"], args.show, "the same held-out problems after training (sampled)")

    title = f"Word problems: held-out accuracy on {settings.eval_tasks} problems"
    summary = reporting.before_after_summary(logs, before, after, title, time.perf_counter() - started, training_seconds, interpreter.output_dir)
    reporting.print_summary("python_interpreter", summary, settings, args.save_dir, "held-out problems", Path(args.log_dir) / "python_interpreter")
    logger.info(f"of which held-out evaluations {summary['evaluation_seconds']:.0f} s, training {training_seconds:.0f} s; threads: {settings.threads}")
    logger.info(f"every episode, step by step: {reporting.view_command(interpreter.output_dir)}")
    return summary


if __name__ == "__main__":
    main()
