"""Turn the sides' JSON measurements into medians, ratios, token-equality checks and Markdown tables."""

from __future__ import annotations

import statistics
from typing import Any

EOS_TOKEN_ID = 2  # <|im_end|> of the bundled SmolLM2 tokenizer


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


# ------------------------------------------------------------------------------ main summary table
def summary_row(
    name: str,
    legacy: list[dict],
    textenv: list[dict],
    run_index: int | None = 0,
    model_flops: dict[str, float] | None = None,
    ceiling: dict[str, Any] | None = None,
    bf16: bool = False,
) -> list[Any]:
    """One table row: median time, tokens/s and peak RSS of each side, and textenv's ratios. With
    `model_flops` (per side) and the matmul `ceiling`, also each side's model GFLOP/s (FLOPs / median
    wall time), their percentage of the fp32 ceiling, and with `bf16`, textenv's of the bf16 ceiling."""

    def seconds(result: dict) -> float:
        return result["runs"][run_index]["seconds"] if run_index is not None else result["seconds"]

    def tokens(result: dict) -> int:
        return result["runs"][run_index]["generated_tokens"] if run_index is not None else result["generated_tokens"]

    def cpu_seconds(result: dict) -> float:
        return result["runs"][run_index]["seconds_cpu"] if run_index is not None else result["seconds_cpu"]

    legacy_time, textenv_time = median([seconds(r) for r in legacy]), median([seconds(r) for r in textenv])
    legacy_cpu, textenv_cpu = median([cpu_seconds(r) for r in legacy]), median([cpu_seconds(r) for r in textenv])
    legacy_tps = median([tokens(r) / seconds(r) for r in legacy])
    textenv_tps = median([tokens(r) / seconds(r) for r in textenv])
    legacy_rss, textenv_rss = median([r["peak_rss_mb"] for r in legacy]), median([r["peak_rss_mb"] for r in textenv])
    row = [
        name,
        legacy_time,
        textenv_time,
        f"**{ratio(legacy_time, textenv_time):.2f}x**",
        legacy_cpu,
        textenv_cpu,
        f"{ratio(legacy_cpu, textenv_cpu):.2f}x",
        legacy_tps,
        textenv_tps,
        f"{ratio(textenv_tps, legacy_tps):.2f}x",
        legacy_rss,
        textenv_rss,
        f"{ratio(textenv_rss, legacy_rss):.2f}x",
        path_label(textenv),
    ]
    if model_flops is not None and ceiling is not None:
        legacy_gflops = model_flops["legacy"] / legacy_time / 1e9
        textenv_gflops = model_flops["textenv"] / textenv_time / 1e9
        row += [legacy_gflops, textenv_gflops, f"{_percent(legacy_gflops, ceiling['fp32'])} / {_percent(textenv_gflops, ceiling['fp32'])}"]
        if bf16:
            row.append(_percent(textenv_gflops, ceiling["bf16"]))
    return row


def _percent(part: float, whole: float) -> str:
    return f"{100 * ratio(part, whole):.0f}%"


SUMMARY_HEADER = [
    "workload",
    "legacy s",
    "textenv s",
    "speed-up",
    "legacy CPU s",
    "textenv CPU s",
    "CPU speed-up",
    "legacy tok/s",
    "textenv tok/s",
    "tok/s ratio",
    "legacy peak RSS MiB",
    "textenv peak RSS MiB",
    "memory ratio",
    "textenv decoding path",
]


def decoding_path(results: list[dict]) -> str:
    """What decoded the turns of a side's runs (the same in every run), or "n/a" for a workload without
    decoding (the PPO steps)."""
    return results[0].get("decoding_path", "n/a") if results else "n/a"


def path_label(results: list[dict]) -> str:
    """`decoding_path` without the reason, for a table cell (`path_lines` gives the whole of it)."""
    return decoding_path(results).split(" (")[0]


def path_lines(labelled_results: dict[str, list[dict]]) -> list[str]:
    """One line per workload whose turns were decoded, naming the path in full (with the reason, on the
    `generate` fallback), for the text under the tables."""
    return [f"{label}: {decoding_path(results)}" for label, results in labelled_results.items() if decoding_path(results) != "n/a"]


def summary_header(with_flops: bool = False, bf16: bool = False) -> list[str]:
    """The summary table's columns (`summary_row` with or without model FLOPs, bf16 textenv or not)."""
    header = list(SUMMARY_HEADER)
    if with_flops:
        header += ["legacy model GFLOP/s", "textenv model GFLOP/s", "% of fp32 ceiling (legacy / textenv)"]
        if bf16:
            header.append("textenv % of bf16 ceiling")
    return header


# ------------------------------------------------------------------------------ turns
def turns_table(legacy: list[dict], textenv: list[dict], max_turns_list: list[int]) -> str:
    """Cost of max_turns k for each side. Legacy takes turns in lockstep: the elapsed time at the end of turn
    k of one greedy max_turns run (greedy decoding makes a max_turns=k run identical to the first k turns of
    a longer one). textenv runs episodes at their own pace, so turn k has no end time: it is measured as a
    separate max_turns=k run for every k."""
    rows = []
    for k in max_turns_list:
        legacy_cum = median([_elapsed_after(r, k) for r in legacy])
        textenv_cum = median([_elapsed_after(r, k) for r in textenv])
        legacy_turn = median([_turn_ms_per_episode(r, k) for r in legacy])
        textenv_turn = median([_turn_ms_per_episode(r, k) for r in textenv])
        active = _active_episodes(legacy[0], k)
        rows.append([k, active, legacy_cum, textenv_cum, f"**{ratio(legacy_cum, textenv_cum):.2f}x**", legacy_turn, textenv_turn])
    header = ["max_turns k", "episodes in turn k", "legacy s (turns 1..k)", "textenv s (turns 1..k)", "speed-up", "legacy ms/episode in turn k", "textenv ms/episode in turn k"]
    return markdown_table(header, rows)


def _lockstep_turns(result: dict) -> list[dict] | None:
    return result["runs"][0]["turns"]


def _run_with_max_turns(result: dict, k: int) -> dict:
    return next(run for run in result["runs"] if run["max_turns"] == k)


def _elapsed_after(result: dict, k: int) -> float:
    turns = _lockstep_turns(result)
    if turns is None:
        return _run_with_max_turns(result, k)["seconds"]
    return turns[min(k, len(turns)) - 1]["elapsed"]


def _turn_ms_per_episode(result: dict, k: int) -> float:
    turns = _lockstep_turns(result)
    if turns is None:
        episodes = _episodes_with_turn(_run_with_max_turns(result, k), k)
        before = _elapsed_after(result, k - 1) if k > 1 else 0.0
        return 1000 * (_elapsed_after(result, k) - before) / episodes if episodes else float("nan")
    if k > len(turns):
        return float("nan")
    return 1000 * turns[k - 1]["seconds"] / turns[k - 1]["episodes"]


def _episodes_with_turn(run: dict, k: int) -> int:
    """Episodes of a run that had a k-th model turn."""
    return sum(1 for episode in run["episodes"] if sum(not segment["system"] for segment in episode["segments"]) >= k)


def _active_episodes(result: dict, k: int) -> int:
    turns = _lockstep_turns(result)
    if turns is None:
        return _episodes_with_turn(_run_with_max_turns(result, k), k)
    return turns[k - 1]["episodes"] if k <= len(turns) else 0


# ------------------------------------------------------------------------------ token equality
def compare_episodes(legacy_run: dict, textenv_run: dict) -> dict[str, Any]:
    """Count episodes whose every segment's token ids are equal, and explain the others."""
    identical, explained, diverged = 0, 0, []
    for index, (legacy_episode, textenv_episode) in enumerate(zip(legacy_run["episodes"], textenv_run["episodes"])):
        if legacy_episode["segments"] == textenv_episode["segments"]:
            identical += 1
        elif _differs_only_after_eos(legacy_episode, textenv_episode):
            explained += 1
        else:
            diverged.append(_first_difference(index, legacy_episode, textenv_episode))
    return {"episodes": len(legacy_run["episodes"]), "identical": identical, "eos_fix": explained, "diverged": diverged}


def _differs_only_after_eos(legacy_episode: dict, textenv_episode: dict) -> bool:
    """Legacy keeps generating after EOS (it never stops on it); textenv ends the turn at EOS."""
    for legacy_segment, textenv_segment in zip(legacy_episode["segments"], textenv_episode["segments"]):
        if legacy_segment == textenv_segment:
            continue
        ids = textenv_segment["ids"]
        return bool(ids) and ids[-1] == EOS_TOKEN_ID and legacy_segment["ids"][: len(ids)] == ids
    return False


def _first_difference(index: int, legacy_episode: dict, textenv_episode: dict) -> dict[str, Any]:
    for turn, (legacy_segment, textenv_segment) in enumerate(zip(legacy_episode["segments"], textenv_episode["segments"])):
        if legacy_segment != textenv_segment:
            position = next(
                (i for i, (a, b) in enumerate(zip(legacy_segment["ids"], textenv_segment["ids"])) if a != b),
                min(len(legacy_segment["ids"]), len(textenv_segment["ids"])),
            )
            return {"episode": index, "segment": turn, "token": position}
    return {"episode": index, "segment": len(legacy_episode["segments"]), "token": 0}


def equality_line(name: str, comparison: dict[str, Any]) -> str:
    text = f"{name}: {comparison['identical']}/{comparison['episodes']} episodes token-identical"
    if comparison["eos_fix"]:
        text += f", {comparison['eos_fix']} differ only after an EOS (legacy ignores EOS; textenv ends the turn there)"
    if comparison["diverged"]:
        first = comparison["diverged"][0]
        text += (
            f", {len(comparison['diverged'])} diverge (first: episode {first['episode']}, segment "
            f"{first['segment']}, token {first['token']})"
        )
    return text


# ------------------------------------------------------------------------------ PPO stats
def compare_stats(legacy_stats: dict[str, Any], textenv_stats: dict[str, Any]) -> dict[str, Any]:
    """Max abs difference of the scalar stats both sides report (timings excluded), the worst keys, and
    the array stats (distributions) that differ."""
    scalar_differences, array_differences = {}, {}
    for key, legacy_value in legacy_stats.items():
        if key.startswith("time/") or key not in textenv_stats:
            continue
        textenv_value = textenv_stats[key]
        if not isinstance(legacy_value, list):
            scalar_differences[key] = abs(legacy_value - textenv_value) if not isinstance(textenv_value, list) else float("inf")
            continue
        textenv_values = textenv_value if isinstance(textenv_value, list) else [textenv_value]
        if len(legacy_value) != len(textenv_values):
            array_differences[key] = float("inf")
        else:
            difference = max((abs(a - b) for a, b in zip(legacy_value, textenv_values)), default=0.0)
            if difference > 1e-3:
                array_differences[key] = difference
    worst = sorted(scalar_differences.items(), key=lambda item: -item[1])[:3]
    return {
        "max_abs_diff": max(scalar_differences.values(), default=float("nan")),
        "worst": worst,
        "compared": len(scalar_differences),
        "arrays_differing": array_differences,
        "missing": sorted(set(legacy_stats) - set(textenv_stats)),
    }


def gym_table(results: dict, episodes: int, turns: int) -> str:
    """The gym workload: the naive per-turn loop against GymScheduler, and GymScheduler's tokens/s against
    TextEnvironment's on the same episodes (medians), with token-equality checks."""
    naive, scheduler, text_env = (results[mode] for mode in ("naive", "scheduler", "text-env"))
    seconds = {mode: median([run["seconds"] for run in results[mode]]) for mode in ("naive", "scheduler", "text-env")}
    rate = {mode: median([run["tokens_per_second"] for run in results[mode]]) for mode in ("naive", "scheduler", "text-env")}
    same_as_naive = scheduler[0]["replies"] == naive[0]["replies"]
    same_as_text_env = scheduler[0]["replies"] == text_env[0]["replies"]
    header = ["workload", "naive loop s", "GymScheduler s", "speed-up", "GymScheduler tok/s", "TextEnvironment s",
              "TextEnvironment tok/s", "tok/s GymScheduler / TextEnvironment", "generated tokens", "peak RSS MiB (naive / Gym / TextEnv)",
              "decoding path (Gym / TextEnv)"]
    row = [
        f"gym ({episodes} episodes x {turns} turns, `{results.get('script', 'chat')}` env)",
        seconds["naive"], seconds["scheduler"], f"**{ratio(seconds['naive'], seconds['scheduler']):.2f}x**",
        rate["scheduler"], seconds["text-env"], rate["text-env"], f"{rate['scheduler'] / rate['text-env']:.2f}",
        scheduler[0]["generated_tokens"],
        " / ".join(f"{median([run['peak_rss_mb'] for run in results[mode]]):.0f}" for mode in ("naive", "scheduler", "text-env")),
        f"{path_label(scheduler)} / {path_label(text_env)}",
    ]
    checks = (
        f"gym: every reply's token ids equal between GymScheduler and the naive loop: {same_as_naive}; "
        f"between GymScheduler and TextEnvironment on the same episodes: {same_as_text_env} "
        f"({scheduler[0]['turns']} turns, {scheduler[0]['generated_tokens']} / {naive[0]['generated_tokens']} / "
        f"{text_env[0]['generated_tokens']} generated tokens)."
    )
    return markdown_table(header, [row]) + "\n\n" + checks
