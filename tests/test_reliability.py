"""Fault isolation at scale and data that survives crashes.

* 1,000 gym episodes against an env that raises in 10% of resets/steps/closes, hangs in 5% of steps and
  returns malformed tuples in 5%: every episode is logged exactly once with its error, every env that
  was created is closed, nothing leaks, memory stays flat.
* `kill -9` in the middle of a rollout leaves only whole lines in completions.jsonl.
"""

import asyncio
import gc
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

from textenv.gym import Env, GymScheduler, ScriptedPolicy, envs
from textenv.gym.completions import read_completions

EPISODES = 1000
SCRIPTS = Path(__file__).parent / "scripts"


class FaultyEnv(Env):
    """Injects faults from a per-row seed and counts what it injected."""

    injected: Counter = Counter()
    created = closed = 0

    def __init__(self, env_config):
        super().__init__(env_config)
        self.rng = random.Random(env_config["seed"])
        self.faults: list[str] = []
        FaultyEnv.created += 1

    def _inject(self, fault):
        self.faults.append(fault)
        FaultyEnv.injected[fault] += 1

    async def reset(self, request):
        if self.rng.random() < 0.10:
            self._inject("reset_raises")
            raise RuntimeError("reset failed")
        return "Say something.", {"seed": self.env_config["seed"]}, "You are terse."

    async def step(self, messages):
        roll = self.rng.random()
        if roll < 0.10:
            self._inject("step_raises")
            raise RuntimeError("step failed")
        if roll < 0.15:
            self._inject("step_hangs")
            await asyncio.sleep(3600)
        if roll < 0.20:
            self._inject("step_malformed")
            return ("malformed", 1.0)
        return "Again.", 0.5, self.rng.random() < 0.3, {"roll": roll}

    async def close(self):
        FaultyEnv.closed += 1
        if self.rng.random() < 0.10:
            self._inject("close_raises")
            raise RuntimeError("close failed")


EXPECTED_ERROR = {
    "reset_raises": ("reset", "RuntimeError"),
    "step_raises": ("step", "RuntimeError"),
    "step_hangs": ("step", "EnvTimeoutError"),
    "step_malformed": ("step", "EnvContractError"),
    "close_raises": ("close", "RuntimeError"),
}


def _resources():
    process = psutil.Process()
    return {
        "threads": threading.active_count(),
        "children": len(process.children(recursive=True)),
        "fds": process.num_fds(),
    }


def _run_chaos(tokenizer, log_path, seeds):
    scheduler = GymScheduler(
        tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "Fine."),
        gym_env="faulty", max_turns=4, step_timeout=0.05, max_concurrency=200,
    )
    scheduler.run(({"env_config": {"seed": seed}} for seed in seeds), completions_path=log_path, keep_episodes=False)
    return scheduler.stats


def test_thousand_faulty_episodes_each_logged_once_closed_and_nothing_leaks(tokenizer, tmp_path):
    envs["faulty"] = FaultyEnv
    FaultyEnv.injected, FaultyEnv.created, FaultyEnv.closed = Counter(), 0, 0
    log_path = tmp_path / "completions.jsonl"
    try:
        _run_chaos(tokenizer, tmp_path / "warmup.jsonl", range(-50, 0))  # imports, caches, thread pools
        gc.collect()
        before = _resources()
        FaultyEnv.injected, FaultyEnv.created, FaultyEnv.closed = Counter(), 0, 0
        started = time.monotonic()
        first = _run_chaos(tokenizer, log_path, range(0, EPISODES // 2))
        gc.collect()
        rss_half = psutil.Process().memory_info().rss
        second = _run_chaos(tokenizer, log_path, range(EPISODES // 2, EPISODES))
        seconds = time.monotonic() - started
        gc.collect()
        rss_end = psutil.Process().memory_info().rss
        after = _resources()
    finally:
        envs.pop("faulty")

    records = read_completions(log_path)
    assert len(log_path.read_text().splitlines()) == len(records) == EPISODES
    seeds = sorted(r["trajectory_infos"][0]["seed"] for r in records if r["trajectory_infos"])
    assert len({r["trajectory_id"] for r in records}) == EPISODES
    assert FaultyEnv.created == FaultyEnv.closed == first.envs_closed + second.envs_closed == EPISODES

    # Replay each row's seed to know which faults it got, and check each one is recorded.
    recorded = Counter()
    episodes_with_faults = 0
    for record in records:
        stages_types = {(error["stage"], error["type"]) for error in record["errors"]}
        for stage_type in stages_types:
            recorded[stage_type] += 1
        if record["errors"]:
            episodes_with_faults += 1
            assert record["finish_reason"] == "error" and record["error"] is not None
        else:
            assert record["finish_reason"] in ("done", "max_turns")
    injected_by_error = Counter()
    for fault, count in FaultyEnv.injected.items():
        injected_by_error[EXPECTED_ERROR[fault]] += count
    assert recorded == injected_by_error
    for fault in EXPECTED_ERROR:
        assert FaultyEnv.injected[fault] > 0, f"no {fault} was injected"
    assert len(seeds) == EPISODES - FaultyEnv.injected["reset_raises"]

    assert after["threads"] <= before["threads"]
    assert after["children"] == before["children"]
    assert after["fds"] <= before["fds"]
    assert rss_end - rss_half < 30_000_000, "memory grew between the two halves of the run"
    print(
        f"\nchaos: {EPISODES} episodes in {seconds:.1f} s; faults injected {dict(FaultyEnv.injected)}; "
        f"episodes with errors {episodes_with_faults}; records {len(records)}; envs created/closed "
        f"{FaultyEnv.created}/{FaultyEnv.closed}; resources before {before} after {after}; "
        f"RSS half->end {(rss_end - rss_half) / 1e6:+.1f} MB"
    )


def test_kill_9_mid_rollout_leaves_only_whole_lines(tmp_path):
    log_path = tmp_path / "completions.jsonl"
    process = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "gym_rollout_until_killed.py"), str(log_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not log_path.exists() or log_path.stat().st_size < 2_000_000):
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    raw = log_path.read_bytes()
    assert len(raw) >= 2_000_000, "the rollout wrote too little before the deadline"
    assert raw.endswith(b"\n"), "the kill left a torn last line"
    lines = raw.decode("utf-8").splitlines()
    records = read_completions(log_path)
    assert len(records) == len(lines) > 50
    assert all(r["trajectory_infos"][1]["payload"] == "y" * 20000 for r in records)
