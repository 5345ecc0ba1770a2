"""The `textenv` command.

Subcommands live in one table, `SUBCOMMANDS`: each entry names a function that adds its arguments and a
function that runs it. Add one with `@subcommand("name", help=...)` on a ``run(args)`` function whose
``add_arguments`` is given too, or with `delegate("name", "module")` for a module that has its own
``main(argv)`` (its arguments are passed through unchanged).

    textenv rollout   --model M --dataset rows.jsonl --gym_env NAME --max_turns N --output completions.jsonl
    textenv train-gym --model M --dataset rows.jsonl --gym_env NAME --steps S --output completions.jsonl
    textenv demo      [--quick] [--budget-minutes M] [--output-dir DIR] [--mixed-precision bf16]
    textenv train     --task calculator|gym [--dataset rows.jsonl] [--config run.yaml] [PPOConfig / ModelConfig options]
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

from textenv.logs import LOG_LEVELS, setup_logging

logger = logging.getLogger(__name__)


@dataclass
class Subcommand:
    """A `textenv` subcommand: `add_arguments(parser)` and `run(args) -> result`, or a delegated module."""

    help: str
    add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
    run: Optional[Callable[[argparse.Namespace], Any]] = None
    module: Optional[str] = None


SUBCOMMANDS: Dict[str, Subcommand] = {}


def subcommand(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Decorator registering ``run(args)`` as ``textenv NAME``."""

    def register(run: Callable[[argparse.Namespace], Any]):
        SUBCOMMANDS[name] = Subcommand(help=help, add_arguments=add_arguments, run=run)
        return run

    return register


def delegate(name: str, module: str, help: str) -> None:
    """Register ``textenv NAME ...`` as ``module.main([...])``."""
    SUBCOMMANDS[name] = Subcommand(help=help, module=module)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="textenv", description="Teach language models to use tools with RL.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=command.help, description=command.help)
        if command.add_arguments is not None:
            command.add_arguments(sub)
        else:
            sub.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of {command.module}")
    return parser


def run_command(argv: Sequence[str]) -> Any:
    """Run ``textenv ARGV...`` and return what the subcommand returned (for Python callers and tests)."""
    argv = list(argv)
    if argv and argv[0] in SUBCOMMANDS and SUBCOMMANDS[argv[0]].module is not None:
        return importlib.import_module(SUBCOMMANDS[argv[0]].module).main(argv[1:])
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return SUBCOMMANDS[args.command].run(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the `textenv` console script; returns the exit status (0)."""
    run_command(sys.argv[1:] if argv is None else argv)
    return 0


# ---------------------------------------------------------------------------------------------- gym
def add_gym_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by `rollout` and `train-gym` (ms-swift's names)."""
    parser.add_argument("--model", default="bundled", help="model folder or hub id; 'bundled' (default) for SmolLM2-135M-Instruct; 'tiny' for a random tiny model (tests)")
    parser.add_argument("--dataset", required=True, help="rows: a .jsonl file (each row may carry env_config / ctx_config)")
    parser.add_argument("--gym_env", default=None, help="env name for rows without env_config.name")
    parser.add_argument("--context_manager", default=None, help="context manager for rows without ctx_config.name (default dummyContextManager)")
    parser.add_argument("--max_turns", type=int, default=4, help="model turns per episode (0 = no limit; default 4)")
    parser.add_argument("--loss_scale", default="last_round", choices=["last_round", "default", "all"])
    parser.add_argument("--external_plugins", action="append", default=[], help="plugin .py file registering envs / context managers (repeatable)")
    parser.add_argument("--output", default="completions.jsonl", help="completions.jsonl to append to")
    parser.add_argument("--max_new_tokens", type=int, default=64, help="tokens per model turn")
    parser.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    parser.add_argument("--max_length", type=int, default=None, help="end an episode once its context has this many tokens")
    parser.add_argument("--batch_size", type=int, default=16, help="episodes generated together")
    parser.add_argument("--max_concurrency", type=int, default=64, help="episodes alive at once")
    parser.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="no", help="'bf16': decode (and train) in bf16 autocast, weights float32")
    parser.add_argument("--step_timeout", type=float, default=60.0, help="seconds an env reset/step/close may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    parser.add_argument("--log_level", "--log-level", dest="log_level", choices=LOG_LEVELS, default="info", help="(default: %(default)s; other ranks: warning)")
    parser.add_argument("--tool_parser", default=None, help="for envs with JSON tool calls: hermes, qwen, llama3 or mistral (default: the chat template's)")


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    add_gym_arguments(parser)
    parser.add_argument("--num_generations", type=int, default=1, help="episodes per row")


def add_train_gym_arguments(parser: argparse.ArgumentParser) -> None:
    add_gym_arguments(parser)
    parser.add_argument("--steps", type=int, default=10, help="PPO steps")
    parser.add_argument("--ppo_batch_size", type=int, default=8, help="episodes per PPO step")
    parser.add_argument("--mini_batch_size", type=int, default=None, help="default: ppo_batch_size")
    parser.add_argument("--ppo_epochs", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=1.41e-5)
    parser.add_argument("--init_kl_coef", type=float, default=0.2)
    parser.add_argument("--save_dir", default=None, help="save the trained model (and value head) here")


def _scheduler(args: argparse.Namespace, model, tokenizer):
    from textenv.gym import GymScheduler
    from textenv.options import mixed_precision_setting

    generation_kwargs: Dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.temperature is not None:
        generation_kwargs.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        generation_kwargs.update(do_sample=False)
    return GymScheduler(
        model,
        tokenizer,
        gym_env=args.gym_env,
        context_manager=args.context_manager,
        max_turns=args.max_turns,
        loss_scale=args.loss_scale,
        generation_kwargs=generation_kwargs,
        batch_size=args.batch_size,
        max_concurrency=args.max_concurrency,
        step_timeout=args.step_timeout,
        max_length=args.max_length,
        external_plugins=args.external_plugins,
        mixed_precision=mixed_precision_setting(args.mixed_precision),
        tool_parser=args.tool_parser,
    )


def _summary(episodes) -> Dict[str, Any]:
    count = len(episodes)
    return {
        "episodes": count,
        "mean_reward": sum(e.total_reward for e in episodes) / count if count else 0.0,
        "mean_turns": sum(e.num_turns for e in episodes) / count if count else 0.0,
        "errors": sum(1 for e in episodes if e.error),
    }


@subcommand("rollout", help="run gym episodes and append them to completions.jsonl", add_arguments=add_rollout_arguments)
def rollout(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    from textenv.gym import load_plugins, load_rows
    from textenv.training import load_policy

    load_plugins(args.external_plugins)
    rows = load_rows(args.dataset)
    torch.manual_seed(args.seed)
    model, tokenizer = load_policy(args.model, value_head=False, seed=args.seed)
    scheduler = _scheduler(args, model, tokenizer)
    episodes = scheduler.run(rows, num_generations=args.num_generations, completions_path=args.output, progress=not args.no_progress)
    summary = {**_summary(episodes), "output": str(args.output)}
    logger.info(" ".join(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}" for key, value in summary.items()))
    return summary


@subcommand("train-gym", help="PPO on gym episodes (rollout -> PPOTrainer.step), logging to completions.jsonl", add_arguments=add_train_gym_arguments)
def train_gym(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    from textenv.gym import GymSource, load_plugins, load_rows
    from textenv.options import mixed_precision_setting
    from textenv.training import Settings, StepLog, build_policy, build_trainer, train

    load_plugins(args.external_plugins)
    rows = load_rows(args.dataset)
    settings = Settings(
        model=args.model,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.ppo_batch_size,
        mini_batch_size=args.mini_batch_size or args.ppo_batch_size,
        ppo_epochs=args.ppo_epochs,
        learning_rate=args.learning_rate,
        init_kl_coef=args.init_kl_coef,
        lora=False,
        value_head_init_std=0.0,
        mixed_precision=mixed_precision_setting(args.mixed_precision),
    )
    torch.manual_seed(args.seed)
    model, tokenizer = build_policy(settings)
    trainer = build_trainer(model, tokenizer, settings, name="train-gym")
    episodes = GymSource(_scheduler(args, trainer.model, tokenizer), rows, settings.batch_size, completions_path=args.output)
    torch.manual_seed(args.seed)

    def report(log: StepLog) -> None:
        if not args.no_progress:
            logger.info(f"step {log.step}: reward_mean={log.reward_mean:.3f} kl={log.kl:.4f}")

    logs = train(trainer, episodes, settings.steps, on_step=report, progress=not args.no_progress)
    if args.save_dir:
        trainer.save_pretrained(args.save_dir)
    rewards = [log.reward_mean for log in logs]
    logger.info(f"steps={len(logs)} reward_means={[round(r, 3) for r in rewards]} output={args.output}")
    return {"steps": len(logs), "reward_means": rewards, "output": str(args.output)}


delegate("demo", "textenv.demo", help="train the calculator agent on the bundled model and report held-out accuracy (the main job)")
delegate("train", "textenv.training.command", help="PPO training of a TextEnvironment task or a Gym dataset, with TRL-style options and --config")


if __name__ == "__main__":  # pragma: no cover
    main()
