"""The gym example runs end to end on the bundled model (small setting): rollout -> PPO step -> completions.jsonl."""

import importlib.util
from pathlib import Path

import pytest

from textenv.gym import read_completions

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gym_env.py"


@pytest.mark.slow
def test_gym_example_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TEXTENV_SMALL", "1")
    spec = importlib.util.spec_from_file_location("gym_env_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "1", "--output", str(tmp_path)])
    assert result["lines"] == 2 and result["trained_tokens"] > 0
    assert result["kl"] == pytest.approx(0.0, abs=1e-3)  # the first step starts at the reference model
    records = read_completions(tmp_path / "completions.jsonl")
    assert [r["env"] for r in records] == ["capitals", "capitals"]
    assert all(r["trajectory_infos"][0]["word"] in ("apple", "river") for r in records)
    assert "PPO:" in capsys.readouterr().out
