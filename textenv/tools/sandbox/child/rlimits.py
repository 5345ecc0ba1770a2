"""Resource limits of the sandboxed child: CPU time, address space, open files, file size and no core
dumps first (:func:`set_limits`), then, once the namespaces are entered, the process limit
(:func:`limit_processes`).

The kernel checks ``RLIMIT_NPROC`` at each fork against the number of tasks (processes and threads) its
real uid already has, not against the forking process's descendants. What it counts decides what
``max_processes`` bounds:

- as root, the code runs as a uid of its own (one per concurrent run), so only its tasks count;
- as an ordinary user, the count is kept per user namespace (Linux >= 5.14), and the limit is set after
  entering the sandbox's own user namespace: only the sandbox's tasks count (the bootstrap and the PID
  namespace's init included), whatever else that user runs (a trainer's threads, other sandboxes). Set
  before, the namespace would take the limit as its ceiling for the uid's tasks everywhere, and every
  fork would fail once the user had ``max_processes`` tasks;
- with no user namespace (refused, or a kernel before 5.14), the limit is the uid's task count at the
  start plus ``max_processes``, reported as missing: tasks the user ends elsewhere during the call let
  the code start that many more, tasks it starts elsewhere leave the code fewer (forks then fail with
  ``EAGAIN``), and the count (a scan of ``/proc``) misses tasks outside this PID namespace.
Stdlib only and Python 3.8 compatible: this file runs in the child, joined with the other child files.
"""

import os

OWN_TASKS = ("own uid", "own user namespace")  # process_limit values that count only the sandbox's tasks


def set_limits(config):
    """Every limit but the process limit; returns the names applied, or why none could be."""
    try:
        import resource
    except ImportError:
        return "unavailable"
    wanted = {
        "RLIMIT_CPU": (config["cpu_seconds"], config["cpu_seconds"] + 1),
        "RLIMIT_AS": (config["memory_bytes"],) * 2,
        "RLIMIT_NOFILE": (config["max_open_files"],) * 2,
        "RLIMIT_FSIZE": (config["max_file_bytes"],) * 2,
        "RLIMIT_CORE": (0, 0),
    }
    return [name for name, (soft, hard) in wanted.items() if lower_limit(resource, name, soft, hard)]


def lower_limit(resource, name, soft, hard):
    """Set limit ``name`` to ``(soft, hard)``, never above its current hard limit; whether it was set."""
    kind = getattr(resource, name, None)
    if kind is None:
        return False
    _, current_hard = resource.getrlimit(kind)
    if current_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, current_hard), min(hard, current_hard)
    try:
        resource.setrlimit(kind, (soft, hard))
        return True
    except (ValueError, OSError):
        return False


def limit_processes(config, layers):
    """Set ``RLIMIT_NPROC`` so that it bounds the sandbox's own tasks (see the module docstring), after
    the namespaces are entered and before any fork; record in ``layers["process_limit"]`` what it counts
    (a value of `OWN_TASKS`, or the reason it does not count only the sandbox's tasks)."""
    try:
        import resource
    except ImportError:
        layers["process_limit"] = "unavailable: no resource module"
        return
    limit = config["max_processes"]
    if os.geteuid() == 0:
        counts = "own uid" if config["uid"] is not None else "not enforced: the code runs as root"
    elif layers.get("user_namespace") is True and kernel_at_least(5, 14):
        counts = "own user namespace"
    else:
        others = tasks_of_uid(os.getuid()) - 1  # this process is the sandbox's first task
        limit += others
        why = "no user namespace" if layers.get("user_namespace") is not True else "a kernel before 5.14"
        counts = "relative (%s): %d tasks of uid %d elsewhere at the start + %d" % (
            why, others, os.getuid(), config["max_processes"])
    if not lower_limit(resource, "RLIMIT_NPROC", limit, limit):
        counts = "failed: RLIMIT_NPROC could not be set"
    elif isinstance(layers.get("rlimits"), list):
        layers["rlimits"].append("RLIMIT_NPROC")
    layers["process_limit"] = counts


def kernel_at_least(major, minor):
    try:
        numbers = os.uname().release.split("-")[0].split(".")
        return (int(numbers[0]), int(numbers[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def tasks_of_uid(uid):
    """The processes and threads whose real uid is ``uid``, as far as this PID namespace's /proc shows."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return count
