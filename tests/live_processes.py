"""The processes running on this machine, read from /proc, for tests that check what a run left behind."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import List


@dataclass(frozen=True)
class LiveProcess:
    pid: int
    parent: int
    group: int
    argv: List[str]

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def live_processes() -> List[LiveProcess]:
    """Every live process (a zombie counts as gone), with its parent and its command line."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, parent, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except (OSError, ValueError):
            continue
        if state != "Z":
            found.append(LiveProcess(int(entry.name), int(parent), int(group), argv))
    return found


def own_children() -> List[LiveProcess]:
    """This process's live children."""
    return [process for process in live_processes() if process.parent == os.getpid()]
