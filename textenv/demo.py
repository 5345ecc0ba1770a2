"""The main job (`make demo`, `textenv demo`): calculator episodes on the bundled model.

Runs a batch of calculator tasks through TextEnvironment with the bundled SmolLM2-135M-Instruct, shows
a few episodes with `show_text` and prints the accuracy.
"""

from __future__ import annotations

import argparse
import time

import torch

from textenv.environment import TextEnvironment
from textenv.models import load_bundled_model
from textenv.tasks import calculator as task
from textenv.tools import Calculator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=32, help="number of calculator tasks (default 32)")
    parser.add_argument("--show", type=int, default=3, help="episodes to print with show_text (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", action="store_true", help="sample at temperature 1 instead of greedy")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    torch.manual_seed(args.seed)
    model, tokenizer = load_bundled_model()
    generation_kwargs = {"max_new_tokens": 32, "do_sample": args.sample}
    if args.sample:
        generation_kwargs.update(top_k=0, top_p=1.0)
    env = TextEnvironment(
        model, tokenizer, {task.TOOL_NAME: Calculator()}, task.exact_match_reward, task.PROMPT,
        max_turns=4, generation_kwargs=generation_kwargs,
    )
    queries, answers = task.generate_tasks(args.tasks, seed=args.seed)
    started = time.perf_counter()
    *_, rewards, histories = env.run(queries, answers=answers)
    seconds = time.perf_counter() - started
    for history in histories[: args.show]:
        history.show_text(show_legend=history is histories[0])
        print()
    accuracy = sum(float(r) for r in rewards) / len(rewards)
    print(f"Accuracy: {accuracy:.1%} on {len(rewards)} calculator tasks ({seconds:.1f} s)")
    return {"accuracy": accuracy, "seconds": seconds}


if __name__ == "__main__":
    main()
