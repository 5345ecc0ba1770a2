"""The code blocks of the README and the documentation pages, and the markers that say how the tests check them.

A ```python block runs (the blocks of one page in order, in one fresh process) unless the line before it is
``<!-- docs-test: skip: REASON -->`` (it needs a GPU, servers or a long run: only compiled and its imports
resolved) or ``<!-- example: NAME -->`` (run by the test module that names that marker). The command lines of
the pages are tests/docs_commands.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
MARKER = re.compile(r"<!-- (docs-test: skip: [^>]+|example: [\w-]+) -->\s*$")


@dataclass
class Block:
    """One fenced code block: its page, language, source and the marker on the line before it (or None)."""

    page: Path
    language: str
    source: str
    line: int
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order."""
    text = page.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(page, match.group(1), match.group(2), line, marker.group(1) if marker else None))
    return blocks


def python_blocks(page: Path) -> list[Block]:
    return [block for block in page_blocks(page) if block.language == "python"]


def example_source(page: str, marker: str) -> str:
    """The source of the ```python block right after `marker` (``<!-- example: NAME -->``) on `page`, a path
    under docs/, for the test that runs it."""
    blocks = [block for block in python_blocks(ROOT / "docs" / page) if f"<!-- {block.marker} -->" == marker]
    assert blocks, f"docs/{page} has no python block right after {marker}"
    return blocks[0].source
