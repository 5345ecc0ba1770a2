"""The `textenv rollout` command and `textenv train --task gym` (tiny model), and the subcommand table."""

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
    assert set(SUBCOMMANDS) == {"rollout", "train", "demo", "serve", "check-model", "view"}
    help_text = build_parser().format_help()
    assert all(name in help_text for name in SUBCOMMANDS)


def test_an_unknown_command_names_the_commands(capsys):
    with pytest.raises(ValueError, match="no command 'train-gym'; choose one of demo, train, rollout, serve, check-model, view"):
        run_command(["train-gym", "--steps", "1"])


def test_rollout_refuses_a_run_without_a_dataset():
    with pytest.raises(ValueError, match="no rows to play: give --dataset"):
        run_command(["rollout", "--model", "tiny"])


def test_rollout_command(rows_file, tmp_path, capsys):
    out = tmp_path / "completions.jsonl"
    summary = run_command([
        "rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env",
        "--external_plugins", str(PLUGIN), "--max_turns", "2", "--max_new_tokens", "3",
        "--loss_scale", "last_round", "--output", str(out), "--no_progress", "--temperature", "0",
    ])
    assert summary["episodes"] == 3 and summary["errors"] == 0
    records = read_completions(out)
    assert sorted(r["env"] for r in records) == ["guess_env", "guess_env", "math_env"]
    assert all(r["num_turns"] in (1, 2) and r["trajectory_infos"] for r in records)
    assert "episodes=3" in capsys.readouterr().out
    again = tmp_path / "again.jsonl"
    run_command(["rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env", "--external_plugins", str(PLUGIN),
                 "--max_turns", "2", "--max_new_tokens", "3", "--output", str(again), "--no_progress", "--temperature", "0"])
    greedy = lambda path: sorted((r["env"], json.dumps(r["messages"])) for r in read_completions(path))  # noqa: E731
    assert greedy(out) == greedy(again)  # --temperature 0 decodes greedily


def test_rollout_refuses_an_unknown_gym_env_option_in_one_line(rows_file, tmp_path, capsys):
    exit_code = main(["rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "nope", "--external_plugins", str(PLUGIN)])
    error = capsys.readouterr().err
    assert exit_code == 2 and error.count("\n") == 1
    assert error.startswith("textenv rollout: error: --gym_env nope: Environment 'nope' not found") and "guess_env" in error


def test_rollout_unknown_env_of_a_row_is_recorded_per_episode(rows_file, tmp_path):
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    rows[1]["env_config"] = {"name": "nope"}
    rows_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "c.jsonl"
    exit_code = main([
        "rollout", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env",
        "--external_plugins", str(PLUGIN), "--max_turns", "1", "--max_new_tokens", "2", "--output", str(out), "--no_progress",
    ])
    assert exit_code == 0
    by_env = {r["env"]: r for r in read_completions(out)}
    assert "Environment 'nope' not found" in by_env["nope"]["error"]["message"]
    assert "guess_env" in by_env["nope"]["error"]["message"]
    assert by_env["guess_env"]["error"] is None


def test_train_gym_task(rows_file, tmp_path):
    summary = run_command([
        "train", "--task", "gym", "--model", "tiny", "--dataset", str(rows_file), "--gym_env", "math_env",
        "--external_plugins", str(PLUGIN), "--max_turns", "2", "--max_new_tokens", "3", "--temperature", "1.0",
        "--ppo_steps", "2", "--batch_size", "2", "--mini_batch_size", "1", "--ppo_epochs", "1", "--max_concurrency", "1",
        "--output_dir", str(tmp_path), "--no_progress",
    ])
    assert summary["steps"] == 2 and len(summary["reward_means"]) == 2
    assert [r["step"] for r in read_completions(tmp_path / "completions.jsonl")] == [0, 0, 1, 1]
    assert any((tmp_path / "final").iterdir())
