"""The engine's worker (`textenv.engine.worker`) on a tiny random model: a model error reaches every row and the
engine serves the next call; a decoding thread that dies fails every request it holds or that waits; hosting decodes in the
calling thread, returns the episodes' result and re-raises their error."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from textenv.engine import GenerationEngine
from textenv.engine.scheduler import RequestScheduler

# The dying thread of one test is reported by pytest as an unhandled thread exception: that is the point.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
GREEDY = {"do_sample": False, "max_new_tokens": 3, "eos_token_id": -1}


class Dying(BaseException):
    """What kills a thread (as KeyboardInterrupt or SystemExit would), not an error a row reports."""


def engine_for(model, tokenizer, batch_size=4):
    return GenerationEngine(model, tokenizer, generation_kwargs=GREEDY, batch_size=batch_size)


def contexts(tokenizer, count=3):
    return [tokenizer(f"question {index}: what is {index}+{index}?", return_tensors="pt").input_ids[0] for index in range(count)]


@pytest.mark.parametrize("failing_forward", ["prefill", "decoding step"])
def test_a_model_error_reaches_every_row_and_the_next_call_is_served(tiny_model, tokenizer, failing_forward):
    engine = engine_for(tiny_model, tokenizer, batch_size=2)  # three rows: one waits while the first two fail
    assert engine.fast_path  # probed before the hook: the probe's forwards do not fail
    raised = []

    def model_fails(module, args, kwargs):
        one_token = kwargs["input_ids"].shape[-1] == 1  # a decoding step feeds one token per row
        if one_token == (failing_forward == "decoding step"):
            raised.append(RuntimeError(f"CUDA error: device-side assert ({failing_forward})"))
            raise raised[-1]

    handle = tiny_model.register_forward_pre_hook(model_fails, with_kwargs=True)

    async def three_episodes():
        turns = asyncio.gather(*[engine.generate(context) for context in contexts(tokenizer)], return_exceptions=True)
        return await asyncio.wait_for(turns, timeout=60)  # a row never told would wait for ever

    try:
        outcomes = engine.run_hosted(three_episodes())
    finally:
        handle.remove()
    assert len(raised) == 2 and all(any(outcome is error for error in raised) for outcome in outcomes)
    assert [len(c.token_ids) for c in engine.generate_batch(contexts(tokenizer))] == [3, 3, 3]


@pytest.mark.parametrize("rows_in_its_batch", [False, True])
def test_a_dying_decoding_thread_fails_every_request_it_holds_or_that_waits(tiny_model, tokenizer, monkeypatch, rows_in_its_batch):
    """It dies at its second step: with one-token turns in a one-row batch, its batch is empty then and two rows
    wait; with three-token turns in a two-row batch, two rows are half decoded and one waits."""
    engine = engine_for(tiny_model, tokenizer, batch_size=2 if rows_in_its_batch else 1)
    take, calls = RequestScheduler.take, []

    def dies_at_its_second_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Dying()
        return take(self, *args, **kwargs)

    monkeypatch.setattr(RequestScheduler, "take", dies_at_its_second_step)
    raised = []

    def call() -> None:
        try:
            engine.generate_batch(contexts(tokenizer), generation_kwargs={"max_new_tokens": 3 if rows_in_its_batch else 1})
        except Dying as error:
            raised.append(error)

    caller = threading.Thread(target=call, daemon=True)  # a request never told would block the call for ever
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive() and len(raised) == 1
    assert engine.scheduler.waiting == [] and engine._worker is None


def test_hosting_decodes_in_the_calling_thread_and_returns_or_raises_what_the_episodes_do(tiny_model, tokenizer):
    engine = engine_for(tiny_model, tokenizer)
    decoding_threads = set()
    handle = tiny_model.register_forward_hook(lambda *args: decoding_threads.add(threading.current_thread()))

    async def episodes():
        return [c.token_ids.tolist() for c in await asyncio.gather(*[engine.generate(context) for context in contexts(tokenizer)])]

    try:
        hosted = engine.run_hosted(episodes())
    finally:
        handle.remove()
    assert decoding_threads == {threading.current_thread()}
    assert hosted == [c.token_ids.tolist() for c in engine.generate_batch(contexts(tokenizer))]

    async def failing_episodes():
        await engine.generate(contexts(tokenizer)[0])
        raise ValueError("the env broke")

    with pytest.raises(ValueError, match="the env broke"):
        engine.run_hosted(failing_episodes())
    # The call before may still have had its thread ending (then this one decoded on a thread of its own, the
    # documented fallback): either way every decoding thread ends once nothing waits.
    deadline = time.monotonic() + 10
    while engine._worker is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine._worker is None
