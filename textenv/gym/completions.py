"""`completions.jsonl`: one JSON line per finished episode, appended and flushed as it finishes.

Fields: `step`, `prompt` (the chat-template text of every message before the final reply),
`completion` (the final assistant reply, ``""`` if none), `messages`, `total_reward`, `step_rewards`,
`num_turns`, `trajectory_id`, `trajectory_infos` (the reset info then every step info; ms-swift
documents this field but stopped writing it), `finish_reason`, `error` (`null` or
``{"stage", "type", "message"}``), `env` and `row_index`; when the engine reports log-probabilities (the
vLLM backend), also `turn_logprobs`: per model turn, the log-probability of each generated token (`null`
for a turn without them); in a training loop, `turn_policy_versions`: per model turn, the version of the
weights that sampled it. Values that JSON cannot hold are written as their `repr`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

from textenv.jsonl import iter_jsonl


class CompletionsLog:
    """Append-only JSONL writer. Each line reaches the file in one `write` system call on an `O_APPEND`
    descriptor before `write` returns (optionally fsynced), so a crash, even `kill -9`, leaves only whole
    lines behind and loses at most the line being written.

    Args:
        path (`str` or `Path`): the file; parent folders are created; an existing file is appended to.
        fsync (`bool`, defaults to `False`): also ask the OS to put each line on disk.

    Use it as a context manager, or call `close()`.
    """

    def __init__(self, path: Union[str, Path], fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: Dict[str, Any]) -> None:
        """Append one record as a JSON line."""
        if self._fd is None:
            raise ValueError(f"{self.path}: the completions log is closed.")
        line = (json.dumps(record, ensure_ascii=False, default=repr) + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        while written < len(line):  # only on a full disk or an interrupted write; finish the line
            written += os.write(self._fd, line[written:])
        if self.fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def closed(self) -> bool:
        return self._fd is None

    def __enter__(self) -> "CompletionsLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_completions(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """Every complete line of a `completions.jsonl` (a torn last line, from a crash, is skipped)."""
    return list(iter_completions(path))


def iter_completions(path: Union[str, Path]) -> Iterator[Dict[str, Any]]:
    """`read_completions`, one record at a time."""
    return iter_jsonl(path, skip_torn_lines=True)
