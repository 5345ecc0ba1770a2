"""The one episode driver: every episode of both front ends is played by `play`.

    reset -> (context -> generate -> react) until a stop rule -> close

A front end describes its episodes by subclassing `Episode` (what the context is, how to react to the
model's turn, which stop rules apply); `play_all` runs many of them concurrently against one generator
(the `GenerationEngine`, or a `BatchedGenerator` around a batch function). An error ends only the episode
it happened in and is recorded there; `close` always runs.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol

import torch

from textenv.engine.sampling import RandomStream

FINISH_MAX_TURNS = "max_turns"
FINISH_MAX_LENGTH = "max_length"
FINISH_ERROR = "error"


class Generator(Protocol):
    """What the driver generates with: one turn per call, and a notice when an episode is over."""

    async def generate(self, context_ids: torch.Tensor, stop_strings: Iterable[str] = (), generation_kwargs: dict | None = None, *, episode: Hashable | None = None): ...

    def end_episode(self, episode: Hashable) -> None: ...


@dataclass(frozen=True)
class StopRule:
    """A named end condition: after a reaction, the first rule whose `applies(episode)` holds ends the
    episode with `name` as its finish reason."""

    name: str
    applies: Callable[["Episode"], bool]


def max_turns_reached(episode: "Episode") -> bool:
    return episode.max_turns is not None and episode.turns >= episode.max_turns


MAX_TURNS = StopRule(FINISH_MAX_TURNS, max_turns_reached)


class EpisodeFailure(Exception):
    """Ends an episode: `error` happened at `stage` (`reset`, `context_manager`, `generate`, `step`,
    `close`, ...) during model turn `turn` (`None` outside the turns)."""

    def __init__(self, stage: str, error: BaseException, turn: Optional[int] = None):
        super().__init__(f"{stage}: {error}")
        self.stage = stage
        self.error = error
        self.turn = turn


class EpisodeKey:
    """An episode's key for the generator (hashed by identity). Its `random_stream` (set by `play_all`)
    is the episode's own randomness for sampled tokens, so a run's episodes are the same however their
    turns were batched."""

    __slots__ = ("random_stream", "__weakref__")

    def __init__(self, random_stream: Optional[RandomStream] = None):
        self.random_stream = random_stream


class Episode:
    """One episode as the driver plays it; front ends subclass it.

    Attributes:
        key (`EpisodeKey`): the episode's key for the generator (its KV cache is kept under it).
        stop_strings (`tuple[str]`): strings that end a model turn.
        generation_kwargs (`dict`, *optional*): generation settings of this episode's turns.
        stop_rules (`tuple[StopRule]`): checked after the reset and after every reaction.
        max_turns (`int`, *optional*): the most model turns (`MAX_TURNS` applies it when listed).
        max_length (`int`, *optional*): the episode ends with `"max_length"` instead of generating from a
            context this long.
        turns (`int`): model turns taken.
        finish_reason (`str`, *optional*): the stop rule that ended it, `"max_length"` or `"error"`.
        failures (`list[EpisodeFailure]`): what went wrong, in order.
    """

    stop_strings: tuple[str, ...] = ()
    generation_kwargs: Optional[dict] = None
    stop_rules: tuple[StopRule, ...] = (MAX_TURNS,)
    max_turns: Optional[int] = None
    max_length: Optional[int] = None

    def __init__(self) -> None:
        self.key = EpisodeKey()
        self.turns = 0
        self.finish_reason: Optional[str] = None
        self.failures: list[EpisodeFailure] = []

    async def reset(self) -> None:
        """Start the episode (an env's `reset`, the first context)."""

    def context(self) -> torch.Tensor:
        """The token ids to generate the next turn from (after any context management)."""
        raise NotImplementedError

    async def react(self, completion) -> None:
        """Take the model's turn (a `Completion`): record it and answer it (a tool, `env.step`)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the episode holds (an env's `close`); runs whatever happened before."""

    def stop_reason(self) -> Optional[str]:
        return next((rule.name for rule in self.stop_rules if rule.applies(self)), None)


async def play(episode: Episode, generator: Generator) -> Episode:
    """Play one episode to its end; failures are recorded in `episode.failures`, never raised."""
    stage = "reset"
    try:
        await episode.reset()
        while (reason := episode.stop_reason()) is None:
            stage = "context_manager"
            context = episode.context()
            if episode.max_length is not None and len(context) >= episode.max_length:
                reason = FINISH_MAX_LENGTH
                break
            stage = "generate"
            completion = await generator.generate(context, episode.stop_strings, episode.generation_kwargs, episode=episode.key)
            episode.turns += 1
            stage = "step"
            await episode.react(completion)
        episode.finish_reason = reason
    except asyncio.CancelledError:
        episode.failures.append(EpisodeFailure("run", asyncio.CancelledError("the run was cancelled")))
        raise
    except Exception as error:  # noqa: BLE001 - an episode's error ends that episode only
        episode.failures.append(error if isinstance(error, EpisodeFailure) else EpisodeFailure(stage, error, _turn_of(stage, episode)))
    finally:
        generator.end_episode(episode.key)
        await _close(episode)
    if episode.failures:
        episode.finish_reason = FINISH_ERROR
    return episode


def _turn_of(stage: str, episode: Episode) -> Optional[int]:
    """The model turn an error at `stage` belongs to: the one being prepared, or the one just taken."""
    return {"context_manager": episode.turns + 1, "generate": episode.turns + 1, "step": episode.turns}.get(stage)


async def _close(episode: Episode) -> None:
    try:
        await episode.close()
    except Exception as error:  # noqa: BLE001
        episode.failures.append(error if isinstance(error, EpisodeFailure) else EpisodeFailure("close", error))


async def play_all(
    episodes: Iterable[Callable[[], Episode]],
    generator: Generator,
    max_concurrency: int,
    on_done: Callable[[int, Episode], None] = lambda index, episode: None,
) -> None:
    """Play episodes concurrently, at most `max_concurrency` at once, creating each one only when a slot is
    free (`episodes` yields factories and is read lazily). ``on_done(index, episode)`` runs as each ends,
    with the episode's position in `episodes`; nothing else keeps the episodes.

    Episode `index` samples its tokens from its own `RandomStream`, spawned from one draw of torch's global
    generator made here: seeding torch before the call reproduces the episodes, whatever the timing of
    their turns (the engine's own decoding; a `generate` fallback or a batch function samples as it does).
    """
    slots = asyncio.Semaphore(max_concurrency)
    tasks: set[asyncio.Task] = set()
    run_stream = RandomStream(int(torch.randint(0, 2**62, (1,)).item()))

    async def run(index: int, make: Callable[[], Episode]) -> None:
        try:
            episode = make()
            episode.key.random_stream = run_stream.spawn(index)
            await play(episode, generator)
            on_done(index, episode)
        finally:
            slots.release()

    try:
        for index, make in enumerate(episodes):
            await slots.acquire()
            task = asyncio.create_task(run(index, make))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
    finally:
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)


class EnvTimeoutError(TimeoutError):
    """An env call took longer than its timeout."""


class Timeouts:
    """Awaits env calls with a time limit. A call past its limit is cancelled but not waited for (an env
    that ignores cancellation must not hang its episode); `cancel_abandoned` gives those a last chance."""

    def __init__(self) -> None:
        self._abandoned: set[asyncio.Task] = set()

    async def call(self, stage: str, call: Callable[[], Any], timeout: Optional[float]) -> Any:
        """``call()``'s result, awaited with `timeout` seconds if it is awaitable (plain results pass)."""
        result = call()
        if not inspect.isawaitable(result):
            return result
        task = asyncio.ensure_future(result)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            raise EnvTimeoutError(f"{stage} did not return within {timeout:g} s")
        return task.result()

    async def cancel_abandoned(self, grace: float = 1.0) -> None:
        tasks = [task for task in self._abandoned if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
