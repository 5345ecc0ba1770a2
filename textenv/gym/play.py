"""One gym episode as the episode driver plays it.

For a dataset row: a fresh env (a registered class, or a TRL environment through `TrlEnvironment`) and
context manager; `reset` gives the system and first user message (or a whole opening conversation); each
turn the context manager picks the messages, the model replies (through the chat template, keeping its
exact token ids), `env.step` sees the conversation, and its observation becomes the next user message
unless the episode is over. Episodes end on `done`, `max_turns` (no observation is appended after the
last turn: the ms-swift G1 bug), `max_length`, or an error; an episode that ended without an error then gets
the env's `final_reward` (if any) before `close`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Dict, Mapping, Optional

import torch

from textenv.chat.transcript import Transcript
from textenv.engine.stopping import FINISH_LENGTH
from textenv.episodes.driver import FINISH_ERROR, MAX_TURNS, Episode, EpisodeFailure, StopRule, Timeouts
from textenv.gym.env import ContextManager, Env
from textenv.gym.episode import FINISH_DONE, FINISH_MAX_LENGTH, FINISH_MAX_TURNS, GymEpisode, error_record
from textenv.environments.kind import KIND_FIELD, EnvironmentKind, RoutedKinds
from textenv.gym.registry import resolve_context_manager
from textenv.gym.rows import make_request
from textenv.gym.validation import check_final_reward, check_managed_messages, check_reset_result, check_step_result
from textenv.tools.json_calls import OBSERVATION_CONTROL_STRINGS

logger = logging.getLogger(__name__)


class GymPlay(Episode):
    """A dataset row's episode: its env, context manager and transcript, and the `GymEpisode` it yields.

    Args:
        scheduler (`GymScheduler`): the run's settings (renderer, limits, stop strings, timeouts, stats).
        index (`int`): the row's index.
        row (`Mapping`): the dataset row.
        step (`int`): the training step, recorded in the episode.
        timeouts (`Timeouts`): the run's timed env calls.
    """

    stop_rules = (StopRule(FINISH_DONE, lambda play: play.done), MAX_TURNS)

    def __init__(self, scheduler, index: int, row: Mapping[str, Any], step: int, timeouts: Timeouts):
        super().__init__()
        self.scheduler = scheduler
        self.row = row
        self.timeouts = timeouts
        self.result = GymEpisode(row_index=index, step=step)
        self.max_turns = scheduler.max_turns
        self.max_length = scheduler.max_length
        self.generation_kwargs = scheduler.generation_kwargs
        self.env: Optional[Env] = None
        self.manager: Optional[ContextManager] = None
        self.transcript: Optional[Transcript] = None
        self.observation: Optional[str] = None
        self.done = False

    async def reset(self) -> None:
        request = self._checked("config", lambda: make_request(self.row))
        self.result.trajectory_id = request.uuid
        ctx_config = dict(request.data_dict.get("ctx_config") or {})
        kind = self._kind()
        self.result.env_name = kind.env_name(self.row)
        self.manager = self._checked("config", lambda: resolve_context_manager(ctx_config, self.scheduler.context_manager)(ctx_config))
        self.env = self._checked("config", lambda: kind.adapter(self.row, self.result.row_index))
        self.scheduler.stats.envs_created += 1
        self.result.closed = False
        reset = await self._env_call("reset", lambda: self.env.reset(request))
        observation, info, system = self._checked("reset", lambda: check_reset_result(reset, type(self.env).__name__))
        self.result.trajectory_infos.append(info)
        renderer, parser = self._checked("reset", self._tool_chat)
        self._fit_turn_budget()
        opening = self._opening(observation, system, renderer)
        self.transcript = self._checked("reset", lambda: Transcript(renderer, opening, tool_parser=parser))
        self.stop_strings = tuple(dict.fromkeys([*self.scheduler.stop_strings, *getattr(self.env, "stop_strings", ())]))

    def _kind(self) -> EnvironmentKind:
        """The kind that plays this row: the scheduler's, or with several the one the row's `env_kind` names
        (recorded in the episode before anything can fail)."""
        kinds = self.scheduler.environments
        if not isinstance(kinds, RoutedKinds):
            self.result.env_kind = kinds.kind
            return kinds
        self.result.env_kind = self.row.get(KIND_FIELD)
        return self._checked("config", lambda: kinds.route(self.row))[1]

    def _opening(self, observation, system: Optional[str], renderer) -> list:
        """The first messages: the system prompt (if any) and the observation as the user message, or the
        opening conversation `reset` returned (its texts defused like any observation)."""
        opening = [{"role": "system", "content": renderer.neutralize(system)}] if system else []
        if isinstance(observation, str):
            return [*opening, {"role": "user", "content": self._observation_text(observation)}]
        for message in observation:
            text = renderer.neutralize(message["content"]) if message["role"] == "system" else self._observation_text(message["content"])
            opening.append({**message, "content": text})
        return opening

    def _fit_turn_budget(self) -> None:
        """Give an episode with JSON tools the tokens its longest call needs (see `GymScheduler.fit_tool_calls`)."""
        schemas = getattr(self.env, "tool_schemas", None)
        chosen = self.generation_kwargs.get("max_new_tokens")
        if not schemas or (chosen is not None and not self.scheduler.fit_tool_calls):
            return
        needed = self.scheduler.chat_tools().turn_budget(list(schemas))
        if chosen is None or chosen < needed:
            self.generation_kwargs = {**self.generation_kwargs, "max_new_tokens": needed}

    def _count_cut_tool_call(self, completion) -> None:
        """A turn that reached `max_new_tokens` with a call the parser could not read: counted, reported once."""
        calls = self.transcript.messages[-1].get("tool_calls") or []
        if completion.finish_reason != FINISH_LENGTH or not any(call.get("error") for call in calls):
            return
        self.result.tool_calls_cut += 1
        self.scheduler.stats.tool_calls_cut += 1
        if not self.scheduler.warned_cut_tool_call:
            self.scheduler.warned_cut_tool_call = True
            budget = self.generation_kwargs.get("max_new_tokens")
            fix = ("The budget was fitted to the longest call of the episode's tools, so the model wrote a longer call than any of "
                   "them (a tool that does not exist, arguments it does not take): --max_new_tokens N allows longer turns"
                   if self.scheduler.fit_tool_calls else
                   "Raise --max_new_tokens (generation_kwargs['max_new_tokens']) to fit the tool calls, or leave it out so that each "
                   "episode gets what its tools need")
            logger.warning(
                f"A model turn reached max_new_tokens={budget} inside a tool call: the call could not be read and the env was "
                f"told so. {fix}. Such turns are counted (tool_calls_cut); this is said once."
            )

    def _tool_chat(self) -> tuple:
        """`(renderer, tool_parser)`: the env's `tool_schemas` (JSON tool calls) described through the chat
        template and its calls parsed, or the plain renderer and no parser."""
        schemas = getattr(self.env, "tool_schemas", None)
        if not schemas:
            return self.scheduler.renderer, None
        chat = self.scheduler.chat_tools()
        return chat.renderer_for(list(schemas)), chat.parser_for(list(schemas))

    def context(self) -> torch.Tensor:
        if self.observation is not None:  # a user message, or tool results rendered together
            messages = self.observation if isinstance(self.observation, list) else [{"role": "user", "content": self.observation}]
            self.transcript.add_messages([{**message, "content": self._observation_text(message["content"])} for message in messages])
            self.observation = None
        managed = self.manager.manage_context(self.transcript.messages, self.result.trajectory_id)
        self.transcript.apply_context(check_managed_messages(managed, type(self.manager).__name__))
        ids, self.prompt = self.transcript.generation_context()
        return ids

    async def react(self, completion) -> None:
        self.result.num_turns = self.turns
        self.result.turn_finish_reasons.append(completion.finish_reason)
        self.result.turn_logprobs.append(completion.logprobs.tolist() if completion.logprobs is not None else None)
        self.result.turn_policy_versions.append(completion.policy_version)
        self._checked("generate", lambda: self.transcript.add_reply(completion, self.prompt), self.turns)
        self._count_cut_tool_call(completion)
        extra = {"completion": completion} if "completion" in inspect.signature(self.env.step).parameters else {}
        outcome = await self._env_call("step", lambda: self.env.step(self.transcript.messages, **extra), self.turns)
        observation, reward, done, info = self._checked("step", lambda: check_step_result(outcome, type(self.env).__name__), self.turns)
        self.result.step_rewards.append(reward)
        self.result.total_reward += reward
        self.result.trajectory_infos.append(info)
        self.scheduler.stats.count_tool_calls(info)
        self.done = done
        self.observation = None if done else observation

    async def close(self) -> None:
        if self.env is None:
            return
        try:
            if not self.failures and self.transcript is not None:
                await self._final_reward()
        finally:
            try:
                await self._env_call("close", self.env.close)
            finally:
                self.result.closed = True
                self.scheduler.stats.envs_closed += 1

    async def _final_reward(self) -> None:
        """Add the env's `final_reward` (if it has one and gives a value) to the episode's reward."""
        final_reward = getattr(self.env, "final_reward", None)
        if final_reward is None:
            return
        accepted = inspect.signature(final_reward).parameters
        extra = {"step": self.result.step} if "step" in accepted else {}
        if "completion_ids" in accepted:  # only TRL environments ask for the ids: build them only then
            extra["completion_ids"] = self.transcript.completion_ids()
        value = await self._env_call("final_reward", lambda: final_reward(self.transcript.messages, **extra))
        value = self._checked("final_reward", lambda: check_final_reward(value, type(self.env).__name__))
        if getattr(self.env, "reward_info", None):  # what TRL reward functions logged (log_extra, log_metric)
            self.result.trajectory_infos.append(dict(self.env.reward_info))
        if value is not None:
            self.result.final_reward = value
            self.result.total_reward += value

    # ------------------------------------------------------------------ the result
    def finish(self) -> GymEpisode:
        """The `GymEpisode`: errors, finish reason, messages, the trainable history, rewards."""
        episode = self.result
        episode.errors = [error_record(failure.stage, failure.error, failure.turn) for failure in self.failures]
        episode.finish_reason = self.finish_reason or FINISH_ERROR
        prompt = ""
        if self.transcript is not None:
            try:
                episode.messages = self.transcript.messages
                episode.history = self.transcript.to_history(self.scheduler.loss_scale)
                before_reply = episode.messages[:-1] if episode.completion else episode.messages
                prompt = self.transcript.renderer.render(before_reply)
            except Exception as error:  # noqa: BLE001 - never lose the episode's log line
                episode.errors.append(error_record("history", error, episode.num_turns))
                episode.finish_reason = FINISH_ERROR
        if episode.history is not None:
            episode.history.reward = episode.total_reward
            episode.history.info = episode.rollout_infos()
            episode.history.complete(truncated=episode.finish_reason in (FINISH_MAX_TURNS, FINISH_MAX_LENGTH))
        episode.prompt = prompt
        return episode

    # ------------------------------------------------------------------ helpers
    def _observation_text(self, observation: str) -> str:
        return self.scheduler.renderer.neutralize(observation, OBSERVATION_CONTROL_STRINGS)

    @staticmethod
    def _checked(stage: str, function: Callable[[], Any], turn: Optional[int] = None) -> Any:
        try:
            return function()
        except Exception as error:  # noqa: BLE001 - env/user code errors end this episode only
            raise EpisodeFailure(stage, error, turn) from error

    async def _env_call(self, stage: str, call: Callable[[], Any], turn: Optional[int] = None) -> Any:
        """Call an env method (async, or plain for lenience) with the scheduler's timeout."""
        try:
            return await self.timeouts.call(stage, call, self.scheduler.step_timeout)
        except Exception as error:  # noqa: BLE001
            raise EpisodeFailure(stage, error, turn) from error


def completion_record(episode: GymEpisode) -> Dict[str, Any]:
    """The `completions.jsonl` line of an episode; `final_reward` only when the env gave one, `turn_logprobs`
    only when the engine reported some, `turn_policy_versions` only in a training loop, `tool_calls_cut` only when a turn was cut inside a tool call."""
    record = {
        "step": episode.step,
        "prompt": episode.prompt,
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
        "env_kind": episode.env_kind,
        "row_index": episode.row_index,
    }
    if episode.final_reward is not None:
        record["final_reward"] = episode.final_reward
    if any(logprobs is not None for logprobs in episode.turn_logprobs):
        record["turn_logprobs"] = episode.turn_logprobs
    if any(version is not None for version in episode.turn_policy_versions):
        record["turn_policy_versions"] = episode.turn_policy_versions
    if episode.tool_calls_cut:
        record["tool_calls_cut"] = episode.tool_calls_cut
    return record
