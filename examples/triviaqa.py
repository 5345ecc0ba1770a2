"""Teach a language model to look things up with PPO (the legacy TRL `triviaqa.py` example, offline).

The questions are about a fictional world (`examples/data/fictional_wiki.jsonl`: invented people, places
and facts), so the model cannot know the answers: it has to search. From a 2-shot prompt it learns to
call `<request><Wiki>search words<call>`, read the passage the `Wiki` tool (BM25 `WikiSearch` over the
corpus) returns, and answer `Result=answer<submit>`. Tool responses are cut at 400 characters, as in the
legacy example. The reward is 1 when the submitted answer contains an accepted answer after
normalisation (case, punctuation and articles ignored) and 0 otherwise. Each PPO step plays
`--batch_size` episodes with TextEnvironment (sampling at temperature 1) and optimises on them with
`PPOTrainer.step`.

The defaults are small enough for a CPU (the bundled SmolLM2-135M-Instruct with LoRA adapters); a smoke
test runs in seconds with `--model tiny --steps 1 --batch_size 2`; for a GPU-size run, e.g.:

    python examples/triviaqa.py --device cuda --steps 200 --batch_size 32 --mini_batch_size 8 \\
        --max_new_tokens 64 --threads 0

Statistics go to tensorboard (`tensorboard --logdir runs/triviaqa`).
"""


import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from textenv import TextEnvironment, options, reporting, training
from textenv.logs import setup_logging
from textenv.tasks import triviaqa as task
from textenv.tools import WikiSearch

DATA_DIR = Path(__file__).resolve().parent / "data"
MAX_TOOL_RESPONSE = 400  # characters, as in the legacy example


@dataclass
class TriviaArguments:
    corpus: Path = field(default=DATA_DIR / "fictional_wiki.jsonl", metadata={"help": "documents to search, one {title, text} per line"})
    questions: Path = field(default=DATA_DIR / "fictional_wiki_questions.jsonl", metadata={"help": "one {question, answers, title} per line"})


def parse(argv: list[str] | None = None) -> tuple:
    """`(settings, example options, trivia options, command options)`; the defaults make a CPU-sized run of
    the bundled model (``--eval_tasks``: held-out questions answered greedily after training, 0 = none)."""
    defaults = dict(ppo_steps=4, batch_size=4, mini_batch_size=4, ppo_epochs=1, max_new_tokens=32, max_turns=2, eval_tasks=8)
    classes = (training.Settings, options.ExampleArguments, TriviaArguments, options.CommandArguments)
    return options.parse_options(classes, argv, description=__doc__, defaults=defaults)


def build_environment(model, tokenizer, settings: training.Settings, corpus: Path) -> TextEnvironment:
    """The trivia TextEnvironment: the 2-shot prompt, the `Wiki` tool over `corpus` and the
    normalised-answer reward, sampling at temperature 1."""
    return TextEnvironment(
        model,
        tokenizer,
        {task.TOOL_NAME: WikiSearch(corpus)},
        task.answer_match_reward,
        task.PROMPT,
        max_turns=settings.max_turns,
        max_tool_reponse=MAX_TOOL_RESPONSE,
        generation_kwargs=settings.generation_kwargs(),
        batch_size=settings.generation_batch_size,
    )



def task_batches(questions: list[dict], batch_size: int, seed: int) -> Iterator[tuple[list[str], list[list[str]]]]:
    """An endless stream of `(queries, accepted answers)` batches of random questions."""
    rng = random.Random(seed)
    while True:
        yield task.generate_tasks(questions, batch_size, seed=rng.randrange(2**32))


def evaluate_held_out(env: TextEnvironment, held_out: list[dict], count: int, seed: int) -> training.Evaluation:
    """Greedy accuracy on the first `count` held-out questions, which never appear in training: only
    searching can answer them."""
    records = random.Random(seed).sample(held_out, min(count, len(held_out)))
    queries = [task.format_query(record["question"]) for record in records]
    return training.evaluate(env, queries, [record["answers"] for record in records], sample=False)


def main(argv: list[str] | None = None) -> dict:
    """Train, evaluate on held-out tasks and print a summary.

    Args:
        argv: command-line arguments (default: `sys.argv[1:]`).

    Returns:
        The summary: `steps`, mean reward over the first and last steps, final KL, held-out accuracy (when
        evaluated) and wall time in seconds.
    """
    settings, args, trivia, command = parse(argv)
    setup_logging(command.log_level)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)

    model, tokenizer = training.build_policy(settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings, args.log_dir, name="triviaqa")
    env = build_environment(model, tokenizer, settings, trivia.corpus)
    train_questions, held_out = task.split_questions(task.load_questions(trivia.questions))
    batches = task_batches(train_questions, settings.batch_size, settings.seed)

    logs = training.train(ppo_trainer, training.TextEnvironmentSource(env, batches), settings.ppo_steps, progress=not command.no_progress)
    ppo_trainer.accelerator.end_training()
    if args.save_dir:
        ppo_trainer.save_pretrained(args.save_dir)

    summary = reporting.summarise(logs)
    if settings.eval_tasks > 0:
        evaluation = evaluate_held_out(env, held_out, settings.eval_tasks, settings.seed)
        for history in evaluation.histories[: args.show]:
            history.show_text(show_legend=history is evaluation.histories[0])
        summary["held_out_accuracy"] = evaluation.accuracy
    summary["seconds"] = time.perf_counter() - started
    reporting.print_summary("triviaqa", summary, settings, args.save_dir, "questions never trained on", Path(args.log_dir) / "triviaqa")
    return summary



if __name__ == "__main__":
    main()
