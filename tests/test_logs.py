"""Logging through the `logging` module (rank 0 by default), no bare print in library code, progress bars."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from textenv.environment import TextEnvironment
from textenv.logs import setup_logging

PACKAGE = Path(__file__).resolve().parents[1] / "textenv"
# The sandbox's child process talks to its parent over stdout: printing is its protocol.
# The sandbox bootstrap talks to its parent over stdout; textenv check-model's product is its report on stdout.
PRINT_ALLOWED = {PACKAGE / "tools" / "sandbox" / "bootstrap.py", PACKAGE / "check_model.py"}


def test_no_bare_print_in_library_code():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path in PRINT_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_main_process_logs_info_other_ranks_only_warnings(capsys, monkeypatch):
    logger = logging.getLogger("textenv.test")
    setup_logging("info")
    logger.info("hello from rank 0")
    monkeypatch.setenv("RANK", "1")
    setup_logging("info")
    logger.info("hello from rank 1")
    logger.warning("warning from rank 1")
    out = capsys.readouterr().out
    assert "hello from rank 0" in out and "hello from rank 1" not in out and "warning from rank 1" in out


def test_log_level_is_applied_and_checked(capsys):
    setup_logging("warning", main_process=True)
    logging.getLogger("textenv.test").info("quiet")
    setup_logging("debug", main_process=True)
    logging.getLogger("textenv.test").debug("loud")
    out = capsys.readouterr().out
    assert "quiet" not in out and "loud" in out
    assert len([h for h in logging.getLogger("textenv").handlers if type(h).__name__ == "_StdoutHandler"]) == 1
    with pytest.raises(ValueError, match="log_level must be one of"):
        setup_logging("verbose")
    setup_logging("info")


@pytest.mark.parametrize("tool_format", ["tags", "json"])
def test_text_environment_progress_bar_is_opt_in(tokenizer, tiny_model, capsys, tool_format):
    kwargs = {"generation_kwargs": {"max_new_tokens": 2, "do_sample": False}, "max_turns": 1, "tool_format": tool_format}
    TextEnvironment(tiny_model, tokenizer, {}, None, "", **kwargs).run(["a", "b", "c"])
    assert "episodes" not in capsys.readouterr().err
    TextEnvironment(tiny_model, tokenizer, {}, None, "", progress=True, **kwargs).run(["a", "b", "c"])
    assert "3/3" in capsys.readouterr().err
