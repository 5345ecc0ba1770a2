"""Which isolation layers the kernel grants here, found once per process by a real sandboxed run, and
what each missing layer leaves open (for warnings, ``strict`` refusals and docs/guides/safety.md)."""

from __future__ import annotations

import threading

from .bootstrap import disabled_layers_for_testing
from .limits import SandboxLimits
from .process import run_python

# What is no longer stopped when a required layer is missing.
LAYER_EFFECTS = {
    "landlock": "the kernel does not confine reads, writes and program starts to the allowed paths "
    "(only the audit hook and file permissions remain)",
    "pid_namespace": "a child that calls setsid() or forks twice can outlive the call",
    "network_namespace": "the network is reachable (only the audit hook refuses sockets)",
    "uid": "the code runs as root (file permissions and RLIMIT_NPROC do not hold)",
    "rlimits": "CPU time and memory are not limited by the kernel",
    "process_limit": "max_processes does not bound the sandbox's tasks alone: without a user namespace it comes "
    "on top of the uid's task count at the start of the call, so tasks that uid ends or starts elsewhere during "
    "the call let the code start more, or fewer (forks then fail with EAGAIN); as root without the uid switch "
    "it does not hold",
    "no_new_privs": "set-uid programs can raise privileges",
    "audit_hook": "Python-level checks (sockets, ctypes, writes, /proc) are off",
}

_PROBED: dict[tuple, dict] = {}
_PROBE_LOCK = threading.Lock()


def isolation_layers(limits: SandboxLimits) -> dict:
    """The layers a run with ``limits`` gets on this machine (a real sandboxed ``pass``, cached per process).

    Returns:
        `dict`: layer name -> `True`, a value (Landlock ABI, sandbox uid, rlimits applied) or the reason
        it is missing; ``"missing"`` maps each missing required layer to its reason.
    """
    key = (limits, tuple(disabled_layers_for_testing()))
    with _PROBE_LOCK:
        if key not in _PROBED:
            result = run_python("pass", limits)
            layers = dict(result.layers)
            if not layers:
                reason = f"the sandbox child ended before reporting (exit {result.returncode}): {result.stderr[-500:]}"
                layers = {"missing": {"sandbox": reason}}
            _PROBED[key] = layers
        return dict(_PROBED[key])


def describe_missing(missing: dict) -> str:
    """One line per missing layer: its name, why it is missing, and what that leaves open."""
    return "\n".join(
        f"  - {name} ({reason}): {LAYER_EFFECTS.get(name, 'the sandbox could not start')}"
        for name, reason in sorted(missing.items())
    )
