"""The child's working directory and environment: a fresh temporary directory holding the snippet,
owned by the run's uid, a scrubbed environment, and the removal of the directory afterwards."""

from __future__ import annotations

import os
import shutil

from .identity import Identity

SNIPPET_FILENAME = "snippet.py"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


def prepare_workdir(workdir: str, code: str, identity: Identity | None) -> None:
    """Write ``code`` to the snippet file in ``workdir`` and hand both to ``identity`` (when switching uid).

    Args:
        workdir (`str`): The run's fresh, empty working directory.
        code (`str`): The untrusted code.
        identity (`Identity` or `None`): The run's uid/gid, or `None` when the run keeps the parent's.
    """
    snippet_path = os.path.join(workdir, SNIPPET_FILENAME)
    with open(snippet_path, "w", encoding="utf-8") as snippet:
        snippet.write(code)
    if identity is not None:
        os.chown(workdir, identity.uid, identity.gid)
        os.chown(snippet_path, identity.uid, identity.gid)


def child_environment(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing from the parent's, so no tokens, keys or proxies reach the code."""
    return {
        "PATH": SAFE_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def remove_tree(path: str) -> None:
    """Remove the working directory ``path``, even where the code made its files read-only."""

    def make_writable_and_retry(function, failed_path, _exc_info):
        # Code running as our own uid may have chmod-ed its files read-only.
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
