"""The `grpo-vs-trl` workload of `run.py`: its options, its inputs, its runs (`grpo_side.py`, one fresh process
per side and run, the side that goes first alternating) and its report (a table of medians, textenv / TRL, and
the checks that both sides did the same thing)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import grpo_side
import grpo_task
import workload
from report import decoding_path, markdown_table, median, path_label, ratio

WORKLOAD = "grpo-vs-trl"
SIDES = ("trl", "textenv")
EVAL_ROWS = 32
HERE = Path(__file__).resolve().parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--grpo-*`` options."""
    defaults = grpo_side.DEFAULTS
    parser.add_argument("--grpo-steps", type=int, default=defaults["steps"], help=f"{WORKLOAD}: training steps per run (default: %(default)s)")
    parser.add_argument("--grpo-episodes", type=int, default=defaults["batch_size"], help=f"{WORKLOAD}: episodes per step (default: %(default)s)")
    parser.add_argument("--grpo-generations", type=int, default=defaults["num_generations"], help=f"{WORKLOAD}: episodes per group (default: %(default)s)")
    parser.add_argument("--grpo-mini-batch", type=int, default=defaults["mini_batch_size"],
                        help=f"{WORKLOAD}: rows per forward/backward, TRL's per_device_train_batch_size (default: %(default)s)")
    parser.add_argument("--grpo-eval-rows", type=int, default=EVAL_ROWS, help=f"{WORKLOAD}: held-out rows (default: %(default)s)")
    parser.add_argument("--grpo-sampled-eval", action="store_true", help=f"{WORKLOAD}: also evaluate sampled at temperature 1")


def settings(args: argparse.Namespace) -> dict:
    """The grpo-vs-trl settings of the command line (the rest are `grpo_side.DEFAULTS`)."""
    return {**grpo_side.DEFAULTS, "steps": args.grpo_steps, "batch_size": args.grpo_episodes, "num_generations": args.grpo_generations,
            "mini_batch_size": args.grpo_mini_batch, "sampled_eval": args.grpo_sampled_eval}


def write_inputs(folder: Path, settings: dict, eval_rows: int = EVAL_ROWS) -> Path:
    """The grpo-vs-trl inputs both sides read: the model folder, the settings, the training rows (exactly the
    steps' prompts, seed 0) and the held-out rows (seed 1, none among the training questions)."""
    from textenv.models import bundled_model_path

    grpo_side.settings_mapping(settings)  # a bad combination fails here, before any run
    prompts = settings["steps"] * settings["batch_size"] // settings["num_generations"]
    train_rows, held_out_rows = grpo_task.train_and_held_out_rows(prompts, eval_rows, seed=0)
    path = folder / f"{WORKLOAD}.json"
    path.write_text(json.dumps({"model_path": str(bundled_model_path()), "settings": settings, "train_rows": train_rows, "eval_rows": held_out_rows}))
    return path


def measure(repeats: int, threads: int, inputs: Path, run_side: Callable, rotated: Callable) -> dict:
    """TRL's GRPOTrainer and textenv's GRPO on the same inputs, `repeats` times each in fresh processes, the side
    that goes first alternating (`run_side` and `rotated`: run.py's)."""
    results: dict = {side: [] for side in SIDES}
    side_script = (sys.executable, HERE / "grpo_side.py")
    for repeat in range(repeats):
        for side in rotated(list(SIDES), repeat):
            print(f"[{WORKLOAD}] run {repeat + 1}/{repeats}: {side} ...", file=sys.stderr, flush=True)
            results[side].append(run_side(side_script, None, None, ["--side", side, "--inputs", str(inputs)], threads))
    content = workload.read_json(inputs)
    results.update(settings=content["settings"], eval_rows=len(content["eval_rows"]))
    return results


GRPO_SIDE_LABELS = {"trl": "TRL GRPOTrainer", "textenv": "textenv GRPO"}


def table(results: dict) -> str:
    """The grpo-vs-trl workload: one row per figure, a column per side (medians over the runs) and textenv / TRL."""
    trl, textenv, settings = results["trl"], results["textenv"], results["settings"]
    versions = trl[0].get("versions", {})
    title = (f"grpo-vs-trl ({settings['steps']} steps x {settings['batch_size']} episodes, groups of {settings['num_generations']}; "
             f"calculator tool task)")
    header = [title, f"TRL {versions.get('trl', '')} GRPOTrainer".replace("  ", " "), "textenv GRPO", "textenv / TRL"]

    def figure(label: str, value, ratio_of: bool = True, spec: str | None = None) -> list:
        a, b = median([value(run) for run in trl]), median([value(run) for run in textenv])
        cells = [a, b] if spec is None else [format(a, spec), format(b, spec)]
        return [label, *cells, f"{ratio(b, a):.2f}x" if ratio_of else ""]

    rows = [
        figure("wall s per step (median over the steps)", lambda run: run["step_seconds_median"]),
        figure("... of which playing the episodes (median)", lambda run: median([step["rollout_seconds"] for step in run["steps"]])),
        figure("wall s, all steps", lambda run: run["seconds"]),
        figure("CPU s, all steps", lambda run: run["seconds_cpu"]),
        figure("peak RSS MiB before training (model, held-out evaluation, trainer set up)", lambda run: run.get("peak_rss_before_training_mb", float("nan"))),
        figure("peak RSS MiB after training", lambda run: run["peak_rss_mb"]),
        figure("episodes trained", lambda run: run["episodes"]),
        figure("model tokens generated", lambda run: run["generated_tokens"]),
        figure("model turns per episode (mean)", lambda run: run.get("model_turns", float("nan")) / run["episodes"] if run["episodes"] else float("nan")),
        figure("generated tokens / wall s", lambda run: run["generated_tokens"] / run["seconds"] if run["seconds"] else float("nan")),
        ["mean reward, first -> last step", _reward_trend(trl), _reward_trend(textenv), ""],
    ]
    for mode, label in (("greedy", "greedy"), ("sampled", "sampled (temperature 1)")):
        if mode in trl[0]["before"]:
            rows.append([f"held-out {label} accuracy, before -> after ({len(trl[0]['before'][mode]['rewards'])} rows)",
                         _accuracy_change(trl, mode), _accuracy_change(textenv, mode), ""])
    rows.append(["training turns decoded by", path_label(trl), path_label(textenv), ""])
    return markdown_table(header, rows)


def _reward_trend(runs: list[dict]) -> str:
    first = median([run["steps"][0].get("reward_mean", float("nan")) for run in runs if run["steps"]])
    last = median([run["steps"][-1].get("reward_mean", float("nan")) for run in runs if run["steps"]])
    return f"{first:.2f} -> {last:.2f}"


def _accuracy_change(runs: list[dict], mode: str) -> str:
    """`before -> after` (medians), with every run's when there are several."""
    text = f"{median([run['before'][mode]['accuracy'] for run in runs]):.2f} -> {median([run['after'][mode]['accuracy'] for run in runs]):.2f}"
    if len(runs) > 1:
        text += " (runs: " + ", ".join(f"{run['before'][mode]['accuracy']:.2f} -> {run['after'][mode]['accuracy']:.2f}" for run in runs) + ")"
    return text


def lines(results: dict) -> list[str]:
    """What the grpo-vs-trl table leaves out: the checks that both sides did the same thing, what TRL needed to run
    the task, the decoding paths in full, every run's time per step, the versions."""
    trl, textenv = results["trl"], results["textenv"]
    same_prompt = trl[0].get("first_prompt_ids") == textenv[0].get("first_prompt_ids")
    same_before = trl[0]["before"]["greedy"]["rewards"] == textenv[0]["before"]["greedy"]["rewards"]
    step_ratio = ratio(median([run["step_seconds_median"] for run in trl]), median([run["step_seconds_median"] for run in textenv]))
    lines = [
        f"- grpo-vs-trl: a textenv step took {1 / step_ratio if step_ratio else float('nan'):.2f}x the time of a TRL step "
        f"(**{step_ratio:.2f}x** TRL's speed); per-run median s/step: TRL "
        + ", ".join(f"{run['step_seconds_median']:.3g}" for run in trl) + "; textenv " + ", ".join(f"{run['step_seconds_median']:.3g}" for run in textenv) + ".",
        f"- The first training prompt has the same token ids on both sides: {same_prompt} ({len(textenv[0].get('first_prompt_ids') or [])} tokens).",
        f"- Held-out greedy rewards before training are the same on both sides (same model, same measurement): {same_before}.",
    ]
    needed = trl[0].get("trl_needed") or []
    lines.append("- What TRL needed to run this task: " + ("; ".join(needed) if needed else "nothing beyond the settings") + ".")
    lines.append(f"- Training turns: TRL: {decoding_path(trl)}; textenv: {decoding_path(textenv)}. Held-out evaluation, both sides: "
                 f"{trl[0]['before']['greedy'].get('decoding_path', 'n/a')}.")
    lines.append(f"- Versions: {trl[0].get('versions')}.")
    return lines


def command_flags(results: dict) -> str:
    """The ``--grpo-*`` flags (those off their defaults) of a saved run's results."""
    saved, defaults = results.get("settings", {}), grpo_side.DEFAULTS
    flags = (
        ("--grpo-steps", saved.get("steps"), defaults["steps"]), ("--grpo-episodes", saved.get("batch_size"), defaults["batch_size"]),
        ("--grpo-generations", saved.get("num_generations"), defaults["num_generations"]),
        ("--grpo-mini-batch", saved.get("mini_batch_size"), defaults["mini_batch_size"]),
        ("--grpo-eval-rows", results.get("eval_rows"), EVAL_ROWS),
    )
    command = "".join(f" {flag} {value}" for flag, value, default in flags if value not in (None, default))
    return command + (" --grpo-sampled-eval" if saved.get("sampled_eval") else "")


def render(results: dict) -> list[str]:
    """The report's parts: the table, the check lines and the settings of both sides."""
    return [table(results), "", *lines(results), "", "Settings (the same on both sides; benchmarks/grpo_side.py):", "",
            markdown_table(["setting", "textenv", "TRL"], grpo_side.mapping_rows(results["settings"]))]
