"""The main job (`make demo`, `textenv demo`): train the calculator agent with PPO on a CPU.

The bundled SmolLM2-135M-Instruct, with LoRA adapters on its top layers, learns to answer `What is a op b?`
by calling the calculator tool (TextEnvironment + PPOTrainer.step, exact-match reward). The demo

1. measures held-out accuracy on a fixed set of 100 tasks (seeded, never used for training), both
   sampling at temperature 1 (the policy as it is trained) and greedy;
2. shows a few held-out episodes;
3. trains with PPO on fresh random tasks;
4. measures and shows again, prints a before/after table, the wall time and the peak memory, and saves
   the reward curve to `outputs/demo/reward_curve.png`.

Every episode (training and held-out, before and after) and every step goes to `outputs/demo/episodes.jsonl`
and `steps.jsonl` as the demo runs: `textenv view outputs/demo` shows them. A new demo run moves those two files of
the previous one to `outputs/demo/previous/<time>/` (the reward curve is drawn anew).

Training runs a fixed number of steps, but stops early when the next step would not leave time for the final
evaluation within `--budget_minutes` (20 by default, 45 with `--tool_format json`, whose longer chat
prompts and JSON calls make every step and evaluation about twice as slow): on a busy machine the demo
trains less.

`--quick` (or `TEXTENV_SMALL=1`) runs a tiny version for smoke tests. Every training setting is an option
(`textenv demo --help`), shared with the examples and, for how episodes are played, with `textenv train`
and `textenv rollout`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

from textenv import training
from textenv.extras import require
from textenv.logs import setup_logging
from textenv.options import CommandArguments
from textenv.parsing import parse_options, settings_phase
from textenv.reporting import peak_memory_mb, view_command
from textenv.view import set_aside_previous_run

logger = logging.getLogger(__name__)

DEMO_SETTINGS = training.Settings()
QUICK_SETTINGS = replace(
    DEMO_SETTINGS,
    ppo_steps=2,
    batch_size=2,
    mini_batch_size=1,
    ppo_epochs=1,
    max_new_tokens=8,
    max_turns=2,
    eval_tasks=2,
    num_generations=2,
)
SMALL_ENV_VAR = "TEXTENV_SMALL"
DEFAULT_BUDGET_MINUTES = {"tags": 20.0, "json": 45.0}


@dataclass
class DemoArguments:
    """What the demo adds to the training `Settings` (whose options it shares with the examples)."""

    quick: bool = field(default=False, metadata={"help": f"a tiny smoke-test run (also: {SMALL_ENV_VAR}=1); other options still apply"})
    output_dir: str = field(
        default="outputs/demo",
        metadata={"help": "the run directory: reward curve, episodes.jsonl and steps.jsonl (textenv view shows them)"},
    )
    show: int = field(default=2, metadata={"help": "held-out episodes shown before and after training"})
    budget_minutes: Optional[float] = field(
        default=None,
        metadata={
            "help": "stop training early so that the whole demo, final evaluation included, fits in this many minutes "
            f"(0: no limit; default {DEFAULT_BUDGET_MINUTES['tags']:g}, {DEFAULT_BUDGET_MINUTES['json']:g} with --tool_format json)"
        },
    )


def parse(argv: Sequence[str] | None = None) -> tuple[training.Settings, DemoArguments, CommandArguments]:
    """The demo's settings (the fixed demo ones, or the quick ones with ``--quick`` / `TEXTENV_SMALL=1`,
    with any option given on the command line or in ``--config`` on top) and its own options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = any(argument.split("=")[0] == "--quick" for argument in argv) or os.environ.get(SMALL_ENV_VAR, "") not in ("", "0")
    defaults = asdict(QUICK_SETTINGS if quick else DEMO_SETTINGS)
    if not quick:
        defaults.pop("max_new_tokens")  # its default depends on --tool_format
        defaults.pop("mini_batch_size")  # its default depends on --batch_size
    classes = (training.Settings, DemoArguments, CommandArguments)
    return parse_options(classes, argv, prog="textenv demo", description=__doc__, defaults=defaults)


def print_summary(before: dict, after: dict, settings: training.Settings, steps_run: int, seconds: float, curve: Path) -> None:
    training.log_before_after(f"Calculator agent: held-out accuracy on {settings.eval_tasks} tasks", before, after)
    logger.info(
        f"training: {steps_run} of {settings.ppo_steps} {settings.algorithm.upper()} steps x {settings.batch_size} episodes, "
        f"lr {settings.learning_rate}, LoRA r={settings.lora_rank} on the top {settings.lora_layers} layers, {training.algorithm_summary(settings)}, "
        f"{settings.mixed_precision or 'float32'}, tool calls as {settings.tool_format}"
    )
    logger.info(f"wall time: {seconds / 60:.1f} min ({seconds:.0f} s), peak memory: {peak_memory_mb():.0f} MiB")
    logger.info(f"reward curve: {curve}")
    logger.info(f"every episode, step by step: {view_command(curve.parent)} --output page.html")


def main(argv: Sequence[str] | None = None) -> dict:
    """Run the demo and return its figures (accuracies before/after, seconds, the curve's path)."""
    started = time.perf_counter()
    with settings_phase():
        settings, args, command = parse(argv)
        setup_logging(command.log_level)
        training.seed_everything(settings.seed, settings.threads)
        model, tokenizer = training.build_policy(settings)
        env = training.build_calculator_environment(model, tokenizer, settings)
        ppo_trainer = training.build_trainer(model, tokenizer, settings)
    previous = set_aside_previous_run(args.output_dir)
    if previous is not None:
        logger.info(f"the previous demo run's episodes and steps moved to {previous}")
    eval_queries, eval_answers = training.calculator_tasks(settings.eval_tasks, settings.eval_seed, settings)
    task_batches = training.calculator_task_batches(settings.batch_size, settings.seed, eval_queries, plain=settings.tool_format == "json")

    before = training.measure_environment(env, eval_queries, eval_answers, "before", args.output_dir, progress=not command.no_progress)
    training.show_episodes(before["sampled"], args.show, "held-out episodes before training (sampled)")
    deadline = None
    budget_minutes = DEFAULT_BUDGET_MINUTES[settings.tool_format] if args.budget_minutes is None else args.budget_minutes
    if budget_minutes > 0:  # leave the time the final evaluation will take (as long as the first one)
        evaluation_seconds = sum(evaluation.seconds for evaluation in before.values())
        deadline = started + 60 * budget_minutes - evaluation_seconds
    episodes = training.TextEnvironmentSource(env, task_batches)
    logs = training.train(
        ppo_trainer, episodes, settings.ppo_steps, deadline=deadline, progress=not command.no_progress, run_dir=args.output_dir,
        max_staleness=settings.max_staleness,
    )
    if len(logs) < settings.ppo_steps:
        logger.info(f"time budget reached: stopping after {len(logs)} of {settings.ppo_steps} steps")
    after = training.measure_environment(env, eval_queries, eval_answers, "after", args.output_dir, len(logs), progress=not command.no_progress)
    training.show_episodes(after["sampled"], args.show, "the same held-out tasks after training (sampled)")

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
    axis.set_xlabel("training step")
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
