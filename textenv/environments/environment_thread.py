"""The thread an episode's sync environment code runs on: a TRL environment instance sees one thread of its own,
as in TRL, while the episodes go on concurrently on the event loop (`textenv.environments.trl`)."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, Optional


class EnvironmentThread:
    """A daemon thread that runs one episode's sync environment code, one call at a time, in order."""

    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None

    async def run(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` on the thread (started on first use), awaited on the running loop.

        Returns:
            What the function returned; what it raised is raised here.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="textenv-trl-env", daemon=True)
            self._thread.start()
        self._queue.put((function, args, kwargs, future, loop))
        return await future

    def stop(self) -> None:
        """Let the thread end after the calls already queued."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            function, args, kwargs, future, loop = item
            try:
                outcome, value = future.set_result, function(*args, **kwargs)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting episode
                outcome, value = future.set_exception, error
            try:
                loop.call_soon_threadsafe(_settle, future, outcome, value)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(future: asyncio.Future, outcome: Callable[[Any], None], value: Any) -> None:
    if not future.done():  # a timed-out call was cancelled meanwhile
        outcome(value)
