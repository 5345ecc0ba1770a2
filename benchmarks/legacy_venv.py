"""Create (once) the legacy virtual environment: trl 0.11.4 on transformers 4.46.3.

torch is installed first, pinned to the main venv's version (`pip install torch==2.13.0` takes the local
CPU wheel; an unpinned torch would pull gigabytes of CUDA packages), then the legacy stack, and the
install is checked not to have replaced torch.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

LEGACY_VENV = Path(__file__).resolve().parent / ".legacy-venv"
TORCH_REQUIREMENT = "torch==2.13.0"
# accelerate 1.1.1 is the release current with transformers 4.46.3 (Nov 2024); rich is imported by
# trl 0.11.4 at module level. `datasets` comes in as a dependency of trl.
LEGACY_REQUIREMENTS = ("trl==0.11.4", "transformers==4.46.3", "accelerate==1.1.1", "rich")
READY_MARKER = ".textenv-benchmark-ready"


def legacy_python() -> Path:
    return LEGACY_VENV / "bin" / "python"


def ensure_legacy_venv(log=print) -> Path:
    """Return the legacy venv's python, creating and filling the venv first if needed."""
    marker = LEGACY_VENV / READY_MARKER
    expected = "\n".join((TORCH_REQUIREMENT, *LEGACY_REQUIREMENTS))
    if marker.is_file() and marker.read_text() == expected and legacy_python().is_file():
        return legacy_python()
    log(f"creating the legacy venv in {LEGACY_VENV} (once; a few minutes) ...")
    venv.EnvBuilder(with_pip=True, clear=True).create(LEGACY_VENV)
    _pip("install", TORCH_REQUIREMENT)
    _pip("install", *LEGACY_REQUIREMENTS, TORCH_REQUIREMENT)
    _check_versions()
    marker.write_text(expected)
    return legacy_python()


def _pip(*args: str) -> None:
    """Run pip in the legacy venv; its output goes to `.legacy-venv/install.log` (shown on failure)."""
    log_path = LEGACY_VENV / "install.log"
    with open(log_path, "a") as log:
        completed = subprocess.run([str(legacy_python()), "-m", "pip", *args], stdout=log, stderr=subprocess.STDOUT)
    if completed.returncode != 0:
        sys.exit(f"pip {' '.join(args)} failed in the legacy venv; see {log_path}:\n{log_path.read_text()[-3000:]}")


def _check_versions() -> None:
    code = "import torch, transformers, trl; print(torch.__version__, transformers.__version__, trl.__version__)"
    output = subprocess.run([str(legacy_python()), "-c", code], check=True, capture_output=True, text=True).stdout.split()
    torch_version, transformers_version, trl_version = output
    wanted_torch = TORCH_REQUIREMENT.split("==")[1]
    if not torch_version.startswith(wanted_torch) or transformers_version != "4.46.3" or trl_version != "0.11.4":
        sys.exit(f"legacy venv has torch {torch_version}, transformers {transformers_version}, trl {trl_version}; expected {wanted_torch}, 4.46.3, 0.11.4")
