"""The README's own-environment example runs exactly as written (the code block after the
``<!-- example: own-environment -->`` marker, in a fresh process) and learns what its reward asks for.

The example samples from seeded streams, but the CPU's kernel level and the thread count change float rounding and
so which tokens are sampled: the check is on an effect large against that spread (measured here: the share of
brief replies rose from 4% to 38%, 24 episodes each), not on exact figures. `make test` runs it in the main half
(newest releases, 2 threads): on the lower-bound set with one thread (transformers 5.21) it did not gain the 15
points in 3 runs on 2026-11-26 (4% -> 0-8%, different rewards each run), a known gap still open.
"""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MARKER = "<!-- example: own-environment -->"
LEARNED_POINTS = 15  # percentage points the sampled share must rise by


def readme_block(marker: str) -> str:
    """The first ```python block after `marker` in the README."""
    text = README.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(marker):], re.DOTALL)
    assert match, f"no python block after {marker}"
    return match.group(1)


def test_the_own_environment_example_runs_as_written_and_learns(tmp_path):
    completed = subprocess.run([sys.executable, "-c", readme_block(MARKER)], cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert completed.returncode == 0, completed.stderr[-4000:]
    before, after = (int(value) for value in re.search(r"at most five words, sampled: (\d+)% -> (\d+)%", completed.stdout).groups())
    assert after >= before + LEARNED_POINTS, completed.stdout
