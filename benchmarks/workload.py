"""What both benchmark sides share: the calculator task, its prompt and tool, the fixed inputs, and how
measurements are taken and printed.

This module is imported by `legacy_side.py` (legacy venv: trl 0.11.4, transformers 4.46.3) and by
`textenv_side.py` (main venv), so it uses only the standard library and torch.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import random
import re
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

NUM_THREADS = 2
TOOL_NAME = "SimpleCalculatorTool"
STOP_STRINGS = ("<call>", "<submit>")

# The 2-shot prompt of trl's examples/research_projects/tools/calculator.py (v0.11.4).
CALCULATOR_PROMPT = """\
What is 13-3?

<request><SimpleCalculatorTool>13-3<call>10.0<response>

Result=10<submit>

What is 4*3?

<request><SimpleCalculatorTool>4*3<call>12.0<response>

Result=12<submit>"""

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_RESULT_PATTERN = re.compile(r"Result\s*=\s*(-?\d+(\.\d+)?)\s*<submit>")


def make_calculator_tasks(count: int, seed: int) -> tuple[list[str], list[float]]:
    """Seeded tasks `"\\n\\nWhat is {a} {op} {b}?"` (a, b in [0, 50), op in - + *) and their answers."""
    rng = random.Random(seed)
    queries, answers = [], []
    for _ in range(count):
        a, b, op = rng.randrange(50), rng.randrange(50), rng.choice("-+*")
        queries.append(f"\n\nWhat is {a} {op} {b}?")
        answers.append(float({"-": a - b, "+": a + b, "*": a * b}[op]))
    return queries, answers


def simple_calculator(query: str) -> str:
    """The legacy example tool's behaviour: arithmetic on + - * /, result shown as a float ("10.0")."""

    def evaluate(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -evaluate(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError("unsupported expression")

    try:
        return str(round(evaluate(ast.parse(query.strip(), mode="eval").body), 4))
    except Exception as error:  # noqa: BLE001 - a tool answers with text
        return f"Error: {type(error).__name__}"


def exact_match_reward(last_segments: list[str], answers: list[float]) -> list[float]:
    """1.0 when `Result=<number><submit>` is within 0.01 of the answer, else 0.0 (plain floats)."""
    rewards = []
    for text, answer in zip(last_segments, answers):
        match = _RESULT_PATTERN.search(text)
        rewards.append(1.0 if match and abs(float(match.group(1)) - answer) < 0.01 else 0.0)
    return rewards


# The `turns` workload: the same tool and syntax, with a one-shot prompt of eight chained calls. The
# model copies the pattern, so episodes really run for eight turns (with the 2-shot calculator prompt
# every episode is over after two turns, and max_turns 4 or 8 would measure nothing).
CHAIN_PROMPT = "Add 7 eight times, starting at 5.\n\n" + "".join(
    f"<request><SimpleCalculatorTool>{5 + 7 * step}{'.0' if step else ''}+7<call>{5 + 7 * (step + 1)}.0<response>\n\n"
    for step in range(8)
) + "Result=61<submit>"


def make_chain_tasks(count: int, seed: int) -> tuple[list[str], list[float]]:
    """Seeded tasks `"\n\nAdd {k} eight times, starting at {s}."` and their answers."""
    rng = random.Random(seed)
    queries, answers = [], []
    for _ in range(count):
        step, start = rng.randrange(2, 10), rng.randrange(1, 50)
        queries.append(f"\n\nAdd {step} eight times, starting at {start}.")
        answers.append(float(start + 8 * step))
    return queries, answers


def greedy_generation_kwargs(max_new_tokens: int, eos_token_id: int) -> dict[str, Any]:
    """Greedy variant of the legacy examples' kwargs (they never stop on EOS: `eos_token_id=-1`)."""
    return {"do_sample": False, "max_new_tokens": max_new_tokens, "pad_token_id": eos_token_id, "eos_token_id": -1}


# ---------------------------------------------------------------------------------------- measuring
def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    """This process's resident set size now, in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def cpu_seconds() -> float:
    """CPU time used by this process so far (user + system, all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def stopwatch(record: dict[str, Any], key: str) -> Iterator[None]:
    """Store the wall time of the block in `record[key]` and its CPU time in `record[key + "_cpu"]`
    (seconds). CPU time is less disturbed by other processes on a shared machine."""
    start, start_cpu = time.perf_counter(), cpu_seconds()
    yield
    record[key] = time.perf_counter() - start
    record[key + "_cpu"] = cpu_seconds() - start_cpu


class TurnTimer:
    """Wraps an environment's `generate(histories)` to time each model turn and count its episodes.

    Each turn records its own generation time, the number of episodes still running, and the time
    elapsed since the run started (`run_started` is set by the caller right before `env.run`).
    """

    def __init__(self, env: Any):
        self.turns: list[dict[str, float]] = []
        self.run_started = time.perf_counter()
        self._generate = env.generate
        env.generate = self

    def __call__(self, histories):
        active = sum(1 for history in histories if not history.completed)
        start = time.perf_counter()
        result = self._generate(histories)
        end = time.perf_counter()
        self.turns.append({"seconds": end - start, "episodes": active, "elapsed": end - self.run_started})
        return result


def timed_run(env: Any, inputs: dict[str, Any], time_turns: bool = True) -> dict[str, Any]:
    """Run `env.run(queries, answers=...)` once and record time, tokens, per-turn times and episodes.

    ``time_turns=False`` leaves `env.generate` alone: textenv then runs each episode at its own pace (a
    wrapped `generate` makes it take turns in lockstep, as legacy TRL does), and no per-turn times exist.
    """
    timer = TurnTimer(env) if time_turns else None
    record: dict[str, Any] = {"max_turns": env.max_turns}
    if timer is not None:
        timer.run_started = time.perf_counter()
    with stopwatch(record, "seconds"):
        _, _, masks, rewards, histories = env.run(inputs["queries"], answers=inputs["answers"])
    record["generated_tokens"] = int(sum(int(mask.sum()) for mask in masks))
    record["turns"] = timer.turns if timer is not None else None
    record["rewards"] = [float(reward) for reward in rewards]
    record["episodes"] = [episode_record(history) for history in histories]
    return record


def episode_record(history: Any) -> dict[str, Any]:
    """Exact segments of one TextHistory: token ids, whether the model wrote them, completion flags."""
    segments = []
    for (start, end), system in zip(history.token_spans, history.system_spans):
        segments.append({"system": bool(system), "ids": history.tokens[start:end].tolist()})
    return {"segments": segments[1:], "query_length": len(segments[0]["ids"]), "completed": bool(history.completed)}


def emit(result: dict[str, Any]) -> None:
    """Print the one JSON line the orchestrator reads (prefixed so library chatter cannot be confused), with
    the CPU it was measured on (`cpu`: kernel level and bf16 nativeness)."""
    sys.stdout.write("BENCH_RESULT " + json.dumps({**result, "cpu": cpu_description()}) + "\n")
    sys.stdout.flush()


def cpu_description() -> str:
    """This CPU, the kernels torch runs on it and whether bf16 is native (`textenv/hardware.py`, loaded by its
    path: the legacy venv has no textenv, and the module needs only torch)."""
    name = "textenv_hardware"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "textenv" / "hardware.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name].describe_cpu()


def read_json(path: str | Path) -> Any:
    with open(path) as file:
        return json.load(file)


# ---------------------------------------------------------------------------------------- PPO batch
def make_varied_ppo_batch(vocab_size: int, rows: int = 8, seed: int = 0) -> dict[str, list]:
    """A PPO batch whose rows share no prompt: queries of 80-101 and responses of 56-70 token ids drawn
    from [100, vocab_size), each response with a tool mask (first third 1, the next quarter 0 like a
    tool's output, the rest 1), scores in [0, 1); all from `random.Random(seed)`."""
    rng = random.Random(seed)
    batch: dict[str, list] = {"queries": [], "responses": [], "masks": [], "scores": []}
    for _ in range(rows):
        query_length, response_length = rng.randint(80, 101), rng.randint(56, 70)
        batch["queries"].append([rng.randrange(100, vocab_size) for _ in range(query_length)])
        batch["responses"].append([rng.randrange(100, vocab_size) for _ in range(response_length)])
        model_part, tool_part = response_length // 3, response_length // 4
        batch["masks"].append([1] * model_part + [0] * tool_part + [1] * (response_length - model_part - tool_part))
        batch["scores"].append(rng.random())
    return batch


def ppo_batch_tensors(batch: dict) -> tuple[list, list, list, list]:
    """`(queries, responses, scores, masks)` as the lists of tensors `PPOTrainer.step` takes."""
    import torch

    queries = [torch.tensor(ids, dtype=torch.long) for ids in batch["queries"]]
    responses = [torch.tensor(ids, dtype=torch.long) for ids in batch["responses"]]
    masks = [torch.tensor(mask, dtype=torch.long) for mask in batch["masks"]]
    scores = [torch.tensor(score, dtype=torch.float32) for score in batch["scores"]]
    return queries, responses, scores, masks


def timed_ppo_steps(trainer: Any, batch: dict) -> dict[str, Any]:
    """Two `trainer.step` calls on the same batch: a warm-up (its one-time allocations: optimizer state,
    gradient buffers, the reference model's first pass) and the timed step, whose time and stats are
    reported (steady-state training). `peak_rss_mb` is the process's high-water mark, over both steps."""
    queries, responses, scores, masks = ppo_batch_tensors(batch)
    result: dict[str, Any] = {}
    with stopwatch(result, "first_step_seconds"):
        trainer.step(queries, responses, scores, response_masks=masks)
    result["rss_before_step_mb"] = current_rss_mb()
    with stopwatch(result, "seconds"):
        stats = trainer.step(queries, responses, scores, response_masks=masks)
    result["stats"] = jsonable_stats(stats)
    result["generated_tokens"] = int(sum(int(mask.sum()) for mask in masks))
    result["peak_rss_mb"] = peak_rss_mb()
    return result


def jsonable_stats(stats: dict) -> dict[str, Any]:
    """Stats as JSON: scalars as floats, arrays as (flat) lists of floats."""
    import numpy as np
    import torch

    result = {}
    for key, value in stats.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().float().cpu().numpy()
        array = np.asarray(value, dtype=np.float64)
        result[key] = float(array) if array.ndim == 0 else array.ravel().tolist()
    return result
