"""Logging: every module logs to a logger under ``textenv`` (``logging.getLogger(__name__)``).

A library call shows nothing below WARNING (Python's default). The command line and the demo call
`setup_logging`, which prints textenv's records as plain lines on stdout, on the main process only: under
``accelerate launch`` or ``torchrun`` the other ranks show warnings and errors only.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ROOT = "textenv"


class _StdoutHandler(logging.Handler):
    """Writes to whatever `sys.stdout` is at the time (so notebooks and captured output see it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def is_main_process() -> bool:
    """Rank 0 of a distributed launch (``RANK``, else ``LOCAL_RANK``), or a single process."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")) or 0) == 0


def setup_logging(level: str = "info", main_process: bool | None = None) -> logging.Logger:
    """Print textenv's log records at `level` and above on stdout (other ranks: WARNING and above).

    Args:
        level (`str`): one of `LOG_LEVELS`.
        main_process (`bool`, *optional*): whether this process logs at `level`; default `is_main_process()`.

    Returns:
        The ``textenv`` logger.

    Raises:
        ValueError: an unknown level, naming the choices.
    """
    if str(level).lower() not in LOG_LEVELS:
        raise ValueError(f"log_level must be one of {list(LOG_LEVELS)}, got {level!r}.")
    numeric = getattr(logging, str(level).upper())
    if not (is_main_process() if main_process is None else main_process):
        numeric = max(numeric, logging.WARNING)
    logger = logging.getLogger(ROOT)
    logger.setLevel(numeric)
    for handler in [handler for handler in logger.handlers if isinstance(handler, _StdoutHandler)]:
        logger.removeHandler(handler)
    handler = _StdoutHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    return logger


def progress_bar(total: int, enabled: bool, desc: str = "episodes", unit: str = "episode"):
    """A tqdm bar over `total` items (a disabled one when not `enabled`, or off the main process)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not (enabled and is_main_process()))
