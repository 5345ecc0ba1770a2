"""`accelerate launch --num_processes 2 textenv train` on the CPU (gloo): both ranks train in lockstep (equal
weights, checked by the command), rank 0 alone logs and writes completions.jsonl, and the run resumes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DDP_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "accelerate" / "ddp.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    textenv_script = shutil.which("textenv", path=str(Path(sys.executable).parent))
    command = [
        # The README's recipe: the DDP config on a machine without CUDA starts CPU processes on gloo (MULTI_CPU).
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(DDP_CONFIG), "--main_process_port", str(_free_port()),
        textenv_script, "train", *arguments,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=500, cwd=tmp_path)


@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_two_processes_train_resume_and_log_once(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"query": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(8)) + "\n")
    common = [
        "--model_name_or_path", "tiny", "--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env", "--steps", "4",
        "--batch_size", "2", "--mini_batch_size", "1", "--max_new_tokens", "4", "--no_progress", "--output_dir", str(tmp_path / "out"),
    ]
    first = launch(tmp_path, *common, "--save_steps", "1")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count("trained weights identical on 2 process(es)") == 1  # checked on both, logged by rank 0
    assert first.stdout.count("step 1: reward_mean") == 1 and first.stdout.count("step 2: reward_mean") == 1
    completions = (tmp_path / "out" / "completions.jsonl").read_text().splitlines()
    assert len(completions) == 4  # rank 0's 2 episodes per step, 2 steps; one file
    state = json.loads((tmp_path / "out" / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["num_processes"] == 2 and len(state["run"]["sources"]) == 2

    resumed = launch(tmp_path, *common, "--resume_from_checkpoint", "latest")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "after 2 steps" in resumed.stdout  # latest = checkpoint-2
    assert "steps=0" in resumed.stdout  # nothing left to run after the last checkpoint
