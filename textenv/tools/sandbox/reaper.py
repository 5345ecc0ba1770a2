"""Ending a sandboxed run: kill its process group and every leftover process of its uid, and reap the child."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .identity import Identity


def wait(process: subprocess.Popen) -> int | None:
    """Reap ``process`` and return its exit status, killing its group if it has not exited within 5 s."""
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        kill_group(process)
        return process.wait()


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group ``process`` leads (started with ``start_new_session``), if it still exists."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_everything(process: subprocess.Popen, identity: Identity | None) -> None:
    """Kill the process group, every process still running as this run's uid, and reap the child.

    Args:
        process (`subprocess.Popen`): The sandboxed child; its stdout and stderr pipes are closed too.
        identity (`Identity` or `None`): The run's own uid/gid, or `None` when it kept the parent's uid.
    """
    kill_group(process)
    if identity is not None:
        _kill_processes_of_uid(identity.uid)
    wait(process)
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
