"""The engine's worker: the decoding thread, and hosting it in the caller's thread.

`serve` is the decoding thread's whole life: it asks the scheduler what to admit, serves the `generate` batch
the scheduler hands it, admits rows into the `ContinuousDecoder` and runs one decoding step, until the scheduler
says nothing runs or waits. A model error fails the rows it concerns and the thread goes on; a thread that dies
fails every request it holds or that waits, so that no episode waits on a thread that is gone.

`run_hosted` decodes in the calling thread while the episodes' event loop runs in a helper thread: decoding in
the thread that set up torch is faster than in a second one (on a machine with few cores, a second thread's
OpenMP team makes every team wait passively, about 20% slower here). When decoding stops with an interrupt (Ctrl-C),
the episodes are cancelled and given time to close their envs (an MCP server, an OpenEnv session) before it
propagates.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import torch

from textenv.asyncio_bridge import run_sync
from textenv.engine.decoding import ContinuousDecoder, DecodeRequest
from textenv.engine.hf_generate import HFGenerateRequest, serve_with_hf
from textenv.engine.sampling import DEFAULT_MAX_NEW_TOKENS
from textenv.engine.unwrapping import decoding_model, unwrap_model

if TYPE_CHECKING:
    from textenv.engine.engine import GenerationEngine


EPISODES_CLOSING_SECONDS = 60.0  # the longest a Ctrl-C waits for the cancelled episodes to close their envs


def serve(engine: GenerationEngine, max_rows: int) -> None:
    """The decoding thread of `engine`: admit, step, retire, until nothing is running or waiting.

    Args:
        engine (`GenerationEngine`): whose scheduler, model, tokenizer and prefix cache it serves.
        max_rows (`int`): the most rows decoded at the same time.
    """
    scheduler = engine.scheduler
    model, fast_model = unwrap_model(engine.model), decoding_model(engine.model)
    cache_argument = engine._probed_path(fast_model).cache_argument
    decoder = ContinuousDecoder(fast_model, engine.prefix_cache, engine.tokenizer.pad_token_id, max_rows, cache_argument, engine.reuse_cache)
    admitted: list[DecodeRequest] = []
    fallback: list[HFGenerateRequest] = []
    try:
        with torch.inference_mode(), engine._autocast(model):
            while True:
                admitted, fallback = scheduler.take(decoder, fast_model)
                if admitted is None:
                    return
                _step(decoder, model, engine.tokenizer.pad_token_id, admitted, fallback)
    except BaseException as error:  # never leave a request waiting on a thread that is gone
        scheduler.fail_stranded(error)
        decoder.fail(error)  # the rows it was decoding
        for request in [*(admitted or []), *fallback]:  # taken but not yet in its batch (a request reports once)
            request.done(None, error)
        raise


def _step(decoder: ContinuousDecoder, model, pad_token_id: int, admitted: list[DecodeRequest], fallback: list[HFGenerateRequest]) -> None:
    """Serve the `generate` batch, admit the new rows and decode one token for every row; a model error is
    reported to every row it concerns (the admitted rows that did not make it into the batch, and the batch)."""
    try:
        if fallback:
            serve_with_hf(model, pad_token_id, fallback, DEFAULT_MAX_NEW_TOKENS)
        decoder.admit(admitted)
        if decoder.batch is not None:
            decoder.step()
    except Exception as error:  # noqa: BLE001 - reported to every row it concerns
        running = decoder.batch.requests if decoder.batch else []
        for request in admitted:
            if request not in running:
                request.done(None, error)
        decoder.fail(error)


def reported_once(done: Callable) -> Callable:
    """`done`, called at most once: a dying thread fails every request it took, some of which had already
    been reported (and a blocking call counts each report)."""
    reported = threading.Event()

    def report(token_ids, outcome) -> None:
        if not reported.is_set():
            reported.set()
            done(token_ids, outcome)

    return report


def start_worker(engine: GenerationEngine, max_rows: int) -> threading.Thread:
    """A decoding thread for `engine` (not started: the scheduler starts it under its lock)."""
    return threading.Thread(target=serve, args=(engine, max_rows), name="textenv-engine", daemon=True)


def run_hosted(engine: GenerationEngine, coroutine: Awaitable) -> Any:
    """Run `coroutine` (episodes that generate with `engine`) to completion and return its result, decoding in the
    calling thread while the episodes' event loop runs in a helper thread. Falls back to `run_sync` (decoding in
    the engine's own thread) when another call is decoding."""
    # Probe now, before the episodes' thread starts: the probe keeps torch's random state by saving and restoring
    # it, which would undo a draw the episodes made meanwhile.
    engine._probed_path(decoding_model(engine.model))
    finished = engine.scheduler.host(threading.current_thread())
    if finished is None:
        return run_sync(coroutine)
    outcome: dict[str, Any] = {}

    async def tracked() -> Any:
        outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
        return await coroutine

    def episodes() -> None:
        try:
            outcome["result"] = asyncio.run(tracked())  # this new thread has no event loop
        except BaseException as error:  # noqa: BLE001 - re-raised in the calling thread
            outcome["error"] = error
        finally:
            engine.scheduler.end_hosting(finished)

    helper = threading.Thread(target=episodes, name="textenv-episodes", daemon=True)
    helper.start()
    try:
        serve(engine, engine.batch_size)
    except BaseException:  # Ctrl-C while decoding: cancel the episodes, so that each closes its env (its servers)
        if "task" in outcome:
            outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        helper.join(EPISODES_CLOSING_SECONDS)
        raise
    helper.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
