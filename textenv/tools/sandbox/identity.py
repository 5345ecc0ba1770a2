"""Unprivileged uids/gids for sandboxed runs when the parent runs as root.

Each concurrent run gets a uid of its own, so that RLIMIT_NPROC counts only that run's processes and
its leftovers can be found and killed by uid (:func:`~.reaper.kill_everything`).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

_SANDBOX_UID_BASE = 1_900_000_000
_SLOTS_PER_PROCESS = 256


def running_as_root() -> bool:
    """Whether this process runs with effective uid 0 (and so switches sandboxed runs to a sandbox uid)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass(frozen=True)
class Identity:
    """The uid and gid one sandboxed run (or interpreter probe) runs as."""

    uid: int
    gid: int


class IdentityPool:
    """Hands out a distinct unprivileged uid/gid to each concurrent run of this process."""

    def __init__(self) -> None:
        self._free = list(range(_SLOTS_PER_PROCESS))
        self._available = threading.Condition()

    def _base(self) -> int:
        return _SANDBOX_UID_BASE + (os.getpid() % 65536) * _SLOTS_PER_PROCESS

    def acquire(self) -> Identity:
        """Take a free identity, waiting while all of this process's slots are in use."""
        with self._available:
            while not self._free:
                self._available.wait()
            slot = self._free.pop(0)  # oldest first: a just-released uid may still have zombies counted
        uid = self._base() + slot
        return Identity(uid=uid, gid=uid)

    def release(self, identity: Identity) -> None:
        """Give back an identity taken with :meth:`acquire`."""
        with self._available:
            self._free.append(identity.uid - self._base())
            self._available.notify()

    def probe_identity(self) -> Identity:
        """The identity interpreter probes use: just below this process's range, never a run's."""
        uid = self._base() - 1
        return Identity(uid=uid, gid=uid)


IDENTITIES = IdentityPool()
