"""The main job (`make demo`, `textenv demo`): train the calculator agent with PPO on a CPU.

The bundled SmolLM2-135M-Instruct, with LoRA adapters on its top layers, learns to answer `What is a op b?`
by calling the calculator tool (TextEnvironment + PPOTrainer.step, exact-match reward). The demo

1. measures held-out accuracy on a fixed set of 100 tasks (seeded, never used for training), both
   sampling at temperature 1 (the policy as it is trained) and greedy;
2. shows a few held-out episodes;
3. trains with PPO on fresh random tasks;
4. measures and shows again, prints a before/after table, the wall time and the peak memory, and saves
   the reward curve to `outputs/demo/reward_curve.png`.

Training runs a fixed number of steps, but stops early when the next step would not leave time for the final
evaluation within `--budget-minutes` (20 by default, 45 with `--tool-format json`, whose longer chat
prompts and JSON calls make every step and evaluation about twice as slow): on a busy machine the demo
trains less.

`--quick` (or `TEXTENV_SMALL=1`) runs a tiny version for smoke tests.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from textenv import training
from textenv.extras import require
from textenv.logs import LOG_LEVELS, setup_logging
from textenv.options import mixed_precision_setting
from textenv.reporting import peak_memory_mb

logger = logging.getLogger(__name__)

DEMO_SETTINGS = training.Settings()
QUICK_SETTINGS = replace(
    DEMO_SETTINGS,
    steps=2,
    batch_size=2,
    mini_batch_size=1,
    ppo_epochs=1,
    max_new_tokens=8,
    max_turns=2,
    eval_tasks=2,
)
SMALL_ENV_VAR = "TEXTENV_SMALL"
JSON_MAX_NEW_TOKENS = 48  # a JSON call of the calculator is about 34 tokens
DEFAULT_BUDGET_MINUTES = {"tags": 20.0, "json": 45.0}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="textenv demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"a tiny smoke-test run (also: {SMALL_ENV_VAR}=1)")
    parser.add_argument("--model", default="bundled", help="'bundled' (default), 'tiny' (random weights, for tests) or a folder / hub id")
    parser.add_argument("--output-dir", default="outputs/demo", help="where the reward curve goes (default: %(default)s)")
    parser.add_argument("--show", type=int, default=2, help="held-out episodes shown before and after training (default: %(default)s)")
    parser.add_argument(
        "--budget-minutes", type=float, default=None,
        help="stop training early so that the whole demo, final evaluation included, fits in this many minutes "
        f"(0 = no limit; default: {DEFAULT_BUDGET_MINUTES['tags']:g}, {DEFAULT_BUDGET_MINUTES['json']:g} with --tool-format json)",
    )
    parser.add_argument(
        "--mixed-precision", choices=["no", "bf16"], default="no",
        help="'bf16': rollouts and PPO steps in bf16 autocast, weights float32 (default: %(default)s)",
    )
    parser.add_argument(
        "--tool-format", choices=["tags", "json"], default="tags",
        help="'tags': the legacy <request><Calculator>...<call> syntax; 'json': the chat template's JSON tool calls "
        "(default: %(default)s)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--log-level", "--log_level", dest="log_level", choices=LOG_LEVELS, default="info", help="(default: %(default)s)")
    return parser


def demo_settings(args: argparse.Namespace) -> training.Settings:
    """The fixed demo settings, or the quick ones with `--quick` / `TEXTENV_SMALL=1`."""
    quick = args.quick or os.environ.get(SMALL_ENV_VAR, "") not in ("", "0")
    base = QUICK_SETTINGS if quick else DEMO_SETTINGS
    if args.tool_format == "json" and not quick:
        base = replace(base, max_new_tokens=JSON_MAX_NEW_TOKENS)
    return replace(base, model=args.model, mixed_precision=mixed_precision_setting(args.mixed_precision), tool_format=args.tool_format)


def measure(env, queries: list[str], answers: list[float], label: str, progress: bool = False) -> dict[str, training.Evaluation]:
    """Sampled and greedy held-out evaluations of the current policy (with a progress bar if asked)."""
    results = {}
    env.progress = progress
    for mode, sample in (("sampled", True), ("greedy", False)):
        results[mode] = training.evaluate(env, queries, answers, sample=sample)
        logger.info(f"[{label}] held-out accuracy ({mode}): {results[mode].accuracy:.1%} ({results[mode].seconds:.0f} s)")
    env.progress = False
    return results


def show_episodes(evaluation: training.Evaluation, count: int, title: str) -> None:
    """Print the first `count` episodes of an evaluation with `show_text`."""
    logger.info(f"\n--- {title} ---")
    for index, history in enumerate(evaluation.histories[:count]):
        history.show_text(show_legend=index == 0)
        logger.info("")


def print_summary(before: dict, after: dict, settings: training.Settings, steps_run: int, seconds: float, curve: Path) -> None:
    logger.info(f"\n=== Calculator agent: held-out accuracy on {settings.eval_tasks} tasks, before -> after PPO ===")
    for mode, name in (("sampled", "sampled (temperature 1)"), ("greedy", "greedy")):
        change = 100 * (after[mode].accuracy - before[mode].accuracy)
        logger.info(f"{name:<24} {before[mode].accuracy:6.1%} -> {after[mode].accuracy:6.1%}  ({change:+.1f} points)")
    logger.info(
        f"training: {steps_run} of {settings.steps} PPO steps x {settings.batch_size} episodes, lr {settings.learning_rate}, "
        f"LoRA r={settings.lora_rank} on the top {settings.lora_layers} layers, ppo_epochs {settings.ppo_epochs}, "
        f"init_kl_coef {settings.init_kl_coef}, {settings.mixed_precision or 'float32'}, tool calls as {settings.tool_format}"
    )
    logger.info(f"wall time: {seconds / 60:.1f} min ({seconds:.0f} s), peak memory: {peak_memory_mb():.0f} MiB")
    logger.info(f"reward curve: {curve}")


def main(argv: list[str] | None = None) -> dict:
    """Run the demo and return its figures (accuracies before/after, seconds, the curve's path)."""
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    settings = demo_settings(args)
    started = time.perf_counter()
    training.seed_everything(settings.seed, settings.threads)

    model, tokenizer = training.build_policy(settings)
    env = training.build_calculator_environment(model, tokenizer, settings)
    ppo_trainer = training.build_trainer(model, tokenizer, settings)
    eval_queries, eval_answers = training.calculator_tasks(settings.eval_tasks, settings.eval_seed, settings)
    task_batches = training.calculator_task_batches(settings.batch_size, settings.seed, eval_queries, plain=settings.tool_format == "json")

    before = measure(env, eval_queries, eval_answers, "before", progress=not args.no_progress)
    show_episodes(before["sampled"], args.show, "held-out episodes before training (sampled)")
    deadline = None
    budget_minutes = DEFAULT_BUDGET_MINUTES[args.tool_format] if args.budget_minutes is None else args.budget_minutes
    if budget_minutes > 0:  # leave the time the final evaluation will take (as long as the first one)
        evaluation_seconds = sum(evaluation.seconds for evaluation in before.values())
        deadline = started + 60 * budget_minutes - evaluation_seconds
    episodes = training.TextEnvironmentSource(env, task_batches)
    logs = training.train(ppo_trainer, episodes, settings.steps, deadline=deadline, progress=not args.no_progress)
    if len(logs) < settings.steps:
        logger.info(f"time budget reached: stopping after {len(logs)} of {settings.steps} steps")
    after = measure(env, eval_queries, eval_answers, "after", progress=not args.no_progress)
    show_episodes(after["sampled"], args.show, "the same held-out tasks after training (sampled)")

    curve = plot_reward_curve(
        logs,
        Path(args.output_dir) / "reward_curve.png",
        held_out={"held-out sampled, before": before["sampled"].accuracy, "held-out sampled, after": after["sampled"].accuracy},
    )
    seconds = time.perf_counter() - started
    print_summary(before, after, settings, len(logs), seconds, curve)
    return {
        "sampled_before": before["sampled"].accuracy,
        "sampled_after": after["sampled"].accuracy,
        "greedy_before": before["greedy"].accuracy,
        "greedy_after": after["greedy"].accuracy,
        "train_rewards": [log.reward_mean for log in logs],
        "seconds": seconds,
        "peak_memory_mb": peak_memory_mb(),
        "reward_curve": str(curve),
    }


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` values before it."""
    averages = []
    for index in range(len(values)):
        chunk = values[max(0, index - window + 1) : index + 1]
        averages.append(sum(chunk) / len(chunk))
    return averages


def plot_reward_curve(logs: Sequence[training.StepLog], path: str | Path, held_out: dict[str, float] | None = None) -> Path:
    """Save a PNG of the mean training reward per PPO step (and its moving average), with optional
    horizontal lines for held-out accuracies.

    Args:
        logs (`Sequence[StepLog]`): the training loop's logs.
        path (`str` or `Path`): the PNG to write (its folder is created).
        held_out (`dict[str, float]`, *optional*): `{label: accuracy}`, one dashed line each.

    Returns:
        The path of the PNG.
    """
    matplotlib = require("matplotlib", "the demo's reward curve")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [log.step + 1 for log in logs]
    rewards = [log.reward_mean for log in logs]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, rewards, marker="o", alpha=0.5, label="training reward (sampled)")
    axis.plot(steps, moving_average(rewards, 4), linewidth=2, label="moving average (4 steps)")
    for (label, accuracy), style in zip((held_out or {}).items(), ("--", ":", "-.", "--")):
        axis.axhline(accuracy, linestyle=style, color="grey", label=label)
    axis.set_xlabel("PPO step")
    axis.set_ylabel("mean reward (exact match)")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title("Calculator agent: reward during PPO")
    axis.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


if __name__ == "__main__":
    main()
