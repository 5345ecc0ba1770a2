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
    parser.add_argument("--grpo-shots", type=int, default=defaults["shots"],
                        help=f"{WORKLOAD}: solved examples in every prompt, 0-4 (default: %(default)s, a 648-token prompt)")
    parser.add_argument("--grpo-lora-layers", type=int, default=defaults["lora_layers"],
                        help=f"{WORKLOAD}: LoRA on the top N layers (0: all) on both sides (default: full fine-tuning)")
    parser.add_argument("--grpo-lora-rank", type=int, default=defaults["lora_rank"], help=f"{WORKLOAD}: LoRA rank (default: %(default)s)")
    parser.add_argument("--grpo-learning-rate", type=float, default=defaults["learning_rate"], help=f"{WORKLOAD}: (default: %(default)s)")
    parser.add_argument("--grpo-sides", default=",".join(defaults["sides"]),
                        help=f"{WORKLOAD}: comma-separated sides of {', '.join(grpo_side.SIDE_NAMES)} (textenv-padded: "
                        "share_prompt_prefix=False) (default: %(default)s)")


def settings(args: argparse.Namespace) -> dict:
    """The grpo-vs-trl settings of the command line (the rest are `grpo_side.DEFAULTS`)."""
    return {**grpo_side.DEFAULTS, "steps": args.grpo_steps, "batch_size": args.grpo_episodes, "num_generations": args.grpo_generations,
            "mini_batch_size": args.grpo_mini_batch, "sampled_eval": args.grpo_sampled_eval, "shots": args.grpo_shots,
            "lora_layers": args.grpo_lora_layers, "lora_rank": args.grpo_lora_rank, "learning_rate": args.grpo_learning_rate,
            "sides": [side.strip() for side in args.grpo_sides.split(",") if side.strip()]}


def write_inputs(folder: Path, settings: dict, eval_rows: int = EVAL_ROWS) -> Path:
    """The grpo-vs-trl inputs both sides read: the model folder, the settings, the training rows (exactly the
    steps' prompts, seed 0) and the held-out rows (seed 1, none among the training questions)."""
    from textenv.models import bundled_model_path

    grpo_side.settings_mapping(settings)  # a bad combination fails here, before any run
    prompts = settings["steps"] * settings["batch_size"] // settings["num_generations"]
    train_rows, held_out_rows = grpo_task.train_and_held_out_rows(prompts, eval_rows, seed=0, shots=settings["shots"])
    path = folder / f"{WORKLOAD}.json"
    path.write_text(json.dumps({"model_path": str(bundled_model_path()), "settings": settings, "train_rows": train_rows, "eval_rows": held_out_rows}))
    return path


def measure(repeats: int, threads: int, inputs: Path, run_side: Callable, rotated: Callable) -> dict:
    """TRL's GRPOTrainer and textenv's GRPO on the same inputs, `repeats` times each in fresh processes, the side
    that goes first alternating (`run_side` and `rotated`: run.py's)."""
    sides = workload.read_json(inputs)["settings"]["sides"]
    results: dict = {side: [] for side in sides}
    side_script = (sys.executable, HERE / "grpo_side.py")
    for repeat in range(repeats):
        for side in rotated(list(sides), repeat):
            print(f"[{WORKLOAD}] run {repeat + 1}/{repeats}: {side} ...", file=sys.stderr, flush=True)
            results[side].append(run_side(side_script, None, None, ["--side", side, "--inputs", str(inputs)], threads))
    content = workload.read_json(inputs)
    results.update(settings=content["settings"], eval_rows=len(content["eval_rows"]))
    return results


RATIOS = (("textenv", "trl", "textenv / TRL"), ("textenv", "textenv-padded", "textenv packed / padded"))


def sides_of(results: dict) -> list[str]:
    """The sides a saved result holds, in `grpo_side.SIDE_NAMES` order."""
    return [side for side in grpo_side.SIDE_NAMES if side in results]


def _side_label(side: str, results: dict) -> str:
    if side == "trl":
        return f"TRL {results['trl'][0].get('versions', {}).get('trl', '')} GRPOTrainer".replace("  ", " ")
    return "textenv GRPO" if side == "textenv" else "textenv GRPO, padded (share_prompt_prefix=False)"


def table(results: dict) -> str:
    """The grpo-vs-trl workload: one row per figure, a column per side (medians over the runs) and the ratios of
    textenv to TRL and of packed to padded textenv (where both sides ran)."""
    settings, sides = results["settings"], sides_of(results)
    ratios = [(a, b, label) for a, b, label in RATIOS if a in results and b in results]
    title = (f"grpo-vs-trl ({settings['steps']} steps x {settings['batch_size']} episodes, groups of {settings['num_generations']}; "
             f"calculator tool task, {settings.get('shots', grpo_side.DEFAULTS['shots'])} shots; {grpo_side.trained_weights(settings)})")
    header = [title, *(_side_label(side, results) for side in sides), *(label for *_, label in ratios)]

    def figure(label: str, value, ratio_of: bool = True) -> list:
        medians = {side: median([value(run) for run in results[side]]) for side in sides}
        return [label, *medians.values(), *(f"{ratio(medians[a], medians[b]):.2f}x" if ratio_of else "" for a, b, _ in ratios)]

    def text(label: str, describe) -> list:
        return [label, *(describe(results[side]) for side in sides), *("" for _ in ratios)]

    rows = [
        figure("wall s per step (median over the steps)", lambda run: run["step_seconds_median"]),
        figure("... of which playing the episodes (median)", lambda run: median([step["rollout_seconds"] for step in run["steps"]])),
        figure("... the rest: training (median)", lambda run: median([step["seconds"] - step["rollout_seconds"] for step in run["steps"]])),
        figure("wall s, all steps", lambda run: run["seconds"]),
        figure("CPU s, all steps", lambda run: run["seconds_cpu"]),
        figure("peak RSS MiB before training (model, held-out evaluation, trainer set up)", lambda run: run.get("peak_rss_before_training_mb", float("nan"))),
        figure("peak RSS MiB after training", lambda run: run["peak_rss_mb"]),
        figure("episodes trained", lambda run: run["episodes"]),
        figure("model tokens generated", lambda run: run["generated_tokens"]),
        figure("model turns per episode (mean)", lambda run: run.get("model_turns", float("nan")) / run["episodes"] if run["episodes"] else float("nan")),
        figure("generated tokens / wall s", lambda run: run["generated_tokens"] / run["seconds"] if run["seconds"] else float("nan")),
        text("mean reward, first -> last step", _reward_trend),
    ]
    first = results[sides[0]][0]
    for mode, label in (("greedy", "greedy"), ("sampled", "sampled (temperature 1)")):
        if mode in first["before"]:
            rows.append(text(f"held-out {label} accuracy, before -> after ({len(first['before'][mode]['rewards'])} rows)",
                             lambda runs, mode=mode: _accuracy_change(runs, mode)))
    rows.append(text("training turns decoded by", lambda runs: path_label(runs)))
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
    """What the grpo-vs-trl table leaves out: the speed ratios with every run's time per step, the checks that the
    sides did the same thing, what TRL needed to run the task, the decoding paths in full, the versions."""
    sides = sides_of(results)
    first = {side: results[side][0] for side in sides}
    lines = []
    for a, b, label in RATIOS:
        if a in results and b in results:
            speed = ratio(median([run["step_seconds_median"] for run in results[b]]), median([run["step_seconds_median"] for run in results[a]]))
            lines.append(f"- {label}: a {a} step took {1 / speed if speed else float('nan'):.2f}x the time of a {b} step "
                         f"(**{speed:.2f}x** the speed); per-run median s/step: "
                         + "; ".join(f"{side} " + ", ".join(f"{run['step_seconds_median']:.3g}" for run in results[side]) for side in (b, a)) + ".")
    prompts = {side: run.get("first_prompt_ids") for side, run in first.items()}
    lines.append(f"- The first training prompt has the same token ids on every side: {len({str(ids) for ids in prompts.values()}) == 1} "
                 f"({len(prompts[sides[0]] or [])} tokens).")
    before = {str(run["before"]["greedy"]["rewards"]) for run in first.values()}
    lines.append(f"- Held-out greedy rewards before training are the same on every side (same model, same measurement): {len(before) == 1}.")
    if "textenv" in first:
        lines.append(f"- textenv's mini-batches ran packed (shared prefixes once): {first['textenv'].get('packed')}.")
    if "trl" in first:
        needed = first["trl"].get("trl_needed") or []
        lines.append("- What TRL needed to run this task: " + ("; ".join(needed) if needed else "nothing beyond the settings") + ".")
    lines.append("- Training turns: " + "; ".join(f"{side}: {decoding_path(results[side])}" for side in sides) + ". Held-out evaluation, "
                 f"every side: {first[sides[0]]['before']['greedy'].get('decoding_path', 'n/a')}.")
    lines.append(f"- Versions: {first[sides[0]].get('versions')}" + (f"; TRL's side: {first['trl'].get('versions')}" if "trl" in first else "") + ".")
    return lines


def command_flags(results: dict) -> str:
    """The ``--grpo-*`` flags (those off their defaults) of a saved run's results."""
    saved, defaults = results.get("settings", {}), grpo_side.DEFAULTS
    flags = (
        ("--grpo-steps", saved.get("steps"), defaults["steps"]), ("--grpo-episodes", saved.get("batch_size"), defaults["batch_size"]),
        ("--grpo-generations", saved.get("num_generations"), defaults["num_generations"]),
        ("--grpo-mini-batch", saved.get("mini_batch_size"), defaults["mini_batch_size"]),
        ("--grpo-eval-rows", results.get("eval_rows"), EVAL_ROWS), ("--grpo-shots", saved.get("shots"), defaults["shots"]),
        ("--grpo-lora-layers", saved.get("lora_layers"), defaults["lora_layers"]),
        ("--grpo-lora-rank", saved.get("lora_rank"), defaults["lora_rank"]),
        ("--grpo-learning-rate", saved.get("learning_rate"), defaults["learning_rate"]),
        ("--grpo-sides", ",".join(saved.get("sides") or defaults["sides"]), ",".join(defaults["sides"])),
    )
    command = "".join(f" {flag} {value}" for flag, value, default in flags if value not in (None, default))
    return command + (" --grpo-sampled-eval" if saved.get("sampled_eval") else "")


def render(results: dict) -> list[str]:
    """The report's parts: the table, the check lines and the settings of both sides."""
    return [table(results), "", *lines(results), "", "Settings (the same on both sides; benchmarks/grpo_side.py):", "",
            markdown_table(["setting", "textenv", "TRL"], grpo_side.mapping_rows(results["settings"]))]
