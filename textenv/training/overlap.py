"""Rollouts beside training: where the training loop's batches come from, played in step or ahead of it.

`EpisodePipeline` hands `textenv.training.train` each step's batch. With ``max_staleness=0`` (the default) it
plays the batch when the loop asks for it, in the loop's thread, with that step's weights: the loop is
legacy's, one step after the other. With ``max_staleness=K >= 1`` a rollout thread plays the next batches while
the trainer steps, on vLLM servers (which hold their own copy of the weights):

- **admission**: step s's batch is started only once the servers hold version s - K or newer (version v is the
  weights after v optimizer steps), so no turn of it is sampled more than K versions before the weights it is
  trained into (step s trains version s). An episode that could not finish within the bound is never started,
  so none is thrown away for being too old; GRPO's groups are whole batches' parts and stay together;
- **weights**: after each step the loop calls `publish(version)`: new turns wait, those in flight finish on the
  old weights, the servers load the new ones, and the turns go on stamped with the new version
  (`textenv.vllm.gate.ServingGate`);
- **faults and stopping**: an error of the rollout thread reaches the trainer with the batch it was playing;
  stopping (the last step, an error, Ctrl-C) closes the servers' gate, waits for the rollout thread, and counts
  and logs the episodes played ahead that were never trained on.

The in-process engine refuses ``K >= 1``: it decodes with the trainer's live weights in this process, so a
rollout thread would read weights the optimizer is writing, and the two would share the same CPU cores.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from textenv.training.sources import EpisodeBatch, EpisodeSource

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2  # how often a waiting trainer looks up (Ctrl-C is handled between looks)
STOP_WAIT_SECONDS = 600.0  # the longest wait for the rollout thread's batch in flight when stopping


@dataclass
class Arrival:
    """One step's batch as the pipeline hands it over.

    Attributes:
        batch (`EpisodeBatch`): the episodes.
        source_state (`dict`, *optional*): the episode source's `state_dict()` right after it drew this batch
            (what a checkpoint of this step must resume from; `None` for a source without one).
        episode_seconds (`float`): wall time from asking for the batch to having it (playing it, or waiting
            for the rollout thread).
        wait_seconds (`float`): of those, the time the trainer waited for a batch played ahead (0 in step).
        weight_sync_seconds (`float`, *optional*): seconds the weight syncs before these episodes took, in
            step; `None` on an engine that never syncs.
        episodes_ahead (`int`): episodes played or in flight for later steps when this batch was handed over.
    """

    batch: EpisodeBatch
    source_state: dict | None
    episode_seconds: float
    wait_seconds: float
    weight_sync_seconds: float | None
    episodes_ahead: int = 0


class EpisodePipeline:
    """Each step's batch, played in step (``max_staleness=0``) or ahead of it by a rollout thread.

    Args:
        source (`EpisodeSource`): plays the batches.
        steps (`int`): the loop's last step + 1.
        start_step (`int`, defaults to 0): the first step (a resumed run's).
        max_staleness (`int`, defaults to 0): most policy versions between a turn's weights and the weights it
            is trained into; 0 plays each batch when the loop asks for it.
        num_generations (`int`, *optional*): GRPO's group size (``collect(step, num_generations=G)``).
        batch_size (`int`, defaults to 0): episodes per batch, to count a discarded batch in flight.

    Raises:
        ValueError: `max_staleness` is negative, or is at least 1 and the source's engine cannot run beside
            training (the message says why and what to use).
    """

    def __init__(self, source: EpisodeSource, steps: int, *, start_step: int = 0, max_staleness: int = 0,
                 num_generations: int | None = None, batch_size: int = 0):
        if not isinstance(max_staleness, int) or max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: play each step's episodes in step), got {max_staleness!r}.")
        self.source = source
        self.engine = engine_of(source)
        self.steps = steps
        self.max_staleness = max_staleness
        self.num_generations = num_generations
        self.batch_size = batch_size
        self.episodes_dropped = 0
        self._published = start_step
        self._first_step = start_step
        self._in_flight = False  # the rollout thread is playing a batch
        self._changed = threading.Condition()
        self._stopping = False
        self._arrivals: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        if max_staleness:
            self._start_rollouts(start_step)

    # ------------------------------------------------------------------------------ the loop's side
    def next_batch(self, step: int) -> Arrival:
        """The batch of `step` (steps are asked for in order).

        Raises:
            whatever playing the batch raised (in the rollout thread too).
        """
        if not self.max_staleness:
            return self._play_in_step(step)
        asked = time.perf_counter()
        while True:
            try:
                arrival = self._arrivals.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._arrivals.empty():
                    raise RuntimeError(f"the rollout thread ended without playing step {step}'s batch") from None
        if isinstance(arrival, BaseException):
            raise arrival
        arrival.wait_seconds = arrival.episode_seconds = time.perf_counter() - asked
        arrival.episodes_ahead = self._episodes_ahead()
        return arrival

    def publish(self, version: int) -> tuple[float, float] | None:
        """After a step: the weights of `version` go to the servers (rollouts ahead only; in step, the engine
        syncs them before the next batch). Returns `(pause_seconds, sync_seconds)`, or `None` in step."""
        if not self.max_staleness:
            return None
        timings = self.engine.publish_weights(version)
        with self._changed:
            self._published = version
            self._changed.notify_all()
        return timings

    def server_busy_seconds(self) -> float | None:
        """The servers' busy time so far (`ServingGate.busy_seconds`), or `None` on an engine without a gate."""
        gate = getattr(self.engine, "gate", None)
        return None if gate is None else gate.busy_seconds

    def close(self) -> int:
        """Stop the rollout thread (if any) and return the episodes played ahead that were never trained on."""
        if self._thread is None:
            return 0
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self.engine.gate.close()
        self._thread.join(STOP_WAIT_SECONDS)
        alive = self._thread.is_alive()
        if alive:
            logger.warning(f"The rollout thread did not stop within {STOP_WAIT_SECONDS:.0f} s; it is left to finish on its own.")
        self.engine.gate.reopen()
        self.engine.auto_sync = True
        self._thread = None
        self.episodes_dropped += self._discard_waiting(alive)
        if self.episodes_dropped:
            logger.warning(f"{self.episodes_dropped} episodes played ahead of training were discarded when the loop stopped (never trained on).")
        return self.episodes_dropped

    def __enter__(self) -> "EpisodePipeline":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------------------ playing
    def _play_in_step(self, step: int) -> Arrival:
        if self.engine is not None and hasattr(self.engine, "policy_version"):
            self.engine.policy_version = step
        started = time.perf_counter()
        syncs_before = _sync_seconds(self.engine)
        batch = self._collect(step)
        weight_sync_seconds = None if syncs_before is None else sum(_sync_seconds(self.engine)[len(syncs_before):])
        return Arrival(batch, _state_of(self.source), time.perf_counter() - started, 0.0, weight_sync_seconds)

    def _collect(self, step: int) -> EpisodeBatch:
        if self.num_generations:
            return self.source.collect(step, num_generations=self.num_generations)
        return self.source.collect(step)

    def _start_rollouts(self, start_step: int) -> None:
        if not getattr(self.engine, "supports_overlap", False):
            raise ValueError(
                f"max_staleness={self.max_staleness} needs rollouts on vLLM (--engine vllm) with weight syncing: the in-process "
                "engine decodes with the trainer's live weights in this process, so a rollout thread would read weights the "
                "optimizer is writing and share the trainer's CPU cores (no speed-up). Use --engine vllm, or max_staleness=0."
            )
        if getattr(self.engine, "sleeps_between_runs", False):
            raise ValueError(
                f"max_staleness={self.max_staleness} plays episodes while the trainer steps, when vLLM's sleep mode would have "
                "released its memory: turn one off (--vllm_enable_sleep_mode false, or max_staleness=0)."
            )
        self.engine.prepare()  # the first check and sync, before the trainer runs beside the rollouts
        self.engine.auto_sync = False
        self.engine.policy_version = start_step
        self._thread = threading.Thread(target=self._play_ahead, name="textenv-rollouts", daemon=True)
        self._thread.start()

    def _play_ahead(self) -> None:
        for step in range(self._first_step, self.steps):
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or self._published >= step - self.max_staleness)
                if self._stopping:
                    return
            started = time.perf_counter()
            self._in_flight = True
            try:
                arrival = Arrival(self._collect(step), _state_of(self.source), time.perf_counter() - started, 0.0, None)
            except BaseException as error:  # noqa: BLE001 - handed to the trainer, which raises it
                arrival = error
            self._arrivals.put(arrival)
            self._in_flight = False
            if isinstance(arrival, BaseException):
                return

    def _episodes_ahead(self) -> int:
        """Episodes played ahead and not handed over yet, plus the batch in flight (counted whole)."""
        with self._arrivals.mutex:
            waiting = list(self._arrivals.queue)
        played = sum(len(arrival.batch.scores) for arrival in waiting if isinstance(arrival, Arrival))
        return played + (self.batch_size if self._in_flight else 0)

    def _discard_waiting(self, thread_alive: bool) -> int:
        """Empty the hand-over queue after stopping; the episodes discarded (a batch that ended in an error, or
        that is still in flight, counted whole)."""
        discarded = self.batch_size if thread_alive else 0
        while not self._arrivals.empty():
            arrival = self._arrivals.get_nowait()
            discarded += len(arrival.batch.scores) if isinstance(arrival, Arrival) else self.batch_size
        return discarded


def staleness(batch: EpisodeBatch, trained_version: int) -> tuple[float, int]:
    """`(mean, max)` over the batch's model turns of how many versions older than `trained_version` the weights
    that sampled each turn were (turns of unknown version are left out; `(0.0, 0)` when none is known)."""
    ages = [trained_version - version for episode in batch.episodes for version in turn_versions(episode) if version is not None]
    return (sum(ages) / len(ages), max(ages)) if ages else (0.0, 0)


def turn_versions(episode: Any) -> list[int | None]:
    """Per model turn, the version of the weights that sampled it (a `TextHistory` or a `GymEpisode`)."""
    if hasattr(episode, "turn_policy_versions"):
        return list(episode.turn_policy_versions)
    return list(getattr(episode, "policy_versions", []))


def engine_of(source: EpisodeSource) -> Any:
    """The engine a source's front end plays on (`None` for a scripted policy or an unknown source)."""
    front_end = getattr(source, "env", None) or getattr(source, "scheduler", None)
    if front_end is None or getattr(front_end, "policy", None) is not None:
        return None
    return getattr(front_end, "engine", None)


def _sync_seconds(engine: Any) -> list[float] | None:
    seconds = getattr(engine, "sync_seconds", None)
    return list(seconds) if seconds is not None else None


def _state_of(source: EpisodeSource) -> dict | None:
    return source.state_dict() if hasattr(source, "state_dict") else None
