"""One command that measures the GPU path (`make gpu-check`), for a lent GPU machine with torch and transformers but
no vLLM and no network; tested on the CPU with the same code (`--device cpu --tiny`).

    python benchmarks/gpu_check.py --out gpu-check                 # on a GPU: three model shapes, bf16
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/g  # the CPU test's run

Sections, each guarded (a section that fails or runs out of the time budget says so and the check goes on):

- `env`: the date, the card, torch / transformers / accelerate / peft / trl versions, the commit;
- `cuda-tests`: the test modules marked `cuda`, run with pytest (they skip without CUDA);
- `generation`: the Gym benchmark's chat episodes (32 x 6) on random-weight models of the bundled model's shape, a
  Qwen3-0.6B and a Qwen3-1.7B shape (bf16 on a GPU): the per-turn `generate` loop, and GymScheduler on each engine
  (`textenv`, `transformers`, `vllm`), with the speed-up over the loop and the episodes whose replies equal its;
- `training`: PPO and GRPO steps, full and LoRA, on one batch of 8 rows per shape, and TRL's `GRPOTrainer` loss
  step on the same batch: median seconds and peak GPU memory.

It writes `gpu-check.json` (everything) and `gpu-check.md` (the tables and the issue's two goals checked) into
`--out`, and prints the Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import gym_side  # noqa: E402
from gpu_sections import SHAPES, build_shape, generation_paths, training_steps  # noqa: E402

SECTIONS = ("env", "cuda-tests", "generation", "training")
PACKAGES = ("torch", "transformers", "accelerate", "peft", "trl", "vllm")
GOALS = ("generation >= 3x the generate loop (qwen3-0.6b)", "GRPO step at least as fast as TRL's (qwen3-0.6b, full)")
GENERATION_GOAL = 3.0  # in-process generation at least 3x the per-turn generate loop, for the 0.6B shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="2-layer models, 4 episodes x 2 turns, 8 new tokens (the CPU test)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help=f"model shapes, from {', '.join(SHAPES)}")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), help=f"sections, from {', '.join(SECTIONS)}")
    parser.add_argument("--out", default="gpu-check", help="the folder for gpu-check.json and gpu-check.md")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting new work after this many seconds")
    args = parser.parse_args(argv)
    for flag, values, known in (("--shapes", args.shapes, SHAPES), ("--sections", args.sections, SECTIONS)):
        unknown = [value for value in values if value not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run on a GPU machine, or pass --device cpu --tiny")
    return args


def environment() -> dict:
    versions = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"date": datetime.date.today().isoformat(), "card": torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (CPU)",
            "cuda": torch.version.cuda or "none", "commit": commit or "unknown", **versions}


def cuda_tests() -> dict:
    modules = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py") if "pytest.mark.cuda" in path.read_text())
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", *modules],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|skipped|error|deselected)", summary)}
    return {"modules": modules, "summary": summary, "exit_code": done.returncode, **counts}


def run(args: argparse.Namespace) -> dict:
    started, dtype = time.perf_counter(), torch.bfloat16 if args.device == "cuda" else torch.float32
    episodes, turns = (4, 2) if args.tiny else (32, 6)
    gym_side.MAX_NEW_TOKENS = 8 if args.tiny else gym_side.DEFAULT_MAX_NEW_TOKENS
    report = {"settings": {"device": args.device, "dtype": str(dtype).removeprefix("torch."), "tiny": args.tiny, "episodes": episodes,
                           "turns": turns, "max_new_tokens": gym_side.MAX_NEW_TOKENS, "shapes": args.shapes}}
    if "env" in args.sections:
        report["env"] = environment()
    if "cuda-tests" in args.sections:
        report["cuda_tests"] = guarded(cuda_tests)
    for shape_name in args.shapes:
        if time.perf_counter() - started > args.budget_s:
            report.setdefault("skipped", []).append(f"{shape_name}: the time budget ({args.budget_s:g} s) was spent")
            continue
        shape = guarded(lambda: build_shape(shape_name, args.device, dtype, args.tiny))
        if isinstance(shape, dict):
            report.setdefault("generation", {})[shape_name] = [shape]
            continue
        if "generation" in args.sections:
            report.setdefault("generation", {})[shape_name] = generation_paths(shape, episodes, turns)
        if "training" in args.sections and time.perf_counter() - started <= args.budget_s:
            report.setdefault("training", {})[shape_name] = training_steps(shape, args.device, steps=2 if args.tiny else 3, tiny=args.tiny)
        del shape
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    report["seconds"] = time.perf_counter() - started
    report["goals"] = goals(report)
    return report


def guarded(work):
    try:
        return work()
    except Exception as error:  # noqa: BLE001 - recorded, the check goes on
        return {"error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}


def goals(report: dict) -> dict:
    """The issue's two goals on a GPU: in-process generation >= 3x the generate loop (0.6B shape), and textenv's GRPO
    step at least as fast as TRL's (same shape, full fine-tuning)."""
    if report["settings"]["device"] != "cuda":
        return {goal: "not measured: not a GPU run" for goal in GOALS}
    shape = "qwen3-0.6b"
    paths = {row["path"]: row for row in report.get("generation", {}).get(shape, []) if "seconds" in row}
    best = max((row["speedup"] for label, row in paths.items() if label in ("engine=textenv", "engine=transformers")), default=None)
    steps = {row["algorithm"]: row for row in report.get("training", {}).get(shape, []) if row.get("method") == "full" and "seconds" in row}
    grpo, trl_grpo = steps.get("grpo"), steps.get("trl-grpo")
    generation = "not measured" if best is None else f"{'PASS' if best >= GENERATION_GOAL else 'FAIL'} ({best:.2f}x)"
    step = "not measured" if not (grpo and trl_grpo) else (
        f"{'PASS' if grpo['seconds'] <= trl_grpo['seconds'] else 'FAIL'} ({grpo['seconds']:.3g} s against {trl_grpo['seconds']:.3g} s)")
    return dict(zip(GOALS, (generation, step)))


def markdown(report: dict) -> str:
    env, settings = report.get("env", {}), report["settings"]
    lines = [f"# gpu-check, {env.get('date', '')}: {env.get('card', settings['device'])}", ""]
    if env:
        lines += [table(["what", "value"], [[key, value] for key, value in env.items()]), ""]
    lines += [f"{settings['dtype']}, Gym shape {settings['episodes']} episodes x {settings['turns']} turns, {settings['max_new_tokens']} new tokens "
              f"a turn{', tiny shapes' if settings['tiny'] else ''}; {report['seconds']:.0f} s in all.", ""]
    if "cuda_tests" in report:
        tests = report["cuda_tests"]
        lines += [f"CUDA tests: {tests.get('summary', tests.get('error'))} ({', '.join(tests.get('modules', []))})", ""]
    for shape, rows in report.get("generation", {}).items():
        lines += [f"Generation, {shape}:", "", table(["path", "s", "speed-up over the generate loop", "replies equal to the loop's", "decoding path"],
                                                      [_generation_row(row) for row in rows]), ""]
    for shape, rows in report.get("training", {}).items():
        lines += [f"Training steps, {shape} (batch of 8):", "", table(["algorithm", "method", "s (median)", "peak GPU MiB"],
                                                                      [_training_row(row) for row in rows]), ""]
    lines += [f"- {item}" for item in report.get("skipped", [])]
    lines += ["Goals:", "", table(["goal", "result"], [[goal, result] for goal, result in report["goals"].items()])]
    return "\n".join(lines) + "\n"


def _generation_row(row: dict) -> list:
    if "error" in row:
        return [row.get("path", "model"), "-", "-", "-", row["error"]]
    return [row["path"], f"{row['seconds']:.3g}", f"{row['speedup']:.2f}x", row["equal_episodes"], row["decoding_path"]]


def _training_row(row: dict) -> list:
    if "error" in row:
        return [row["algorithm"], row["method"], "-", row["error"]]
    peak = "n/a (CPU)" if row["peak_mib"] is None else f"{row['peak_mib']:.0f}"
    return [row["algorithm"], row["method"], f"{row['seconds']:.3g}", peak]


def table(header: list[str], rows: list[list]) -> str:
    cells = [header, ["---"] * len(header), *[[str(cell).replace("|", "/") for cell in row] for row in rows]]
    return "\n".join("| " + " | ".join(row) + " |" for row in cells)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))
    text = markdown(report)
    (out / "gpu-check.md").write_text(text)
    print(text)
    return report


if __name__ == "__main__":
    main()
