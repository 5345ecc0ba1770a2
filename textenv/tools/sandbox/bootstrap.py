"""The child side of a sandboxed run, seen from the parent: the program the child runs (the modules of
:mod:`.child` joined into one text), the configuration the parent passes it, and the status report it
sends back on a pipe (the layers it set up, and those missing)."""

from __future__ import annotations

import json
import os

from .child import child_program
from .identity import Identity
from .limits import SandboxLimits
from .workspace import SNIPPET_FILENAME

# Runs as `python -I -c BOOTSTRAP CONFIG_JSON` in the working directory.
BOOTSTRAP = child_program()

# Names accepted in TEXTENV_SANDBOX_TEST_DISABLE_LAYERS (comma-separated): the layers a test can turn off
# to see what a machine without them does (warnings, strict refusal) or that the others hold alone.
TEST_DISABLE_VARIABLE = "TEXTENV_SANDBOX_TEST_DISABLE_LAYERS"
DISABLEABLE_LAYERS = ("user_namespace", "network_namespace", "pid_namespace", "mount_namespace", "landlock",
                      "audit_hook")


def child_config(limits: SandboxLimits, identity: Identity | None, status_fd: int) -> dict:
    """The configuration :data:`BOOTSTRAP` reads from its first argument (as JSON).

    Args:
        limits (`SandboxLimits`): The run's limits, turned into rlimit values, and its read paths.
        identity (`Identity` or `None`): The uid/gid to switch to, or `None` to keep the parent's.
        status_fd (`int`): The inherited pipe end the child reports its active layers on.
    """
    return {
        "snippet": SNIPPET_FILENAME,
        "cpu_seconds": max(1, int(limits.timeout) + 1),
        "memory_bytes": limits.memory_mb * 1024 * 1024,
        "max_processes": limits.max_processes,
        "max_open_files": limits.max_open_files,
        "max_file_bytes": limits.max_file_mb * 1024 * 1024,
        "allow_subprocesses": limits.allow_subprocesses,
        "read_paths": list(limits.read_paths),
        "strict": limits.strict,
        "disabled_layers": disabled_layers_for_testing(),
        "uid": identity.uid if identity else None,
        "gid": identity.gid if identity else None,
        "status_fd": status_fd,
    }


def disabled_layers_for_testing() -> list[str]:
    """The layers named in ``TEXTENV_SANDBOX_TEST_DISABLE_LAYERS`` (for tests only; reported as missing)."""
    names = [name.strip() for name in os.environ.get(TEST_DISABLE_VARIABLE, "").split(",") if name.strip()]
    unknown = sorted(set(names) - set(DISABLEABLE_LAYERS))
    if unknown:
        raise ValueError(f"{TEST_DISABLE_VARIABLE}: unknown layers {unknown}; choose from {list(DISABLEABLE_LAYERS)}")
    return names


def parse_status(raw: bytes) -> dict:
    """The layers the child reported as active on the status pipe (``raw``, all it wrote); empty if none."""
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}
