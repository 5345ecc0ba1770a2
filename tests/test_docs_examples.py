"""Every example of the README and the documentation site runs: the python blocks of each page in a fresh
process (in order, as a reader would paste them), blocks marked as needing a GPU or servers compiled with their
imports resolved, blocks owned by another test named in it (see tests/docs_blocks.py for the markers). The
command lines are tests/test_docs_commands.py's."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

from tests.docs_blocks import PAGES, ROOT, python_blocks

RUN_TIMEOUT_S = 900


def page_id(page) -> str:
    return str(page.relative_to(ROOT))


RUNNABLE_PAGES = [page for page in PAGES if any(block.marker is None for block in python_blocks(page))]
MARKED_BLOCKS = [block for page in PAGES for block in python_blocks(page) if block.marker is not None]


@pytest.mark.parametrize("page", RUNNABLE_PAGES, ids=page_id)
def test_the_python_blocks_of_a_page_run(page, tmp_path):
    blocks = [block for block in python_blocks(page) if block.marker is None]
    program = "\n\n".join(f"# {block.where}\n{block.source}" for block in blocks)
    completed = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert completed.returncode == 0, f"{page_id(page)}: the page's python blocks fail:\n{completed.stderr[-4000:]}"


def imported_names(source: str) -> list[tuple[str, str | None]]:
    """(module, name) for every import of `source`; name is None for `import module`."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [(node.module, alias.name) for alias in node.names]
    return names


@pytest.mark.parametrize("block", [block for block in MARKED_BLOCKS if block.marker.startswith("docs-test: skip")], ids=lambda block: block.where)
def test_a_block_that_cannot_run_here_compiles_and_its_imports_resolve(block):
    compile(block.source, block.where, "exec")
    for module, name in imported_names(block.source):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name), f"{block.where}: `from {module} import {name}`: no such name"


@pytest.mark.parametrize("block", [block for block in MARKED_BLOCKS if block.marker.startswith("example:")], ids=lambda block: block.where)
def test_a_block_marked_as_an_example_is_run_by_a_test(block):
    marker = f"<!-- {block.marker} -->"
    owners = [path.name for path in (ROOT / "tests").glob("test_*.py") if marker in path.read_text() and path.name != "test_docs_examples.py"]
    assert owners, f"{block.where}: no test module runs the block marked {marker}"
