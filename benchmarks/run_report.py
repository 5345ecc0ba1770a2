"""The Markdown report of a `run.py` run (`render`), from its raw measurements or a saved `--json` file, with the
command line that made it."""

from __future__ import annotations

import argparse
import os
import platform

import engines_report
import grpo_bench
import report
import vllm_bench
import workload
from run_workloads import (
    ALL_GYM_MODES,
    ALL_WORKLOADS,
    GRPO_WORKLOAD,
    GYM_CLIENT_LOOP,
    GYM_EPISODES,
    GYM_MODES,
    GYM_TURNS,
    GYM_VLLM_MODES,
    MAX_NEW_TOKENS,
    ON_VLLM,
    PPO_EPISODES,
    PPO_EPOCHS,
    PPO_WORKLOADS,
    ROLLOUT_QUERIES,
    SIDE_WORKLOADS,
    TURNS,
    WORKLOADS,
)


def saved_repeats(raw: dict) -> int:
    """Runs per side of a saved --json file."""
    for name in ALL_WORKLOADS:
        if name in raw:
            results = raw[name]
            side = next(key for key in ("legacy", *ALL_GYM_MODES, *grpo_bench.grpo_side.SIDE_NAMES) if key in results)
            return len(results[side])
    return 0


def command_line(raw: dict, args: argparse.Namespace) -> str:
    """The command that made `raw`, from its saved settings (or `args` for settings older files lack)."""
    settings = {**vars(args), **raw.get("settings", {})}
    command = "python benchmarks/run.py" + (" --quick" if settings["quick"] else "")
    command += " --bf16" if settings["bf16"] else ""
    if set(args.workloads) != set(WORKLOADS):
        command += " --workloads " + " ".join(args.workloads)
    gym = raw.get("gym", {})
    flags = (
        ("--repeats", settings["repeats"], None), ("--threads", settings["threads"], workload.NUM_THREADS),
        ("--engine", settings.get("engine"), "textenv"), ("--vllm-dtype", settings.get("vllm_dtype"), "float32"),
        ("--rollout-queries", settings.get("rollout_queries"), ROLLOUT_QUERIES),
        ("--turns-episodes", settings.get("turns_episodes"), 8 if settings["quick"] else ROLLOUT_QUERIES),
        ("--gym-script", gym.get("script"), "chat"), ("--gym-episodes", gym.get("episodes"), GYM_EPISODES),
        ("--gym-turns", gym.get("turns"), GYM_TURNS), ("--gym-max-new-tokens", gym.get("max_new_tokens"), MAX_NEW_TOKENS),
        ("--gym-modes", " ".join(mode for mode in ALL_GYM_MODES if mode in gym) or None, " ".join(default_gym_modes(raw))),
    )
    command += "".join(f" {flag} {value}" for flag, value, default in flags if value not in (None, default))
    return command + grpo_bench.command_flags(raw.get(GRPO_WORKLOAD, {}))


def render(raw: dict, repeats: int, args: argparse.Namespace) -> str:
    settings = raw.get("settings", {})  # a saved run's own flags (absent in files saved before they were kept)
    bf16, threads = settings.get("bf16", args.bf16), settings.get("threads", args.threads)
    precision = "textenv ran in bf16 mixed precision, legacy in fp32" if bf16 else "both sides in fp32"
    if "vllm" in raw:
        precision += f"; the vLLM server in {raw['vllm']['dtype']}"
    parts = [
        f"Command: `{command_line(raw, args)}` — {repeats} run(s) per side, medians; {precision}; CPU only, torch.set_num_threads({threads}) on "
        f"both sides; {platform.processor() or platform.machine()}, {os.cpu_count()} cores. These are CPU "
        "figures: this run used no GPU.",
        "",
    ]
    ceiling = raw.get("ceiling")
    if ceiling:
        parts += [
            f"Matmul ceiling on this machine ({ceiling['threads']} threads): fp32 {ceiling['fp32']:.0f} GFLOP/s, "
            f"bf16 {ceiling['bf16']:.0f} GFLOP/s (best median over torch GEMMs of the model's shapes; see benchmarks/flops.py). "
            + report.cpu_line([ceiling]),
            "",
        ]
    summary_rows, notes = [], []
    with_flops = bool(ceiling) and all("model_flops" in raw[name] for name in SIDE_WORKLOADS if name in raw)

    def row(name: str, label: str, run_index: int | None, side: str = "textenv") -> list:
        """Legacy against textenv's `side`: "textenv" (the in-process engine) or "vllm"."""
        flop_counts = raw[name].get("model_flops") if with_flops else None
        flop_counts = flop_counts and {"legacy": flop_counts["legacy"], "textenv": flop_counts[side]}
        return report.summary_row(label, raw[name]["legacy"], raw[name][side], run_index=run_index,
                                  model_flops=flop_counts, ceiling=ceiling, bf16=bf16)

    for name, max_turns, run_index in (("rollout", 4, 0), ("turns", max(TURNS), -1)):
        if name in raw:
            label = f"{name} ({len(raw[name]['legacy'][0]['runs'][0]['episodes'])} episodes, max_turns {max_turns})"
            summary_rows += [row(name, label + ON_VLLM.get(side, ""), run_index, side) for side in ("textenv", "vllm") if side in raw[name]]
            notes += report.rollout_equality_lines(name, raw[name], run_index)
    labels = {
        "ppo-step": f"ppo-step ({PPO_EPISODES} episodes, {PPO_EPOCHS} epochs, mini-batch 4; 2nd step)",
        "ppo-step-varied": f"ppo-step-varied ({PPO_EPISODES} rows, no shared prompt, {PPO_EPOCHS} epochs, mini-batch 4; 2nd step)",
    }
    for name in PPO_WORKLOADS:
        if name not in raw:
            continue
        summary_rows.append(row(name, labels[name], None))
        stats = report.compare_stats(raw[name]["legacy"][0]["stats"], raw[name]["textenv"][0]["stats"])
        worst = ", ".join(f"`{key}` {value:.2e}" for key, value in stats["worst"][:3])
        line = f"{name} stats (2nd step): {stats['compared']} scalar stats compared, max abs diff {stats['max_abs_diff']:.1e} (largest: {worst})"
        if stats["arrays_differing"]:
            line += "; array stats that differ: " + ", ".join(f"`{key}` (max {value:.2g})" for key, value in stats["arrays_differing"].items())
        if stats["missing"]:
            line += f"; missing in textenv: {stats['missing']}"
        notes.append(line)
    header = report.summary_header(with_flops=with_flops, bf16=bf16)
    summary_results = [results for name in SIDE_WORKLOADS if name in raw for results in raw[name].values() if isinstance(results, list)]
    parts += [report.cpu_line(*summary_results), "", report.markdown_table(header, summary_rows), ""] if summary_rows else []
    if with_flops and summary_rows:
        parts += [
            "Model GFLOP/s: the workload's minimal model FLOPs (benchmarks/flops.py; PPO: from the batch, the same for "
            "both sides; rollouts: from each side's own final episodes) divided by the median wall time; % of ceiling: "
            "that rate against the matmul ceiling above (legacy / textenv).",
            "",
        ]
    if "gym" in raw:
        gym_results = [results for results in raw["gym"].values() if isinstance(results, list)]
        shape = raw["gym"].get("episodes", GYM_EPISODES), raw["gym"].get("turns", GYM_TURNS)
        parts += [report.cpu_line(*gym_results), ""]
        if all(mode in raw["gym"] for mode in GYM_MODES):
            parts += [report.gym_table(raw["gym"], *shape), ""]
        if GYM_CLIENT_LOOP in raw["gym"]:
            parts += [vllm_bench.client_loop_table(raw["gym"], *shape), ""]
        if all(mode in raw["gym"] for mode in ("naive", "scheduler", engines_report.TRANSFORMERS_CB)):
            parts += [engines_report.transformers_cb_table(raw["gym"], *shape), ""]
        if "naive" in raw["gym"] and sum(mode in raw["gym"] for mode in engines_report.BACKEND_SIDES) >= 3:
            parts += [f"The generation paths on {shape[0]} x {shape[1]} Gym episodes:", "", engines_report.backends_table(raw["gym"]), ""]
    if GRPO_WORKLOAD in raw:
        parts += [report.cpu_line(*(raw[GRPO_WORKLOAD][side] for side in grpo_bench.sides_of(raw[GRPO_WORKLOAD]))), "", *grpo_bench.render(raw[GRPO_WORKLOAD]), ""]
    for side in ("textenv", "vllm"):
        if side in raw.get("turns", {}):
            title, label = ("", "textenv") if side == "textenv" else (", textenv on vLLM", "vLLM")
            legacy, results = raw["turns"]["legacy"], raw["turns"][side]
            parts += [f"How cost grows with turns (`turns` workload{title}). " + report.cpu_line(legacy, results), "",
                      report.turns_table(legacy, results, list(TURNS), label=label), ""]
    parts += ["Same outputs:", ""] + [f"- {note}" for note in notes] if notes else []
    decoded = {name + ON_VLLM.get(side, ""): raw[name][side] for name in ("rollout", "turns") if name in raw for side in ("textenv", "vllm") if side in raw[name]}
    if "gym" in raw:
        decoded.update({f"gym {mode}": raw["gym"][mode] for mode in ("scheduler", "text-env", *GYM_VLLM_MODES, "naive", engines_report.TRANSFORMERS_CB, engines_report.TRANSFORMERS_BACKEND, GYM_CLIENT_LOOP)
                        if mode in raw["gym"]})
    if decoded:
        parts += ["", "What decoded the turns:", ""] + [f"- {line}" for line in report.path_lines(decoded)]
    if "vllm" in raw:
        parts += [part for line in report.vllm_lines(raw) for part in ("", line)]
    side_results = any_workload_results(raw)
    if "legacy" in side_results:
        versions = {side: results[0]["versions"] for side, results in side_results.items()}
        parts += ["", f"Versions: legacy {versions.get('legacy')}; textenv {versions.get('textenv')}."]
    return "\n".join(parts)


def default_gym_modes(raw: dict) -> tuple[str, ...]:
    """The gym modes a run has without --gym-modes (those on a server with --engine vllm)."""
    return GYM_MODES + ((*GYM_VLLM_MODES, GYM_CLIENT_LOOP) if raw.get("settings", {}).get("engine") == "vllm" else ())


def any_workload_results(raw: dict) -> dict[str, list[dict]]:
    """`{"legacy": [...], "textenv": [...]}` of the first legacy-against-textenv workload of a run."""
    results = next((raw[name] for name in SIDE_WORKLOADS if name in raw), {})
    return {side: results[side] for side in ("legacy", "textenv") if side in results}
