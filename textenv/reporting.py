"""What the demo and the example scripts print after training: run summaries and peak memory."""

from __future__ import annotations

import logging
import os
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

from textenv.training import Evaluation, StepLog, algorithm_summary, log_before_after

logger = logging.getLogger(__name__)


def summarise(logs: Sequence[StepLog]) -> dict:
    """Mean reward over the first and the last tenth of the steps (at least one step each) and the final KL.

    Returns:
        `{"steps", "window", "first_reward", "last_reward", "final_kl"}`.
    """
    window = max(1, len(logs) // 10)
    rewards = [log.reward_mean for log in logs]
    return {
        "steps": len(logs),
        "window": window,
        "first_reward": sum(rewards[:window]) / window,
        "last_reward": sum(rewards[-window:]) / window,
        "final_kl": logs[-1].kl,
    }


def before_after_summary(
    logs: Sequence[StepLog],
    before: dict[str, Evaluation],
    after: dict[str, Evaluation],
    title: str,
    seconds: float,
    training_seconds: float,
    output_dir: str,
) -> dict:
    """An example's summary of a measure -> train -> measure run: `summarise`, the before -> after accuracies
    (logged as a table under `title`), `held_out_accuracy` (greedy, after training), `seconds`,
    `evaluation_seconds`, `training_seconds`, `peak_memory_mb` and `output_dir` (the run directory)."""
    summary = summarise(logs)
    summary.update(log_before_after(title, before, after))
    summary["held_out_accuracy"] = after["greedy"].accuracy
    summary["seconds"] = seconds
    summary["evaluation_seconds"] = sum(evaluation.seconds for evaluation in (*before.values(), *after.values()))
    summary["training_seconds"] = training_seconds
    summary["peak_memory_mb"] = peak_memory_mb()
    summary["output_dir"] = output_dir
    return summary


def print_summary(name: str, summary: dict, settings, save_dir: str | None, held_out: str, log_dir: str | Path) -> None:
    """Print an example run's summary (what the smoke tests check).

    Args:
        name (`str`): the example's name, shown in the header.
        summary (`dict`): from `summarise`, plus `seconds` and optionally `held_out_accuracy`.
        settings (`Settings`): the run's settings (batch size, model, LoRA, learning rate, held-out tasks).
        save_dir (`str`, *optional*): where the model was saved.
        held_out (`str`): what the held-out tasks are, e.g. `"held-out problems"`.
        log_dir (`str` or `Path`): where the tensorboard logs went.
    """
    logger.info(f"\n=== {name} PPO summary ===")
    logger.info(f"steps: {summary['steps']} x {settings.batch_size} episodes, model: {settings.model}, lora: {settings.lora}, lr: {settings.learning_rate}")
    logger.info(
        f"mean reward: first {summary['window']} step(s) {summary['first_reward']:.3f}, "
        f"last {summary['window']} step(s) {summary['last_reward']:.3f}; final KL {summary['final_kl']:.3f}"
    )
    if "held_out_accuracy" in summary:
        logger.info(f"held-out accuracy (greedy, {settings.eval_tasks} {held_out}): {summary['held_out_accuracy']:.1%}")
    logger.info(f"wall time: {summary['seconds']:.1f} s, peak memory: {peak_memory_mb():.0f} MiB")
    logger.info(f"tensorboard logs: {log_dir}" + (f"; model saved to {save_dir}" if save_dir else ""))


def report_run(title: str, before: dict[str, Evaluation], after: dict[str, Evaluation], logs: Sequence[StepLog], settings,
               run_dir: str, started: float, unit: str = "episodes") -> dict:
    """Log the end of a measure -> train -> measure script (the Gym and verifiers examples): the before ->
    after table under `title`, the training settings, wall time and peak memory, and the `textenv view` command.

    Args:
        started (`float`): `time.perf_counter()` at the script's start.
        unit (`str`): what an episode is called in the log (``"games"``, ``"episodes"``).

    Returns:
        The before/after figures of `log_before_after`, plus `train_rewards`, `seconds` and `output_dir`.
    """
    figures = log_before_after(title, before, after)
    seconds = time.perf_counter() - started
    logger.info(f"training: {len(logs)} {settings.algorithm.upper()} steps x {settings.batch_size} {unit}, lr {settings.learning_rate}, "
                f"LoRA r={settings.lora_rank} on the top {settings.lora_layers} layers, {algorithm_summary(settings)}")
    logger.info(f"wall time: {seconds / 60:.1f} min ({seconds:.0f} s), peak memory: {peak_memory_mb():.0f} MiB")
    logger.info(f"every episode, step by step: {view_command(run_dir)}")
    return {**figures, "train_rewards": [log.reward_mean for log in logs], "seconds": seconds, "output_dir": run_dir}


def peak_memory_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux `ru_maxrss` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def view_command(run_dir: str | Path) -> str:
    """The shell command that shows `run_dir` with `textenv view`, spelt so that it runs from the shell that
    started this process: `make demo` runs `.venv/bin/textenv` without activating `.venv`, so where `PATH`
    finds no `textenv` of this environment the command names the environment's own script."""
    script = Path(sys.executable).parent / "textenv"
    found = shutil.which("textenv")
    if script.exists() and (found is None or Path(found).resolve() != script.resolve()):
        relative = os.path.relpath(script)
        program = relative if not relative.startswith("..") else str(script)
    else:
        program = "textenv"
    return f"{program} view {run_dir}"
