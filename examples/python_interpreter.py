"""Teach a language model to solve word problems with a Python interpreter and PPO (the legacy TRL
`python_interpreter.py` example, offline).

The script generates arithmetic word problems (apples and bags, a bakery, sharing marbles, a train,
savings, change from a note). From a 1-shot prompt the model learns to write a short program in the call,
`<request><PythonInterpreter>code<call>`, read what it printed, and answer `Result = N <submit>`. The code
runs in the sandboxed `PythonInterpreter` (separate process, no network, resource limits). Episodes have
at most 2 model turns, as in the legacy example. The reward is 1 when N is within 0.1 of the answer and 0
otherwise. Each PPO step plays `--batch-size` episodes with TextEnvironment (sampling at temperature 1)
and optimises on them with `PPOTrainer.step`.

The defaults are small enough for a CPU (the bundled SmolLM2-135M-Instruct with LoRA adapters); a smoke
test runs in seconds with `--model tiny --steps 1 --batch-size 2`; for a GPU-size run, e.g.:

    python examples/python_interpreter.py --device cuda --steps 200 --batch-size 32 --mini-batch-size 8 \\
        --max-new-tokens 192 --threads 0

Statistics go to tensorboard (`tensorboard --logdir runs/python_interpreter`).
"""


import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from textenv import TextEnvironment, options, reporting, training
from textenv.logs import setup_logging
from textenv.tasks import word_problems as task
from textenv.tools import PythonInterpreter

EVAL_SEED = 1234  # the held-out problems; training batches are drawn from other seeds


@dataclass
class InterpreterArguments:
    tool_timeout: float = field(default=5.0, metadata={"help": "seconds a program may run in the sandbox"})


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, example options, interpreter options, command options)`; the defaults make a CPU-sized
    run of the bundled model (``--eval_tasks``: held-out problems solved greedily after training, 0 = none)."""
    defaults = dict(ppo_steps=4, batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=80, max_turns=2, eval_tasks=8)
    classes = (training.Settings, options.ExampleArguments, InterpreterArguments, options.CommandArguments)
    return options.parse_options(classes, argv, description=__doc__, defaults=defaults)


def build_environment(model, tokenizer, settings: training.Settings, tool_timeout: float) -> TextEnvironment:
    """The word-problem TextEnvironment: the 1-shot prompt, the sandboxed `PythonInterpreter` (named by
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
    """Train, evaluate on held-out tasks and print a summary.

    Args:
        argv: command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The summary: `steps`, mean reward over the first and last steps, final KL, held-out accuracy (when
        evaluated) and wall time in seconds.
    """
    settings, args, interpreter, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)

    model, tokenizer = training.build_policy(settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings, args.log_dir, name="python_interpreter")
    env = build_environment(model, tokenizer, settings, interpreter.tool_timeout)
    eval_queries, eval_answers = task.generate_tasks(settings.eval_tasks, seed=EVAL_SEED)
    batches = task_batches(settings.batch_size, settings.seed, exclude=set(eval_queries))

    logs = training.train(ppo_trainer, training.TextEnvironmentSource(env, batches), settings.ppo_steps, progress=not command.no_progress)
    ppo_trainer.accelerator.end_training()
    if args.save_dir:
        ppo_trainer.save_pretrained(args.save_dir)

    summary = reporting.summarise(logs)
    if settings.eval_tasks > 0:
        evaluation = training.evaluate(env, eval_queries, eval_answers, sample=False)
        for history in evaluation.histories[: args.show]:
            history.show_text(show_legend=history is evaluation.histories[0])
        summary["held_out_accuracy"] = evaluation.accuracy
    summary["seconds"] = time.perf_counter() - started
    reporting.print_summary("python_interpreter", summary, settings, args.save_dir, "held-out problems", Path(args.log_dir) / "python_interpreter")
    return summary



if __name__ == "__main__":
    main()
