"""Benchmark textenv against legacy TRL 0.11.4, side by side, on the bundled SmolLM2-135M-Instruct.

    python benchmarks/run.py            # all workloads, 3 repeats
    python benchmarks/run.py --quick    # one repeat, fewer turns (a few minutes)

Creates the legacy venv (`benchmarks/.legacy-venv`: trl 0.11.4, transformers 4.46.3) on first use, writes
the fixed inputs to a temporary folder, then runs every workload in fresh processes, alternating legacy
and textenv, and prints medians, ratios and token-equality checks as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
import workload  # noqa: E402
from legacy_venv import ensure_legacy_venv  # noqa: E402

WORKLOADS = ("rollout", "turns", "ppo-step", "gym")
GYM_MODES = ("naive", "scheduler", "text-env")
GYM_EPISODES, GYM_TURNS = 32, 6
ROLLOUT_QUERIES = 32
PPO_EPISODES = 8
MAX_NEW_TOKENS = 32
TURNS = tuple(range(1, 9))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat; the turns workload with 8 episodes")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=None, help="runs per side (default 3, 1 with --quick)")
    parser.add_argument(
        "--threads", type=int, default=workload.NUM_THREADS,
        help="torch threads on both sides (default 2; 1 avoids thread-barrier stalls on a busy machine)",
    )
    parser.add_argument("--gym-script", choices=["chat", "math"], default="chat", help="the gym workload's env prompts (default: chat, short prompts: the worst case)")
    parser.add_argument("--json", type=Path, default=None, help="also write all raw measurements here")
    parser.add_argument("--render", type=Path, default=None, help="only print the tables of a saved --json file")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    if args.render:
        raw = json.loads(args.render.read_text())
        args.workloads = [name for name in WORKLOADS if name in raw]
        print(render(raw, len(next(iter(raw.values()))["legacy"]), args))
        return
    legacy_python = ensure_legacy_venv(log=lambda message: print(message, file=sys.stderr))
    sides = {"legacy": (str(legacy_python), HERE / "legacy_side.py"), "textenv": (sys.executable, HERE / "textenv_side.py")}
    with tempfile.TemporaryDirectory(prefix="textenv-bench-") as folder:
        inputs = write_inputs(Path(folder), quick=args.quick)
        raw = {}
        for name in args.workloads:
            if name == "gym":
                raw[name] = measure_gym(repeats, args.threads, args.gym_script)
                continue
            if name == "ppo-step":
                run_side(sides["textenv"], "make-ppo-batch", inputs["ppo-step"], threads=args.threads)
            raw[name] = measure(name, sides, inputs[name], repeats, args.threads)
    if args.json:
        args.json.write_text(json.dumps(raw))
    print(render(raw, repeats, args))


def write_inputs(folder: Path, quick: bool) -> dict[str, Path]:
    """The fixed, seeded inputs of every workload, one JSON file each, read by both sides."""
    from textenv.models import bundled_model_path

    model_path = str(bundled_model_path())
    queries, answers = workload.make_calculator_tasks(ROLLOUT_QUERIES, seed=0)
    chain_queries, chain_answers = workload.make_chain_tasks(8 if quick else ROLLOUT_QUERIES, seed=0)
    ppo_queries, ppo_answers = workload.make_calculator_tasks(PPO_EPISODES, seed=1)
    common = {"model_path": model_path, "max_new_tokens": MAX_NEW_TOKENS}
    contents = {
        "rollout": {**common, "prompt": workload.CALCULATOR_PROMPT, "queries": queries, "answers": answers},
        "turns": {**common, "prompt": workload.CHAIN_PROMPT, "queries": chain_queries, "answers": chain_answers},
        "ppo-step": {
            **common,
            "prompt": workload.CALCULATOR_PROMPT,
            "queries": ppo_queries,
            "answers": ppo_answers,
            "mini_batch_size": 4,
            "batch_path": str(folder / "ppo_batch.json"),
            "value_head_path": str(folder / "value_head.pt"),
        },
    }
    paths = {}
    for name, content in contents.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(content))
    return paths


def measure(name: str, sides: dict, inputs: Path, repeats: int, threads: int) -> dict[str, list[dict]]:
    """Run a workload `repeats` times per side in fresh processes, alternating which side goes first."""
    results: dict[str, list[dict]] = {"legacy": [], "textenv": []}
    side_workload = "ppo-step" if name == "ppo-step" else "rollout"
    extra = {"legacy": ["--max-turns", "4"], "textenv": ["--max-turns", "4"]}
    if name == "turns":
        # Legacy's turns end together: one max_turns 8 run gives every turn's end time. textenv's episodes run
        # at their own pace, so each max_turns k is its own run.
        extra = {"legacy": ["--max-turns", str(max(TURNS))], "textenv": ["--max-turns", *map(str, range(1, max(TURNS) + 1))]}
    for repeat in range(repeats):
        order = ("legacy", "textenv") if repeat % 2 == 0 else ("textenv", "legacy")
        for side in order:
            print(f"[{name}] run {repeat + 1}/{repeats}: {side} ...", file=sys.stderr, flush=True)
            results[side].append(run_side(sides[side], side_workload, inputs, extra[side], threads))
    return results


def measure_gym(repeats: int, threads: int, script: str) -> dict[str, list[dict]]:
    """The gym workload on the main venv: a naive per-turn loop, GymScheduler and TextEnvironment on the
    same episodes, each `repeats` times in fresh processes, the order rotated every repeat."""
    results: dict[str, list[dict]] = {mode: [] for mode in GYM_MODES}
    side = (sys.executable, HERE / "gym_side.py")
    for repeat in range(repeats):
        order = GYM_MODES[repeat % 3 :] + GYM_MODES[: repeat % 3]
        for mode in order:
            print(f"[gym] run {repeat + 1}/{repeats}: {mode} ...", file=sys.stderr, flush=True)
            extra = ["--mode", mode, "--script", script, "--episodes", str(GYM_EPISODES), "--turns", str(GYM_TURNS)]
            results[mode].append(run_side(side, None, None, extra, threads))
    results["script"] = script
    return results


def run_side(side: tuple[str, Path], side_workload: str, inputs: Path, extra: list[str] = (), threads: int = workload.NUM_THREADS) -> dict:
    python, script = side
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONWARNINGS": "ignore",
    }
    command = [python, str(script), "--threads", str(threads), *extra]
    if side_workload is not None:
        command += ["--workload", side_workload, "--inputs", str(inputs)]
    completed = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=HERE)
    for line in completed.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return json.loads(line[len("BENCH_RESULT ") :])
    sys.exit(f"{script.name} --workload {side_workload} failed (exit {completed.returncode}):\n{completed.stderr[-4000:]}")


# ------------------------------------------------------------------------------ output
def render(raw: dict, repeats: int, args: argparse.Namespace) -> str:
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "") + (f" --repeats {args.repeats}" if args.repeats else "")
    command += f" --threads {args.threads}" if args.threads != workload.NUM_THREADS else ""
    if set(args.workloads) != set(WORKLOADS):
        command += " --workloads " + " ".join(args.workloads)
    parts = [
        f"Command: `{command}` — {repeats} run(s) per side, medians; CPU only, torch.set_num_threads({args.threads}) on "
        f"both sides; {platform.processor() or platform.machine()}, {os.cpu_count()} cores. No GPU figures: "
        "no GPU was available for these measurements.",
        "",
    ]
    summary_rows, notes = [], []
    if "rollout" in raw:
        summary_rows.append(report.summary_row(f"rollout ({ROLLOUT_QUERIES} episodes, max_turns 4)", raw["rollout"]["legacy"], raw["rollout"]["textenv"]))
        notes.append(report.equality_line("rollout", report.compare_episodes(raw["rollout"]["legacy"][0]["runs"][0], raw["rollout"]["textenv"][0]["runs"][0])))
    if "turns" in raw:
        episodes = len(raw["turns"]["legacy"][0]["runs"][0]["episodes"])
        summary_rows.append(report.summary_row(f"turns ({episodes} episodes, max_turns {max(TURNS)})", raw["turns"]["legacy"], raw["turns"]["textenv"], run_index=-1))
        notes.append(report.equality_line("turns", report.compare_episodes(raw["turns"]["legacy"][0]["runs"][0], raw["turns"]["textenv"][0]["runs"][-1])))
    if "ppo-step" in raw:
        summary_rows.append(report.summary_row("ppo-step (8 episodes, 4 epochs, mini-batch 4)", raw["ppo-step"]["legacy"], raw["ppo-step"]["textenv"], run_index=None))
        stats = report.compare_stats(raw["ppo-step"]["legacy"][0]["stats"], raw["ppo-step"]["textenv"][0]["stats"])
        worst = ", ".join(f"`{key}` {value:.2e}" for key, value in stats["worst"][:3])
        line = f"ppo-step stats: {stats['compared']} scalar stats compared, max abs diff {stats['max_abs_diff']:.1e} (largest: {worst})"
        if stats["arrays_differing"]:
            line += "; array stats that differ: " + ", ".join(f"`{key}` (max {value:.2g})" for key, value in stats["arrays_differing"].items())
        if stats["missing"]:
            line += f"; missing in textenv: {stats['missing']}"
        notes.append(line)
    parts += [report.markdown_table(report.SUMMARY_HEADER, summary_rows), ""] if summary_rows else []
    if "gym" in raw:
        parts += [report.gym_table(raw["gym"], GYM_EPISODES, GYM_TURNS), ""]
    if "turns" in raw:
        parts += ["How cost grows with turns (`turns` workload):", "", report.turns_table(raw["turns"]["legacy"], raw["turns"]["textenv"], list(TURNS)), ""]
    parts += ["Same outputs:", ""] + [f"- {note}" for note in notes]
    side_results = any_workload_results(raw)
    if "legacy" in side_results:
        versions = {side: results[0]["versions"] for side, results in side_results.items()}
        parts += ["", f"Versions: legacy {versions.get('legacy')}; textenv {versions.get('textenv')}."]
    return "\n".join(parts)


def any_workload_results(raw: dict) -> dict[str, list[dict]]:
    return next((results for name, results in raw.items() if name != "gym"), {})


if __name__ == "__main__":
    main()
