"""The Python-level layer of the sandboxed child: an audit hook (``sys.addaudithook``, which cannot be
removed) refusing sockets, ``ctypes``/``cffi``, starting processes (unless allowed), writing or changing
files outside the working directory, reading other processes' ``/proc`` entries and signalling other
processes. Python code cannot remove it, but native code could get around it: the kernel layers
(namespaces, Landlock, the uid switch, rlimits) are what hold against that.
Stdlib only and Python 3.8 compatible: this file runs in the child, joined with the other child files.
"""

import os
import sys


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

    def real_path(path):
        real = realpath(fspath(path))
        return os.fsdecode(real) if isinstance(real, bytes) else real

    def inside(path):
        if isinstance(path, int):  # a file descriptor: opened under these same rules
            return True
        real = real_path(path)
        return real == workdir or real.startswith(workdir + sep)

    def other_process_entry(path):
        if isinstance(path, int):
            return False
        parts = real_path(path).split(sep)
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
