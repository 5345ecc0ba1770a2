"""A verifiers v1 taskset evaluated two ways on one vLLM server of the bundled model: verifiers' own evaluation
(`Env.run_episode` inside `Env.serving`, its chat harness posting to the server's chat-completions endpoint
through verifiers' interception server; the server renders tools with textenv's tool template and parses the
calls with vLLM's hermes parser, as textenv renders and parses them) and textenv (`GymScheduler(verifiers_env=load_v1_environment(ID),
engine="vllm")`: the same harness and interception server, the requests answered from the episode's token
ids).

    python benchmarks/verifiers_v1_eval.py --runs 3 --generations 4        # in .venv-vllm (vLLM and verifiers 0.4)

Both sides decode greedily with the same token budget, all episodes at once; every timed run starts on an
emptied prefix cache, the two sides alternate and the figures are medians. Prints episodes per second, the mean
reward of each side and how many episodes got the same reward on both sides, then one `BENCH_RESULT {json}`
line. Tasksets (verifiers' own, tests/data/verifiers_v1): `echo-v1` (one turn, 16 phrases), `echo-user-sim-v1`
(two turns, a scripted user) and `glossary` (an MCP tool, 5 tasks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import vllm_bench
from verifiers_eval import _given_server, _rewards, compare

ROOT = Path(__file__).resolve().parents[1]
TASKSETS = ROOT / "tests" / "data" / "verifiers_v1"
PHRASES = ["hello world", "ping", "verifiers", "good morning", "blue sky", "open the door", "seven", "red apple",
           "quick brown fox", "thank you", "see you soon", "rain today", "green light", "big city", "small step", "last one"]
ENV_ARGS = {"echo-v1": {"taskset": {"phrases": PHRASES}}, "echo-user-sim-v1": {}, "glossary": {"agent": {"max_turns": 3}}}


def verifiers_side(env, generations: int, url: str, model: str, max_tokens: int) -> tuple[float, dict]:
    """verifiers' own evaluation: seconds, and (task key, n) -> reward."""
    from verifiers.v1.clients import EvalClientConfig, ModelContext
    from verifiers.v1.types import SamplingConfig

    context = ModelContext(model=model, client=EvalClientConfig(base_url=f"{url}/v1", api_key_var="NO_KEY"),
                           sampling=SamplingConfig(max_tokens=max_tokens, temperature=0.0))
    tasks = [task for task in env.taskset for _ in range(generations)]

    async def run() -> list:
        async with env.serving():
            return await asyncio.gather(*(env.run_episode(task, context) for task in tasks))

    started = time.perf_counter()
    episodes = asyncio.run(run())
    seconds = time.perf_counter() - started
    return seconds, _rewards((episode.task.key, episode.traces[0].reward if episode.traces else 0.0) for episode in episodes)


def textenv_side(scheduler, rows: list, generations: int) -> tuple[float, dict]:
    started = time.perf_counter()
    episodes = scheduler.run(rows, num_generations=generations)
    seconds = time.perf_counter() - started
    errors = [episode.errors for episode in episodes if episode.errors]
    if errors:
        raise RuntimeError(f"textenv episodes failed: {errors[:2]}")
    return seconds, _rewards((episode.trajectory_infos[-1]["task"], episode.final_reward) for episode in episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--envs", default="echo-v1,echo-user-sim-v1,glossary")
    parser.add_argument("--url", default=None, help="a running server of the bundled model serving textenv's tool template with the "
                        "hermes tool parser; default: start one")
    args = parser.parse_args()

    from textenv.chat.templates import tool_chat_template
    from textenv.gym import GymScheduler
    from textenv.environments.verifiers_v1 import load_v1_environment, task_rows
    from textenv.models import load_bundled_model
    from textenv.vllm.client import VLLMServerClient

    sys.path.insert(0, str(TASKSETS))
    # verifiers' tool servers import the taskset in their own process: as installed (textenv adds the folder itself)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TASKSETS), os.environ.get("PYTHONPATH")]))
    model, tokenizer = load_bundled_model()
    results = {}
    # The server renders tools as textenv does (its tool template for a tokenizer whose template has none, as the
    # bundled model's) and parses the calls in that form, so that both sides show the model the same prompt.
    template = Path(tempfile.mkdtemp()) / "tool_template.jinja"
    template.write_text(tool_chat_template(tokenizer) or tokenizer.chat_template)
    tool_args = ["--chat-template", str(template), "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with (_given_server(args.url) if args.url else vllm_bench.running_server(args.dtype, extra_args=tool_args)) as server:
        served = VLLMServerClient(server.url).request("GET", "/v1/models")["data"][0]["id"]
        with vllm_bench.prepared_engine(server.url, model, tokenizer) as engine:
            for name in args.envs.split(","):
                env = load_v1_environment(name, ENV_ARGS[name])
                rows = task_rows(env)
                scheduler = GymScheduler(model, tokenizer, verifiers_env=env, engine=engine, max_concurrency=256, batch_size=256,
                                         generation_kwargs={"max_new_tokens": args.max_tokens, "do_sample": False})
                sides = {"verifiers": lambda: verifiers_side(env, args.generations, server.url, served, args.max_tokens),
                         "textenv": lambda: textenv_side(scheduler, rows, args.generations)}
                results[name] = compare(name, sides, len(rows) * args.generations, args.runs, engine)
        record = vllm_bench.server_record(server, args.dtype)
    print("BENCH_RESULT " + json.dumps({"server": record, "results": results, "max_tokens": args.max_tokens}))


if __name__ == "__main__":
    main()
