"""`textenv rollout` / `textenv train --task verifiers --env_id ID --env_args JSON` and examples/verifiers_env.py:
a verifiers environment from the command line, with the errors that name the fix."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the verifiers tests need textenv[verifiers]")
pytest.importorskip("verifiers.legacy", reason="the classic verifiers tests need verifiers 0.3 (textenv[verifiers]); 0.4 has only v1")

from textenv.cli import run_command  # noqa: E402
from textenv.gym import read_completions  # noqa: E402
from textenv.view import load_run  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENV_ARGS = json.dumps({"num_train_examples": 8, "num_eval_examples": 3})


@pytest.fixture(autouse=True)
def arithmetic_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES / "verifiers"))


def test_rollout_plays_the_environments_eval_rows(tmp_path):
    out = tmp_path / "completions.jsonl"
    summary = run_command(["rollout", "--model", "tiny", "--task", "verifiers", "--env_id", "arithmetic", "--env_args", ENV_ARGS,
                           "--max_new_tokens", "4", "--output", str(out), "--no_progress", "--num_generations", "2"])
    assert summary["episodes"] == 6 and summary["errors"] == 0
    records = read_completions(out)
    assert {record["env"] for record in records} == {"arithmetic"} and all("final_reward" in record for record in records)
    infos = [record["trajectory_infos"][-1] for record in records]
    assert all(set(info["metrics"]) == {"last_number_is_right", "short_reply", "num_turns"} for info in infos)
    assert records[0]["messages"][0] == {"role": "system", "content": "Work out the result. End your reply with the number."}


def test_train_grpo_on_a_verifiers_environment(tmp_path):
    run_command(["train", "--task", "verifiers", "--env_id", "arithmetic", "--env_args", ENV_ARGS, "--model", "tiny",
                 "--algorithm", "grpo", "--num_generations", "2", "--batch_size", "4", "--mini_batch_size", "4", "--ppo_steps", "1",
                 "--max_new_tokens", "4", "--output_dir", str(tmp_path), "--no_progress"])
    records = read_completions(tmp_path / "completions.jsonl")
    assert len(records) == 4 and all(record["trajectory_infos"][-1]["stop_condition"] == "max_turns_reached" for record in records)


@pytest.mark.parametrize("argv, error, message", [
    (["--env_id", "arithmetic"], ValueError, "--task verifiers needs --env_id.*and --env_id needs --task verifiers"),
    (["--task", "verifiers"], ValueError, "--task verifiers needs --env_id"),
    (["--task", "verifiers", "--env_id", "arithmetic", "--max_turns", "2"], ValueError, r"--max_turns 2 with --env_id.*--env_args"),
    (["--task", "verifiers", "--env_id", "arithmetic", "--env_args", "{num: 1}"], ValueError, "--env_args '{num: 1}' is not JSON"),
    (["--task", "verifiers", "--env_id", "arithmetic", "--env_args", "[1]"], ValueError, "is a JSON list; give an object"),
    (["--task", "verifiers", "--env_id", "no-such-env"], ModuleNotFoundError, "no module 'no_such_env' is installed.*prime env install"),
])
def test_command_line_mistakes_name_the_fix(argv, error, message, tmp_path):
    with pytest.raises(error, match=message):
        run_command(["rollout", "--model", "tiny", "--output", str(tmp_path / "c.jsonl"), "--no_progress", *argv])


def test_verifiers_example_end_to_end(tmp_path, capsys):
    main = runpy.run_path(str(EXAMPLES / "verifiers_env.py"))["main"]
    result = main(["--model", "tiny", "--ppo_steps", "1", "--batch_size", "4", "--mini_batch_size", "4", "--num_generations", "2", "--eval_tasks", "2",
                   "--max_new_tokens", "4", "--threads", "0", "--no_progress", "--output_dir", str(tmp_path), "--env_args", ENV_ARGS])
    assert len(result["train_rewards"]) == 1 and all(0.0 <= result[key] <= 1.0 for key in ("greedy_before", "greedy_after"))
    phases = sorted({episode["phase"] for episode in load_run(tmp_path).episodes})
    assert phases == ["eval-after-greedy", "eval-after-sampled", "eval-before-greedy", "eval-before-sampled", "train"]
    assert "arithmetic: held-out tasks solved of 2" in capsys.readouterr().out


def test_the_documented_verifiers_example_runs_as_written():
    import subprocess
    import sys

    from tests.docs_blocks import example_source

    completed = subprocess.run([sys.executable, "-c", example_source("guides/verifiers.md", "<!-- example: verifiers -->")], cwd=EXAMPLES.parent,
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line for line in completed.stdout.splitlines() if " -> " in line]
    assert len(lines) == 8 and all("'last_number_is_right'" in line for line in lines)
