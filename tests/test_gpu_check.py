"""`make gpu-check` (`benchmarks/gpu_check.py`) on the CPU: the same code path as on a GPU, with tiny shapes (2 layers,
each shape's real vocabulary and tokenizer) of the SmolLM2 and Qwen3-0.6B shapes (the Qwen3-1.7B shape differs from
the 0.6B one only in its sizes). Every section is there: the environment, the CUDA tests (skipped here, counted), the
generation paths against the per-turn `generate` loop with equal replies (vLLM, not installed here, says so), the PPO
and GRPO steps (full and LoRA) beside TRL's GRPOTrainer on the same batch with time and peak memory, the goals (not
judged off a GPU); the goals' PASS / FAIL on made-up GPU results, the time budget and a row's time limit; and bad
flags are refused in one line naming the flag.

The run uses one torch thread (OMP_NUM_THREADS=1): on this 2-core machine, shared with other processes, two threads
made the tiny steps 20x slower."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "gpu_check.py"
SHAPES = ("smollm2", "qwen3-0.6b")
TRL_1_16 = Version(importlib.metadata.version("trl")) >= Version("1.16")
TRAINING_ROWS = ["ppo full", "ppo lora", "grpo full", "grpo lora", "trl-grpo full", "trl-grpo lora"]

sys.path[:0] = [str(ROOT / "benchmarks")]
import gpu_check  # noqa: E402
import gpu_report  # noqa: E402


def gpu_check_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    done = gpu_check_run("--device", "cpu", "--tiny", "--shapes", *SHAPES, "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "gpu-check.json").read_text()), (out / "gpu-check.md").read_text(), done.stdout


def test_every_section_is_reported(report):
    data, page, printed = report
    env = data["env"]
    assert env["card"] == "no GPU (CPU)" and env["torch"].startswith("2.") and env["trl"] == importlib.metadata.version("trl")
    assert env["vllm"] == ("not installed" if importlib.util.find_spec("vllm") is None else importlib.metadata.version("vllm"))
    (tests,) = data["cuda_tests"]
    assert "tests/test_ppo_cuda.py" in tests["modules"] and tests["exit_code"] == 0
    assert tests["counts"]["skipped"] >= 2 and tests["counts"]["passed"] == tests["counts"]["failed"] == 0, tests
    assert [row["name"] for row in data["shapes"]] == list(SHAPES) and all(row["parameters"] > 0 for row in data["shapes"])
    assert list(data["generation"]) == list(data["training"]) == list(SHAPES)
    assert data["settings"]["episodes"] == 4 and data["settings"]["turns"] == 2 and "cut_short" not in data
    for heading in ("## Environment", "## CUDA tests", "## Generation: smollm2", "## Training steps: qwen3-0.6b", "## Goals"):
        assert heading in page, heading
    assert page.startswith("# gpu-check: no GPU (CPU), ") and page.strip() in printed


def test_generation_paths_reply_as_the_generate_loop_and_vllm_says_it_is_not_installed(report):
    data = report[0]
    for shape, rows in data["generation"].items():
        paths = {row["name"]: row for row in rows}
        assert list(paths) == ["generate loop", "engine=textenv", "engine=transformers", "engine=vllm"], shape
        assert paths["generate loop"]["speedup"] == 1.0 and paths["engine=textenv"]["decoding_path"] == "textenv decoding loop"
        ran = [row for row in rows if "seconds" in row]
        assert {"generate loop", "engine=textenv"} <= {row["name"] for row in ran}, rows
        for row in ran:  # greedy on every path: the same token ids as the loop's, every episode and every reply
            assert row["seconds"] > 0 and row["equal_episodes"] == "4/4" and row["equal_replies"] == "8/8", (shape, row)
            assert row["peak_mib"] > 0 and row["speedup"] > 0
        transformers = paths["engine=transformers"]  # transformers' continuous batching, or why it is not there
        assert transformers.get("decoding_path", "").startswith("transformers continuous batching") or \
            transformers.get("unavailable", "").startswith("not available"), transformers
        if importlib.util.find_spec("vllm") is None:
            assert paths["engine=vllm"]["unavailable"].startswith("not installed") and "vllm" in paths["engine=vllm"]["unavailable"]
    assert "| engine=vllm | - |" in report[1] and "not installed (No module named 'vllm')" in report[1]


def test_training_rows_time_ppo_grpo_and_trls_step_with_peak_memory(report):
    data, page, _ = report
    for shape, rows in data["training"].items():
        assert [row["name"] for row in rows] == TRAINING_ROWS, shape
        for row in rows:
            if row["algorithm"] == "trl-grpo" and not TRL_1_16:  # the lower-bound half's TRL: the row says what it needs
                assert row["unavailable"].startswith("not available: trl ") and "make gpu-wheels" in row["unavailable"], row
                continue
            assert row["seconds"] > 0 and len(row["step_seconds"]) == 2 and row["rows"] in (4, 8), (shape, row)
            assert row["memory"] == "process peak RSS" and row["peak_mib"] > 0, row
            assert (row["trainable_parameters"] < 1e6) == (row["method"] == "lora"), row
    assert "| trl-grpo full |" in page and "| ppo lora |" in page
    assert all(result.startswith("not measured: not a GPU run") for result in data["goals"].values()), data["goals"]


def gpu_results(speedups: dict, grpo_seconds: float | None, trl_seconds: float | None) -> dict:
    """Made-up results of a GPU run (not tiny) on the goals' shape."""
    generation = [{"name": "generate loop", "seconds": 10.0, "speedup": 1.0}]
    generation += [{"name": name, "seconds": 10.0 / value, "speedup": value} for name, value in speedups.items()]
    training = [{"name": "grpo full", "seconds": grpo_seconds}] if grpo_seconds else [{"name": "grpo full", "error": "OutOfMemoryError"}]
    training += [{"name": "trl-grpo full", "seconds": trl_seconds}] if trl_seconds else [{"name": "trl-grpo full", "unavailable": "not installed (trl)"}]
    return {"settings": {"device": "cuda", "tiny": False}, "generation": {"qwen3-0.6b": generation}, "training": {"qwen3-0.6b": training}}


def test_goals_pass_fail_and_not_measured():
    passed = gpu_report.goals(gpu_results({"engine=textenv": 0.7, "engine=transformers": 3.4}, 1.0, 1.5))
    assert passed[gpu_report.GENERATION_GOAL].startswith("PASS: best engine=transformers")
    assert passed[gpu_report.GRPO_GOAL].startswith("PASS: 1 s against TRL's 1.5 s")
    failed = gpu_report.goals(gpu_results({"engine=textenv": 2.9}, 2.0, 1.5))
    assert failed[gpu_report.GENERATION_GOAL].startswith("FAIL") and failed[gpu_report.GRPO_GOAL].startswith("FAIL")
    missing = gpu_report.goals(gpu_results({}, None, None))
    assert missing[gpu_report.GENERATION_GOAL] == "not measured: its rows did not run"
    assert missing[gpu_report.GRPO_GOAL] == "not measured: grpo full: OutOfMemoryError; trl-grpo full: not installed (trl)"


def test_a_row_past_its_limit_is_skipped_and_the_check_goes_on(tmp_path):
    args = gpu_check.parse_args(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--budget-s", "60"])
    check = gpu_check.Check(args, {"device": "cpu", "dtype": "float32", "tiny": True, "episodes": 4, "turns": 2, "max_new_tokens": 8,
                                   "timed_steps": 2, "budget_s": 60}, planned_rows=2)
    started = time.perf_counter()
    slow = check.run_row(("training", "smollm2"), "ppo full", lambda: time.sleep(30) or {}, limit=0.3, algorithm="ppo")
    assert time.perf_counter() - started < 5 and slow["skipped"].startswith("skipped: ran past its time limit"), slow
    failing = check.run_row(("training", "smollm2"), "grpo full", lambda: 1 / 0)
    assert failing["error"] == "ZeroDivisionError: division by zero"
    check.budget_s = 0  # the budget spent: a row is not started
    spent = check.run_row(("training", "smollm2"), "grpo lora", lambda: pytest.fail("a row ran after the budget"))
    assert spent["skipped"] == "skipped: the time budget (0 s) was spent"
    written = json.loads((tmp_path / "gpu-check.json").read_text())  # written after every row
    assert [row["name"] for row in written["training"]["smollm2"]] == ["ppo full", "grpo full", "grpo lora"]
    assert "| ppo full | - | - | - | - | - | skipped: ran past its time limit" in (tmp_path / "gpu-check.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--shapes", "qwen9"], "--shapes: unknown qwen9; choose from smollm2, qwen3-0.6b, qwen3-1.7b"),
    (["--sections", "speed"], "--sections: unknown speed; choose from env, cuda-tests, generation, training"),
    pytest.param(["--device", "cuda"], "--device cuda: torch sees no CUDA device here",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here")),
])
def test_bad_flags_are_refused_in_one_line(flags, message):
    done = gpu_check_run(*flags, "--out", "/nonexistent/never-written")
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
