"""A Python interpreter tool that runs the model's code in a sandboxed child process."""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Sequence

from .base import TOOL_ERROR_PREFIX
from .sandbox import SandboxLimits, SandboxResult, run_python
from .sandbox import process as sandbox_process
from .sandbox.isolation import describe_missing, isolation_layers

logger = logging.getLogger(__name__)

_CODE_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)
_SIGNAL_REASONS = {
    signal.SIGKILL: "killed (a limit was exceeded)",
    signal.SIGSEGV: "crashed (segmentation fault)",
    getattr(signal, "SIGXCPU", -1): "CPU time limit exceeded",
    getattr(signal, "SIGXFSZ", -1): "file size limit exceeded",
}


class PythonInterpreter:
    """Run the model's Python code in a separate, sandboxed process and return what it printed.

    Each call starts a fresh interpreter (``python -I``) in a new temporary directory that is removed
    afterwards. Nothing persists between calls. As in a notebook cell, the value of a final bare
    expression is printed (``"x = 2\\nx * 21"`` returns ``"42\\n"``). A Markdown code fence around the
    code is removed.

    Returned text: the standard output on success; otherwise ``"Tool error: <reason>"`` followed by the
    output so far and the traceback. Reasons: ``timed out after N s``, ``memory limit of N MB exceeded``,
    ``output limit of N characters exceeded``, ``exit code N``, ``CPU time limit exceeded``, ... The
    call itself never raises.

    Isolation layers (Linux; found at construction, reported in :attr:`isolation`, see
    docs/guides/safety.md):

    1. **Process and directory.** A child in its own session, working directory = a fresh temporary
       folder (also ``HOME`` and ``TMPDIR``) removed after the call; standard input ``/dev/null``; no
       inherited file descriptors; an environment with nothing from the parent's (no tokens or keys).
    2. **Namespaces.** A network namespace (only a down loopback interface) and a PID namespace: when the
       code's process ends, the kernel kills every process it started, ``setsid()`` and double forks
       included. An ordinary user gets them inside a user namespace of its own.
    3. **Unprivileged uid when the parent is root**: one per concurrent run, no groups, the working
       folder ``chown``-ed to it. A mount namespace covers folders that uid cannot enter (``/root``) with
       a tmpfs and mounts back only the Python installation, the working folder and ``read_paths``, so
       the project's own interpreter (a pyenv or venv under ``/root``) runs the code.
    4. **Landlock** (the kernel's own access control, not undone by ctypes or native code): the code
       can read only the Python standard library (not site-packages), the system's shared libraries,
       ``/dev/null``/``/dev/urandom``, its working folder (read and write) and ``read_paths``. Everything
       else (``$HOME``, ``/tmp``, the dataset, the project's source, ``/proc``) is refused with
       ``PermissionError``; symlinks are followed to their target before the check, and hard links into
       the working folder from outside cannot be made. TCP connect/bind and signals to processes outside
       the sandbox are refused too.
    5. **Resource limits**: ``RLIMIT_CPU`` (timeout + 1 s), ``RLIMIT_AS`` (``memory_mb``),
       ``RLIMIT_NPROC`` (``max_processes``), ``RLIMIT_NOFILE``, ``RLIMIT_FSIZE`` (``max_file_mb``),
       no core dumps; no capabilities, ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal. The process
       limit counts only the sandbox's tasks (its own uid as root, its own user namespace otherwise), so
       a caller whose user already runs many threads (a trainer) is not refused; without a user
       namespace it comes on top of the user's task count at the start (``process_limit`` missing).
    6. **Audit hook** (Python-level): refuses sockets, ``ctypes``/``cffi``, starting processes (unless
       ``allow_subprocesses``), writes outside the working folder, other processes' ``/proc`` entries
       and signals to other processes.
    7. **Parent-side limits.** A wall-clock ``timeout`` that kills the whole process group; output read
       incrementally and the run killed once ``max_output_chars`` are read.

    A layer the kernel refuses is reported as missing: the interpreter logs a warning naming it and what
    it leaves open, or with ``strict=True`` refuses (at construction, and each call checks again).

    Calls are independent and the tool can be used from several threads at once.

    Args:
        timeout (`float`, *optional*, defaults to 5.0):
            Wall-clock seconds the code may run per call, counted once the sandbox is set up (about
            50 ms; up to 30 s is allowed for that on a loaded machine).
        memory_mb (`int`, *optional*, defaults to 512):
            Address-space limit of the child, in MiB.
        max_output_chars (`int`, *optional*, defaults to 10000):
            Characters of output (stdout and stderr together) read before the run is stopped.
        max_processes (`int`, *optional*, defaults to 32):
            Processes and threads the sandbox may have at once (as an ordinary user its bootstrap and its
            PID namespace's init count too; not enforced when root runs the code without the uid switch).
        max_file_mb (`int`, *optional*, defaults to 16):
            Largest file the code may write, in MiB.
        allow_subprocesses (`bool`, *optional*, defaults to `False`):
            Let the code fork or start programs (still limited by ``max_processes`` and killed at the end;
            only programs it may read, e.g. the interpreter itself, can be started).
        read_paths (`list[str | os.PathLike]`, *optional*):
            Files or folders (with everything below them) the code may read besides the standard
            library, e.g. a data file, or ``site.getsitepackages()`` to let it import installed packages.
        strict (`bool`, *optional*, defaults to `False`):
            Refuse to run when an isolation layer is missing on this machine, instead of warning.

    Attributes:
        isolation (`dict`): The layers active on this machine, from a sandboxed run made at construction:
            ``network_namespace``, ``pid_namespace``, ``landlock`` (the ABI version), ``uid``, ``rlimits``,
            ``process_limit`` (what it counts), ``no_new_privs``, ``audit_hook``, ... and ``missing`` (each
            missing layer and why).

    Example:

    ```python
    >>> interpreter = PythonInterpreter(timeout=2)
    >>> interpreter("print(sum(range(10)))")
    '45\\n'
    >>> interpreter("while True: pass")
    'Tool error: timed out after 2 s'
    ```
    """

    # Constructor arguments that loosen the sandbox: a downloaded tool config may set them only with
    # trust_remote_code=True (see `load_tool`).
    security_arguments = (
        "timeout", "memory_mb", "max_output_chars", "max_processes", "max_file_mb", "allow_subprocesses", "read_paths",
    )

    def __init__(
        self,
        timeout: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 10_000,
        max_processes: int = 32,
        max_file_mb: int = 16,
        allow_subprocesses: bool = False,
        read_paths: Sequence[str | os.PathLike] | None = None,
        strict: bool = False,
    ):
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.max_processes = max_processes
        self.max_file_mb = max_file_mb
        self.allow_subprocesses = allow_subprocesses
        self.read_paths = _checked_read_paths(read_paths)
        self.strict = strict
        self.limits = SandboxLimits(
            timeout=timeout,
            memory_mb=memory_mb,
            max_output_chars=max_output_chars,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            allow_subprocesses=allow_subprocesses,
            read_paths=tuple(self.read_paths),
            strict=strict,
        )
        self.isolation = isolation_layers(self.limits)
        self._check_isolation()

    def _check_isolation(self) -> None:
        missing = self.isolation.get("missing") or {}
        if not missing:
            return
        details = describe_missing(missing)
        if self.strict:
            raise RuntimeError(f"PythonInterpreter(strict=True): isolation layers missing on this machine:\n{details}")
        logger.warning("PythonInterpreter: running without these isolation layers (pass strict=True to refuse):\n%s", details)

    def __call__(self, code: str) -> str:
        """Run ``code`` and return its output or a ``"Tool error: ..."`` text."""
        if not isinstance(code, str):
            return f"{TOOL_ERROR_PREFIX}expected Python source text, got {type(code).__name__}"
        code = strip_code_fence(code)
        if not code.strip():
            return f"{TOOL_ERROR_PREFIX}no code to run"
        try:
            result = self.run(code)
        except Exception as error:  # noqa: BLE001 - e.g. no fork possible; the episode goes on
            return f"{TOOL_ERROR_PREFIX}could not start the sandbox: {error}"
        return self.format_result(result)

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` in the sandbox and return the raw :class:`~textenv.tools.sandbox.SandboxResult`
        (output, exit status, flags and the isolation layers that were active)."""
        return run_python(code, self.limits)

    def format_result(self, result: SandboxResult) -> str:
        """The text the model sees for ``result``."""
        separator = "\n" if result.stdout and result.stderr and not result.stdout.endswith("\n") else ""
        output = result.stdout + separator + result.stderr
        if result.timed_out and result.code_started_after is None:
            limit = sandbox_process.SET_UP_SECONDS
            return self._error(f"the sandbox was not set up within {limit:g} s (is the machine overloaded?)", output)
        if result.timed_out:
            return self._error(f"timed out after {self.timeout:g} s", output)
        if result.output_limited:
            return self._error(f"output limit of {self.max_output_chars} characters exceeded", output)
        if result.returncode == 0:
            return result.stdout
        if result.returncode is not None and result.returncode < 0:
            reason = _SIGNAL_REASONS.get(-result.returncode, f"killed by signal {-result.returncode}")
            return self._error(reason, output)
        if _last_line(result.stderr).startswith("MemoryError"):
            return self._error(f"memory limit of {self.memory_mb} MB exceeded", output)
        return self._error(f"exit code {result.returncode}", output)

    @staticmethod
    def _error(reason: str, output: str) -> str:
        return f"{TOOL_ERROR_PREFIX}{reason}" + (f"\n{output}" if output else "")


def _checked_read_paths(read_paths: Sequence[str | os.PathLike] | None) -> list[str]:
    if read_paths is None:
        return []
    if isinstance(read_paths, (str, bytes, os.PathLike)):
        raise TypeError(f"PythonInterpreter(read_paths={read_paths!r}): pass a list of paths, e.g. [{str(read_paths)!r}]")
    checked = []
    for path in read_paths:
        real = os.path.realpath(os.fspath(path))
        if not os.path.exists(real):
            raise ValueError(f"PythonInterpreter(read_paths=...): {os.fspath(path)!r} does not exist; list existing files or folders")
        checked.append(real)
    return checked


def strip_code_fence(code: str) -> str:
    """Remove one Markdown code fence (```` ```python ... ``` ````) around ``code``, if there is one."""
    fenced = _CODE_FENCE.match(code)
    return fenced.group(1) if fenced else code


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
