"""A verifiers environment evaluated two ways on one vLLM server of the bundled model: verifiers' own evaluation
(`Environment.generate` through its `OpenAIChatCompletionsClient`, the chat-completions endpoint) and textenv
(`GymScheduler(verifiers_env=..., engine="vllm")`: token ids in and out, the weights sent once before timing).

    python benchmarks/verifiers_eval.py --runs 3 --examples 32 --generations 4

Both sides decode greedily with the same token budget; every timed run starts on an emptied prefix cache, the
two sides alternate and the figures are medians. Prints episodes per second, the mean reward of each side and
how many episodes got the same reward on both sides (per example and generation, greedy), then one
`BENCH_RESULT {json}` line. Environments: `arithmetic` (examples/verifiers, single turn) and verifiers'
`alphabet_sort` (tests/data/verifiers_environments, 1 to 3 turns).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import types
from pathlib import Path

import vllm_bench

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENTS = {
    "arithmetic": (ROOT / "examples" / "verifiers", {"num_train_examples": 8, "num_eval_examples": 64}),
    "alphabet-sort": (ROOT / "tests" / "data" / "verifiers_environments" / "alphabet_sort",
                      {"dataset_name": str(ROOT / "tests" / "data" / "verifiers_environments" / "alphabet_sort" / "offline_dataset"),
                       "dataset_split": "train"}),
}


def load(name: str):
    from textenv.environments.verifiers import load_verifiers_environment

    folder, env_args = ENVIRONMENTS[name]
    sys.path.insert(0, str(folder))
    return load_verifiers_environment(name, env_args)


def eval_rows(env, examples: int) -> list:
    dataset = env.get_eval_dataset() if env.eval_dataset_source is not None else env.get_dataset()
    return [dict(row) for row in dataset.select(range(min(examples, len(dataset))))]


def verifiers_side(env, rows: list, generations: int, url: str, model: str, max_tokens: int) -> tuple[float, dict]:
    """verifiers' own evaluation: seconds, and (example_id, generation) -> reward."""
    from openai import AsyncOpenAI
    from verifiers.legacy.clients.openai_chat_completions_client import OpenAIChatCompletionsClient

    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0))
    inputs = [row for row in rows for _ in range(generations)]
    started = time.perf_counter()
    outputs = asyncio.run(env.generate(inputs, client=client, model=model, sampling_args={"max_tokens": max_tokens, "temperature": 0.0},
                                       on_progress=lambda *a, **k: None))["outputs"]
    seconds = time.perf_counter() - started
    return seconds, _rewards((output["example_id"], output["reward"]) for output in outputs)


def textenv_side(scheduler, rows: list, generations: int) -> tuple[float, dict]:
    started = time.perf_counter()
    episodes = scheduler.run(rows, num_generations=generations)
    seconds = time.perf_counter() - started
    errors = [episode.errors for episode in episodes if episode.errors]
    if errors:
        raise RuntimeError(f"textenv episodes failed: {errors[:2]}")
    return seconds, _rewards((rows[episode.row_index]["example_id"], episode.final_reward) for episode in episodes)


def _rewards(pairs) -> dict:
    """(example_id, n-th reward of that example in sorted order) -> reward: greedy episodes of one example
    are alike, so sorting pairs them up whatever order they finished in."""
    by_example: dict = {}
    for example_id, reward in pairs:
        by_example.setdefault(str(example_id), []).append(float(reward or 0.0))
    return {(example, index): reward for example, rewards in by_example.items() for index, reward in enumerate(sorted(rewards))}


def compare(name: str, sides: dict, episodes: int, runs: int, engine) -> dict:
    """Time `sides` (name -> run, returning (seconds, rewards)) alternately, `runs` times each on an emptied prefix
    cache; print and return the medians, the mean rewards, this process's CPU seconds and the episodes of equal reward."""
    times = {side: [] for side in sides}
    client_cpu = {side: [] for side in sides}
    rewards = {}
    order = list(sides)
    for run in range(runs):
        for side in order if run % 2 == 0 else order[::-1]:
            vllm_bench.fresh_cache(engine)
            cpu = time.process_time()
            seconds, rewards[side] = sides[side]()
            times[side].append(seconds)
            client_cpu[side].append(time.process_time() - cpu)
            print(f"[{name}] run {run + 1} {side}: {seconds:.1f} s", file=sys.stderr, flush=True)
    same = sum(rewards["verifiers"].get(key) == value for key, value in rewards["textenv"].items())
    r = {
        "episodes": episodes,
        **{f"{side}_seconds": statistics.median(times[side]) for side in times},
        **{f"{side}_seconds_all": times[side] for side in times},
        **{f"{side}_episodes_per_s": episodes / statistics.median(times[side]) for side in times},
        **{f"{side}_mean_reward": statistics.fmean(rewards[side].values()) for side in rewards},
        **{f"{side}_client_cpu_seconds": statistics.median(client_cpu[side]) for side in client_cpu},
        "same_reward": same, "runs": runs,
    }
    print(f"{name}: {episodes} episodes, verifiers {r['verifiers_episodes_per_s']:.2f} ep/s (reward {r['verifiers_mean_reward']:.3f}), "
          f"textenv {r['textenv_episodes_per_s']:.2f} ep/s (reward {r['textenv_mean_reward']:.3f}), "
          f"textenv/verifiers {r['textenv_episodes_per_s'] / r['verifiers_episodes_per_s']:.2f}x, same reward {same}/{episodes}; "
          f"this process's CPU seconds: verifiers {r['verifiers_client_cpu_seconds']:.1f}, textenv {r['textenv_client_cpu_seconds']:.1f}")
    return r


@contextlib.contextmanager
def _given_server(url: str):
    """A server started elsewhere, described as `running_server`'s (no start-up time, not stopped here)."""
    yield types.SimpleNamespace(url=url, startup_seconds=None, process=types.SimpleNamespace(pid=None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--envs", default="arithmetic,alphabet-sort")
    parser.add_argument("--url", default=None, help="a running server of the bundled model (`textenv serve`); default: start one")
    args = parser.parse_args()

    from textenv.gym import GymScheduler
    from textenv.models import load_bundled_model
    from textenv.vllm.client import VLLMServerClient

    model, tokenizer = load_bundled_model()
    results = {}
    with (_given_server(args.url) if args.url else vllm_bench.running_server(args.dtype)) as server:
        served = VLLMServerClient(server.url).request("GET", "/v1/models")["data"][0]["id"]
        with vllm_bench.prepared_engine(server.url, model, tokenizer) as engine:
            for name in args.envs.split(","):
                env = load(name)
                rows = eval_rows(env, args.examples)
                scheduler = GymScheduler(model, tokenizer, verifiers_env=env, engine=engine, max_concurrency=256, batch_size=256,
                                         generation_kwargs={"max_new_tokens": args.max_tokens, "do_sample": False})
                sides = {"verifiers": lambda: verifiers_side(env, rows, args.generations, server.url, served, args.max_tokens),
                         "textenv": lambda: textenv_side(scheduler, rows, args.generations)}
                results[name] = compare(name, sides, len(rows) * args.generations, args.runs, engine)
        record = vllm_bench.server_record(server, args.dtype)
    print("BENCH_RESULT " + json.dumps({"server": record, "results": results, "max_tokens": args.max_tokens}))


if __name__ == "__main__":
    main()
