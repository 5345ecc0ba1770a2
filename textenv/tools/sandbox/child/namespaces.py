"""Kernel namespaces of the sandboxed child (Linux).

- a network namespace: only a down loopback interface exists;
- a PID namespace: the code runs as a process of a fresh namespace whose first process (its "init") is
  killed when the code's process ends, and the kernel then kills every process left in the namespace,
  including children that called ``setsid()`` or forked twice;
- as root only, a mount namespace in which a tmpfs covers each folder the unprivileged sandbox user
  cannot enter (``/root`` for a pyenv or a venv there) and only the Python installation, the working
  directory and the paths the user allowed are mounted back inside it.

An ordinary user gets the namespaces inside a user namespace of its own (same uid and gid inside), in
which the kernel also counts the sandbox's tasks for the process limit apart from the user's others.
Stdlib only and Python 3.8 compatible: this file runs in the child, joined with the other child files.
"""

import ctypes
import os
import signal
import stat

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = {"network_namespace": CLONE_NEWNET, "pid_namespace": CLONE_NEWPID, "mount_namespace": CLONE_NEWNS}

MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same number on every architecture (>= 424)
OPEN_TREE_CLONE, AT_RECURSIVE, AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH = 0x1, 0x8000, -100, 0x4


def load_libc():
    """The C library, or the reason it cannot be loaded (then no kernel layer can be set up)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except Exception as error:  # noqa: BLE001 - reported as a missing layer
        return "unavailable: %s" % error


def os_error(what):
    errno = ctypes.get_errno()
    return OSError(errno, "%s: %s" % (what, os.strerror(errno)))


def enter_namespaces(libc, names, disabled):
    """Unshare the namespaces ``names`` (keys of `NAMESPACE_FLAGS`); return ``{name: True or reason}``,
    with ``user_namespace`` too when not root (it holds the others, and :mod:`.rlimits` counts in it)."""
    status = {}
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        if "user_namespace" in disabled:
            reason = "disabled for testing (no user namespace)"
        elif libc.unshare(CLONE_NEWUSER) != 0:
            reason = "refused: user namespaces: %s" % os.strerror(ctypes.get_errno())
        else:
            reason = None
        if reason is not None:
            return dict({name: reason for name in names}, user_namespace=reason)
        map_own_ids(uid, gid)
        status["user_namespace"] = True
    for name in names:
        if name in disabled:
            status[name] = "disabled for testing"
        elif libc.unshare(NAMESPACE_FLAGS[name]) == 0:
            status[name] = True
        else:
            status[name] = "refused: %s" % os.strerror(ctypes.get_errno())
    return status


def map_own_ids(uid, gid):
    """Inside a new user namespace, be the same uid and gid as outside (no other ids exist there)."""
    for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)), ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as mapping:
            mapping.write(text)


def expose_to_sandbox_user(libc, paths):
    """In this process's new mount namespace, let a user with no rights on the folders around ``paths``
    reach them: a tmpfs covers each first folder on the way that others may not enter, and ``paths``
    are mounted back at their own place inside it. Returns the paths mounted back."""
    covered = {}
    for path in paths:
        closed = first_closed_ancestor(path)
        if closed is not None:
            covered.setdefault(closed, []).append(path)
    if not covered:
        return []
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise os_error("making mounts private")
    exposed = []
    for folder, inside in covered.items():
        trees = [(path, clone_tree(libc, path)) for path in outermost(inside)]
        if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k") != 0:
            raise os_error("covering " + folder)
        for path, tree in trees:
            make_mount_point(path, stat.S_ISDIR(os.fstat(tree).st_mode))
            if libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
                raise os_error("mounting " + path)
            os.close(tree)
            exposed.append(path)
    return exposed


def first_closed_ancestor(path):
    """The first folder above ``path`` that users other than its owner may not enter, or None."""
    parts = path.strip("/").split("/")[:-1]
    for depth in range(len(parts)):
        folder = "/" + "/".join(parts[: depth + 1])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def outermost(paths):
    """``paths`` without those inside another one of them."""
    unique = sorted(set(paths))
    return [path for path in unique if not any(path.startswith(other + "/") for other in unique if other != path)]


def clone_tree(libc, path):
    flags = OPEN_TREE_CLONE | AT_RECURSIVE | os.O_CLOEXEC
    tree = libc.syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), path.encode(), ctypes.c_uint(flags))
    if tree < 0:
        raise os_error("cloning " + path)
    return tree


def make_mount_point(path, is_folder):
    old_umask = os.umask(0o022)
    try:
        os.makedirs(path if is_folder else os.path.dirname(path), exist_ok=True)
        if not is_folder:
            open(path, "a").close()
    finally:
        os.umask(old_umask)


def run_in_pid_namespace(libc, status_fd, body):
    """Run ``body`` (which ends with ``os._exit``) as a process of the PID namespace entered before, then
    end the namespace, so that no process the code started survives, and exit as ``body`` did."""
    init = os.fork()
    if init == 0:  # PID 1 of the namespace: reaps orphans until it is killed
        os.close(status_fd)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        reap_forever()
    body_pid = os.fork()
    if body_pid == 0:
        body()
    os.close(status_fd)
    _, wait_status = os.waitpid(body_pid, 0)
    os.kill(init, signal.SIGKILL)  # the kernel then kills every process left in the namespace
    os.waitpid(init, 0)
    exit_as(wait_status)


def reap_forever():
    while True:
        try:
            os.wait()
        except ChildProcessError:
            signal.pause()
        except InterruptedError:
            pass


def exit_as(wait_status):
    """End this process the way a child with ``wait_status`` ended (the same exit code or signal)."""
    if os.WIFSIGNALED(wait_status):
        number = os.WTERMSIG(wait_status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(wait_status))
