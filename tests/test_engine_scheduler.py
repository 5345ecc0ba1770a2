"""The engine's scheduler alone (`textenv.engine.scheduler.RequestScheduler`), with stand-in threads and a recording
prefix cache: what is admitted together, which requests `generate` serves as one batch, ended episodes released
only by the decoding thread, the thread forgotten when idle, a hosted thread waiting for the episodes' next turns,
and stranded requests failed when the thread dies."""

from __future__ import annotations

import asyncio
import threading

import torch

from textenv.engine.decoding import DecodeRequest
from textenv.engine.hf_generate import HFGenerateRequest
from textenv.engine.sampling import SamplingSettings
from textenv.engine.scheduler import RequestScheduler


class RecordingCache:
    """The prefix cache's methods the scheduler calls, recorded."""

    def __init__(self):
        self.calls = []

    def release(self, owner):
        self.calls.append(("release", owner))

    def validate(self, model):
        self.calls.append(("validate", model))

    def clear(self):
        self.calls.append(("clear",))

    def end_call(self):
        self.calls.append(("end_call",))


class Idle:
    """A worker stand-in: a thread that is never started by the test's own code (the scheduler starts it)."""

    def __init__(self):
        self.started = 0

    def __call__(self):
        outer = self

        class Thread(threading.Thread):
            def start(self):
                outer.started += 1

        return Thread()


def loop_request(owner=None, done=None):
    settings = SamplingSettings(max_new_tokens=4)
    return DecodeRequest(torch.tensor([1, 2]), settings, None, done or (lambda ids, outcome: None), owner=owner)


def generate_request(do_sample: bool):
    return HFGenerateRequest(torch.tensor([1]), {"num_beams": 2, "do_sample": do_sample}, None, lambda ids, outcome: None)


def test_requests_staged_in_one_loop_iteration_are_handed_over_together():
    scheduler, worker = RequestScheduler(RecordingCache()), Idle()
    handed = []
    scheduler.submit = lambda requests, start: handed.append(list(requests))

    async def three_episodes_ask():
        loop = asyncio.get_running_loop()
        for owner in "abc":
            scheduler.stage(loop, loop_request(owner), worker)
        await asyncio.sleep(0)
        scheduler.stage(loop, loop_request("d"), worker)
        await asyncio.sleep(0)

    asyncio.run(three_episodes_ask())
    assert [[r.owner for r in batch] for batch in handed] == [["a", "b", "c"], ["d"]]


def test_submit_starts_one_worker_and_take_admits_what_fits_after_validating_the_cache():
    cache, worker = RecordingCache(), Idle()
    scheduler = RequestScheduler(cache)
    requests = [loop_request(owner) for owner in range(5)]
    scheduler.submit(requests[:3], worker)
    scheduler.submit(requests[3:], worker)
    assert worker.started == 1 and scheduler.worker is not None
    admitted, fallback = scheduler.take(wants_rows=True, free_rows=2, max_rows=8, model="m", batch_running=False)
    assert [r.owner for r in admitted] == [0, 1] and fallback == [] and cache.calls == [("validate", "m")]
    admitted, _ = scheduler.take(wants_rows=False, free_rows=2, max_rows=8, model="m", batch_running=True)
    assert admitted == [] and [r.owner for r in scheduler.waiting] == [2, 3, 4]


def test_generate_requests_are_served_as_one_batch_of_the_first_ones_settings():
    scheduler = RequestScheduler(RecordingCache())
    greedy, sampled, greedy_too = generate_request(False), generate_request(True), generate_request(False)
    scheduler.submit([greedy, loop_request(), sampled, greedy_too], Idle())
    admitted, fallback = scheduler.take(wants_rows=False, free_rows=0, max_rows=8, model=None, batch_running=False)
    assert fallback == [greedy, greedy_too] and admitted == []
    _, fallback = scheduler.take(wants_rows=False, free_rows=0, max_rows=8, model=None, batch_running=False)
    assert fallback == [sampled]


def test_ended_episodes_are_released_by_the_decoding_thread_and_an_idle_thread_is_forgotten():
    cache = RecordingCache()
    scheduler = RequestScheduler(cache, reuse_cache=False)
    scheduler.end_episode("before")  # no thread decodes: released at once
    scheduler.submit([loop_request("x")], Idle())
    scheduler.end_episode("during")  # the thread owns the cache: released at its next step
    assert cache.calls == [("release", "before")]
    scheduler.take(wants_rows=True, free_rows=4, max_rows=4, model=None, batch_running=False)
    assert ("release", "during") in cache.calls
    assert scheduler.take(wants_rows=True, free_rows=4, max_rows=4, model=None, batch_running=False) == (None, [])
    assert scheduler.worker is None and cache.calls[-1] == ("clear",)  # reuse_cache=False: cleared when idle


def test_a_hosted_thread_waits_for_the_episodes_next_turns_until_hosting_ends():
    scheduler = RequestScheduler(RecordingCache())
    finished = scheduler.host(threading.current_thread())
    assert scheduler.host(threading.current_thread()) is None  # another call decodes: not hosted twice
    late = loop_request("late")
    threading.Timer(0.2, lambda: scheduler.submit([late], Idle())).start()
    admitted, _ = scheduler.take(wants_rows=True, free_rows=4, max_rows=4, model=None, batch_running=False)
    assert admitted == [late]
    threading.Timer(0.2, lambda: scheduler.end_hosting(finished)).start()
    assert scheduler.take(wants_rows=True, free_rows=4, max_rows=4, model=None, batch_running=False) == (None, [])
    assert finished.is_set() and scheduler.worker is None


def test_a_dying_thread_fails_every_waiting_request():
    outcomes = []
    scheduler = RequestScheduler(RecordingCache())
    scheduler.submit([loop_request(owner, done=lambda ids, outcome: outcomes.append((ids, outcome))) for owner in range(2)], Idle())
    error = MemoryError("out of memory")
    scheduler.fail_stranded(error)
    assert outcomes == [(None, error), (None, error)] and scheduler.waiting == [] and scheduler.worker is None
