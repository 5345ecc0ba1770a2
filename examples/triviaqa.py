"""Teach a language model to look things up with PPO (the legacy TRL `triviaqa.py` example, offline).

The questions are about the towns of an invented country (`examples/data/fictional_towns.jsonl`, made by
`textenv.tasks.triviaqa.generate_towns`): who is a town's mayor, in which province it lies, when it was
founded. The model cannot know the answers: from a 3-shot prompt it learns to search for the question,
`<request><Wiki>question<call>`, read the sentence the `Wiki` tool (BM25 `WikiSearch` over the encyclopedia's
sentences) returns, and answer `Result=answer<submit>`. Tool responses are cut at 400 characters, as in the legacy example. The reward is 1
when the submitted answer is the fact asked for (case, punctuation and articles ignored) and 0 otherwise.

What changed from the legacy example, and why (see `textenv.tasks.triviaqa`): TriviaQA over Wikipedia needs
the internet and a larger model; 55 handwritten questions about a handwritten fictional wiki left the bundled
SmolLM2-135M-Instruct at 0-2%, with only 11 held-out questions. Generated one-fact sentences, a search that
returns the answering sentence and one example per kind of question make it learnable; the facts stay invented.

Like the demo, the example

1. measures the accuracy on a fixed set of held-out questions (`--eval_tasks`, seeded by `--eval_seed`) about
   the last 100 towns, which no training question asks about, sampling at temperature 1 and greedy;
2. trains with PPO on random questions about the other towns (the demo's `training.Settings`: LoRA on the
   bundled model, 20 steps x 16 episodes);
3. measures again and prints the before -> after table, the wall time and the peak memory.

Every episode and every step goes to the run directory (`--output_dir`, default `outputs/triviaqa`; `textenv
view outputs/triviaqa` shows them); a new run moves the previous run's files to `previous/<time>/` there.
Statistics also go to tensorboard (`tensorboard --logdir runs/triviaqa`). A smoke test runs in seconds with
`--model tiny --ppo_steps 1 --batch-size 2 --eval-tasks 1`; for a GPU-size run, e.g.:

    python examples/triviaqa.py --device cuda --ppo_steps 200 --batch_size 32 --mini_batch_size 8 --threads 0
"""


import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from textenv import TextEnvironment, options, reporting, training
from textenv.logs import setup_logging
from textenv.tasks import triviaqa as task
from textenv.view import set_aside_previous_run

logger = logging.getLogger("textenv.examples.triviaqa")  # printed by setup_logging (__main__ would not be)

DATA_DIR = Path(__file__).resolve().parent / "data"
MAX_TOOL_RESPONSE = 400  # characters, as in the legacy example
# Changes to the demo's `training.Settings`: a search, then the answer (two turns), and 60 held-out questions.
DEFAULTS = dict(max_new_tokens=32, max_turns=2, eval_tasks=60)


@dataclass
class TriviaArguments:
    """What the trivia example adds to the example options."""

    towns: Path = field(default=DATA_DIR / "fictional_towns.jsonl", metadata={"help": "the encyclopedia: one town per line (textenv.tasks.triviaqa.write_towns)"})
    output_dir: str = field(default="outputs/triviaqa", metadata={"help": "the run directory: episodes.jsonl and steps.jsonl (textenv view shows them)"})


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, example options, trivia options, command options)`; the defaults are the recipe that learns
    on a CPU with the bundled model (`DEFAULTS` on top of the demo's settings)."""
    classes = (training.Settings, options.ExampleArguments, TriviaArguments, options.CommandArguments)
    parsed = options.parse_options(classes, argv, description=__doc__, defaults=DEFAULTS)
    if parsed[0].eval_tasks < 1:
        raise ValueError(f"--eval_tasks must be at least 1 (the example measures before and after training), got {parsed[0].eval_tasks}.")
    return parsed


def build_environment(model, tokenizer, settings: training.Settings, towns: list[dict], towns_path: Path) -> TextEnvironment:
    """The trivia TextEnvironment: the 3-shot prompt, the `Wiki` tool over the encyclopedia and the
    answer-match reward, sampling at temperature 1."""
    wiki = task.build_search(towns_path)
    return TextEnvironment(
        model,
        tokenizer,
        {task.TOOL_NAME: wiki},
        task.answer_match_reward,
        task.build_prompt(towns, wiki),
        max_turns=settings.max_turns,
        max_tool_response=MAX_TOOL_RESPONSE,
        generation_kwargs=settings.generation_kwargs(),
        batch_size=settings.generation_batch_size,
    )


def task_batches(towns: list[dict], batch_size: int, seed: int) -> Iterator[tuple[list[str], list[list[str]]]]:
    """An endless stream of `(queries, accepted answers)` batches of random questions about `towns`."""
    rng = random.Random(seed)
    while True:
        yield task.generate_tasks(towns, batch_size, seed=rng.randrange(2**32))


def main(argv: list[str] | None = None) -> dict:
    """Measure on held-out questions, train, measure again and print a summary.

    Args:
        argv: command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The summary: `steps`, mean reward over the first and last steps, final KL, held-out accuracies (sampled
        and greedy, before and after; `held_out_accuracy` is the greedy one after training), seconds in all,
        in the evaluations and in training, peak memory and the run directory.
    """
    settings, args, trivia, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)
    previous = set_aside_previous_run(trivia.output_dir)
    if previous is not None:
        logger.info(f"the previous run's episodes and steps moved to {previous}")

    model, tokenizer = training.build_policy(settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings, args.log_dir, name="triviaqa")
    towns = task.load_towns(trivia.towns)
    env = build_environment(model, tokenizer, settings, towns, trivia.towns)
    training_towns, held_out_towns = task.split_towns(towns)
    eval_queries, eval_answers = task.generate_tasks(held_out_towns, settings.eval_tasks, seed=settings.eval_seed)
    progress = not command.no_progress

    before = training.measure_environment(env, eval_queries, eval_answers, "before", trivia.output_dir, progress=progress)
    training.show_episodes(before["sampled"], args.show, "held-out episodes before training (sampled)")
    training_started = time.perf_counter()
    episodes = training.TextEnvironmentSource(env, task_batches(training_towns, settings.batch_size, settings.seed))
    logs = training.train(ppo_trainer, episodes, settings.ppo_steps, progress=progress, run_dir=trivia.output_dir, max_staleness=settings.max_staleness)
    training_seconds = time.perf_counter() - training_started
    ppo_trainer.accelerator.end_training()
    if args.save_dir:
        ppo_trainer.save_pretrained(args.save_dir)
    after = training.measure_environment(env, eval_queries, eval_answers, "after", trivia.output_dir, step=len(logs), progress=progress)
    training.show_episodes(after["sampled"], args.show, "the same held-out questions after training (sampled)")

    title = f"Trivia: held-out accuracy on {settings.eval_tasks} questions"
    summary = reporting.before_after_summary(logs, before, after, title, time.perf_counter() - started, training_seconds, trivia.output_dir)
    reporting.print_summary("triviaqa", summary, settings, args.save_dir, "questions about held-out towns", Path(args.log_dir) / "triviaqa")
    logger.info(f"of which held-out evaluations {summary['evaluation_seconds']:.0f} s, training {training_seconds:.0f} s; threads: {settings.threads}")
    logger.info(f"every episode, step by step: {reporting.view_command(trivia.output_dir)}")
    return summary


if __name__ == "__main__":
    main()
