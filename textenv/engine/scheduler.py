"""The engine's scheduler: the requests waiting for the decoding thread, and what to admit at each step.

Requests arrive from the episodes' event loops (`stage`: every request made in one event-loop iteration is
handed over together, so that episodes whose turns ended together are admitted, and their shared prefix computed,
as one group) or from a blocking call (`submit`). At each step the decoding thread asks `take` what to admit:
the requests `transformers`' `generate` must serve (the first waiting one's settings, as a batch) and, when the
decoder wants rows, the waiting loop requests that fit. Episodes that ended while the thread decoded are released
from the prefix cache at the next step (the thread owns the cache while it runs).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Hashable, Protocol

from textenv.engine.decoding import DecodeRequest
from textenv.engine.hf_generate import HFGenerateRequest
from textenv.engine.prefix_cache import PrefixCache

HOSTED_WAIT_SECONDS = 1.0  # how long a hosted thread waits for the episodes' next turns before looking again


class Decoder(Protocol):
    """What the scheduler reads of the decoding thread's `ContinuousDecoder` (only that thread changes it)."""

    batch: Any  # the rows in flight, `None` when none
    max_rows: int

    @property
    def free_rows(self) -> int: ...

    def wants_rows(self) -> bool: ...


class RequestScheduler:
    """The waiting requests of one engine and the admission decision.

    Args:
        prefix_cache (`PrefixCache`): the engine's cache; ended episodes are released from it.
        reuse_cache (`bool`): when `False` the cache is cleared each time the decoding thread ends.

    Attributes:
        lock (`threading.Lock`): guards everything below, and the prefix cache outside the decoding thread.
        worker (`threading.Thread`, *optional*): the thread decoding now, if any.
        hosted_until (`threading.Event`, *optional*): set when the hosted episodes have all ended (`run_hosted`);
            until then an idle decoding thread waits for their next turns instead of ending.
    """

    def __init__(self, prefix_cache: PrefixCache, reuse_cache: bool = True):
        self.prefix_cache = prefix_cache
        self.reuse_cache = reuse_cache
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.waiting: list[DecodeRequest | HFGenerateRequest] = []
        self.ended: list[Hashable] = []
        self.worker: threading.Thread | None = None
        self.hosted_until: threading.Event | None = None
        self._staged: dict[asyncio.AbstractEventLoop, list] = {}

    # ------------------------------------------------------------------------------ arrivals
    def stage(self, loop: asyncio.AbstractEventLoop, request: Any, start_worker: Callable[[], threading.Thread]) -> None:
        """Hand `request` over at the end of this event-loop iteration, with every other request made in it."""
        staged = self._staged.setdefault(loop, [])
        staged.append(request)
        if len(staged) == 1:
            loop.call_soon(lambda: self.submit(self._staged.pop(loop), start_worker))

    def submit(self, requests: list, start_worker: Callable[[], threading.Thread]) -> None:
        """Queue `requests` and wake the decoding thread, starting one (`start_worker()`) when none runs."""
        with self.lock:
            self.waiting.extend(requests)
            self.wakeup.notify_all()
            if self.worker is None:
                self.worker = start_worker()
                self.worker.start()

    def end_episode(self, episode: Hashable) -> None:
        """Release the episode's cached KV now, or at the decoding thread's next step if one runs."""
        with self.lock:
            if self.worker is None:
                self.prefix_cache.release(episode)
            else:
                self.ended.append(episode)

    # ------------------------------------------------------------------------------ hosting
    def host(self, thread: threading.Thread) -> threading.Event | None:
        """Make `thread` the decoding thread until the returned event is set; `None` when another thread decodes."""
        with self.lock:
            if self.worker is not None:
                return None
            self.worker, self.hosted_until = thread, threading.Event()
            return self.hosted_until

    def end_hosting(self, finished: threading.Event) -> None:
        """The hosted episodes have all ended: the decoding thread may stop once it is idle."""
        with self.lock:
            finished.set()
            self.wakeup.notify_all()

    # ------------------------------------------------------------------------------ admission
    def take(self, decoder: Decoder, model: Any) -> tuple[list | None, list]:
        """What the decoding thread does next; while hosted and idle, waits for the episodes' next turns.

        Args:
            decoder (`Decoder`): the thread's decoder: whether it runs rows (`batch`), wants rows now (`wants_rows()`),
                how many fit (`free_rows`) and the most rows of one `generate` batch (`max_rows`).
            model: the decoding model, against which the prefix cache is validated before rows are admitted.

        Returns:
            `(admitted, fallback)`: the loop requests to admit now (`None`: nothing runs or waits, the thread
            ends and is forgotten) and the requests `generate` serves now (the first waiting one's settings).
        """
        with self.lock:
            self._release_ended()
            while not self.waiting and decoder.batch is None and self.hosted_until is not None and not self.hosted_until.is_set():
                self.wakeup.wait(timeout=HOSTED_WAIT_SECONDS)
                self._release_ended()
            if not self.waiting and decoder.batch is None:
                self.worker, self.hosted_until = None, None
                if not self.reuse_cache:
                    self.prefix_cache.clear()
                return None, []
            fallback = self._take_fallback(decoder.max_rows)
            admitted: list[DecodeRequest] = []
            if decoder.wants_rows():
                admitted = [r for r in self.waiting if isinstance(r, DecodeRequest)][: decoder.free_rows]
                self._remove(admitted)
                if admitted and self.reuse_cache:
                    self.prefix_cache.validate(model)
            return admitted, fallback

    def fail_stranded(self, error: BaseException) -> None:
        """The decoding thread is dying: forget it and fail every waiting request with `error`."""
        with self.lock:
            stranded, self.waiting, self.worker, self.hosted_until = self.waiting, [], None, None
        for request in stranded:
            request.done(None, error)

    def end_call(self) -> None:
        """A blocking call's requests are all served: the cache's per-call bookkeeping ends."""
        with self.lock:
            self.prefix_cache.end_call()

    def _take_fallback(self, max_rows: int) -> list[HFGenerateRequest]:
        fallback = [r for r in self.waiting if isinstance(r, HFGenerateRequest)]
        if not fallback:
            return []
        fallback = [r for r in fallback if r.same_batch_as(fallback[0])][:max_rows]
        self._remove(fallback)
        return fallback

    def _remove(self, taken: list) -> None:
        self.waiting = [r for r in self.waiting if all(r is not t for t in taken)]

    def _release_ended(self) -> None:
        for episode in self.ended:
            self.prefix_cache.release(episode)
        self.ended.clear()
