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


def cpu_line(*result_lists: list[dict]) -> str:
    """The line above a table: the CPU its figures were measured on, with the kernel level torch ran and
    whether bf16 is native, as each side process recorded it (`workload.cpu_description`)."""
    cpus = list(dict.fromkeys(result["cpu"] for results in result_lists for result in results if result.get("cpu")))
    return "CPU: " + ("; ".join(cpus) if cpus else "not recorded (results saved before the CPU was)") + "."


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
def turns_table(legacy: list[dict], textenv: list[dict], max_turns_list: list[int], label: str = "textenv") -> str:
    """Cost of max_turns k for each side. Legacy takes turns in lockstep: the elapsed time at the end of turn
    k of one greedy max_turns run (greedy decoding makes a max_turns=k run identical to the first k turns of
    a longer one). textenv runs episodes at their own pace, so turn k has no end time: it is measured as a
    separate max_turns=k run for every k. `label` names the textenv side in the header (e.g. "vLLM")."""
    rows = []
    for k in max_turns_list:
        legacy_cum = median([_elapsed_after(r, k) for r in legacy])
        textenv_cum = median([_elapsed_after(r, k) for r in textenv])
        legacy_turn = median([_turn_ms_per_episode(r, k) for r in legacy])
        textenv_turn = median([_turn_ms_per_episode(r, k) for r in textenv])
        active = _active_episodes(legacy[0], k)
        rows.append([k, active, legacy_cum, textenv_cum, f"**{ratio(legacy_cum, textenv_cum):.2f}x**", legacy_turn, textenv_turn])
    header = ["max_turns k", "episodes in turn k", "legacy s (turns 1..k)", f"{label} s (turns 1..k)", "speed-up",
              "legacy ms/episode in turn k", f"{label} ms/episode in turn k"]
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


GYM_HEADER = ["workload", "naive loop s", "GymScheduler s", "speed-up", "GymScheduler tok/s", "TextEnvironment s",
              "TextEnvironment tok/s", "tok/s GymScheduler / TextEnvironment", "generated tokens",
              "peak RSS MiB (naive / Gym / TextEnv)", "decoding path (Gym / TextEnv)"]
VLLM_SUFFIX = "-vllm"  # the gym modes on the vLLM server: "scheduler-vllm", "text-env-vllm"


def gym_table(results: dict, episodes: int, turns: int) -> str:
    """The gym workload: the naive per-turn loop against GymScheduler, and GymScheduler's tokens/s against
    TextEnvironment's on the same episodes (medians), with token-equality checks; a second row with both
    front ends on vLLM when the run has them."""
    naive, scheduler, text_env = (results[mode] for mode in ("naive", "scheduler", "text-env"))
    label = f"gym ({episodes} episodes x {turns} turns, `{results.get('script', 'chat')}` env)"
    rows = [_gym_row(label, naive, scheduler, text_env)]
    checks = (
        f"gym: every reply's token ids equal between GymScheduler and the naive loop: {_replies(scheduler) == _replies(naive)}; "
        f"between GymScheduler and TextEnvironment on the same episodes: {_replies(scheduler) == _replies(text_env)} "
        f"({scheduler[0]['turns']} turns, {scheduler[0]['generated_tokens']} / {naive[0]['generated_tokens']} / "
        f"{text_env[0]['generated_tokens']} generated tokens)."
    )
    if "scheduler" + VLLM_SUFFIX in results:
        on_vllm, text_env_on_vllm = results["scheduler" + VLLM_SUFFIX], results["text-env" + VLLM_SUFFIX]
        rows.append(_gym_row(f"{label} on vLLM", naive, on_vllm, text_env_on_vllm))
        checks += (
            f"\n\ngym on vLLM: episodes whose every reply's token ids equal, GymScheduler on vLLM against the in-process "
            f"GymScheduler: {equal_episodes(on_vllm, scheduler)}, against the naive loop: {equal_episodes(on_vllm, naive)}; "
            f"TextEnvironment on vLLM against GymScheduler on vLLM: {equal_episodes(text_env_on_vllm, on_vllm)}."
        )
    return markdown_table(GYM_HEADER, rows) + "\n\n" + checks


def _gym_row(label: str, naive: list[dict], scheduler: list[dict], text_env: list[dict]) -> list[Any]:
    runs = {"naive": naive, "scheduler": scheduler, "text-env": text_env}
    seconds = {mode: median([run["seconds"] for run in results]) for mode, results in runs.items()}
    rate = {mode: median([run["tokens_per_second"] for run in results]) for mode, results in runs.items()}
    return [
        label, seconds["naive"], seconds["scheduler"], f"**{ratio(seconds['naive'], seconds['scheduler']):.2f}x**",
        rate["scheduler"], seconds["text-env"], rate["text-env"], f"{ratio(rate['scheduler'], rate['text-env']):.2f}",
        scheduler[0]["generated_tokens"],
        " / ".join(f"{median([run['peak_rss_mb'] for run in results]):.0f}" for results in runs.values()),
        f"{path_label(scheduler)} / {path_label(text_env)}",
    ]


def _replies(results: list[dict]) -> list:
    return results[0]["replies"]


def equal_episodes(results: list[dict], reference: list[dict]) -> str:
    """`"equal/episodes"`: episodes of the first runs whose replies all have the same token ids."""
    pairs = list(zip(_replies(results), _replies(reference)))
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


# ------------------------------------------------------------------------------ textenv on vLLM
def rollout_equality_lines(name: str, results: dict[str, list[dict]], run_index: int) -> list[str]:
    """Token equality of a rollout workload: textenv against legacy, and with a vLLM side, vLLM against
    legacy and against the in-process engine (`run_index`: textenv's run that matches legacy's)."""
    legacy, textenv = results["legacy"][0]["runs"][0], results["textenv"][0]["runs"][run_index]
    lines = [equality_line(name, compare_episodes(legacy, textenv))]
    if "vllm" in results:
        on_vllm = results["vllm"][0]["runs"][run_index]
        lines.append(equality_line(f"{name} on vLLM against legacy", compare_episodes(legacy, on_vllm)))
        lines.append(equality_line(f"{name} on vLLM against textenv's in-process engine", compare_episodes(textenv, on_vllm)))
    return lines


def vllm_lines(raw: dict) -> list[str]:
    """What the vLLM rows' figures leave out: the server's start-up, each side process's first weight sync
    and first use (the served model's checks), and the server's memory."""
    server, runs = raw["vllm"], _vllm_results(raw)
    syncs = [result["sync_seconds"][0] for result in runs if result.get("sync_seconds")]
    prepares = [result["prepare_seconds"] for result in runs if "prepare_seconds" in result]
    memory = [run["server_rss_mb"] for result in runs for run in result.get("runs", []) if "server_rss_mb" in run]
    lines = [
        f"textenv on vLLM: one vLLM server ({server.get('version', 'vLLM')}, `--dtype {server['dtype']}`"
        + (f": {server['dtype_reason']}" if server.get("dtype_reason") else "") + (f"; CPU: {server['cpu']}" if server.get("cpu") else "") + ") "
        f"for the whole run, ready after {server['startup_seconds']:.0f} s. Each side process on it ({len(runs)}) sends "
        f"the weights at its engine's first use: the first weight sync took {_spread(syncs)} s, the whole first use (sync "
        f"and the served model's checks) {_spread(prepares)} s. None of it is in the figures (a warm-up request "
        "follows, and every timed run starts on an emptied prefix cache).",
    ]
    if memory:
        lines.append(
            "The vLLM rows' CPU s include the server's processes over the timed run; their peak RSS is the textenv "
            f"process's only (it holds the model for the weight syncs); the server's resident memory after a run: {_spread(memory, '.0f')} MiB."
        )
    return lines


def _vllm_results(raw: dict) -> list[dict]:
    """Every side process's result on vLLM: the rollout workloads' "vllm" side and the gym's "-vllm" modes."""
    results = [result for name in ("rollout", "turns") for result in raw.get(name, {}).get("vllm", [])]
    return results + [result for mode, runs in raw.get("gym", {}).items() if mode.endswith(VLLM_SUFFIX) for result in runs]


def _spread(values: list[float], spec: str = ".2f") -> str:
    """`median (min-max)` of some values, or "n/a"."""
    if not values:
        return "n/a"
    text = format(median(values), spec)
    return text if len(values) == 1 else f"{text} ({format(min(values), spec)}-{format(max(values), spec)})"
