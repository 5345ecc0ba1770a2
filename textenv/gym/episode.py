"""`GymEpisode`: the outcome of one gym episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from textenv.environment.history import TextHistory
from textenv.episodes.driver import FINISH_ERROR, FINISH_MAX_LENGTH, FINISH_MAX_TURNS  # noqa: F401 - the finish reasons
from textenv.gym.env import Messages, RolloutOutput

FINISH_DONE = "done"


def error_record(stage: str, error: BaseException, turn: Optional[int] = None) -> Dict[str, Any]:
    """``{"stage", "type", "message", "turn"}`` describing an exception raised at `stage`."""
    return {"stage": stage, "type": type(error).__name__, "message": str(error) or repr(error), "turn": turn}


@dataclass
class GymEpisode:
    """One finished episode.

    Attributes:
        row_index (`int`): the dataset row it came from.
        trajectory_id (`str`): its unique id (the request's `uuid`).
        env_name (`str`, *optional*): the registered env name.
        env_kind (`str`, *optional*): the environment kind that played it (``"gym"``, ``"trl"``, ...; with
            several kinds in a run, the row's `env_kind`).
        messages (`list[dict]`): the final conversation (ends with the last assistant reply unless the
            episode failed before the model replied).
        history (`TextHistory`, *optional*): exact tokens and the loss mask under the scheduler's
            `loss_scale`; `history.reward` is `total_reward`. `None` if the model never replied.
        total_reward (`float`): sum of the step rewards, plus the final reward if any.
        step_rewards (`list[float]`): one per completed `step`.
        final_reward (`float`, *optional*): what the env's `final_reward` gave at the end of the episode
            (`None`: nothing; a TRL environment's `get_reward` and `reward_funcs` give it).
        trajectory_infos (`list[dict]`): the reset info, then every step info.
        num_turns (`int`): model turns taken.
        finish_reason (`str`): `"done"`, `"max_turns"`, `"max_length"` or `"error"`.
        errors (`list[dict]`): every error (`stage`: config, reset, context_manager, generate, step,
            close; `type`, `message`, `turn`).
        turn_finish_reasons (`list[str]`): how each model turn ended (`"eos"`, `"stop"`, `"length"`).
        turn_logprobs (`list`): for each model turn, the engine's log-probability of each generated token
            (a list of floats), or `None` when the engine reported none (the in-process engine).
        turn_policy_versions (`list`): for each model turn, the version of the weights that sampled it (the
            training loop's count of optimizer steps; `None` outside a training loop).
        tool_calls_cut (`int`): model turns that reached `max_new_tokens` inside a tool call (the call could not
            be read, and the env was told so).
        closed (`bool`): the env's `close()` ran (or no env was created).
        step (`int`): the training step it was generated for.
        prompt (`str`): the rendered conversation before the final reply (as `completions.jsonl` logs it).
    """

    row_index: int
    trajectory_id: str = ""
    env_name: Optional[str] = None
    env_kind: Optional[str] = None
    messages: Messages = field(default_factory=list)
    history: Optional[TextHistory] = None
    total_reward: float = 0.0
    step_rewards: List[float] = field(default_factory=list)
    final_reward: Optional[float] = None
    trajectory_infos: List[Dict[str, Any]] = field(default_factory=list)
    num_turns: int = 0
    finish_reason: str = FINISH_ERROR
    errors: List[Dict[str, Any]] = field(default_factory=list)
    turn_finish_reasons: List[str] = field(default_factory=list)
    turn_logprobs: List[Optional[List[float]]] = field(default_factory=list)
    turn_policy_versions: List[Optional[int]] = field(default_factory=list)
    tool_calls_cut: int = 0
    closed: bool = True
    step: int = 0
    prompt: str = ""

    @property
    def error(self) -> Optional[Dict[str, Any]]:
        """The first error, or `None`."""
        return self.errors[0] if self.errors else None

    @property
    def trainable(self) -> bool:
        """It has model tokens to train on and no error."""
        return self.history is not None and not self.errors

    @property
    def completion(self) -> str:
        """The final assistant reply (``""`` if the last message is not one)."""
        if self.messages and self.messages[-1].get("role") == "assistant":
            return self.messages[-1]["content"]
        return ""

    def rollout_infos(self) -> Dict[str, Any]:
        """ms-swift's `rollout_infos` (plus `finish_reason`, `errors`, and `final_reward` when there is one)."""
        infos = {
            "num_turns": self.num_turns,
            "trajectory_id": self.trajectory_id,
            "total_reward": self.total_reward,
            "step_rewards": list(self.step_rewards),
            "trajectory_info": list(self.trajectory_infos),
            "finish_reason": self.finish_reason,
            "errors": list(self.errors),
        }
        if self.final_reward is not None:
            infos["final_reward"] = self.final_reward
        return infos

    def rollout_output(self, trained_token_ids: Optional[List[List[int]]] = None) -> RolloutOutput:
        """The episode as ms-swift's `RolloutOutput`, with the trained turns' exact ids."""
        ids = trained_token_ids if trained_token_ids is not None else self._trained_token_ids()
        return RolloutOutput(
            response=self.completion or None,
            messages=list(self.messages),
            response_token_ids=ids,
            response_loss_mask=[[1] * len(turn) for turn in ids],
            rollout_infos=self.rollout_infos(),
        )

    def _trained_token_ids(self) -> List[List[int]]:
        if self.history is None:
            return []
        return [
            self.history.tokens[start:end].tolist()
            for (start, end), system in zip(self.history.token_spans, self.history.system_spans)
            if not system
        ]
