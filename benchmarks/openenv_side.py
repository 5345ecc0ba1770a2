"""An OpenEnv environment played side by side: by textenv, and by the loop OpenEnv's own documentation plays an
environment with a model. Same model, same rows, greedy decoding: the two sides must play the same episodes.

    python benchmarks/openenv_side.py                     # bundled SmolLM2-135M-Instruct, float32, 2 shapes, 2 runs per side
    python benchmarks/openenv_side.py --quick             # 1 run per side on small shapes
    python benchmarks/openenv_side.py --quick --model tiny --max-new-tokens 4   # the test's run (a tiny random model)

The environment is `openenv_guess.py`: a guess-the-number game written with openenv's classes (a typed action and
observation, an `Environment`, `create_app`, a typed `EnvClient`), served by uvicorn on this machine.

- **OpenEnv's loop** is the one of OpenEnv's documentation ("Load the Fine-Tuned Model and Run Inference" of its
  Wordle GRPO tutorial, with its `.sync()` client of the async/sync guide): one client, one episode after another,
  ``result = env.reset()``, then ``for turn in range(MAX_TURNS): if result.done: break``, the messages rendered with
  the chat template, ``model.generate(**tokenizer([prompt_text]), max_new_tokens=...)`` (greedy), the reply decoded
  and sent with ``env.step(GuessAction(guess=text))``. Its messages are the conversation (the row's system prompt,
  then the observations as user messages and the replies as assistant messages), as textenv renders them. Its
  server is started once, before timing (`OpenEnvServer`: uvicorn on a free port, as for textenv).
- **textenv** is ``GymScheduler(model, tokenizer, environments=OpenEnvEnvironments(app="openenv_guess:app"))``:
  every run starts the app's server, plays every episode concurrently (a session each) with the turns decoded
  together, and stops the server. Its time includes that server's start and stop, also printed apart (and the
  speed-up without them: the loop's server is already running).

Runs alternate which side goes first; the figures are medians. Every episode is compared (the messages, the
observations, the rewards, the number of turns and the replies' text). Prints a table and one
`BENCH_RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import workload
from report import markdown_table, ratio

warnings.filterwarnings("ignore")

APP = "openenv_guess:app"
SYSTEM = "You are playing a number guessing game."
SECRETS = (10, 3, 7, 9, 1, 10, 5, 8)  # 10: the bundled model counts down from 12 and finds it on its third guess
SHAPES = ((8, 1, 3), (4, 4, 2))  # (rows, generations per row, max turns)
QUICK_SHAPES = ((2, 1, 3), (1, 2, 2))
LOOP_PATH = "transformers generate, batch 1 (OpenEnv's loop, one episode after another)"


def load(model: str):
    """The model (float32, eval) and tokenizer: `bundled`, `tiny` (a random 2-layer model) or a folder."""
    from textenv.models import load_bundled_model, load_tokenizer

    if model == "tiny":
        from textenv.testing import tiny_causal_lm

        return tiny_causal_lm(seed=0).eval(), load_tokenizer()
    if model == "bundled":
        loaded, tokenizer = load_bundled_model()
        return loaded.eval(), tokenizer
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval(), load_tokenizer(model)


def rows_of(count: int) -> list[dict]:
    """The dataset rows: the secret (a reset argument) and the system prompt both sides open with."""
    return [{"secret": SECRETS[index % len(SECRETS)], "prompt": [{"role": "system", "content": SYSTEM}]} for index in range(count)]


# ------------------------------------------------------------------------------ OpenEnv's loop
def play_openenv_loop(model, tokenizer, url: str, rows: list[dict], generations: int, max_turns: int, max_new_tokens: int) -> list[dict]:
    """OpenEnv's documented loop (see the module docstring), each row played `generations` times."""
    from openenv_guess import GuessAction, GuessEnv

    episodes = []
    with GuessEnv(base_url=url).sync() as env:
        for row in rows:
            for _ in range(generations):
                result = env.reset(secret=row["secret"])
                messages = [*row["prompt"], {"role": "user", "content": result.observation.feedback}]
                episode = {"observations": [result.observation.feedback], "rewards": [], "turns": 0}
                for turn in range(max_turns):
                    if result.done:
                        break
                    prompt_text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                    model_inputs = tokenizer([prompt_text], return_tensors="pt").to(model.device)
                    with torch.no_grad():
                        generated_ids = model.generate(**model_inputs, max_new_tokens=max_new_tokens, do_sample=False,
                                                       pad_token_id=tokenizer.pad_token_id)
                    output_ids = generated_ids[0][len(model_inputs.input_ids[0]):]
                    generated_text = tokenizer.decode(output_ids, skip_special_tokens=True)
                    messages.append({"role": "assistant", "content": generated_text})
                    result = env.step(GuessAction(guess=generated_text))
                    episode["observations"].append(result.observation.feedback)
                    episode["rewards"].append(float(result.reward or 0.0))
                    episode["turns"] += 1
                    if not result.done and turn + 1 < max_turns:
                        messages.append({"role": "user", "content": result.observation.feedback})
                episodes.append({**episode, "messages": messages, "done": bool(result.done)})
    return episodes


# ------------------------------------------------------------------------------ textenv
def textenv_kind(sessions: int):
    """`OpenEnvEnvironments(app=APP)`, recording how long each run's server took to start (until it answered and its
    actions were read) and to stop."""
    from textenv.environments.openenv import OpenEnvEnvironments

    class TimedServer(OpenEnvEnvironments):
        start_seconds = stop_seconds = 0.0

        @contextlib.asynccontextmanager
        async def serving(self):
            started = time.perf_counter()
            async with super().serving():
                self.start_seconds = time.perf_counter() - started
                yield
                stopping = time.perf_counter()
            self.stop_seconds = time.perf_counter() - stopping

    return TimedServer(app=APP, max_sessions=sessions)


def textenv_scheduler(model, tokenizer, sessions: int, max_turns: int, max_new_tokens: int):
    from textenv.gym import GymScheduler

    return GymScheduler(model, tokenizer, environments=textenv_kind(sessions), max_turns=max_turns, loss_scale="default",
                        generation_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
                        batch_size=sessions, max_concurrency=sessions)


def play_textenv(scheduler, rows: list[dict], generations: int) -> list[dict]:
    results = scheduler.run(rows, num_generations=generations)
    errors = [episode.errors for episode in results if episode.errors]
    if errors:
        raise RuntimeError(f"textenv episodes failed: {errors[:2]}")
    return [{"observations": [info["observation"]["feedback"] for info in episode.trajectory_infos],
             "rewards": [float(reward) for reward in episode.step_rewards], "turns": episode.num_turns,
             "messages": [{"role": message["role"], "content": message["content"]} for message in episode.messages],
             "done": episode.finish_reason == "done"} for episode in results]


# ------------------------------------------------------------------------------ comparing and timing
FIELDS = ("messages", "observations", "rewards", "turns")


def compare(loop: list[dict], textenv: list[dict]) -> dict:
    """Episodes equal in every field (the replies are the messages' assistant contents), and the first difference."""
    equal, first = 0, None
    for index, (a, b) in enumerate(zip(loop, textenv)):
        differing = [field for field in (*FIELDS, "done") if a[field] != b[field]]
        equal += not differing
        if differing and first is None:
            first = {"episode": index, "fields": differing, "loop": a, "textenv": b}
    return {"episodes": len(loop), "equal": equal if len(loop) == len(textenv) else 0, "first_difference": first}


def measure(model, tokenizer, url: str, shape: tuple, runs: int, max_new_tokens: int) -> dict:
    """`runs` alternated runs of each side on one shape; seconds, this process's CPU seconds, and the episodes."""
    rows_count, generations, max_turns = shape
    rows = rows_of(rows_count)
    scheduler = textenv_scheduler(model, tokenizer, rows_count * generations, max_turns, max_new_tokens)
    scheduler.engine  # built before timing (the loop's model needs no building)
    sides = {"loop": lambda: play_openenv_loop(model, tokenizer, url, rows, generations, max_turns, max_new_tokens),
             "textenv": lambda: play_textenv(scheduler, rows, generations)}
    record = {"shape": list(shape), "runs": runs, "seconds": {side: [] for side in sides}, "cpu_seconds": {side: [] for side in sides},
              "server_start_seconds": [], "episodes": {}}
    for run in range(runs):
        for side in (("loop", "textenv") if run % 2 == 0 else ("textenv", "loop")):
            started, cpu = time.perf_counter(), workload.cpu_seconds()
            record["episodes"][side] = sides[side]()
            record["seconds"][side].append(time.perf_counter() - started)
            record["cpu_seconds"][side].append(workload.cpu_seconds() - cpu)
            if side == "textenv":
                kind = scheduler.environments
                record["server_start_seconds"].append(kind.start_seconds + kind.stop_seconds)
            print(f"[{shape_label(shape)}] run {run + 1} {side}: {record['seconds'][side][-1]:.1f} s", file=sys.stderr, flush=True)
    record["comparison"] = compare(record["episodes"]["loop"], record["episodes"]["textenv"])
    record["decoding_path"] = {"loop": LOOP_PATH, "textenv": str(scheduler.decoding_path)}
    record["turns"] = sum(episode["turns"] for episode in record["episodes"]["loop"])
    return record


def warm_up(model, tokenizer, url: str, max_new_tokens: int) -> None:
    """One short episode of each side before timing (first calls of the model and the engine)."""
    play_openenv_loop(model, tokenizer, url, rows_of(1), 1, 1, max_new_tokens)
    play_textenv(textenv_scheduler(model, tokenizer, 1, 1, max_new_tokens), rows_of(1), 1)


# ------------------------------------------------------------------------------ report
def shape_label(shape) -> str:
    rows, generations, max_turns = shape
    return f"{rows} rows x {generations} gen., max {max_turns} turns"


def spread(values: list[float]) -> str:
    text = f"{statistics.median(values):.1f}"
    return text if len(values) == 1 else f"{text} ({min(values):.1f}-{max(values):.1f})"


HEADER = ["shape", "episodes / turns", "runs per side", "OpenEnv loop s", "textenv s (server start included)",
          "textenv server start + stop s", "speed-up", "speed-up without start + stop", "CPU s (loop / textenv)", "equal episodes",
          "decoding path (loop / textenv)"]


def speed_ups(record: dict) -> tuple[float, float]:
    loop = statistics.median(record["seconds"]["loop"])
    textenv = statistics.median(record["seconds"]["textenv"])
    start = statistics.median(record["server_start_seconds"])
    return ratio(loop, textenv), ratio(loop, textenv - start)


def table(records: list[dict]) -> str:
    rows = []
    for record in records:
        with_start, without_start = speed_ups(record)
        comparison = record["comparison"]
        rows.append([shape_label(record["shape"]), f"{comparison['episodes']} / {record['turns']}", record["runs"],
                     spread(record["seconds"]["loop"]), spread(record["seconds"]["textenv"]), spread(record["server_start_seconds"]),
                     f"**{with_start:.2f}x**", f"{without_start:.2f}x",
                     f"{statistics.median(record['cpu_seconds']['loop']):.1f} / {statistics.median(record['cpu_seconds']['textenv']):.1f}",
                     f"{comparison['equal']}/{comparison['episodes']}", f"{record['decoding_path']['loop']} / {record['decoding_path']['textenv']}"])
    return markdown_table(HEADER, rows)


def summary_lines(records: list[dict]) -> list[str]:
    worst = min(records, key=lambda record: speed_ups(record)[0])
    with_start, without_start = speed_ups(worst)
    lines = [f"Worst case: {shape_label(worst['shape'])}, textenv {with_start:.2f}x the loop's speed ({without_start:.2f}x "
             "without its server's start and stop)."]
    for record in records:
        comparison = record["comparison"]
        line = (f"{shape_label(record['shape'])}: {comparison['equal']}/{comparison['episodes']} episodes equal on both sides "
                f"(messages, replies' text, observations, rewards, turns); rewards {sum(sum(e['rewards']) for e in record['episodes']['loop']):g} / "
                f"{sum(sum(e['rewards']) for e in record['episodes']['textenv']):g}, turns {record['turns']} / "
                f"{sum(e['turns'] for e in record['episodes']['textenv'])} (loop / textenv).")
        if comparison["first_difference"]:
            first = comparison["first_difference"]
            line += f" First difference: episode {first['episode']}, {', '.join(first['fields'])}."
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 run per side on two small shapes (the test's run)")
    parser.add_argument("--runs", type=int, default=None, help="runs per side and shape (default 2, 1 with --quick)")
    parser.add_argument("--model", default="bundled", help="bundled (SmolLM2-135M-Instruct), tiny (a random 2-layer model) or a folder")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=workload.NUM_THREADS,
                        help="torch threads (default 2; 1 avoids thread-barrier stalls on a busy machine)")
    args = parser.parse_args(argv)
    from textenv.environments.openenv_server import OpenEnvServer

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the servers import openenv_guess from here
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load(args.model)
    shapes, runs = (QUICK_SHAPES, args.runs or 1) if args.quick else (SHAPES, args.runs or 2)
    server = OpenEnvServer(APP, max_sessions=1)
    server.launch()
    try:
        asyncio.run(server.wait_until_ready())
        warm_up(model, tokenizer, server.url, args.max_new_tokens)
        records = [measure(model, tokenizer, server.url, shape, runs, args.max_new_tokens) for shape in shapes]
    finally:
        server.stop()
    print(f"OpenEnv environment `{APP}` ({args.model} model, float32, greedy, up to {args.max_new_tokens} new tokens per turn, "
          f"{args.threads} torch thread(s)); {workload.cpu_description()}.")
    print(table(records))
    print("\n".join(summary_lines(records)))
    result = {"model": args.model, "max_new_tokens": args.max_new_tokens, "threads": args.threads, "records": records}
    workload.emit(result)
    return result


if __name__ == "__main__":
    main()
