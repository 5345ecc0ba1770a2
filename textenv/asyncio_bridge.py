"""Running a coroutine from synchronous code, also when the caller is inside a running event loop."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable


def run_sync(awaitable: Awaitable) -> Any:
    """Run `awaitable` to completion and return its result (exceptions propagate).

    Outside an event loop this is `asyncio.run`. Inside one (a Jupyter notebook, an async caller) the
    awaitable runs in a helper thread with its own loop, since the caller's loop cannot be re-entered.
    """
    if not _inside_event_loop():  # asyncio.run outside the `except`, so its errors carry no loop lookup context
        return asyncio.run(_as_coroutine(awaitable))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="textenv-run-sync") as pool:
        return pool.submit(asyncio.run, _as_coroutine(awaitable)).result()


def _inside_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _as_coroutine(awaitable: Awaitable) -> Any:
    return await awaitable
