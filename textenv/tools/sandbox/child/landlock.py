"""Landlock (Linux >= 5.13): the kernel confines what the code may read, write and execute to a list of
folders and files, whatever its uid, and ctypes or native code cannot undo it.

Granted: the Python installation (its standard library, without site-packages, the executable and
libpython), the system's shared libraries, a few device files, the working directory (read and write)
and the paths the user allowed (read). From ABI 4 TCP connect/bind are refused, and from ABI 6 the code
cannot signal processes outside the sandbox or reach abstract Unix sockets.
Stdlib only and Python 3.8 compatible: this file runs in the child, joined with the other child files.
"""

import ctypes
import glob
import os
import stat
import sys

try:  # separate modules for the parent, tests and linters; one program in the child (see bootstrap.py)
    from .namespaces import os_error
except ImportError:
    pass

SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_ALL = (1 << 16) - 1
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
SITE_FOLDERS = ("site-packages", "dist-packages")
DEVICES_READ = ("/dev/urandom", "/dev/random", "/dev/zero")


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi(libc):
    """The kernel's Landlock ABI version, or 0 where Landlock is missing or disabled."""
    version = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(version, 0)


def handled_filesystem_rights(abi):
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= 1 << 13  # refer: links and renames across folders
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def sandbox_rules(workdir, read_paths):
    """``(path, rights)`` pairs: what the code may read, and the working directory it may also change."""
    readable = [os.path.realpath(sys.executable)] + libpython_files() + system_library_paths() + list(read_paths)
    rules = [(path, FS_READ) for path in readable] + import_folder_rules()
    rules += [(path, FS_READ_FILE) for path in DEVICES_READ + ("/etc/localtime",)]
    return rules + [("/dev/null", FS_READ_FILE | FS_WRITE_FILE), (workdir, FS_ALL)]


def libpython_files():
    """libpython, and a venv's pyvenv.cfg (a new interpreter started from the venv reads it)."""
    venv_config = [os.path.join(sys.prefix, "pyvenv.cfg")] if sys.prefix != sys.base_prefix else []
    return glob.glob(os.path.join(os.path.realpath(sys.base_prefix), "lib", "libpython*")) + venv_config


def import_folder_rules():
    """The interpreter's import folders (standard library, lib-dynload), without site-packages."""
    rules = []
    for entry in sys.path:
        folder = os.path.realpath(entry or ".")
        if os.path.basename(folder) in SITE_FOLDERS or not os.path.exists(folder):
            continue
        if not os.path.isdir(folder) or not any(os.path.isdir(os.path.join(folder, name)) for name in SITE_FOLDERS):
            rules.append((folder, FS_READ))
            continue
        # The standard library folder holds site-packages: grant its entries one by one, but not that one
        # (listing the folder itself, site-packages' names included, stays allowed).
        rules += [(os.path.join(folder, name), FS_READ) for name in os.listdir(folder) if name not in SITE_FOLDERS]
        rules.append((folder, FS_READ_DIR))
    return rules


def system_library_paths():
    """Where the dynamic loader finds the C libraries that extension modules link against."""
    return ["/lib64", "/usr/lib64", "/etc/ld.so.cache"] + glob.glob("/lib/*-linux-*") + glob.glob("/usr/lib/*-linux-*")


def confine_filesystem(libc, abi, rules):
    """Restrict this process (and its future children) to ``rules``; returns the number of paths granted."""
    handled = handled_filesystem_rights(abi)
    attr = RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise os_error("creating the Landlock ruleset")
    try:
        granted = sum(add_rule(libc, ruleset, path, rights, handled) for path, rights in rules)
        if libc.syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise os_error("enforcing the Landlock ruleset")
    finally:
        os.close(ruleset)
    return granted


def add_rule(libc, ruleset, path, rights, handled):
    try:
        parent = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return 0  # a path this system does not have
    try:
        if not stat.S_ISDIR(os.fstat(parent).st_mode):
            rights &= FILE_RIGHTS
        rule = PathBeneathAttr(rights & handled, parent)
        if libc.syscall(ctypes.c_long(SYS_LANDLOCK_ADD_RULE), ctypes.c_int(ruleset),
                        ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise os_error("granting " + path)
    finally:
        os.close(parent)
    return 1
