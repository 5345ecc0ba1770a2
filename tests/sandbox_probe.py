"""Find the processes a sandboxed run left behind, counting only the runs of the calling test.

``make test`` runs its two halves at once and both run sandbox tests, so a scan of every process whose
environment names a sandbox working directory also sees the other half's runs still in progress. A test that
checks for survivors therefore gives its runs a parent folder of their own (``own_sandbox_parent``) and
counts only processes whose environment names that folder.
"""

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from live_processes import live_processes

SANDBOX_PREFIX = "textenv-sandbox-"  # tempfile.mkdtemp's prefix in textenv/tools/sandbox/process.py


@contextmanager
def own_sandbox_parent() -> Iterator[Path]:
    """Sandbox working directories created inside the block go into a fresh folder under the temp dir
    (world-traversable, as the temp dir is: the sandbox may run as another user)."""
    parent = Path(tempfile.mkdtemp(prefix="textenv-test-sandboxes-"))
    parent.chmod(0o755)
    saved = tempfile.tempdir
    tempfile.tempdir = str(parent)
    try:
        yield parent
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(parent, ignore_errors=True)


def environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read()
    except OSError:
        return b""


def sandbox_processes(parent: Path) -> list[int]:
    """Live processes (pids as seen from here) whose environment names a sandbox working directory in
    ``parent``: every process a sandboxed run starts inherits it, and inside a PID namespace their own pids
    mean nothing here."""
    marker = os.path.join(str(parent), SANDBOX_PREFIX).encode()
    return [process.pid for process in live_processes() if marker in environ_of(process.pid)]
