"""`completions.jsonl`: one JSON line per finished episode, appended and flushed as it finishes.

Fields: `step`, `prompt` (the chat-template text of every message before the final reply),
`completion` (the final assistant reply, ``""`` if none), `messages`, `total_reward`, `step_rewards`,
`num_turns`, `trajectory_id`, `trajectory_infos` (the reset info then every step info; ms-swift
documents this field but stopped writing it), `finish_reason`, `error` (`null` or
``{"stage", "type", "message"}``), `env` and `row_index`. Values that JSON cannot hold are written as
their `repr`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union


class CompletionsLog:
    """Append-only JSONL writer; each line is flushed (and optionally fsynced) before `write` returns, so a
    crash loses at most the line being written.

    Args:
        path (`str` or `Path`): the file; parent folders are created; an existing file is appended to.
        fsync (`bool`, defaults to `False`): also ask the OS to put each line on disk.

    Use it as a context manager, or call `close()`.
    """

    def __init__(self, path: Union[str, Path], fsync: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: Dict[str, Any]) -> None:
        """Append one record as a JSON line."""
        line = json.dumps(record, ensure_ascii=False, default=repr)
        self._file.write(line + "\n")
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __enter__(self) -> "CompletionsLog":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def read_completions(path: Union[str, Path]) -> List[Dict[str, Any]]:
    """Every complete line of a `completions.jsonl` (a torn last line, from a crash, is skipped)."""
    return list(iter_completions(path))


def iter_completions(path: Union[str, Path]) -> Iterator[Dict[str, Any]]:
    with open(path, encoding="utf-8") as file:
        for line in file:
            record = _parse(line)
            if record is not None:
                yield record


def _parse(line: str) -> Optional[Dict[str, Any]]:
    if not line.endswith("\n"):
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
