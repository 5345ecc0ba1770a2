"""Every notebook in notebooks/ runs top to bottom in small mode (TEXTENV_SMALL=1) without a cell error,
and is committed with its outputs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # generous: the test machine's CPUs are shared
NOTEBOOK_TIMEOUT_S = 1200


def code_cells(notebook) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_the_notebooks_are_found():
    names = {path.name for path in NOTEBOOKS}
    assert {"calculator.ipynb", "visualising_histories.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_is_saved_executed(path):
    """The committed notebook shows its outputs: every code cell ran, in order, without an error."""
    notebook = nbformat.read(path, as_version=4)
    counts = [cell.execution_count for cell in code_cells(notebook)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: re-execute it top to bottom and save it"
    errors = [output for cell in code_cells(notebook) for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name} was saved with an error output: {errors[0].get('ename')}"


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebook_runs_in_small_mode(path, monkeypatch):
    monkeypatch.setenv("TEXTENV_SMALL", "1")  # the kernel inherits this process's environment
    notebook = nbformat.read(path, as_version=4)
    for cell in code_cells(notebook):
        cell.outputs, cell.execution_count = [], None
    notebook.cells.append(nbformat.v4.new_code_cell('import os; print("TEXTENV_SMALL =", os.environ.get("TEXTENV_SMALL"))'))
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError on the first failing cell

    assert all(cell.execution_count is not None for cell in code_cells(notebook))
    kernel_environment = "".join(output.get("text", "") for output in notebook.cells[-1].outputs)
    assert kernel_environment.strip() == "TEXTENV_SMALL = 1"
