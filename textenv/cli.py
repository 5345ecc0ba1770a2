"""The `textenv` command.

Each subcommand is a module with ``parse(argv)`` (its options, checked together, nothing loaded) and ``main(argv)``
(the run), named in one table, `SUBCOMMANDS`; their options are dataclasses parsed by `textenv.parsing` (TRL's
`TrlParser`: ``--config run.yaml``, both spellings of every option). ``textenv COMMAND --help`` lists a command's
options. A settings error (a bad option or value, options that do not go together, a missing file, a model or
environment that cannot be loaded) ends the command with one line, ``textenv COMMAND: error: ...``, and status 2;
``--debug`` (anywhere on the line) or ``TEXTENV_DEBUG=1`` shows its traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from textenv.parsing import is_settings_error, one_line

DEBUG_FLAG = "--debug"
USAGE_ERROR = 2  # argparse's exit status for a usage error


@dataclass
class Subcommand:
    """A `textenv` subcommand: the module whose ``parse(argv)`` and ``main(argv)`` serve it, its one-line help and
    its synopses (the forms of its command line, for ``textenv --help``; capitals are placeholders)."""

    module: str
    help: str
    synopses: tuple[str, ...]


SUBCOMMANDS: Dict[str, Subcommand] = {
    "demo": Subcommand("textenv.demo", "train the calculator agent on the bundled model and report held-out accuracy (the main job)",
                       ("textenv demo [--algorithm ppo|grpo] [--tool_format tags|json] [--quick]",)),
    "train": Subcommand("textenv.training.command",
                        "train with PPO or GRPO on the calculator task, a Gym dataset, MCP tool servers, a verifiers or an OpenEnv "
                        "environment: checkpoints, resume, trackers, hub",
                        ("textenv train --task calculator [--algorithm ppo|grpo]",
                         "textenv train --task gym --dataset ROWS --gym_env NAME --external_plugins FILE [--algorithm ppo|grpo]",
                         "textenv train --task gym --dataset ROWS --environment_factory FILE:CLASS [--algorithm ppo|grpo]",
                         "textenv train --task gym --dataset ROWS --mcp_server COMMAND|URL --reward_funcs FILE:FUNC [--algorithm ppo|grpo]",
                         "textenv train --task verifiers --env_id ID [--algorithm ppo|grpo]",
                         "textenv train --task openenv --env_id ID --dataset ROWS [--algorithm ppo|grpo]")),
    "rollout": Subcommand("textenv.gym.command", "play Gym, MCP, verifiers or OpenEnv episodes with a model and append them to completions.jsonl",
                          ("textenv rollout --task gym --dataset ROWS --gym_env NAME --external_plugins FILE",
                           "textenv rollout --task gym --dataset ROWS --mcp_server COMMAND|URL --reward_funcs FILE:FUNC",
                           "textenv rollout --task verifiers --env_id ID",
                           "textenv rollout --task openenv --env_id ID --dataset ROWS")),
    "serve": Subcommand("textenv.vllm.server", "start a vLLM server for a model (from .venv-vllm, see `make vllm`) for --engine vllm",
                        ("textenv serve --model bundled --port PORT [--host 127.0.0.1]",)),
    "check-model": Subcommand("textenv.check_model", "say in seconds whether a model's tokenizer and chat template will work for tool calls "
                              "(family, append-only rendering, call format, stop token, thinking, turn budget)",
                              ("textenv check-model MODEL [--tools FILE:CLASS] [--chat_template FILE] [--tool_parser NAME]",)),
    "view": Subcommand("textenv.view.command", "one HTML page of a run: reward and tool-call curves, filterable episodes, their text and tokens",
                       ("textenv view PATH [--output page.html] [--serve]",)),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: a subcommand and its arguments (parsed by the subcommand itself)."""
    synopses = "\n".join(f"  {synopsis}" for command in SUBCOMMANDS.values() for synopsis in command.synopses)
    parser = argparse.ArgumentParser(
        prog="textenv", description="Teach language models to use tools with reinforcement learning (PPO or GRPO).",
        epilog=f"the commands' forms (each command's --help lists its options):\n{synopses}\n\n"
               f"{DEBUG_FLAG} anywhere on the line shows the traceback of a settings error.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help, add_help=False)
        sub.add_argument("args", nargs=argparse.REMAINDER, help=f"options of textenv {name} (see textenv {name} --help)")
    return parser


def command_module(name: str):
    """The module of subcommand `name`.

    Raises:
        ValueError: no such command (the message lists them).
    """
    if name not in SUBCOMMANDS:
        raise ValueError(f"no command {name!r}; choose one of {', '.join(SUBCOMMANDS)} (textenv --help).")
    return importlib.import_module(SUBCOMMANDS[name].module)


def run_command(argv: Sequence[str]) -> Any:
    """Run ``textenv ARGV...`` and return what the subcommand returned (for Python callers and tests); errors
    propagate as raised."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_parser().parse_args(argv)  # prints the help (or the missing command's error) and exits
    return command_module(argv[0]).main(argv[1:])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `textenv` console script; returns the exit status: 0, or 2 after a settings error said
    in one line (``--debug`` or ``TEXTENV_DEBUG=1``: raised with its traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get("TEXTENV_DEBUG", "") not in ("", "0")
    argv = [argument for argument in argv if argument != DEBUG_FLAG]
    try:
        run_command(argv)
    except Exception as error:
        unknown_command = bool(argv) and argv[0] not in SUBCOMMANDS and isinstance(error, ValueError)
        if debug or not (is_settings_error(error) or unknown_command):
            raise
        where = "textenv" if unknown_command else f"textenv {argv[0]}"
        sys.stderr.write(f"{where}: error: {one_line(error)}\n")
        return USAGE_ERROR
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
