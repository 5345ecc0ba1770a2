"""`benchmarks/transcript_bench.py` at a smoke size: one row per template and turn count (a family's own vocabulary or
a marked stand-in), every way timed, the ratio that of the first two's medians."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_transcript_benchmark_prints_a_row_per_template_and_turn_count():
    command = [sys.executable, str(ROOT / "benchmarks" / "transcript_bench.py"), "--templates", "qwen2_5", "gemma4_v5",
               "--turns", "2", "3", "--repeats", "1"]
    lines = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()
    assert lines[0].split()[:3] == ["template", "vocabulary", "turns"]
    rows = [line.split() for line in lines[1:]]
    assert [(row[0], row[-5]) for row in rows] == [("qwen2_5", "2"), ("qwen2_5", "3"), ("gemma4_v5", "2"), ("gemma4_v5", "3")]
    assert "(stand-in)" in lines[3] and "(stand-in)" not in lines[1]
    for row in rows:
        textenv, before, ratio, no_continuation = map(float, row[-4:])
        assert textenv > 0 and before > 0 and no_continuation > 0
        # the ratio of the unrounded medians: within what the printed figures (to 0.1 ms, 0.01) allow
        assert (textenv - 0.05) / (before + 0.05) - 0.005 <= ratio <= (textenv + 0.05) / (before - 0.05) + 0.005
