"""The limits of one sandboxed run, as the parent configures them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    Args:
        timeout (`float`): Wall-clock seconds the code may run before the process group is killed, counted
            from when the sandbox is set up (setting up has its own limit: ``process.SET_UP_SECONDS``).
        memory_mb (`int`): Address-space limit (RLIMIT_AS) in MiB.
        max_output_chars (`int`): Characters of stdout + stderr read before the process is killed.
        max_processes (`int`): RLIMIT_NPROC: processes and threads of the sandbox, counted apart from the
            calling user's other tasks (in its own user namespace, or its own uid as root; see
            :mod:`.child.rlimits`).
        max_open_files (`int`): RLIMIT_NOFILE.
        max_file_mb (`int`): RLIMIT_FSIZE, the largest file the code may write, in MiB.
        allow_subprocesses (`bool`): Let the code fork or start programs (still bounded by the
            process limit and killed at the end). Off by default.
        read_paths (`tuple[str, ...]`): Absolute real paths (files or folders) the code may read besides
            the Python standard library and its working directory.
        strict (`bool`): Refuse to run the code when an isolation layer is missing.
    """

    timeout: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 10_000
    max_processes: int = 32
    max_open_files: int = 64
    max_file_mb: int = 16
    allow_subprocesses: bool = False
    read_paths: tuple[str, ...] = ()
    strict: bool = False
