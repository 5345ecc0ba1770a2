"""The `textenv rollout` / `textenv train-gym` commands (tiny model) and the subcommand table."""

import json
from pathlib import Path

import pytest

from textenv.cli import SUBCOMMANDS, build_parser, main, run_command
from textenv.gym import read_completions

PLUGIN = Path(__file__).parent / "plugins" / "gym_guess_plugin.py"


@pytest.fixture()
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [
        {"secret": 3, "env_config": {"name": "guess_env"}},
        {"problem": "What is 2+2?", "solution": "4"},  # falls back to --gym_env
        {"secret": 4, "env_config": {"name": "guess_env"}, "ctx_config": {"name": "keep_last_round"}},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_subcommand_table():
    assert {"rollout", "train-gym", "demo"} <= set(SUBCOMMANDS)
    help_text = build_parser().format_help()
    assert "rollout" in help_text and "train-gym" in help_text


def test_rollout_command(rows_file, tmp_path, capsys):
    out = tmp_path / "completions.jsonl"
    summary = run_command([
        "rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env",
        "--external_plugins", str(PLUGIN), "--max_turns", "2", "--max_new_tokens", "3",
        "--loss_scale", "last_round", "--output", str(out), "--no_progress",
    ])
    assert summary["episodes"] == 3 and summary["errors"] == 0
    records = read_completions(out)
    assert sorted(r["env"] for r in records) == ["guess_env", "guess_env", "math_env"]
    assert all(r["num_turns"] in (1, 2) and r["trajectory_infos"] for r in records)
    assert "episodes=3" in capsys.readouterr().out


def test_rollout_unknown_env_is_recorded_per_episode(rows_file, tmp_path):
    out = tmp_path / "c.jsonl"
    exit_code = main([
        "rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "nope",
        "--external_plugins", str(PLUGIN), "--max_turns", "1", "--max_new_tokens", "2", "--output", str(out), "--no_progress",
    ])
    assert exit_code == 0
    by_env = {r["env"]: r for r in read_completions(out)}
    assert "Environment 'nope' not found" in by_env["nope"]["error"]["message"]
    assert "guess_env" in by_env["nope"]["error"]["message"]
    assert by_env["guess_env"]["error"] is None


def test_train_gym_command(rows_file, tmp_path):
    out = tmp_path / "completions.jsonl"
    summary = run_command([
        "train-gym", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env",
        "--external_plugins", str(PLUGIN), "--max_turns", "2", "--max_new_tokens", "3", "--temperature", "1.0",
        "--steps", "2", "--ppo_batch_size", "2", "--ppo_epochs", "1", "--output", str(out),
        "--save_dir", str(tmp_path / "model"), "--no_progress",
    ])
    assert summary["steps"] == 2 and len(summary["reward_means"]) == 2
    assert [r["step"] for r in read_completions(out)] == [0, 0, 1, 1]
    assert any((tmp_path / "model").iterdir())
