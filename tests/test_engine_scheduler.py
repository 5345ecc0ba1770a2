"""The engine's scheduler alone (`textenv.engine.scheduler.RequestScheduler`), with stand-in threads, a stand-in
decoder and a recording prefix cache: what is admitted together, which requests `generate` serves as one batch,
ended episodes released only by the decoding thread, the thread forgotten when idle, a hosted thread waiting for
the episodes' next turns, and stranded requests failed when the thread dies."""

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


class StandInDecoder:
    """What the scheduler reads of a `ContinuousDecoder`: rows in flight, whether it wants rows, how many fit."""

    def __init__(self, wants: bool = True, free_rows: int = 4, max_rows: int = 4, running: bool = False):
        self.wants, self.free_rows, self.max_rows = wants, free_rows, max_rows
        self.batch = object() if running else None

    def wants_rows(self) -> bool:
        return self.wants


def loop_request(owner=None, done=None):
    settings = SamplingSettings(max_new_tokens=4)
    return DecodeRequest(torch.tensor([1, 2]), settings, None, done or (lambda ids, outcome: None), owner=owner)


def generate_request(do_sample: bool):
    return HFGenerateRequest(torch.tensor([1]), {"num_beams": 2, "do_sample": do_sample}, None, lambda ids, outcome: None)


def test_requests_staged_in_one_loop_iteration_are_admitted_together():
    scheduler, worker = RequestScheduler(RecordingCache()), Idle()
    admissions, waiting_while_staged = [], []

    async def three_episodes_ask_then_one():
        loop = asyncio.get_running_loop()
        for owner in "abc":
            scheduler.stage(loop, loop_request(owner), worker)
        waiting_while_staged.append(list(scheduler.waiting))  # staged: handed over at the end of this iteration
        await asyncio.sleep(0)
        admissions.append(scheduler.take(StandInDecoder(free_rows=8, max_rows=8), model="m")[0])
        scheduler.stage(loop, loop_request("d"), worker)
        await asyncio.sleep(0)
        admissions.append(scheduler.take(StandInDecoder(free_rows=8, max_rows=8, running=True), model="m")[0])

    asyncio.run(three_episodes_ask_then_one())
    assert waiting_while_staged == [[]]
    assert [[r.owner for r in admitted] for admitted in admissions] == [["a", "b", "c"], ["d"]]
    assert worker.started == 1


def test_submit_starts_one_worker_and_take_admits_what_fits_after_validating_the_cache():
    cache, worker = RecordingCache(), Idle()
    scheduler = RequestScheduler(cache)
    requests = [loop_request(owner) for owner in range(5)]
    scheduler.submit(requests[:3], worker)
    scheduler.submit(requests[3:], worker)
    assert worker.started == 1 and scheduler.worker is not None
    admitted, fallback = scheduler.take(StandInDecoder(free_rows=2, max_rows=8), model="m")
    assert [r.owner for r in admitted] == [0, 1] and fallback == [] and cache.calls == [("validate", "m")]
    admitted, _ = scheduler.take(StandInDecoder(wants=False, free_rows=2, max_rows=8, running=True), model="m")
    assert admitted == [] and [r.owner for r in scheduler.waiting] == [2, 3, 4]


def test_generate_requests_are_served_as_one_batch_of_the_first_ones_settings():
    scheduler = RequestScheduler(RecordingCache())
    greedy, sampled, greedy_too, greedy_three = (generate_request(False), generate_request(True),
                                                 generate_request(False), generate_request(False))
    scheduler.submit([greedy, loop_request(), sampled, greedy_too, greedy_three], Idle())
    admitted, fallback = scheduler.take(StandInDecoder(wants=False, max_rows=2), model=None)
    assert fallback == [greedy, greedy_too] and admitted == []  # same_batch_as the first, at most max_rows
    _, fallback = scheduler.take(StandInDecoder(wants=False, max_rows=2), model=None)
    assert fallback == [sampled]
    _, fallback = scheduler.take(StandInDecoder(wants=False, max_rows=2), model=None)
    assert fallback == [greedy_three] and len(scheduler.waiting) == 1


def test_ended_episodes_are_released_by_the_decoding_thread_and_an_idle_thread_is_forgotten():
    cache = RecordingCache()
    scheduler = RequestScheduler(cache, reuse_cache=False)
    scheduler.end_episode("before")  # no thread decodes: released at once
    scheduler.submit([loop_request("x")], Idle())
    scheduler.end_episode("during")  # the thread owns the cache: released at its next step
    assert cache.calls == [("release", "before")]
    scheduler.take(StandInDecoder(), model=None)
    assert ("release", "during") in cache.calls
    assert scheduler.take(StandInDecoder(), model=None) == (None, [])
    assert scheduler.worker is None and cache.calls[-1] == ("clear",)  # reuse_cache=False: cleared when idle


def test_a_thread_with_rows_in_flight_goes_on_when_nothing_waits():
    scheduler = RequestScheduler(RecordingCache())
    scheduler.submit([], Idle())
    assert scheduler.take(StandInDecoder(running=True), model=None) == ([], [])
    assert scheduler.worker is not None
    assert scheduler.take(StandInDecoder(), model=None) == (None, []) and scheduler.worker is None


def test_a_hosted_thread_waits_for_the_episodes_next_turns_until_hosting_ends():
    scheduler = RequestScheduler(RecordingCache())
    finished = scheduler.host(threading.current_thread())
    assert scheduler.host(threading.current_thread()) is None  # another call decodes: not hosted twice
    late = loop_request("late")
    threading.Timer(0.2, lambda: scheduler.submit([late], Idle())).start()
    admitted, _ = scheduler.take(StandInDecoder(), model=None)
    assert admitted == [late]
    threading.Timer(0.2, lambda: scheduler.end_hosting(finished)).start()
    assert scheduler.take(StandInDecoder(), model=None) == (None, [])
    assert finished.is_set() and scheduler.worker is None


def test_a_dying_thread_fails_every_waiting_request():
    outcomes = []
    scheduler = RequestScheduler(RecordingCache())
    scheduler.submit([loop_request(owner, done=lambda ids, outcome: outcomes.append((ids, outcome))) for owner in range(2)], Idle())
    error = MemoryError("out of memory")
    scheduler.fail_stranded(error)
    assert outcomes == [(None, error), (None, error)] and scheduler.waiting == [] and scheduler.worker is None
