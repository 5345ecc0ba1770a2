"""`BatchedGenerator`: the driver's generator interface around a function that generates for a whole
batch at once (a scripted policy, or an overridden `GymScheduler.generate`).

Each episode asks for its next turn with ``await generator.generate(context, stop_strings)``. One call of
the batch function at a time runs in a worker thread, with every request that is waiting (up to
`batch_size`, same stop strings), so the event loop stays free for env steps while it runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, List, Optional, Tuple

import torch

from textenv.engine.engine import Completion

BatchFunction = Callable[[List[torch.Tensor], Tuple[str, ...]], List[Completion]]


@dataclass
class _Request:
    context: torch.Tensor
    stop_strings: Tuple[str, ...]
    future: asyncio.Future


class BatchedGenerator:
    """Collects generation requests from episodes and serves them in batches.

    Args:
        generate: ``generate(contexts, stop_strings) -> completions``; called in a worker thread.
        batch_size: most requests per call.

    Attributes:
        batch_sizes (`list[int]`): the size of every batch served, in order.
    """

    def __init__(self, generate: BatchFunction, batch_size: int):
        self.batch_function = generate
        self.batch_size = batch_size
        self.batch_sizes: List[int] = []
        self._pending: List[_Request] = []
        self._running: Optional[asyncio.Task] = None

    async def generate(self, context_ids: torch.Tensor, stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None, *, episode: Hashable | None = None) -> Completion:
        """Generate one turn from `context_ids`; returns when its batch is done.

        Raises:
            Exception: whatever the batch function raised for the batch.
        """
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(context_ids, tuple(stop_strings), future))
        self._start_batch()
        return await future

    def end_episode(self, episode: Hashable) -> None:
        """Nothing is kept per episode."""

    def _start_batch(self) -> None:
        if self._running is None and self._pending:
            self._running = asyncio.get_running_loop().create_task(self._serve_batch())

    async def _serve_batch(self) -> None:
        try:
            await asyncio.sleep(0)  # let the other ready episodes queue their requests first
            batch = self._take_batch()
            if batch:
                await self._generate(batch)
        finally:
            self._running = None
            self._start_batch()

    def _take_batch(self) -> List[_Request]:
        self._pending = [request for request in self._pending if not request.future.done()]
        if not self._pending:
            return []
        stops = self._pending[0].stop_strings
        batch = [request for request in self._pending if request.stop_strings == stops][: self.batch_size]
        chosen = {id(request) for request in batch}
        self._pending = [request for request in self._pending if id(request) not in chosen]
        return batch

    async def _generate(self, batch: List[_Request]) -> None:
        self.batch_sizes.append(len(batch))
        contexts = [request.context for request in batch]
        try:
            completions = await asyncio.to_thread(self.batch_function, contexts, batch[0].stop_strings)
            if len(completions) != len(batch):
                raise RuntimeError(f"generate returned {len(completions)} completions for {len(batch)} contexts.")
        except Exception as error:  # noqa: BLE001 - delivered to every episode of the batch
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        for request, completion in zip(batch, completions):
            if not request.future.done():
                request.future.set_result(completion)
