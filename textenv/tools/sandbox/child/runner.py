"""The sandboxed child's main program: set up the layers in order, report them to the parent on the
status pipe, refuse to go on in strict mode when one is missing, then run the snippet like a notebook
cell (the value of a final bare expression is printed).

Order: resource limits; namespaces (as an ordinary user a user namespace, then network, PID, and as root
a mount namespace for the Python installation); the process limit (after the user namespace: see
:mod:`.rlimits`); then, in the namespace's process that runs the code: the switch to the sandbox uid (as
root), no capabilities, ``PR_SET_NO_NEW_PRIVS`` and a parent-death signal, Landlock, the audit hook.
Stdlib only and Python 3.8 compatible: this file runs in the child, joined with the other child files.
"""

import atexit
import ctypes
import json
import os
import sys

try:  # separate modules for the parent, tests and linters; one program in the child (see bootstrap.py)
    from .audit_hook import install_audit_hook
    from .landlock import confine_filesystem, landlock_abi, sandbox_rules
    from .namespaces import enter_namespaces, expose_to_sandbox_user, load_libc, run_in_pid_namespace
    from .rlimits import OWN_TASKS, limit_processes, set_limits
except ImportError:
    pass

# The layers without which `strict` refuses to run code; "uid" only applies when the parent is root.
REQUIRED_LAYERS = ("network_namespace", "pid_namespace", "landlock", "rlimits", "process_limit", "no_new_privs",
                   "audit_hook", "uid")


def drop_privileges(config):
    uid, gid = config.get("uid"), config.get("gid")
    if uid is None:
        return "not root" if os.geteuid() != 0 else "no sandbox user"
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    return os.getuid()


def drop_capabilities(libc):
    """No capabilities at all (an ordinary user has them all inside its own user namespace)."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    linux_capability_version_3 = 0x20080522
    return libc.capset(ctypes.byref(Header(linux_capability_version_3, 0)), (Data * 2)()) == 0


def harden_process(libc):
    pr_set_pdeathsig, pr_set_no_new_privs = 1, 38
    libc.prctl(pr_set_pdeathsig, 9, 0, 0, 0)
    return libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) == 0


def restrict_filesystem(libc, config, workdir):
    abi = landlock_abi(libc)
    if not abi:
        return "unavailable: the kernel has no Landlock (or it is disabled)"
    confine_filesystem(libc, abi, sandbox_rules(workdir, config["read_paths"]))
    return abi


def missing_layers(layers):
    """The required layers that are not active, with the reason each one reported."""
    active = {
        "rlimits": lambda value: isinstance(value, list) and "RLIMIT_AS" in value and "RLIMIT_CPU" in value,
        "uid": lambda value: value == "not root" or (isinstance(value, int) and value != 0),
        "landlock": lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0,
        "process_limit": lambda value: value in OWN_TASKS,
    }
    return {name: layers.get(name, "not set up") for name in REQUIRED_LAYERS
            if not active.get(name, lambda value: value is True)(layers.get(name))}


def layer(layers, name, disabled, set_up):
    """Set up one layer unless disabled; any failure is recorded as its reason."""
    if name in disabled:
        layers[name] = "disabled for testing"
        return
    try:
        layers[name] = set_up()
    except Exception as error:  # noqa: BLE001 - a missing layer is reported, and strict mode refuses
        layers[name] = "failed: %s" % error


def report(config, layers):
    with os.fdopen(config.pop("status_fd"), "w") as status:
        status.write(json.dumps(layers))


def run_snippet(config):
    import ast
    import traceback

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
                sys.stdout.write(repr(value) + "\n")
    except SystemExit:
        raise
    except BaseException as error:
        failure = traceback.TracebackException(type(error), error, error.__traceback__)
        # Hide this program's own frames (compiled from "<string>"): the model only needs its code's.
        failure.stack = traceback.StackSummary.from_list([f for f in failure.stack if f.filename != "<string>"])
        sys.stdout.flush()
        sys.stderr.write("".join(failure.format()))
        sys.stderr.flush()
        os._exit(1)


def confine_and_run(config, libc, layers, workdir):
    """The code's own process: the per-process layers, the report, then the snippet. Never returns."""
    disabled = config["disabled_layers"]
    layer(layers, "uid", disabled, lambda: drop_privileges(config))
    layer(layers, "capabilities_dropped", disabled, lambda: drop_capabilities(libc))
    layer(layers, "no_new_privs", disabled, lambda: harden_process(libc))
    layer(layers, "landlock", disabled, lambda: restrict_filesystem(libc, config, workdir))
    layer(layers, "audit_hook", disabled, lambda: install_audit_hook(workdir, config["allow_subprocesses"]))
    layers["missing"] = missing_layers(layers)
    report(config, layers)
    exit_code = 0
    try:
        if config["strict"] and layers["missing"]:
            sys.stderr.write("sandbox: strict isolation: missing layers %s\n" % ", ".join(sorted(layers["missing"])))
            exit_code = 3
        else:
            run_snippet(config)
    except SystemExit as request:
        exit_code = exit_code_of(request)
    finish(exit_code)


def exit_code_of(request):
    """The exit status ``sys.exit(code)`` gives: 0 for None, the number, or 1 after printing anything else."""
    if request.code is None:
        return 0
    if isinstance(request.code, int):
        return request.code
    sys.stderr.write("%s\n" % (request.code,))
    return 1


def finish(exit_code):
    """Exit the way the interpreter would: exit handlers, flushed streams, then the status."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream must not change the exit status
                pass
        os._exit(exit_code & 0xFF)


def main(config):
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    workdir = os.path.realpath(os.getcwd())
    layers = {"rlimits": set_limits(config)}
    libc = load_libc()
    if isinstance(libc, str):
        layers["kernel"] = libc
        limit_processes(config, layers)
        confine_and_run(config, None, layers, workdir)
    switching_uid = config["uid"] is not None
    names = ["network_namespace", "pid_namespace"] + (["mount_namespace"] if switching_uid else [])
    layers.update(enter_namespaces(libc, names, config["disabled_layers"]))
    limit_processes(config, layers)  # after the user namespace, before any fork
    if layers.get("mount_namespace") is True:
        reachable = [sys.base_prefix, sys.prefix] + config["read_paths"] + [workdir]
        paths = [os.path.realpath(path) for path in reachable]
        layer(layers, "exposed", (), lambda: expose_to_sandbox_user(libc, paths))
    if layers.get("pid_namespace") is True:
        run_in_pid_namespace(libc, config["status_fd"], lambda: confine_and_run(config, libc, layers, workdir))
    confine_and_run(config, libc, layers, workdir)
