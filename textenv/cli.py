"""The `textenv` command.

Each subcommand is a module with a ``main(argv)``, named in one table, `SUBCOMMANDS`; its options are
dataclasses parsed by `textenv.options.parse_options` (TRL's `TrlParser`: ``--config run.yaml``, both
spellings of every option). ``textenv COMMAND --help`` lists a command's options.

    textenv demo    [--quick] [--budget_minutes M] [--tool_format json] [any Settings option]
    textenv train   --task calculator|gym [--dataset rows.jsonl] [--config run.yaml] [PPOConfig / ModelConfig options]
    textenv rollout --model M --dataset rows.jsonl --gym_env NAME --max_turns N --output completions.jsonl
    textenv serve   --model PATH|bundled --port PORT [--dtype auto]   (a vLLM server for --engine vllm)
    textenv view    PATH [--output page.html] [--serve]   (PATH: a run directory or a .jsonl file of episodes)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence


@dataclass
class Subcommand:
    """A `textenv` subcommand: the module whose ``main(argv)`` runs it, and its one-line help."""

    module: str
    help: str


SUBCOMMANDS: Dict[str, Subcommand] = {
    "demo": Subcommand("textenv.demo", "train the calculator agent on the bundled model and report held-out accuracy (the main job)"),
    "train": Subcommand("textenv.training.command", "PPO training of a TextEnvironment task or a Gym dataset: checkpoints, resume, trackers, hub"),
    "rollout": Subcommand("textenv.gym.command", "play Gym episodes with a model and append them to completions.jsonl"),
    "serve": Subcommand("textenv.vllm.server", "start a vLLM server for a model (from .venv-vllm, see `make vllm`) for --engine vllm"),
    "view": Subcommand("textenv.view.command", "one HTML page of a run: reward and tool-call curves, filterable episodes, their text and tokens"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: a subcommand and its arguments (parsed by the subcommand itself)."""
    parser = argparse.ArgumentParser(prog="textenv", description="Teach language models to use tools with RL.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help, add_help=False)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=f"options of textenv {name} (see textenv {name} --help)")
    return parser


def run_command(argv: Sequence[str]) -> Any:
    """Run ``textenv ARGV...`` and return what the subcommand returned (for Python callers and tests)."""
    argv = list(argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        build_parser().parse_args(argv)  # prints the help, or the error naming the commands, and exits
    return importlib.import_module(SUBCOMMANDS[argv[0]].module).main(argv[1:])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `textenv` console script; returns the exit status (0)."""
    run_command(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
