"""Process machinery of the Python sandbox: run untrusted code in a separate, limited, disposable process.

The layers (each documented on :class:`~textenv.tools.PythonInterpreter`) are set up by a small
bootstrap program that runs first in the child interpreter, before the untrusted code:

1. a fresh temporary working directory (removed afterwards) and a scrubbed environment;
2. a new network namespace (``unshare``), so only a down loopback interface exists;
3. ``resource`` limits (CPU, address space, processes, open files, file size, no core dumps);
4. when the parent runs as root: a switch to an unprivileged uid/gid of its own for this run;
5. ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal;
6. a Python audit hook refusing sockets, process creation, ``ctypes``, writes outside the working
   directory, reading other processes' ``/proc`` entries and signalling other processes.

The parent enforces the wall-clock timeout and the output cap, and kills the whole process group (and,
with a uid of its own, every process of that uid) when the run ends.
"""

from __future__ import annotations

import codecs
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

SNIPPET_FILENAME = "snippet.py"
# Unprivileged uids for sandboxed runs when the parent is root: one per concurrent run, so that
# RLIMIT_NPROC counts only that run's processes and leftovers can be found and killed by uid.
_SANDBOX_UID_BASE = 1_900_000_000
_SLOTS_PER_PROCESS = 256
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run.

    Args:
        timeout (`float`): Wall-clock seconds before the process group is killed.
        memory_mb (`int`): Address-space limit (RLIMIT_AS) in MiB.
        max_output_chars (`int`): Characters of stdout + stderr read before the process is killed.
        max_processes (`int`): RLIMIT_NPROC (processes and threads of the sandbox user).
        max_open_files (`int`): RLIMIT_NOFILE.
        max_file_mb (`int`): RLIMIT_FSIZE, the largest file the code may write, in MiB.
        allow_subprocesses (`bool`): Let the code fork or start programs (still bounded by the
            process limit and killed at the end). Off by default.
    """

    timeout: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 10_000
    max_processes: int = 32
    max_open_files: int = 64
    max_file_mb: int = 16
    allow_subprocesses: bool = False


@dataclass
class SandboxResult:
    """What a sandboxed run produced.

    Attributes:
        stdout, stderr (`str`): Captured output (capped by ``max_output_chars`` together).
        returncode (`int` or `None`): Exit status; negative for a signal, as in :mod:`subprocess`.
        timed_out (`bool`): The wall-clock timeout killed the run.
        output_limited (`bool`): The output cap was reached and the run was killed.
        duration (`float`): Wall-clock seconds.
        layers (`dict`): The isolation layers the child reported as active (``network_namespace``,
            ``uid``, ``rlimits``, ``audit_hook``, ...); empty if it died before reporting.
    """

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    output_limited: bool = False
    duration: float = 0.0
    layers: dict = field(default_factory=dict)


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in a fresh sandboxed Python process and return what it produced. Thread-safe."""
    limits = limits or SandboxLimits()
    identity = _IDENTITIES.acquire() if _running_as_root() else None
    workdir = tempfile.mkdtemp(prefix="textenv-sandbox-")
    try:
        _prepare_workdir(workdir, code, identity)
        return _run_in(workdir, limits, identity)
    finally:
        _remove_tree(workdir)
        if identity is not None:
            _IDENTITIES.release(identity)


def sandbox_interpreter() -> str | None:
    """The Python executable sandboxed runs use: ``sys.executable`` unless the parent is root and the
    unprivileged sandbox user cannot run it (e.g. it lives under ``/root``), in which case the first
    system ``python3`` that user can run. ``None`` if there is none (runs then stay root)."""
    if not _running_as_root():
        return sys.executable
    return _INTERPRETERS.usable_by(_IDENTITIES.probe_identity())


# --- the child side -------------------------------------------------------------------------------

# Runs as `python -I -c BOOTSTRAP CONFIG_JSON` in the working directory. Kept Python-3.8 compatible: the
# interpreter may be the system python3 rather than the parent's.
_BOOTSTRAP = r'''
import json, os, sys
config = json.loads(sys.argv[1])
layers = {}

def _libc():
    import ctypes
    return ctypes, ctypes.CDLL(None, use_errno=True)

def unshare_network():
    try:
        ctypes, libc = _libc()
    except Exception as error:
        return "unavailable: %s" % error
    clone_newnet, clone_newuser = 0x40000000, 0x10000000
    flags = clone_newnet if os.geteuid() == 0 else clone_newnet | clone_newuser
    if libc.unshare(flags) == 0:
        return True
    return "refused: %s" % os.strerror(ctypes.get_errno())

def set_limits():
    try:
        import resource
    except ImportError:
        return "unavailable"
    wanted = {
        "RLIMIT_CPU": (config["cpu_seconds"], config["cpu_seconds"] + 1),
        "RLIMIT_AS": (config["memory_bytes"],) * 2,
        "RLIMIT_NPROC": (config["max_processes"],) * 2,
        "RLIMIT_NOFILE": (config["max_open_files"],) * 2,
        "RLIMIT_FSIZE": (config["max_file_bytes"],) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    applied = []
    for name, (soft, hard) in wanted.items():
        kind = getattr(resource, name, None)
        if kind is None:
            continue
        _, current_hard = resource.getrlimit(kind)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        try:
            resource.setrlimit(kind, (soft, hard))
            applied.append(name)
        except (ValueError, OSError):
            pass
    return applied

def drop_privileges():
    uid, gid = config.get("uid"), config.get("gid")
    if uid is None:
        return "not root" if os.geteuid() != 0 else "no sandbox user"
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    return os.getuid()

def harden_process():
    try:
        ctypes, libc = _libc()
        pr_set_pdeathsig, pr_set_no_new_privs = 1, 38
        libc.prctl(pr_set_pdeathsig, 9, 0, 0, 0)
        return libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) == 0
    except Exception:
        return False

def install_audit_hook(workdir, allow_subprocesses):
    own_pid = str(os.getpid())
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    refused_modules = {"ctypes", "_ctypes", "cffi", "_cffi_backend"}
    if not allow_subprocesses:
        refused_modules |= {"_posixsubprocess", "multiprocessing"}
    process_events = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                      "subprocess.Popen", "os.startfile"}
    fs_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod",
                 "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr",
                 "os.removexattr", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.move"}

    def inside(path):
        if isinstance(path, int):
            return True
        real = realpath(fspath(path))
        if isinstance(real, bytes):
            real = os.fsdecode(real)
        return real == workdir or real.startswith(workdir + sep)

    def other_process_entry(path):
        if isinstance(path, int):
            return False
        real = realpath(fspath(path))
        if isinstance(real, bytes):
            real = os.fsdecode(real)
        parts = real.split(sep)
        return len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_pid

    def refuse(what):
        raise PermissionError("sandbox: " + what + " is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in mode for c in "wax+")) or bool(flags & write_flags)
            if writing and not inside(path):
                refuse("writing outside the working directory (%s)" % (path,))
            if other_process_entry(path):
                refuse("reading other processes' /proc entries")
        elif event in fs_events:
            if any(isinstance(a, (str, bytes, os.PathLike)) and not inside(a) for a in args):
                refuse("changing files outside the working directory")
        elif event.startswith("socket."):
            refuse("network access")
        elif event.startswith("ctypes."):
            refuse("ctypes")
        elif event == "import" and args[0].split(".")[0] in refused_modules:
            refuse("importing %s" % args[0])
        elif event in process_events and not allow_subprocesses:
            refuse("starting processes")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and str(args[0]) not in (own_pid, "0"):
            refuse("signalling other processes")

    sys.addaudithook(hook)
    for name in [name for name in sys.modules if name.split(".")[0] in refused_modules]:
        del sys.modules[name]
    return True

def report(layers):
    with os.fdopen(config["status_fd"], "w") as status:
        status.write(json.dumps(layers))

def run_snippet():
    import ast, traceback
    with open(config["snippet"], encoding="utf-8") as source_file:
        source = source_file.read()
    namespace = {"__name__": "__main__", "__file__": config["snippet"], "__builtins__": __builtins__}
    sys.argv = [config["snippet"]]
    try:
        tree = ast.parse(source, config["snippet"])
        last_expression = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last_expression = ast.Expression(tree.body.pop().value)
        exec(compile(tree, config["snippet"], "exec"), namespace)
        if last_expression is not None:
            value = eval(compile(last_expression, config["snippet"], "eval"), namespace)
            if value is not None:
                print(repr(value))
    except SystemExit:
        raise
    except BaseException as error:
        failure = traceback.TracebackException(type(error), error, error.__traceback__)
        # Hide this bootstrap's own frames (compiled from "<string>"): the model only needs its code's.
        failure.stack = traceback.StackSummary.from_list([f for f in failure.stack if f.filename != "<string>"])
        sys.stdout.flush()
        sys.stderr.write("".join(failure.format()))
        sys.stderr.flush()
        os._exit(1)

for stream in (sys.stdout, sys.stderr):
    stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
workdir = os.path.realpath(os.getcwd())
layers["network_namespace"] = unshare_network()
layers["rlimits"] = set_limits()
layers["uid"] = drop_privileges()
layers["no_new_privs"] = harden_process()
layers["audit_hook"] = install_audit_hook(workdir, config["allow_subprocesses"])
report(layers)
del config["status_fd"]
run_snippet()
'''


# --- the parent side ------------------------------------------------------------------------------


def _running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass(frozen=True)
class _Identity:
    uid: int
    gid: int


class _IdentityPool:
    """Hands out a distinct unprivileged uid/gid to each concurrent run of this process."""

    def __init__(self) -> None:
        self._free = list(range(_SLOTS_PER_PROCESS))
        self._available = threading.Condition()

    def _base(self) -> int:
        return _SANDBOX_UID_BASE + (os.getpid() % 65536) * _SLOTS_PER_PROCESS

    def acquire(self) -> _Identity:
        with self._available:
            while not self._free:
                self._available.wait()
            slot = self._free.pop(0)  # oldest first: a just-released uid may still have zombies counted
        uid = self._base() + slot
        return _Identity(uid=uid, gid=uid)

    def release(self, identity: _Identity) -> None:
        with self._available:
            self._free.append(identity.uid - self._base())
            self._available.notify()

    def probe_identity(self) -> _Identity:
        # Probes use an id just below this process's range, so they never collide with a run.
        uid = self._base() - 1
        return _Identity(uid=uid, gid=uid)


class _InterpreterFinder:
    """Finds, once, a Python executable that the unprivileged sandbox user can start and import from."""

    _NOT_SEARCHED = object()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = self._NOT_SEARCHED

    def usable_by(self, identity: _Identity) -> str | None:
        with self._lock:
            if self._found is self._NOT_SEARCHED:
                usable = (candidate for candidate in _candidate_interpreters() if _runs_as(candidate, identity))
                self._found = next(usable, None)
            return self._found


def _candidate_interpreters() -> list[str]:
    candidates = [sys.executable, getattr(sys, "_base_executable", None)]
    same_version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates += [shutil.which(name, path=_SAFE_PATH) for name in (same_version, "python3")]
    unique = []
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and candidate not in unique:
            unique.append(candidate)
    return unique


def _runs_as(executable: str, identity: _Identity) -> bool:
    probe = "import ast, encodings, json, resource, traceback"
    try:
        completed = subprocess.run(
            [executable, "-I", "-c", probe],
            user=identity.uid,
            group=identity.gid,
            extra_groups=[],
            env={"PATH": _SAFE_PATH},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return completed.returncode == 0


_IDENTITIES = _IdentityPool()
_INTERPRETERS = _InterpreterFinder()


def _prepare_workdir(workdir: str, code: str, identity: _Identity | None) -> None:
    snippet_path = os.path.join(workdir, SNIPPET_FILENAME)
    with open(snippet_path, "w", encoding="utf-8") as snippet:
        snippet.write(code)
    if identity is not None:
        os.chown(workdir, identity.uid, identity.gid)
        os.chown(snippet_path, identity.uid, identity.gid)


def _child_environment(workdir: str) -> dict[str, str]:
    # Nothing from the parent's environment: no tokens, keys or proxies reach the code.
    return {
        "PATH": _SAFE_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def _run_in(workdir: str, limits: SandboxLimits, identity: _Identity | None) -> SandboxResult:
    interpreter = sandbox_interpreter() if identity is not None else sys.executable
    if interpreter is None:  # root, but no interpreter the sandbox user can run: stay root (documented)
        interpreter, identity = sys.executable, None
    status_read, status_write = os.pipe()
    config = _child_config(workdir, limits, identity, status_write)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            [interpreter, "-I", "-c", _BOOTSTRAP, json.dumps(config)],
            cwd=workdir,
            env=_child_environment(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_write,),
        )
    except BaseException:
        os.close(status_read)
        raise
    finally:
        os.close(status_write)
    try:
        result = _collect(process, limits, started)
    finally:
        _kill_everything(process, identity)
    result.layers = _read_status(status_read)
    return result


def _child_config(workdir: str, limits: SandboxLimits, identity: _Identity | None, status_fd: int) -> dict:
    return {
        "snippet": SNIPPET_FILENAME,
        "cpu_seconds": max(1, int(limits.timeout) + 1),
        "memory_bytes": limits.memory_mb * 1024 * 1024,
        "max_processes": limits.max_processes,
        "max_open_files": limits.max_open_files,
        "max_file_bytes": limits.max_file_mb * 1024 * 1024,
        "allow_subprocesses": limits.allow_subprocesses,
        "uid": identity.uid if identity else None,
        "gid": identity.gid if identity else None,
        "status_fd": status_fd,
    }


def _collect(process: subprocess.Popen, limits: SandboxLimits, started: float) -> SandboxResult:
    """Read stdout/stderr until both close, the timeout passes or the output cap is reached."""
    decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
    texts = {"stdout": [], "stderr": []}
    total_chars, timed_out, output_limited = 0, False, False
    deadline = started + limits.timeout
    exited_at = None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        selector.register(process.stderr, selectors.EVENT_READ, "stderr")
        while selector.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 0.2:
                break  # the main process is gone; a leftover child is holding the pipes open
            for key, _ in selector.select(timeout=min(0.05, deadline - now)):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                text = decoders[key.data].decode(chunk)
                room = max(limits.max_output_chars - total_chars, 0)
                texts[key.data].append(text[:room])
                total_chars += len(text)
                if total_chars > limits.max_output_chars:
                    output_limited = True
                    break
            if output_limited:
                break
    if timed_out or output_limited:
        _kill_group(process)
    returncode = _wait(process)
    return SandboxResult(
        stdout="".join(texts["stdout"]),
        stderr="".join(texts["stderr"]),
        returncode=returncode,
        timed_out=timed_out,
        output_limited=output_limited,
        duration=time.monotonic() - started,
    )


def _wait(process: subprocess.Popen) -> int | None:
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        return process.wait()


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_everything(process: subprocess.Popen, identity: _Identity | None) -> None:
    """Kill the process group, every process still running as this run's uid, and reap the child."""
    _kill_group(process)
    if identity is not None:
        _kill_processes_of_uid(identity.uid)
    _wait(process)
    for stream in (process.stdout, process.stderr):
        stream.close()


def _kill_processes_of_uid(uid: int, attempts: int = 100) -> None:
    # Processes that left the group with setsid() are still this run's uid; repeat because a process
    # may fork between the scan and the kill (RLIMIT_NPROC bounds how often). The killed orphans stay
    # zombies (counted by RLIMIT_NPROC) until init reaps them, hence the oldest-first uid reuse.
    for _ in range(attempts):
        pids = _live_pids_of_uid(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)


def _live_pids_of_uid(uid: int) -> list[int]:
    if not os.path.isdir("/proc"):
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        real_uid = int(fields.get("Uid", "-1").split()[0])
        if real_uid == uid and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry))
    return pids


def _read_status(status_read: int) -> dict:
    with os.fdopen(status_read, "rb") as status:
        raw = status.read(65536)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(function, failed_path, _exc_info):
        # Code running as our own uid may have chmod-ed its files read-only.
        try:
            os.chmod(os.path.dirname(failed_path), 0o700)
            os.chmod(failed_path, 0o700)
            function(failed_path)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)
