"""`make gpu-check` (`benchmarks/gpu_check.py`) on the CPU: the same code path as on a GPU, with tiny shapes of the
three model shapes. Every section is there: the environment, the CUDA tests (skipped here, counted), the generation
paths against the per-turn `generate` loop (vLLM, not installed here, says so), the PPO and GRPO steps (full and LoRA)
and TRL's GRPO step on the same batch, the goals (not measured off a GPU); and bad flags are refused in one line."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

TRL_1_16 = Version(importlib.metadata.version("trl")) >= Version("1.16")
ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "gpu_check.py"


def gpu_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    done = gpu_check("--device", "cpu", "--tiny", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((out / "gpu-check.json").read_text()), (out / "gpu-check.md").read_text(), done.stdout


def test_every_section_is_reported(report):
    data, page, printed = report
    assert data["env"]["card"] == "no GPU (CPU)" and data["env"]["torch"].startswith("2.") and data["env"]["vllm"] == "not installed"
    tests = data["cuda_tests"]
    assert "tests/test_ppo_cuda.py" in tests["modules"] and tests["exit_code"] == 0 and tests["skipped"] >= 1 and "passed" not in tests
    assert set(data["generation"]) == set(data["training"]) == {"smollm2", "qwen3-0.6b", "qwen3-1.7b"}
    assert page.startswith("# gpu-check, ") and page.strip() in printed


def test_generation_rows_time_every_path_and_say_why_one_cannot_run(report):
    data = report[0]
    for shape, rows in data["generation"].items():
        paths = {row["path"]: row for row in rows}
        assert list(paths) == ["generate loop", "engine=textenv", "engine=transformers", "engine=vllm"], shape
        for label in ("generate loop", "engine=textenv", "engine=transformers"):
            assert paths[label]["seconds"] > 0 and re.fullmatch(r"[0-4]/4", paths[label]["equal_episodes"]), (shape, paths[label])
        assert paths["generate loop"]["speedup"] == 1.0
        assert paths["engine=textenv"]["decoding_path"] == "textenv decoding loop"
        assert paths["engine=transformers"]["decoding_path"].startswith("transformers continuous batching")
        assert "vllm" in paths["engine=vllm"]["error"]


def test_training_rows_time_ppo_grpo_and_trls_step_on_the_same_batch(report):
    data, page, _ = report
    for shape, rows in data["training"].items():
        timed = {(row["algorithm"], row["method"]): row for row in rows}
        assert set(timed) == {("ppo", "full"), ("ppo", "lora"), ("grpo", "full"), ("grpo", "lora"), ("trl-grpo", "full")}, shape
        trl_row = timed.pop(("trl-grpo", "full"))
        assert all(row.get("seconds", 0) > 0 and row["peak_mib"] is None for row in timed.values()), rows
        if TRL_1_16:  # the TRL side is TRL 1.16's GRPOTrainer; an older TRL (the lower-bound half) says why it cannot run
            assert trl_row["seconds"] > 0 and trl_row["peak_mib"] is None, trl_row
        else:
            assert "trl" in trl_row["error"].lower(), trl_row
    assert "| trl-grpo | full |" in page and "n/a (CPU)" in page
    assert set(data["goals"].values()) == {"not measured: not a GPU run"} and "Goals:" in page


@pytest.mark.parametrize("flags, message", [(["--shapes", "qwen9"], "--shapes: unknown qwen9; choose from smollm2, qwen3-0.6b, qwen3-1.7b"),
                                            (["--sections", "speed"], "--sections: unknown speed"),
                                            pytest.param(["--device", "cuda"], "--device cuda: torch sees no CUDA device here",
                                                         marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here"))])
def test_bad_flags_are_refused_in_one_line(flags, message):
    done = gpu_check(*flags, "--out", "/nonexistent/never-written")
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
