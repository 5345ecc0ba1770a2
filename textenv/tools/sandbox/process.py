"""The parent side of a sandboxed run: start the bootstrap in a fresh working directory, read its output
under the wall-clock timeout and the output cap, and always clean up afterwards.

The timeout counts from the moment the child has set up its layers and starts the code (it reports them
on the status pipe just before): setting up takes about 50 ms on a quiet machine but seconds on a loaded
one, and that must not eat the code's own time. Setting up has its own limit, :data:`SET_UP_SECONDS`."""

from __future__ import annotations

import codecs
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from .bootstrap import BOOTSTRAP, child_config, parse_status
from .identity import IDENTITIES, Identity, running_as_root
from .interpreter import sandbox_interpreter
from .limits import SandboxLimits
from .reaper import kill_everything, kill_group, wait
from .workspace import child_environment, prepare_workdir, remove_tree

_STREAMS = ("stdout", "stderr")
_PROBE_CODE = "import ast, encodings, json, math, resource, traceback"
SET_UP_SECONDS = 30.0  # from starting the process until the code runs (the layers are set up)


@dataclass
class SandboxResult:
    """What a sandboxed run produced.

    Attributes:
        stdout, stderr (`str`): Captured output (capped by ``max_output_chars`` together).
        returncode (`int` or `None`): Exit status; negative for a signal, as in :mod:`subprocess`.
        timed_out (`bool`): The wall-clock timeout killed the run (or setting up the sandbox took longer
            than :data:`SET_UP_SECONDS`: ``code_started_after`` is then `None`).
        output_limited (`bool`): The output cap was reached and the run was killed.
        duration (`float`): Wall-clock seconds, setting up included.
        code_started_after (`float` or `None`): Seconds from starting the process until the code ran
            (the layers were set up); `None` if it never ran.
        layers (`dict`): The isolation layers the child reported as active (``network_namespace``,
            ``uid``, ``rlimits``, ``audit_hook``, ...); empty if it died before reporting.
    """

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_limited: bool = False
    duration: float = 0.0
    code_started_after: float | None = None
    layers: dict = field(default_factory=dict)


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed Python process and return what it produced. Thread-safe."""
    limits = limits or SandboxLimits()
    interpreter = sandbox_interpreter(_usable_by_sandbox_user)
    if not running_as_root() or interpreter is None:  # root without a usable interpreter stays root (documented)
        return _run(code, limits, interpreter or sys.executable, None)
    identity = IDENTITIES.acquire()
    try:
        return _run(code, limits, interpreter, identity)
    finally:
        IDENTITIES.release(identity)


def _usable_by_sandbox_user(interpreter: str) -> bool:
    """Whether a sandboxed run of ``interpreter`` as the sandbox user can import the standard library."""
    result = _run(_PROBE_CODE, SandboxLimits(timeout=30), interpreter, IDENTITIES.probe_identity())
    return result.returncode == 0


def _run(code: str, limits: SandboxLimits, interpreter: str, identity: Identity | None) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix="textenv-sandbox-")
    try:
        prepare_workdir(workdir, code, identity)
        return _run_in(workdir, limits, interpreter, identity)
    finally:
        remove_tree(workdir)


def _run_in(workdir: str, limits: SandboxLimits, interpreter: str, identity: Identity | None) -> SandboxResult:
    status_read, status_write = os.pipe()
    config = child_config(limits, identity, status_write)
    started = time.monotonic()
    try:
        process = _start(interpreter, workdir, config)
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)
    status = _Status(status_read)
    try:
        result = _collect(process, limits, status, started)
    finally:
        kill_everything(process, identity)
        reported = status.finish()
    result.layers = parse_status(reported)
    return result


def _start(interpreter: str, workdir: str, config: dict) -> subprocess.Popen:
    """Start the bootstrap in its own session, passing it the status pipe end named in ``config``."""
    return subprocess.Popen(
        [interpreter, "-I", "-c", BOOTSTRAP, json.dumps(config)],
        cwd=workdir,
        env=child_environment(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=(config["status_fd"],),
    )


class _CappedOutput:
    """Decodes stdout/stderr chunks and keeps at most ``max_chars`` characters of the two together."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.total_chars = 0
        self.limited = False
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in _STREAMS}
        self._texts = {name: [] for name in _STREAMS}

    def add(self, stream: str, chunk: bytes) -> None:
        text = self._decoders[stream].decode(chunk)
        room = max(self.max_chars - self.total_chars, 0)
        self._texts[stream].append(text[:room])
        self.total_chars += len(text)
        self.limited = self.total_chars > self.max_chars

    def text(self, stream: str) -> str:
        return "".join(self._texts[stream])


class _Status:
    """The status pipe: the child writes its layers and closes it just before the code runs."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = bytearray()
        self.closed_at: float | None = None

    def add(self, chunk: bytes) -> None:
        if chunk:
            self.data += chunk
        else:
            self.closed_at = time.monotonic()

    def finish(self) -> bytes:
        """Everything the child wrote (read to the end once the child is gone); closes the pipe."""
        with os.fdopen(self.fd, "rb") as pipe:
            if self.closed_at is None:
                self.data += pipe.read(65536)
        return bytes(self.data)


def _collect(process: subprocess.Popen, limits: SandboxLimits, status: _Status, started: float) -> SandboxResult:
    """Read stdout/stderr until both close, the timeout passes or the output cap is reached."""
    output = _CappedOutput(limits.max_output_chars)
    timed_out = _read_until_done(process, output, status, limits, started)
    if timed_out or output.limited:
        kill_group(process)
    returncode = wait(process)
    return SandboxResult(
        stdout=output.text("stdout"),
        stderr=output.text("stderr"),
        returncode=returncode,
        timed_out=timed_out,
        output_limited=output.limited,
        duration=time.monotonic() - started,
        code_started_after=None if status.closed_at is None else status.closed_at - started,
    )


def _deadline(status: _Status, limits: SandboxLimits, started: float) -> float:
    """The set-up limit until the child reports (closes the status pipe), then the code's own timeout from there."""
    if status.closed_at is None:
        return started + SET_UP_SECONDS
    return status.closed_at + limits.timeout


def _read_until_done(process: subprocess.Popen, output: _CappedOutput, status: _Status, limits: SandboxLimits,
                     started: float) -> bool:
    """Feed ``output`` and ``status`` until the output pipes close, the cap is reached or the deadline (`_deadline`,
    which moves once the code starts) passes (returns `True`)."""
    exited_at = None
    with selectors.DefaultSelector() as selector:
        for name in _STREAMS:
            selector.register(getattr(process, name), selectors.EVENT_READ, name)
        selector.register(status.fd, selectors.EVENT_READ, "status")
        while any(key.data != "status" for key in selector.get_map().values()):
            now, deadline = time.monotonic(), _deadline(status, limits, started)
            if now >= deadline:
                _read_ready(selector, output, status, 0)  # what the code wrote in time, if this thread was late
                return True
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                return False  # the main process is gone; a leftover child is holding the pipes open
            _read_ready(selector, output, status, min(0.05, deadline - now))
            if output.limited:
                return False
    return False


def _read_ready(selector: selectors.BaseSelector, output: _CappedOutput, status: _Status, timeout: float) -> None:
    """One read from each pipe that is ready within ``timeout`` seconds; a closed pipe is unregistered."""
    for key, _ in selector.select(timeout=timeout):
        chunk = os.read(key.fd, 65536)
        if key.data == "status":
            status.add(chunk)
        elif chunk:
            output.add(key.data, chunk)
        if not chunk:
            selector.unregister(key.fileobj)
