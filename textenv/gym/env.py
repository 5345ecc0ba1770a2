"""The Gym contract: `Env`, `ContextManager` and the request/response records (ms-swift >= 3.8, "G1").

An `Env` is one episode's world. The scheduler creates a fresh instance per dataset row (per sample),
calls `reset` once, `step` after every model turn, and `close` exactly once at the end, whatever
happened. A `ContextManager` decides, before every model turn, which messages the model sees.

Messages are OpenAI-style dicts: ``{"role": "system" | "user" | "assistant", "content": str}``.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from textenv.chat.renderer import Message, Messages  # noqa: F401 - the message types, re-exported


def new_trajectory_id() -> str:
    """A unique id per episode, in ms-swift's request-id format: ``chatcmpl-<32 hex digits>``."""
    return f"chatcmpl-{uuid.uuid4().hex}"


@dataclass
class RolloutInferRequest:
    """What `Env.reset` receives: one dataset row as a request.

    Attributes:
        messages (`list[dict]`): the row's `messages` column (used for logging only: the env's `reset`
            replaces the conversation).
        images, audios, videos (`list[str]`): the row's media columns (URLs or base64), passed through.
        tools (`list`, *optional*): the row's `tools` column.
        objects (`dict`): the row's `objects` column (grounding tasks), passed through.
        data_dict (`dict`): every other column of the row (`problem`, `solution`, `env_config`,
            `ctx_config`, ...).
        uuid (`str`): the episode's trajectory id, unique per sample.
    """

    messages: Messages = field(default_factory=list)
    images: List[str] = field(default_factory=list)
    audios: List[str] = field(default_factory=list)
    videos: List[str] = field(default_factory=list)
    tools: Optional[List[Any]] = None
    objects: Dict[str, Any] = field(default_factory=dict)
    data_dict: Dict[str, Any] = field(default_factory=dict)
    uuid: str = field(default_factory=new_trajectory_id)


@dataclass
class RolloutOutput:
    """One finished episode in ms-swift's `RolloutOutput` shape.

    Unlike ms-swift G1, which returns no token ids (so the trainer re-tokenizes earlier turns), every
    trained turn's exact generated ids are returned.

    Attributes:
        response (`str`, *optional*): the final assistant reply (`None` if the model never replied).
        messages (`list[dict]`): the final conversation, ending with the latest assistant reply.
        response_token_ids (`list[list[int]]`): the generated ids of each trained turn.
        response_loss_mask (`list[list[int]]`): same shape; 1 = trained.
        rollout_infos (`dict`): `num_turns`, `trajectory_id`, `total_reward`, `step_rewards`,
            `trajectory_info` (reset info then every step info), and `error` when the episode failed.
    """

    response: Optional[str]
    messages: Messages
    response_token_ids: List[List[int]] = field(default_factory=list)
    response_loss_mask: List[List[int]] = field(default_factory=list)
    rollout_infos: Dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode of an environment the model talks to in chat form.

    Subclass it, implement the three coroutines, and register the class under a name
    (``envs["my_env"] = MyEnv``) in a plugin file loaded with ``--external_plugins``.

    The methods are coroutines run on the scheduler's event loop, concurrently with other episodes:
    they must not block. Wrap blocking work (a subprocess, a sync HTTP client) in
    ``await asyncio.to_thread(...)``. A call that takes longer than the scheduler's `step_timeout`, raises,
    or returns a malformed value ends this episode only; the error is recorded in the episode's info.

    Args:
        env_config (`dict`): the row's `env_config` column (``{}`` if absent). Its `name` key chose
            this class.

    Attributes:
        stop_strings (`tuple[str, ...]`): extra strings that end a model turn (besides EOS), e.g.
            ``("<call>",)`` for a tool syntax. Defaults to none.
        tool_schemas (`list[dict]`, *optional*): set (in `__init__`) to offer JSON tool calls: the schemas
            go to the chat template's `tools=`, and each reply reaches `step` with its calls parsed into
            OpenAI-style `tool_calls` (its `content` keeps the text around them).
    """

    stop_strings: Tuple[str, ...] = ()
    tool_schemas: Optional[List[dict]] = None

    def __init__(self, env_config: Dict[str, Any]):
        self.env_config = env_config

    @abstractmethod
    async def reset(self, config: RolloutInferRequest) -> Tuple[str, Dict[str, Any], Optional[str]]:
        """Start the episode.

        Args:
            config (`RolloutInferRequest`): the dataset row (`data_dict` holds its columns).

        Returns:
            tuple: `(observation, info, system_message)`. `observation` (`str` or `list[dict]`): a string
            becomes the first user message; a non-empty list of ``{"role", "content": str}`` messages is the
            whole opening conversation (system, few-shot turns, the user's request; it must not end with an
            assistant message). `info` (`dict`): JSON-serialisable debug data, logged as
            `trajectory_infos[0]`. `system_message` (`str` or `None`): the system prompt; `None` or ``""``
            for none (the chat template's default then applies). With a list opening it is put first, and the
            list must then not hold a system message itself.
        """

    @abstractmethod
    async def step(self, action: Messages) -> Tuple[Any, float, bool, Dict[str, Any]]:
        """React to the model's reply.

        Args:
            action (`list[dict]`): a copy of the whole conversation; ``action[-1]`` is the assistant
                reply just generated.

        Returns:
            tuple: `(next_observation, reward, done, info)`. `next_observation` (`str` or `list[dict]`): a
            string becomes the next user message; a list of ``{"role": "tool", "tool_call_id", "name",
            "content"}`` messages (JSON tool results) is appended as the chat template renders them; ignored
            (may be `None`) when `done` is true or the turn limit is reached. `reward` (`float`): this step's
            reward; the episode's reward is the sum over steps. `done` (`bool`): the episode is over. `info`
            (`dict`): JSON-serialisable debug data, logged in `trajectory_infos`.
        """

    async def final_reward(self, messages: Messages) -> Optional[float]:
        """Optional: the reward of the whole episode, added to the sum of the step rewards.

        Called once, before `close`, when the episode ended without an error (`done`, `max_turns` or
        `max_length`), with the final conversation. The default returns `None`: nothing is added. The TRL
        adapter (`textenv.environments.trl`) scores an episode here with `get_reward` and `reward_funcs`.

        Args:
            messages (`list[dict]`): a copy of the final conversation (opening included).

        Returns:
            A finite float, or `None` for no final reward.
        """
        return None

    @abstractmethod
    async def close(self) -> None:
        """Release what the episode holds. Called exactly once per created env, also after errors and
        timeouts; it must not raise (an exception is recorded and swallowed)."""


class ContextManager(ABC):
    """Chooses what the model sees before each turn (history compression, sliding windows).

    One instance per episode. The returned list replaces the conversation: it is what the model is
    prompted with and what is logged. Turns whose context was rewritten are no longer trained (they
    would be off-policy); the turn generated in the returned context is.

    Args:
        ctx_config (`dict`): the row's `ctx_config` column (``{}`` if absent).
    """

    def __init__(self, ctx_config: Dict[str, Any]):
        self.ctx_config = ctx_config

    @abstractmethod
    def manage_context(self, history: Messages, trajectory_id: str) -> Messages:
        """Return the messages to prompt the model with.

        Args:
            history (`list[dict]`): a copy of the conversation so far (system?, user, assistant, user,
                ..., user). It may be modified and returned.
            trajectory_id (`str`): the episode's id.

        Returns:
            The messages for this turn. A trailing assistant message is dropped before generating.
        """
