"""The command-line options the tool-learning example scripts share (`examples/calculator.py`,
`examples/triviaqa.py`, `examples/python_interpreter.py`), read back as training `Settings`."""

from __future__ import annotations

import argparse

from textenv.logs import LOG_LEVELS
from textenv.training import Settings


def add_training_arguments(parser: argparse.ArgumentParser, defaults: Settings, mini_batch_size: int | None = None) -> None:
    """Add the options every tool-learning example shares (model, device, PPO sizes, LoRA, turns,
    logging) to an `argparse` parser; read them back with `settings_from_args`.

    Args:
        parser (`argparse.ArgumentParser`): the example's parser.
        defaults (`Settings`): the options' defaults.
        mini_batch_size (`int`, *optional*): the default of ``--mini-batch-size`` (`None`: the batch size).
    """
    parser.add_argument("--model", default=defaults.model, help="'bundled' (SmolLM2-135M-Instruct), 'tiny' (random, for smoke tests), or a folder / hub id (default: %(default)s)")
    parser.add_argument("--device", default=defaults.device, help="torch device, e.g. cpu or cuda (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch CPU threads, 0 = torch default (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--steps", type=int, default=defaults.steps, help="PPO steps (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size, help="episodes per PPO step (default: %(default)s)")
    mini_batch_help = "(default: %(default)s)" if mini_batch_size is not None else "(default: the batch size)"
    parser.add_argument("--mini-batch-size", type=int, default=mini_batch_size, help=f"episodes per mini-batch {mini_batch_help}")
    parser.add_argument("--ppo-epochs", type=int, default=defaults.ppo_epochs, help="(default: %(default)s, as in the legacy example)")
    parser.add_argument("--lr", type=float, default=defaults.learning_rate, help="learning rate (default: %(default)s)")
    parser.add_argument("--init-kl-coef", type=float, default=defaults.init_kl_coef, help="(default: %(default)s)")
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=defaults.lora, help="train LoRA adapters instead of all weights (default: %(default)s)")
    parser.add_argument("--lora-rank", type=int, default=defaults.lora_rank, help="(default: %(default)s)")
    parser.add_argument("--lora-layers", type=int, default=defaults.lora_layers, help="adapt only the top N layers, 0 = all (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, help="tokens per model turn (default: %(default)s)")
    parser.add_argument("--max-turns", type=int, default=defaults.max_turns, help="model turns per episode: tool call, then answer (default: %(default)s)")
    parser.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default="no", help="'bf16': PPO step and rollout in bf16 autocast, weights float32 (default: %(default)s)")
    parser.add_argument("--log-dir", default="runs", help="tensorboard logging_dir (default: %(default)s)")
    parser.add_argument("--save-dir", default=None, help="save the trained model (adapters + value head) here")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    parser.add_argument("--log-level", "--log_level", dest="log_level", choices=LOG_LEVELS, default="info", help="(default: %(default)s; other ranks: warning)")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The `Settings` of the options of `add_training_arguments`."""
    return Settings(
        model=args.model,
        device=args.device,
        threads=args.threads,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        mini_batch_size=args.mini_batch_size or args.batch_size,
        ppo_epochs=args.ppo_epochs,
        learning_rate=args.lr,
        init_kl_coef=args.init_kl_coef,
        lora=args.lora,
        lora_rank=args.lora_rank,
        lora_layers=args.lora_layers,
        max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        generation_batch_size=args.batch_size,
        mixed_precision=mixed_precision_setting(args.mixed_precision),
    )


def mixed_precision_setting(choice: str) -> str | None:
    """The ``mixed_precision`` setting of a ``--mixed-precision`` choice: ``None`` for ``"no"``."""
    return None if choice == "no" else choice
