"""vLLM colocated in the training process against the other ways to play the `gym` workload, in one run.

    .venv-vllm/bin/python benchmarks/colocate_bench.py --episodes 32 --turns 6 --repeats 3

Run it in an environment that holds textenv and vLLM (`make vllm` builds `.venv-vllm`). Sides, alternated in
every repeat, each in a fresh process (`gym_side.py`), medians printed side by side:

- `naive`: the per-turn transformers `generate` loop (float32);
- `in-process`: `GymScheduler` on textenv's own engine (float32);
- `vllm-loop <dtype>`: vLLM's own offline engine driven by a plain loop (`LLM.chat` on every unfinished episode
  each turn), the reference colocated textenv is held to;
- `colocated <dtype>`: `GymScheduler` on `ColocatedVLLM` (`vllm_mode="colocate"`);
- `server float32`: `GymScheduler` on a vLLM server (`vllm_mode="server"`, started once before the first repeat,
  `enforce_eager` as well, the same 2 GiB KV cache; each run sends the weights and warms up before timing).

Both vLLM sides run with `enforce_eager=True` (vLLM 0.32 on CPU recompiles at every start); their start-up and
the first weight load are not in the figures. Greedy decoding: the tokens of each side are compared with the
naive loop's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = {
    "naive": ["--mode", "naive"],
    "in-process": ["--mode", "scheduler"],
    "vllm-loop float32": ["--mode", "vllm-loop", "--colocate", "float32"],
    "colocated float32": ["--mode", "scheduler", "--colocate", "float32"],
    "vllm-loop bfloat16": ["--mode", "vllm-loop", "--colocate", "bfloat16"],
    "colocated bfloat16": ["--mode", "scheduler", "--colocate", "bfloat16"],
    "server float32": ["--mode", "scheduler"],  # + --vllm-url of the server main() starts
}
KV_CACHE_GIB = 2


def run_side(arguments: list[str], episodes: int, turns: int) -> dict:
    command = [sys.executable, str(HERE / "gym_side.py"), *arguments, "--episodes", str(episodes), "--turns", str(turns)]
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(KV_CACHE_GIB))}
    completed = subprocess.run(command, capture_output=True, text=True, cwd=HERE, env=environment)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(arguments)} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("BENCH_RESULT "))


def equal_replies(result: dict, reference: dict) -> str:
    same = sum(mine == theirs for mine, theirs in zip(result["replies"], reference["replies"]))
    return f"{same}/{len(reference['replies'])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sides", nargs="+", choices=sorted(SIDES), default=list(SIDES))
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {side: [] for side in args.sides}
    with contextlib.ExitStack() as stack:
        arguments = dict(SIDES)
        if "server float32" in args.sides:
            import vllm_bench

            server = stack.enter_context(vllm_bench.running_server("float32", kv_cache_gib=KV_CACHE_GIB))
            arguments["server float32"] = [*SIDES["server float32"], "--vllm-url", server.url, "--vllm-pid", str(server.process.pid)]
        for repeat in range(args.repeats):
            for side in args.sides:
                runs[side].append(run_side(arguments[side], args.episodes, args.turns))
                print(f"repeat {repeat + 1} {side}: {runs[side][-1]['seconds']:.1f} s", flush=True)
    seconds = {side: statistics.median(run["seconds"] for run in side_runs) for side, side_runs in runs.items()}
    print(f"\n{args.episodes} episodes x {args.turns} turns, medians of {args.repeats} alternated runs; cpu: {runs[args.sides[0]][0]['cpu']}")
    print("| side | s (runs) | x naive | x vLLM's own loop, same dtype | replies equal to naive's |")
    print("|---|---|---|---|---|")
    for side, side_runs in runs.items():
        own_loop = "vllm-loop " + side.split()[-1]  # server float32 is held to it too
        against_naive = f"{seconds['naive'] / seconds[side]:.2f}x" if "naive" in seconds else "-"
        against_loop = f"{seconds[own_loop] / seconds[side]:.3f}x" if not side.startswith(("naive", "in-process", "vllm-loop")) and own_loop in seconds else "-"
        equal = equal_replies(side_runs[0], runs["naive"][0]) if "naive" in runs else "-"
        spread = ", ".join(f"{run['seconds']:.1f}" for run in side_runs)
        print(f"| {side} | {seconds[side]:.1f} ({spread}) | {against_naive} | {against_loop} | {equal} |")


if __name__ == "__main__":
    main()
