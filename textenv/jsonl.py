"""JSON Lines, read in one place: dataset rows, task files and `completions.jsonl`."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, Union


def iter_jsonl(path: Union[str, os.PathLike], skip_torn_lines: bool = False) -> Iterator[Dict[str, Any]]:
    """The JSON objects of a `.jsonl` file, one a line, blank lines skipped.

    Args:
        path: the file.
        skip_torn_lines (`bool`): skip lines that are not complete (no final newline, or not valid JSON:
            a file that a crashed process was appending to) instead of raising.

    Raises:
        ValueError: a line is not valid JSON, or not an object; the message names the file and line.
    """
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip() or (skip_torn_lines and not line.endswith("\n")):
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                if skip_torn_lines:
                    continue
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg}).") from None
            if not isinstance(record, dict):
                if skip_torn_lines:
                    continue
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}.")
            yield record
