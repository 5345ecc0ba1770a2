"""The child side of a sandboxed run: the bootstrap program that sets up the isolation layers and then
runs the snippet, the configuration the parent passes it, and the status report it sends back."""

from __future__ import annotations

import json
import os

from .identity import Identity
from .limits import SandboxLimits
from .workspace import SNIPPET_FILENAME

# Runs as `python -I -c BOOTSTRAP CONFIG_JSON` in the working directory. Kept Python-3.8 compatible: the
# interpreter may be the system python3 rather than the parent's.
BOOTSTRAP = r'''
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


def child_config(limits: SandboxLimits, identity: Identity | None, status_fd: int) -> dict:
    """The configuration :data:`BOOTSTRAP` reads from its first argument (as JSON).

    Args:
        limits (`SandboxLimits`): The run's limits, turned into rlimit values.
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
        "uid": identity.uid if identity else None,
        "gid": identity.gid if identity else None,
        "status_fd": status_fd,
    }


def read_status(status_read: int) -> dict:
    """The layers the child reported as active on the pipe ``status_read`` (closed here); empty if none."""
    with os.fdopen(status_read, "rb") as status:
        raw = status.read(65536)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}
