"""`benchmarks/openenv_side.py`: an OpenEnv environment played by textenv and by the loop of OpenEnv's documentation,
run for real in its quick mode on a tiny random model (servers started as in the benchmark): both sides play equal
episodes, and the report has the figures side by side."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="neither openenv (textenv[openenv]) nor openenv-core is installed")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import openenv_side  # noqa: E402


def test_the_quick_run_plays_equal_episodes_on_both_sides_and_reports_the_figures(capsys):
    result = openenv_side.main(["--quick", "--model", "tiny", "--max-new-tokens", "4", "--threads", "1"])
    output = capsys.readouterr().out
    records = result["records"]
    assert [tuple(record["shape"]) for record in records] == list(openenv_side.QUICK_SHAPES)
    for record in records:
        rows, generations, max_turns = record["shape"]
        loop, textenv = record["episodes"]["loop"], record["episodes"]["textenv"]
        assert len(loop) == len(textenv) == rows * generations
        assert loop == textenv and record["comparison"] == {"episodes": rows * generations, "equal": rows * generations, "first_difference": None}
        assert all(1 <= episode["turns"] <= max_turns and len(episode["rewards"]) == episode["turns"] for episode in loop)
        assert all(len(episode["observations"]) == episode["turns"] + 1 for episode in loop)
        assert [message["role"] for message in loop[0]["messages"][:3]] == ["system", "user", "assistant"]
        assert len(record["seconds"]["loop"]) == len(record["seconds"]["textenv"]) == len(record["server_start_seconds"]) == 1
        assert record["decoding_path"]["loop"] == openenv_side.LOOP_PATH
    header, _, *rows = output[output.index("| shape |"):].split("\n\n")[0].splitlines()[:4]
    assert header == "| " + " | ".join(openenv_side.HEADER) + " |"
    assert len(rows) == 2 and all(row.count("|") == len(openenv_side.HEADER) + 1 for row in rows)
    assert "| 2 rows x 1 gen., max 3 turns | 2 / " in rows[0] and "| 2/2 |" in rows[0] and "**" in rows[0]
    assert "Worst case: " in output and "2/2 episodes equal on both sides" in output
    assert output.count("BENCH_RESULT ") == 1
