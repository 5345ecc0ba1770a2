"""Which Python executable sandboxed runs start: one the unprivileged sandbox user can run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

from .identity import IDENTITIES, Identity, running_as_root
from .workspace import SAFE_PATH


def sandbox_interpreter() -> str | None:
    """The Python executable sandboxed runs use: ``sys.executable`` unless the parent is root and the
    unprivileged sandbox user cannot run it (e.g. it lives under ``/root``), in which case the first
    system ``python3`` that user can run. ``None`` if there is none (runs then stay root)."""
    if not running_as_root():
        return sys.executable
    return _INTERPRETERS.usable_by(IDENTITIES.probe_identity())


class _InterpreterFinder:
    """Finds, once, a Python executable that the unprivileged sandbox user can start and import from."""

    _NOT_SEARCHED = object()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = self._NOT_SEARCHED

    def usable_by(self, identity: Identity) -> str | None:
        with self._lock:
            if self._found is self._NOT_SEARCHED:
                usable = (candidate for candidate in _candidate_interpreters() if _runs_as(candidate, identity))
                self._found = next(usable, None)
            return self._found


def _candidate_interpreters() -> list[str]:
    candidates = [sys.executable, getattr(sys, "_base_executable", None)]
    same_version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates += [shutil.which(name, path=SAFE_PATH) for name in (same_version, "python3")]
    unique = []
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and candidate not in unique:
            unique.append(candidate)
    return unique


def _runs_as(executable: str, identity: Identity) -> bool:
    probe = "import ast, encodings, json, resource, traceback"
    try:
        completed = subprocess.run(
            [executable, "-I", "-c", probe],
            user=identity.uid,
            group=identity.gid,
            extra_groups=[],
            env={"PATH": SAFE_PATH},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0


_INTERPRETERS = _InterpreterFinder()
