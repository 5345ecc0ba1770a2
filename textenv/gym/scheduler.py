"""`GymScheduler`: runs gym episodes concurrently on the shared generation engine.

For every dataset row (times `num_generations`): a fresh env and context manager; `reset` gives the
system and first user message; each turn the context manager picks the messages, the model replies
(through the chat template, keeping its exact token ids), `env.step` sees the conversation, and its
observation becomes the next user message unless the episode is over. Episodes end on `done`,
`max_turns` (no observation is appended after the last turn: the ms-swift G1 bug), `max_length`, or
an error. `close()` always runs. An env that raises, hangs past `step_timeout` or returns a malformed
value ends only its own episode; the error is recorded in the episode and in `completions.jsonl`.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import torch

from textenv.asyncio_bridge import run_sync
from textenv.environment.syntax import CONTROL_TAGS
from textenv.gym.batching import GenerationQueue
from textenv.gym.chat import ChatRenderer
from textenv.gym.completions import CompletionsLog
from textenv.gym.env import ContextManager, Env, RolloutInferRequest
from textenv.gym.episode import FINISH_DONE, FINISH_ERROR, FINISH_MAX_LENGTH, FINISH_MAX_TURNS, GymEpisode, error_record
from textenv.gym.registry import load_plugins, resolve_context_manager, resolve_env
from textenv.gym.rows import load_rows, make_request
from textenv.gym.transcript import Transcript, check_loss_scale
from textenv.gym.validation import check_managed_messages, check_reset_result, check_step_result
from textenv.engine.engine import Completion, RolloutEngine

Policy = Callable[[List[torch.Tensor], Sequence[str]], List[Completion]]


class EnvTimeoutError(TimeoutError):
    """An env call took longer than the scheduler's `step_timeout`."""


@dataclass
class RunStats:
    """Counters of the last `run`: envs created and closed, episodes finished, generation batches."""

    envs_created: int = 0
    envs_closed: int = 0
    episodes: int = 0
    errors: int = 0
    batch_sizes: Optional[List[int]] = None


class _Failure(Exception):
    """Ends an episode: the error at `stage` has been recorded."""


class GymScheduler:
    """Runs multi-turn episodes of registered `Env`s and returns them ready for `PPOTrainer.step`.

    Args:
        model: the policy model (a causal LM or a value-head wrapper); not needed with `policy`.
        tokenizer: its tokenizer, with a chat template.
        gym_env (`str`, *optional*): env name for rows whose `env_config` has no `name`.
        context_manager (`str`, *optional*): context manager name for rows whose `ctx_config` has no
            `name`; defaults to `"dummyContextManager"`.
        max_turns (`int`, *optional*): most model turns per episode; `None` or 0 for no limit.
        loss_scale (`str`, defaults to `"last_round"`): `"last_round"` trains the final reply only
            (ms-swift's server-mode default); `"default"` or `"all"` train every reply generated in the
            context it is trained in. Observations and template tokens are never trained.
        generation_kwargs (`dict`, *optional*): for `model.generate` (`max_new_tokens`, `do_sample`, ...).
        batch_size (`int`, defaults to 16): most episodes generated together.
        max_concurrency (`int`, defaults to 64): most episodes alive at once.
        step_timeout (`float`, *optional*, defaults to 60): seconds each `reset`, `step` and `close` may
            take; `None` for no limit.
        max_length (`int`, *optional*): an episode whose context reaches this many tokens ends
            (`finish_reason="max_length"`) instead of generating.
        stop_strings (`tuple[str]`): strings that end every model turn (an env adds its own
            `stop_strings`).
        policy (`Callable`, *optional*): ``policy(contexts, stop_strings) -> list[Completion]`` used
            instead of the model (e.g. `ScriptedPolicy` for testing envs).
        external_plugins (`str` or `list`, *optional*): plugin files to load (see `load_plugins`).

    Attributes:
        stats (`RunStats`): counters of the last run.
    """

    def __init__(
        self,
        model=None,
        tokenizer=None,
        *,
        gym_env: Optional[str] = None,
        context_manager: Optional[str] = None,
        max_turns: Optional[int] = None,
        loss_scale: str = "last_round",
        generation_kwargs: Optional[dict] = None,
        batch_size: int = 16,
        max_concurrency: int = 64,
        step_timeout: Optional[float] = 60.0,
        max_length: Optional[int] = None,
        stop_strings: Sequence[str] = (),
        policy: Optional[Policy] = None,
        external_plugins: Union[str, Path, Sequence[Union[str, Path]], None] = None,
    ):
        if tokenizer is None:
            raise ValueError("GymScheduler needs the tokenizer (its chat template renders the conversation).")
        if model is None and policy is None:
            raise ValueError("GymScheduler needs a model (or a policy callable for scripted episodes).")
        _check_positive("batch_size", batch_size)
        _check_positive("max_concurrency", max_concurrency)
        self.model = model
        self.tokenizer = tokenizer
        self.gym_env = gym_env
        self.context_manager = context_manager
        self.max_turns = max_turns or None
        self.loss_scale = check_loss_scale(loss_scale)
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        self.max_concurrency = max_concurrency
        self.step_timeout = step_timeout
        self.max_length = max_length
        self.stop_strings = tuple(stop_strings)
        self.policy = policy
        self.renderer = ChatRenderer(tokenizer)
        self.stats = RunStats()
        self._engine: Optional[RolloutEngine] = None
        load_plugins(external_plugins)

    # ------------------------------------------------------------------ generation
    def generate(self, contexts: List[torch.Tensor], stop_strings: Sequence[str] = ()) -> List[Completion]:
        """One model turn per context (runs in the generation thread). Uses `policy` if given, else the
        shared `RolloutEngine`. Override to swap the generator."""
        if self.policy is not None:
            return self.policy(contexts, stop_strings)
        if self._engine is None:
            self._engine = RolloutEngine(self.model, self.tokenizer, batch_size=self.batch_size)
        self._engine.model = self.model
        return self._engine.generate(
            contexts, stop_strings=stop_strings, generation_kwargs=self.generation_kwargs, batch_size=self.batch_size
        )

    # ------------------------------------------------------------------ running
    def run(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        step: int = 0,
        num_generations: int = 1,
        completions_path: Union[str, Path, CompletionsLog, None] = None,
        progress: bool = False,
        keep_episodes: bool = True,
    ) -> List[GymEpisode]:
        """Run one episode per row (`num_generations` per row) and return them in row order.

        Works inside a running event loop too (a notebook): the episodes then run in a helper thread.
        See `arun` for the arguments.
        """
        coroutine = self.arun(
            rows, step=step, num_generations=num_generations, completions_path=completions_path,
            progress=progress, keep_episodes=keep_episodes,
        )
        return run_sync(coroutine)

    async def arun(
        self,
        rows: Iterable[Mapping[str, Any]],
        *,
        step: int = 0,
        num_generations: int = 1,
        completions_path: Union[str, Path, CompletionsLog, None] = None,
        progress: bool = False,
        keep_episodes: bool = True,
    ) -> List[GymEpisode]:
        """Run the episodes of `rows` concurrently.

        Args:
            rows: dataset rows (dicts, read lazily: at most `max_concurrency` episodes are alive at once),
                a `datasets.Dataset`, or the path of a `.jsonl` file.
            step (`int`): the training step, written to `completions.jsonl`.
            num_generations (`int`): episodes per row (each with its own env and trajectory id).
            completions_path: a `completions.jsonl` path (appended to) or an open `CompletionsLog`.
            progress (`bool`): show a tqdm progress bar.
            keep_episodes (`bool`): return the episodes; `False` returns `[]` and keeps memory flat over
                long runs (the log still gets every episode).

        Returns:
            The episodes, ordered by row then generation.
        """
        from tqdm import tqdm

        _check_positive("num_generations", num_generations)
        if isinstance(rows, (str, Path)):
            rows = load_rows(rows)
        self.stats = RunStats()
        log, own_log = _open_log(completions_path)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="textenv-gym-generate")
        queue = GenerationQueue(self.generate, executor, self.batch_size)
        total = len(rows) * num_generations if hasattr(rows, "__len__") else None
        bar = tqdm(total=total, desc="gym episodes", unit="episode") if progress else _NoBar()
        context = _RunContext(queue=queue, log=log, bar=bar, step=step)
        results: Dict[int, GymEpisode] = {}
        try:
            await self._run_all(rows, num_generations, context, results if keep_episodes else None)
        finally:
            await context.cancel_abandoned()
            executor.shutdown(wait=True)
            bar.close()
            if own_log and log is not None:
                log.close()
            self.stats.batch_sizes = list(queue.batch_sizes)
        return [results[key] for key in sorted(results)]

    async def _run_all(self, rows, num_generations, context: "_RunContext", results: Optional[Dict[int, GymEpisode]]) -> None:
        slots = asyncio.Semaphore(self.max_concurrency)
        tasks: set = set()
        try:
            for index, row in enumerate(rows):
                for generation in range(num_generations):
                    await slots.acquire()
                    task = asyncio.create_task(self._episode(index, row, context))
                    tasks.add(task)
                    task.add_done_callback(_finisher(tasks, slots, results, index * num_generations + generation))
            if tasks:
                await asyncio.gather(*list(tasks))
        finally:
            for task in list(tasks):
                task.cancel()
            if tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)

    # ------------------------------------------------------------------ one episode
    async def _episode(self, index: int, row: Mapping[str, Any], context: "_RunContext") -> GymEpisode:
        episode = GymEpisode(row_index=index, step=context.step)
        env: Optional[Env] = None
        try:
            try:
                request = make_request(row)
                episode.trajectory_id = request.uuid
                env_config = dict(request.data_dict.get("env_config") or {})
                ctx_config = dict(request.data_dict.get("ctx_config") or {})
                episode.env_name = env_config.get("name", self.gym_env)
                env_class = resolve_env(env_config, self.gym_env)
                manager = resolve_context_manager(ctx_config, self.context_manager)(ctx_config)
                env = env_class(env_config)
            except Exception as error:  # noqa: BLE001 - a bad row ends its own episode only
                episode.errors.append(error_record("config", error))
            else:
                self.stats.envs_created += 1
                episode.closed = False
                await self._play(env, manager, request, episode, context)
        except _Failure:
            pass
        except asyncio.CancelledError:
            episode.errors.append({"stage": "run", "type": "CancelledError", "message": "the run was cancelled", "turn": None})
            raise
        finally:
            if env is not None:
                await self._close(env, episode, context)
            self._finish(episode, context)
        return episode

    async def _play(self, env: Env, manager: ContextManager, request: RolloutInferRequest, episode: GymEpisode, context: "_RunContext") -> None:
        name = type(env).__name__
        reset = await self._env_call("reset", lambda: env.reset(request), episode, context)
        observation, info, system = self._checked("reset", lambda: check_reset_result(reset, name), episode)
        episode.trajectory_infos.append(info)
        opening = [{"role": "system", "content": self.renderer.neutralize(system)}] if system else []
        opening.append({"role": "user", "content": self._observation_text(observation)})
        transcript = self._checked("reset", lambda: Transcript(self.renderer, opening), episode)
        context.transcripts[id(episode)] = transcript
        stop_strings = tuple(dict.fromkeys([*self.stop_strings, *getattr(env, "stop_strings", ())]))
        for turn in count(1):
            self._checked("context_manager", lambda: self._manage(manager, transcript, episode.trajectory_id), episode, turn)
            ids, prompt = self._checked("context_manager", transcript.generation_context, episode, turn)
            if self.max_length is not None and len(ids) >= self.max_length:
                episode.finish_reason = FINISH_MAX_LENGTH
                return
            completion = await self._generation(context, ids, stop_strings, episode, turn)
            episode.num_turns = turn
            episode.turn_finish_reasons.append(completion.finish_reason)
            self._checked("generate", lambda: transcript.add_reply(completion, prompt), episode, turn)
            result = await self._env_call("step", lambda: env.step(transcript.messages), episode, context, turn)
            observation, reward, done, info = self._checked("step", lambda: check_step_result(result, name), episode, turn)
            episode.step_rewards.append(reward)
            episode.total_reward += reward
            episode.trajectory_infos.append(info)
            if done:
                episode.finish_reason = FINISH_DONE
                return
            if self.max_turns is not None and turn >= self.max_turns:
                episode.finish_reason = FINISH_MAX_TURNS
                return
            transcript.add_message({"role": "user", "content": self._observation_text(observation)})

    def _manage(self, manager: ContextManager, transcript: Transcript, trajectory_id: str) -> None:
        managed = manager.manage_context(transcript.messages, trajectory_id)
        transcript.apply_context(check_managed_messages(managed, type(manager).__name__))

    def _observation_text(self, observation: str) -> str:
        return self.renderer.neutralize(observation, CONTROL_TAGS)

    async def _generation(self, context: "_RunContext", ids: torch.Tensor, stops, episode: GymEpisode, turn: int) -> Completion:
        try:
            return await context.queue.submit(ids, stops)
        except Exception as error:  # noqa: BLE001 - recorded for each episode of the failed batch
            episode.errors.append(error_record("generate", error, turn))
            raise _Failure from error

    def _checked(self, stage: str, function: Callable[[], Any], episode: GymEpisode, turn: Optional[int] = None) -> Any:
        try:
            return function()
        except Exception as error:  # noqa: BLE001 - env/user code errors end this episode only
            episode.errors.append(error_record(stage, error, turn))
            raise _Failure from error

    async def _env_call(self, stage: str, call: Callable[[], Any], episode: GymEpisode, context: "_RunContext", turn: Optional[int] = None) -> Any:
        """Call an env method (async, or plain for lenience) with the timeout; record failures."""
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await context.with_timeout(result, self.step_timeout, stage)
            return result
        except Exception as error:  # noqa: BLE001
            episode.errors.append(error_record(stage, error, turn))
            raise _Failure from error

    async def _close(self, env: Env, episode: GymEpisode, context: "_RunContext") -> None:
        try:
            await self._env_call("close", env.close, episode, context)
        except _Failure:
            pass
        finally:
            episode.closed = True
            self.stats.envs_closed += 1

    # ------------------------------------------------------------------ results
    def _finish(self, episode: GymEpisode, context: "_RunContext") -> None:
        transcript = context.transcripts.pop(id(episode), None)
        if episode.errors:
            episode.finish_reason = FINISH_ERROR
        elif episode.finish_reason == FINISH_ERROR:  # ended without a reason: the turn loop cannot do that
            episode.finish_reason = FINISH_DONE
        prompt = ""
        if transcript is not None:
            try:
                episode.messages = transcript.messages
                episode.history = transcript.to_history(self.loss_scale)
                before_reply = episode.messages[:-1] if episode.completion else episode.messages
                prompt = self.renderer.render(before_reply)
            except Exception as error:  # noqa: BLE001 - never lose the episode's log line
                episode.errors.append(error_record("history", error, episode.num_turns))
                episode.finish_reason = FINISH_ERROR
        if episode.history is not None:
            episode.history.reward = episode.total_reward
            episode.history.info = episode.rollout_infos()
            episode.history.complete(truncated=episode.finish_reason in (FINISH_MAX_TURNS, FINISH_MAX_LENGTH))
        self.stats.episodes += 1
        self.stats.errors += bool(episode.errors)
        if context.log is not None:
            context.log.write(completion_record(episode, prompt))
        context.bar.update(1)


def completion_record(episode: GymEpisode, prompt: str) -> Dict[str, Any]:
    """The `completions.jsonl` line of an episode."""
    return {
        "step": episode.step,
        "prompt": prompt,
        "completion": episode.completion,
        "messages": episode.messages,
        "total_reward": episode.total_reward,
        "step_rewards": episode.step_rewards,
        "num_turns": episode.num_turns,
        "trajectory_id": episode.trajectory_id,
        "trajectory_infos": episode.trajectory_infos,
        "finish_reason": episode.finish_reason,
        "error": episode.error,
        "errors": episode.errors,
        "env": episode.env_name,
        "row_index": episode.row_index,
    }


class _RunContext:
    """What the episodes of one run share: the generation queue, the log, the progress bar, and the
    env calls abandoned after a timeout."""

    def __init__(self, queue: GenerationQueue, log: Optional[CompletionsLog], bar, step: int):
        self.queue = queue
        self.log = log
        self.bar = bar
        self.step = step
        self.transcripts: Dict[int, Transcript] = {}
        self._abandoned: set = set()

    async def with_timeout(self, awaitable: Awaitable, timeout: Optional[float], stage: str) -> Any:
        task = asyncio.ensure_future(awaitable)
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            # Cancel, but do not wait: an env that ignores cancellation must not hang the episode.
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


class _NoBar:
    """Stands in for a tqdm bar when progress is off (tqdm would still start its monitor thread)."""

    def update(self, count: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _finisher(tasks: set, slots: asyncio.Semaphore, results: Optional[Dict[int, GymEpisode]], key: int):
    def finish(task: asyncio.Task) -> None:
        tasks.discard(task)
        slots.release()
        if results is not None and not task.cancelled() and task.exception() is None:
            results[key] = task.result()

    return finish


def _open_log(target) -> tuple[Optional[CompletionsLog], bool]:
    if target is None:
        return None, False
    if isinstance(target, CompletionsLog):
        return target, False
    return CompletionsLog(target), True


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
