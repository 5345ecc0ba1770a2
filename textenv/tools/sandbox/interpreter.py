"""Which Python executable sandboxed runs start: one the unprivileged sandbox user can run."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import Callable

from .identity import running_as_root
from .workspace import SAFE_PATH


def sandbox_interpreter(usable_by_sandbox_user: Callable[[str], bool]) -> str | None:
    """The Python executable sandboxed runs use: ``sys.executable`` unless the parent is root and the
    sandbox user cannot use it even with the mount namespace that exposes the installation to it
    (``usable_by_sandbox_user`` runs a real sandboxed probe), in which case the first system ``python3``
    it can use (standard library only). ``None`` if there is none (runs then stay root)."""
    if not running_as_root():
        return sys.executable
    return _INTERPRETERS.first_usable(usable_by_sandbox_user)


class _InterpreterFinder:
    """Finds, once, a Python executable that the unprivileged sandbox user can start and import from."""

    _NOT_SEARCHED = object()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = self._NOT_SEARCHED

    def first_usable(self, usable: Callable[[str], bool]) -> str | None:
        with self._lock:
            if self._found is self._NOT_SEARCHED:
                self._found = next((candidate for candidate in _candidate_interpreters() if usable(candidate)), None)
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


_INTERPRETERS = _InterpreterFinder()
