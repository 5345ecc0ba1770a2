"""A Python interpreter tool that runs the model's code in a sandboxed child process."""

from __future__ import annotations

import re
import signal

from .base import TOOL_ERROR_PREFIX
from .sandbox import SandboxLimits, SandboxResult, run_python

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

    Isolation layers (Linux; each one is best effort and the next one backs it up):

    1. **Process and directory.** A child process in its own session/process group
       (``start_new_session``), working directory = a fresh ``tempfile.mkdtemp`` folder (also ``HOME``
       and ``TMPDIR``), removed after the call. Standard input is ``/dev/null``; no file descriptors are
       inherited.
    2. **Scrubbed environment.** The child gets only ``PATH``, ``LANG``/``LC_ALL``, ``HOME``, ``TMPDIR``
       and thread-count variables: no tokens or keys from the parent's environment. ``-I`` makes it
       ignore ``PYTHON*`` variables and the user site directory.
    3. **No network.** The child enters a new network namespace (``unshare(CLONE_NEWNET)`` through
       libc; with ``CLONE_NEWUSER`` too when not root) where only a down loopback interface exists.
       Fallback where namespaces are refused (containers, macOS): the audit hook of layer 6.
    4. **Resource limits** (``resource.setrlimit`` in the child): ``RLIMIT_CPU`` (timeout + 1 s),
       ``RLIMIT_AS`` (``memory_mb``: a 10 GB allocation raises ``MemoryError``), ``RLIMIT_NPROC``
       (``max_processes``), ``RLIMIT_NOFILE``, ``RLIMIT_FSIZE`` (``max_file_mb``), ``RLIMIT_CORE`` = 0.
    5. **Unprivileged user when the parent is root.** Root ignores ``RLIMIT_NPROC`` and file
       permissions, so the child switches to a uid/gid of its own (one per concurrent run, in a high
       unused range starting at 1,900,000,000, no supplementary groups) after unsharing the network and
       before running any untrusted code; the temporary directory is ``chown``-ed to it. Files the
       parent's tests or users keep in private (0700) folders are then unreachable. Because this user
       cannot start an interpreter that lives in ``/root`` (pyenv, a venv under ``/root``), the sandbox
       then uses the first system ``python3`` that user can run (standard library only); if there is
       none, the run stays root and this layer is missing (see ``result.layers``). ``PR_SET_NO_NEW_PRIVS``
       blocks set-uid programs, and a parent-death signal kills the child if the parent dies.
    6. **Audit hook** (``sys.addaudithook``, installed before the code runs; hooks cannot be removed):
       refuses sockets, ``ctypes``/``cffi``, starting processes (unless ``allow_subprocesses``),
       opening files for writing or changing files outside the working directory, reading other
       processes' ``/proc/<pid>`` entries, and signalling other processes. It is a Python-level layer
       only; the OS layers above are what hold against native code.
    7. **Parent-side limits.** A wall-clock ``timeout`` after which the whole process group is killed
       (``os.killpg``); output read incrementally and the run killed once ``max_output_chars`` are read
       (a billion printed characters never reach the parent's memory); at the end the process group,
       and with a uid of its own every process of that uid (children that called ``setsid``), are
       killed, so no child outlives the call. Known gap: when the parent is *not* root (no uid of its
       own) and ``allow_subprocesses=True``, a child that calls ``setsid()`` leaves the process group
       and can outlive the call (a busy one is still stopped by ``RLIMIT_CPU``).

    Calls are independent and the tool can be used from several threads at once.

    Args:
        timeout (`float`, *optional*, defaults to 5.0):
            Wall-clock seconds per call.
        memory_mb (`int`, *optional*, defaults to 512):
            Address-space limit of the child, in MiB.
        max_output_chars (`int`, *optional*, defaults to 10000):
            Characters of output (stdout and stderr together) read before the run is stopped.
        max_processes (`int`, *optional*, defaults to 32):
            Process/thread limit of the sandbox user (enforced when not root or when the uid switch works).
        max_file_mb (`int`, *optional*, defaults to 16):
            Largest file the code may write, in MiB.
        allow_subprocesses (`bool`, *optional*, defaults to `False`):
            Let the code fork or start programs (still limited by ``max_processes`` and killed at the end).

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
    security_arguments = ("timeout", "memory_mb", "max_output_chars", "max_processes", "max_file_mb", "allow_subprocesses")

    def __init__(
        self,
        timeout: float = 5.0,
        memory_mb: int = 512,
        max_output_chars: int = 10_000,
        max_processes: int = 32,
        max_file_mb: int = 16,
        allow_subprocesses: bool = False,
    ):
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.max_output_chars = max_output_chars
        self.max_processes = max_processes
        self.max_file_mb = max_file_mb
        self.allow_subprocesses = allow_subprocesses
        self.limits = SandboxLimits(
            timeout=timeout,
            memory_mb=memory_mb,
            max_output_chars=max_output_chars,
            max_processes=max_processes,
            max_file_mb=max_file_mb,
            allow_subprocesses=allow_subprocesses,
        )

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


def strip_code_fence(code: str) -> str:
    """Remove one Markdown code fence (```` ```python ... ``` ````) around ``code``, if there is one."""
    fenced = _CODE_FENCE.match(code)
    return fenced.group(1) if fenced else code


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""
