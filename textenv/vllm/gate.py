"""`ServingGate`: every turn is served whole by one version of the weights, also while training runs beside.

When rollouts overlap training (`textenv.training.train(max_staleness=K)`), the trainer sends new weights to
the servers while episodes are in flight. The gate makes that safe on any number of servers: `pause()` stops
new turns and waits until the turns in flight have finished, the weights are loaded (and the servers' prefix
caches dropped), and `resume(version)` lets the waiting turns through, stamped with the new version. No turn is
ever served with half-loaded weights or by two versions; an episode's later turns may use a newer version than
its earlier ones, and each turn records its own. `close()` refuses new turns (the loop is stopping).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


class RolloutsStopped(RuntimeError):
    """A turn was asked for after the training loop stopped its rollouts."""


class ServingGate:
    """Admits turns between weight updates and counts the version of the weights serving them.

    Attributes:
        version (`int`, *optional*): the version of the weights the servers hold (the training loop's count of
            optimizer steps; `None` outside a training loop).
        pause_seconds (`list[float]`): how long each pause waited for the turns in flight.
        busy_seconds (`float`): wall time so far with at least one turn in flight (the servers' busy time).
    """

    def __init__(self, version: int | None = None):
        self.version = version
        self.pause_seconds: list[float] = []
        self._changed = threading.Condition()
        self._in_flight = 0
        self._paused = False
        self._closed = False
        self._busy_since = 0.0
        self._busy_total = 0.0

    @property
    def busy_seconds(self) -> float:
        with self._changed:
            return self._busy_total + (time.perf_counter() - self._busy_since if self._in_flight else 0.0)

    @contextlib.contextmanager
    def turn(self) -> Iterator[int | None]:
        """Hold the gate open while one turn is served; yields the version of the weights serving it.

        Raises:
            RolloutsStopped: the gate was closed (before or while this turn waited).
        """
        with self._changed:
            self._changed.wait_for(lambda: self._closed or not self._paused)
            if self._closed:
                raise RolloutsStopped("rollouts were stopped: the training loop is ending")
            if not self._in_flight:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
            version = self.version
        try:
            yield version
        finally:
            with self._changed:
                self._in_flight -= 1
                if not self._in_flight:
                    self._busy_total += time.perf_counter() - self._busy_since
                self._changed.notify_all()

    def pause(self) -> float:
        """Stop admitting turns and wait for those in flight to finish; returns the seconds waited."""
        started = time.perf_counter()
        with self._changed:
            self._paused = True
            self._changed.wait_for(lambda: self._in_flight == 0)
        seconds = time.perf_counter() - started
        self.pause_seconds.append(seconds)
        return seconds

    def resume(self, version: int | None = None) -> None:
        """Admit turns again, served by weights of `version` (`None`: the version is unchanged)."""
        with self._changed:
            if version is not None:
                self.version = version
            self._paused = False
            self._changed.notify_all()

    def close(self) -> None:
        """Refuse every turn from now on (waiting ones too), until `reopen()`."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def reopen(self) -> None:
        """Admit turns again after `close()`."""
        with self._changed:
            self._closed = False
            self._changed.notify_all()


__all__ = ["RolloutsStopped", "ServingGate"]
