"""Benchmark textenv against legacy TRL 0.11.4, side by side, on the bundled SmolLM2-135M-Instruct.

    python benchmarks/run.py            # all workloads, 3 repeats
    python benchmarks/run.py --quick    # one repeat, fewer turns (a few minutes)
    python benchmarks/run.py --bf16     # textenv in bf16 mixed precision (legacy stays fp32)
    python benchmarks/run.py --workloads rollout turns gym --engine vllm   # also textenv on a vLLM server
    python benchmarks/run.py --workloads grpo-vs-trl   # textenv's GRPO against TRL 1.16's GRPOTrainer (not in the default set)
    python benchmarks/run.py --workloads async --steps 12   # K = 0, 1, 2 rollouts ahead on vLLM (async_bench.py's options)

Creates the legacy venv (`benchmarks/.legacy-venv`: trl 0.11.4, transformers 4.46.3) on first use, writes
the fixed inputs to a temporary folder, measures this machine's matmul ceiling (`flops.py`) in a fresh
process, then runs every workload in fresh processes, alternating legacy and textenv, and prints medians,
ratios, model GFLOP/s against the ceiling and token-equality checks as Markdown. With `--engine vllm` it
starts a vLLM server first (`vllm_bench.py`) and measures textenv on it too, beside the in-process engine. The
`grpo-vs-trl` workload (`grpo_side.py`) trains with textenv's GRPO and with TRL 1.16's `GRPOTrainer`, both on the main
venv (no legacy venv needed), on the same calculator tool task (`grpo_task.py`). `--workloads async` hands
over to `async_bench.py` (training with rollouts ahead, K = 0, 1, 2 on vLLM; the options after it are its own).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import flops  # noqa: E402
import grpo_bench  # noqa: E402
import report  # noqa: E402
import vllm_bench  # noqa: E402
import workload  # noqa: E402
from legacy_venv import ensure_legacy_venv  # noqa: E402
from run_report import any_workload_results, command_line, default_gym_modes, render, saved_repeats  # noqa: E402, F401 - the report, re-exported
from run_workloads import (  # noqa: E402, F401 - every workload setting, re-exported (tests read run.WORKLOADS, ...)
    ALL_GYM_MODES,
    ALL_WORKLOADS,
    ASYNC_WORKLOAD,
    GRPO_WORKLOAD,
    GYM_CLIENT_LOOP,
    GYM_EPISODES,
    GYM_MODES,
    GYM_TURNS,
    GYM_VLLM_MODES,
    LEGACY_WORKLOADS,
    MAX_NEW_TOKENS,
    ON_VLLM,
    PPO_EPISODES,
    PPO_EPOCHS,
    PPO_WORKLOADS,
    ROLLOUT_QUERIES,
    SIDE_WORKLOADS,
    TURNS,
    VLLM_WORKLOADS,
    WORKLOADS,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat; the turns workload with 8 episodes")
    parser.add_argument("--workloads", nargs="+", choices=ALL_WORKLOADS, default=list(WORKLOADS),
                        help=f"default: {' '.join(WORKLOADS)} ({GRPO_WORKLOAD} only when named; `--workloads {ASYNC_WORKLOAD} ...` first, "
                        "alone, runs async_bench.py with the options after it)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per side (default 3, 1 with --quick)")
    parser.add_argument(
        "--threads", type=int, default=workload.NUM_THREADS,
        help="torch threads on both sides (default 2; 1 avoids thread-barrier stalls on a busy machine)",
    )
    parser.add_argument(
        "--bf16", action="store_true",
        help="run textenv in bf16 mixed precision (rollout: TextEnvironment(mixed_precision='bf16'); PPO: "
        "PPOConfig(accelerator_kwargs={'mixed_precision': 'bf16'})); legacy always runs in fp32",
    )
    parser.add_argument(
        "--engine", choices=["textenv", "vllm"], default="textenv",
        help="textenv: legacy / the naive loop against textenv's in-process engine; vllm: also textenv on a vLLM "
        "server started for the run (rollout, turns and gym workloads)",
    )
    parser.add_argument("--vllm-dtype", choices=vllm_bench.DTYPES, default="float32", help="the vLLM server's --dtype (default: %(default)s, tokens comparable)")
    parser.add_argument("--rollout-queries", type=int, default=ROLLOUT_QUERIES, help="the rollout workload's episodes (default: %(default)s)")
    parser.add_argument("--turns-episodes", type=int, default=None, help=f"the turns workload's episodes (default: {ROLLOUT_QUERIES}, 8 with --quick)")
    parser.add_argument("--gym-script", choices=["chat", "math"], default="chat", help="the gym workload's env prompts (default: chat, short prompts: the worst case)")
    parser.add_argument("--gym-episodes", type=int, default=GYM_EPISODES, help="the gym workload's episodes (default: %(default)s)")
    parser.add_argument("--gym-turns", type=int, default=GYM_TURNS, help="the gym workload's turns per episode (default: %(default)s)")
    parser.add_argument("--gym-max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="the gym workload's tokens per model turn (default: %(default)s)")
    parser.add_argument(
        "--gym-modes", nargs="+", choices=ALL_GYM_MODES, default=None,
        help=f"the gym workload's sides (default: {' '.join(GYM_MODES)}, with --engine vllm also {' '.join(GYM_VLLM_MODES)} {GYM_CLIENT_LOOP}); "
        f"e.g. `--gym-modes scheduler-vllm {GYM_CLIENT_LOOP}`: textenv on vLLM against the plain client loop only",
    )
    grpo_bench.add_arguments(parser)
    parser.add_argument("--json", type=Path, default=None, help="also write all raw measurements here")
    parser.add_argument("--render", type=Path, default=None, help="only print the tables of a saved --json file")
    args = parser.parse_args()
    on_server = [mode for mode in args.gym_modes or () if mode in (*GYM_VLLM_MODES, GYM_CLIENT_LOOP)]
    if on_server and args.engine != "vllm":
        parser.error(f"--gym-modes {' '.join(on_server)} run on a vLLM server: add --engine vllm")
    return args


def main() -> None:
    if sys.argv[1:3] == ["--workloads", ASYNC_WORKLOAD]:
        import async_bench

        async_bench.main(sys.argv[3:])
        return
    args = parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    if args.render:
        raw = json.loads(args.render.read_text())
        args.workloads = [name for name in ALL_WORKLOADS if name in raw]
        print(render(raw, saved_repeats(raw), args))
        return
    args.turns_episodes = args.turns_episodes or (8 if args.quick else ROLLOUT_QUERIES)
    settings = {key: getattr(args, key) for key in ("bf16", "threads", "quick", "repeats", "engine", "vllm_dtype", "rollout_queries", "turns_episodes")}
    raw: dict = {"settings": settings}
    on_vllm = args.engine == "vllm" and any(name in VLLM_WORKLOADS for name in args.workloads)
    with vllm_bench.running_server(args.vllm_dtype) if on_vllm else contextlib.nullcontext() as server:
        if server is not None:
            raw["vllm"] = vllm_bench.server_record(server, args.vllm_dtype)
        measure_all(raw, args, repeats)
    if args.json:
        args.json.write_text(json.dumps(raw))
    print(render(raw, repeats, args))


def measure_all(raw: dict, args: argparse.Namespace, repeats: int) -> None:
    """Every workload of `args`, into `raw` (textenv on vLLM too where `raw` has a server)."""
    sides = {"textenv": (sys.executable, HERE / "textenv_side.py")}
    if any(name in LEGACY_WORKLOADS for name in args.workloads):
        legacy_python = ensure_legacy_venv(log=lambda message: print(message, file=sys.stderr))
        sides = {"legacy": (str(legacy_python), HERE / "legacy_side.py"), **sides}
    if any(name in SIDE_WORKLOADS for name in args.workloads):
        print("[ceiling] matmul GFLOP/s, fp32 and bf16 ...", file=sys.stderr, flush=True)
        raw["ceiling"] = run_side((sys.executable, HERE / "flops.py"), None, None, threads=args.threads)
    model_config = flops.load_model_config()
    server = raw.get("vllm")
    with tempfile.TemporaryDirectory(prefix="textenv-bench-") as folder:
        inputs = write_inputs(Path(folder), args.rollout_queries, args.turns_episodes)
        if any(name in PPO_WORKLOADS for name in args.workloads):
            run_side(sides["textenv"], "make-value-head", inputs["ppo-step"], threads=args.threads)
        for name in args.workloads:
            if name == "gym":
                raw[name] = measure_gym(repeats, args.threads, args.gym_script, args.gym_episodes, args.gym_turns, server,
                                        modes=args.gym_modes, max_new_tokens=args.gym_max_new_tokens)
                continue
            if name == GRPO_WORKLOAD:
                raw[name] = grpo_bench.measure(repeats, args.threads, grpo_bench.write_inputs(Path(folder), grpo_bench.settings(args), args.grpo_eval_rows), run_side, rotated)
                continue
            if name == "ppo-step":
                run_side(sides["textenv"], "make-ppo-batch", inputs["ppo-step"], threads=args.threads)
            raw[name] = measure(name, sides, inputs[name], repeats, args.threads, bf16=args.bf16, server=server if name in VLLM_WORKLOADS else None)
            raw[name]["model_flops"] = model_flops(name, raw[name], inputs[name], model_config)


def write_inputs(folder: Path, rollout_queries: int = ROLLOUT_QUERIES, turns_episodes: int = ROLLOUT_QUERIES) -> dict[str, Path]:
    """The fixed, seeded inputs of every workload, one JSON file each, read by both sides."""
    from textenv.models import bundled_model_path

    model_path = str(bundled_model_path())
    queries, answers = workload.make_calculator_tasks(rollout_queries, seed=0)
    chain_queries, chain_answers = workload.make_chain_tasks(turns_episodes, seed=0)
    ppo_queries, ppo_answers = workload.make_calculator_tasks(PPO_EPISODES, seed=1)
    common = {"model_path": model_path, "max_new_tokens": MAX_NEW_TOKENS}
    # Both PPO workloads load the same value-head init (written by textenv_side.py --workload make-value-head).
    value_head_path = str(folder / "value_head.pt")
    varied_batch_path = folder / "ppo_varied_batch.json"
    vocab_size = flops.load_model_config(model_path)["vocab_size"]
    varied_batch_path.write_text(json.dumps(workload.make_varied_ppo_batch(vocab_size, rows=PPO_EPISODES, seed=0)))
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
            "value_head_path": value_head_path,
        },
        "ppo-step-varied": {
            "model_path": model_path,
            "mini_batch_size": 4,
            "batch_path": str(varied_batch_path),
            "value_head_path": value_head_path,
        },
    }
    paths = {}
    for name, content in contents.items():
        paths[name] = folder / f"{name}.json"
        paths[name].write_text(json.dumps(content))
    return paths


def measure(name: str, sides: dict, inputs: Path, repeats: int, threads: int, bf16: bool = False,
            server: dict | None = None) -> dict[str, list[dict]]:
    """Run a workload `repeats` times per side in fresh processes, rotating which side goes first.
    `bf16` is passed to the in-process textenv side only (legacy always runs in fp32); with `server` (see
    `vllm_bench.server_record`) a third side, "vllm", runs textenv's rollout on that vLLM server."""
    side_workload = "ppo-step" if name in PPO_WORKLOADS else "rollout"
    extra = {"legacy": ["--max-turns", "4"], "textenv": ["--max-turns", "4"]}
    if name == "turns":
        # Legacy's turns end together: one max_turns 8 run gives every turn's end time. textenv's episodes run
        # at their own pace, so each max_turns k is its own run.
        extra = {"legacy": ["--max-turns", str(max(TURNS))], "textenv": ["--max-turns", *map(str, range(1, max(TURNS) + 1))]}
    if server is not None:
        sides = {**sides, "vllm": sides["textenv"]}
        extra["vllm"] = [*extra["textenv"], "--vllm-url", server["url"], "--vllm-pid", str(server["pid"])]
    if bf16:
        extra["textenv"] = [*extra["textenv"], "--bf16"]
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(repeats):
        for side in rotated(list(sides), repeat):
            print(f"[{name}] run {repeat + 1}/{repeats}: {side} ...", file=sys.stderr, flush=True)
            results[side].append(run_side(sides[side], side_workload, inputs, extra[side], threads))
    return results


def model_flops(name: str, results: dict[str, list[dict]], inputs: Path, config: dict) -> dict[str, int]:
    """Each side's minimal model FLOPs of the timed part of the workload (see `flops.py`): for a PPO step,
    from the batch; for a rollout, from the side's own final episodes (of the run the table shows)."""
    if name in PPO_WORKLOADS:
        batch = workload.read_json(workload.read_json(inputs)["batch_path"])
        total = flops.ppo_step_flops(config, map(len, batch["queries"]), map(len, batch["responses"]), PPO_EPOCHS)
        return {side: total for side in results}
    run_index = -1 if name == "turns" else 0
    return {side: flops.rollout_flops(config, results[side][0]["runs"][run_index]["episodes"]) for side in results}


def measure_gym(repeats: int, threads: int, script: str, episodes: int = GYM_EPISODES, turns: int = GYM_TURNS,
                server: dict | None = None, modes: list[str] | None = None, max_new_tokens: int = MAX_NEW_TOKENS) -> dict[str, list[dict]]:
    """The gym workload on the main venv: a naive per-turn loop, GymScheduler and TextEnvironment on the
    same `episodes` x `turns` (and with `server`, GymScheduler and TextEnvironment on that vLLM server, and the
    plain client loop on it), each `repeats` times in fresh processes, the order rotated every repeat. `modes`
    picks some of them (default: all that apply)."""
    on_server = (*GYM_VLLM_MODES, GYM_CLIENT_LOOP)
    modes = tuple(modes or (GYM_MODES + (on_server if server is not None else ())))
    if server is None and any(mode in on_server for mode in modes):
        raise ValueError(f"the gym modes {[mode for mode in modes if mode in on_server]} need a vLLM server (--engine vllm)")
    results: dict[str, list[dict]] = {mode: [] for mode in modes}
    side = (sys.executable, HERE / "gym_side.py")
    for repeat in range(repeats):
        for mode in rotated(modes, repeat):
            print(f"[gym] run {repeat + 1}/{repeats}: {mode} ...", file=sys.stderr, flush=True)
            extra = ["--mode", mode.removesuffix(report.VLLM_SUFFIX), "--script", script, "--episodes", str(episodes), "--turns", str(turns)]
            if max_new_tokens != MAX_NEW_TOKENS:
                extra += ["--max-new-tokens", str(max_new_tokens)]
            if mode in on_server:
                extra += ["--vllm-url", server["url"]] + (["--vllm-pid", str(server["pid"])] if server.get("pid") else [])
            results[mode].append(run_side(side, None, None, extra, threads))
    results.update(script=script, episodes=episodes, turns=turns, max_new_tokens=max_new_tokens)
    return results


def rotated(names, repeat: int) -> list:
    """The order of repeat `repeat`: `names` rotated left by `repeat` (two sides alternate)."""
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


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
    sys.exit(f"{script.name} {' '.join(extra) if side_workload is None else '--workload ' + side_workload} failed "
             f"(exit {completed.returncode}):\n{completed.stderr[-4000:]}")


if __name__ == "__main__":
    main()
