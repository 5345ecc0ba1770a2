"""`view_command`: the `textenv view` command the demo and the examples print runs from the user's shell, also
when `make demo` ran the environment's script without activating it."""

import shutil
import sys

import pytest

from textenv.reporting import view_command


@pytest.fixture
def environment(tmp_path, monkeypatch):
    """A virtual environment's bin folder holding a `textenv` script, as this process's interpreter's folder."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "textenv").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    return bin_dir


def test_the_bare_name_when_path_finds_this_environments_textenv(environment, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: str(environment / name))
    assert view_command("outputs/demo") == "textenv view outputs/demo"


@pytest.mark.parametrize("on_path", [None, "/usr/local/bin/textenv"], ids=["no textenv on PATH", "another environment's"])
def test_the_environments_own_script_when_path_finds_no_textenv_of_it(environment, monkeypatch, on_path):
    monkeypatch.setattr(shutil, "which", lambda name: on_path)
    assert view_command("outputs/demo") == "venv/bin/textenv view outputs/demo"
