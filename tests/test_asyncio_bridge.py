"""run_sync: the same result and the same error whether or not the caller is inside an event loop."""

import asyncio
import threading

import pytest

from textenv.asyncio_bridge import run_sync


async def _thread_name() -> str:
    await asyncio.sleep(0)
    return threading.current_thread().name


async def _fail() -> None:
    raise ValueError("from the awaitable")


def test_outside_a_loop_it_runs_here():
    assert run_sync(_thread_name()) == threading.current_thread().name


def test_inside_a_loop_it_runs_in_a_helper_thread():
    async def caller():
        return run_sync(_thread_name())

    assert asyncio.run(caller()).startswith("textenv-run-sync")


@pytest.mark.parametrize("inside_a_loop", [False, True])
def test_an_error_propagates_without_the_loop_lookup_as_its_context(inside_a_loop):
    async def caller():
        return run_sync(_fail())

    with pytest.raises(ValueError, match="from the awaitable") as raised:
        asyncio.run(caller()) if inside_a_loop else run_sync(_fail())
    assert raised.value.__context__ is None
