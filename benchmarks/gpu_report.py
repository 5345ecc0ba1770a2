"""The Markdown of `gpu_check.py` (`gpu-check.md`) and the issue's two goals, checked from its results: tables of the
environment, the CUDA tests, the generation paths per shape with their speed-ups, the training steps per shape with
time and peak memory, then the goals (PASS / FAIL / not measured)."""

from __future__ import annotations

from typing import Any

GOAL_SHAPE = "qwen3-0.6b"
GENERATION_GOAL = f"in-process generation >= 3x the per-turn generate loop ({GOAL_SHAPE})"
GRPO_GOAL = f"GRPO step at least as fast as TRL's ({GOAL_SHAPE}, full fine-tuning)"
GENERATION_SPEEDUP = 3.0
IN_PROCESS = ("engine=textenv", "engine=transformers")  # GymScheduler's in-process engines (vLLM has its own goal)


def goals(data: dict) -> dict[str, str]:
    """The goals on the `GOAL_SHAPE` rows: PASS or FAIL with the figures, or "not measured" and why (a CPU run's
    figures are shown but never judged)."""
    settings = data["settings"]
    judged = settings["device"] == "cuda" and not settings["tiny"]
    results = {}
    paths = {row["name"]: row for row in data.get("generation", {}).get(GOAL_SHAPE, [])}
    timed = {label: paths[label] for label in IN_PROCESS if paths.get(label, {}).get("speedup") is not None}
    if timed:
        best = max(timed, key=lambda label: timed[label]["speedup"])
        figures = ", ".join(f"{label} {row['speedup']:.2f}x" for label, row in timed.items())
        verdict = "PASS" if timed[best]["speedup"] >= GENERATION_SPEEDUP else "FAIL"
        results[GENERATION_GOAL] = f"{verdict}: best {best} ({figures})"
    else:
        results[GENERATION_GOAL] = "not measured: " + _why(paths, ("generate loop", *IN_PROCESS))
    steps = {row["name"]: row for row in data.get("training", {}).get(GOAL_SHAPE, [])}
    ours, theirs = steps.get("grpo full", {}), steps.get("trl-grpo full", {})
    if "seconds" in ours and "seconds" in theirs:
        verdict = "PASS" if ours["seconds"] <= theirs["seconds"] else "FAIL"
        results[GRPO_GOAL] = (f"{verdict}: {ours['seconds']:.3g} s against TRL's {theirs['seconds']:.3g} s a step "
                              f"({theirs['seconds'] / ours['seconds']:.2f}x TRL's speed){_lora_figures(steps)}")
    else:
        results[GRPO_GOAL] = "not measured: " + _why(steps, ("grpo full", "trl-grpo full"))
    if not judged:
        reason = "not a GPU run" if settings["device"] != "cuda" else "tiny shapes"
        results = {goal: f"not measured: {reason}" + ("" if text.startswith("not measured") else f" ({text.split(': ', 1)[1]})")
                   for goal, text in results.items()}
    return results


def _lora_figures(steps: dict) -> str:
    ours, theirs = steps.get("grpo lora", {}), steps.get("trl-grpo lora", {})
    if "seconds" in ours and "seconds" in theirs:
        return f"; LoRA: {ours['seconds']:.3g} s against {theirs['seconds']:.3g} s"
    return ""


def _why(rows: dict, labels: tuple[str, ...]) -> str:
    reasons = [f"{label}: {status(rows[label])}" for label in labels if label in rows and status(rows[label])]
    return "; ".join(reasons) or "its rows did not run"


def status(row: dict) -> str:
    """What kept a row from being measured ("" for a measured one)."""
    return row.get("skipped") or row.get("unavailable") or row.get("error") or ""


def markdown(data: dict) -> str:
    """`gpu-check.md`: a title line, then one table per part of the results present in `data`."""
    env, settings = data.get("env", {}), data["settings"]
    memory = "GPU memory allocated" if settings["device"] == "cuda" else "process peak RSS"
    lines = [f"# gpu-check: {env.get('card', settings['device'])}, {env.get('date', '')}".rstrip(", "), "",
             f"{settings['device']}, {settings['dtype']}{', tiny shapes' if settings['tiny'] else ''}; Gym shape {settings['episodes']} "
             f"episodes x {settings['turns']} turns, {settings['max_new_tokens']} new tokens a turn, greedy; training: median of "
             f"{settings['timed_steps']} steps after a warm-up; peak memory: {memory}."
             + (f" {data['seconds']:.0f} s in all (budget {settings['budget_s']:g} s)." if "seconds" in data else " (running)"), ""]
    if data.get("cut_short"):
        lines += [f"**Cut short**: {data['cut_short']}.", ""]
    if env:
        lines += ["## Environment", "", table(["what", "value"], [[key, value] for key, value in env.items()]), ""]
    for row in data.get("cuda_tests", []):
        lines += ["## CUDA tests", "", table(["modules", "passed", "failed", "skipped", "errors", "exit code", "pytest says"],
                                             [[", ".join(row.get("modules", [])), *_cells(row.get("counts", {}), "passed", "failed", "skipped", "errors"),
                                               str(row.get("exit_code", "-")), status(row) or row.get("summary", "")]]), ""]
        lines += [f"- {failure}" for failure in row.get("failures", [])]
    shapes = {row["name"]: row for row in data.get("shapes", [])}
    for name, shape in shapes.items():
        if status(shape):
            lines += [f"## {name}", "", f"The model was not built: {status(shape)}", ""]
    for name, rows in data.get("generation", {}).items():
        lines += [f"## Generation: {name}{_size(shapes.get(name))}", "", table(
            ["path", "s", "speed-up over the generate loop", "tokens/s", "episodes equal to the loop's", "replies equal", "peak MiB",
             "decoding path, or status"], [_generation_row(row) for row in rows]), ""]
    for name, rows in data.get("training", {}).items():
        lines += [f"## Training steps: {name}{_size(shapes.get(name))}", "", table(
            ["step", "rows", "s per step (median)", "timed steps (s)", "peak MiB", "trainable parameters", "status"],
            [_training_row(row) for row in rows]), ""]
    if "goals" in data:
        lines += ["## Goals", "", table(["goal", "result"], [[goal, result] for goal, result in data["goals"].items()]), ""]
    return "\n".join(lines)


def _size(shape: dict | None) -> str:
    return f" ({shape['parameters'] / 1e6:.1f}M parameters)" if shape and "parameters" in shape else ""


def _cells(row: dict, *keys: str) -> list[str]:
    return [str(row.get(key, "-")) for key in keys]


def _number(value: Any, form: str = ".3g") -> str:
    return "-" if value is None else format(value, form)


def _generation_row(row: dict) -> list[str]:
    if status(row):
        return [row["name"], "-", "-", "-", "-", "-", "-", status(row)]
    speedup = "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x"
    return [row["name"], _number(row["seconds"]), speedup, _number(row["tokens_per_second"], ".0f"), row["equal_episodes"],
            row["equal_replies"], _number(row.get("peak_mib"), ".0f"), row["decoding_path"]]


def _training_row(row: dict) -> list[str]:
    if status(row):
        return [row["name"], "-", "-", "-", "-", "-", status(row)]
    timed = ", ".join(f"{seconds:.3g}" for seconds in row.get("step_seconds", []))
    return [row["name"], str(row.get("rows", "-")), _number(row["seconds"]), timed, _number(row.get("peak_mib"), ".0f"),
            f"{row.get('trainable_parameters', 0) / 1e6:.2f}M", "measured"]


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table; `|` in a cell is written `/`, newlines as spaces."""
    cells = [header, ["---"] * len(header), *[[str(cell).replace("|", "/").replace("\n", " ") for cell in row] for row in rows]]
    return "\n".join("| " + " | ".join(row) + " |" for row in cells)
