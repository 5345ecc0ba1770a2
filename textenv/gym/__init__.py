"""The ms-swift (>= 3.8) Gym interface on textenv's generation engine.

`Env` and `ContextManager` are the contracts; `envs` and `context_managers` map names to classes (extend
them from a plugin file loaded with `load_plugins`); `GymScheduler` runs episodes and returns them as
`TextHistory`s for `PPOTrainer.step`. `GymScheduler(environment_factory=...)` runs TRL 1.x environment
classes (`TrlEnvironment`) the way `trl.GRPOTrainer` does.
"""

from textenv.chat.renderer import ChatRenderer, ChatTemplateError
from textenv.gym.completions import CompletionsLog, read_completions
from textenv.gym.env import ContextManager, Env, Message, Messages, RolloutInferRequest, RolloutOutput
from textenv.gym.builtin import DummyContextManager, SimpleMathEnv, SlidingWindowContextManager, ToolEnv
from textenv.gym.episode import GymEpisode
from textenv.gym.policy import ScriptedPolicy
from textenv.gym.registry import (
    context_managers,
    envs,
    load_plugins,
    register_context_manager,
    register_env,
    resolve_context_manager,
    resolve_env,
)
from textenv.gym.rows import load_rows, make_request
from textenv.gym.scheduler import EnvTimeoutError, GymScheduler, RunStats
from textenv.gym.training import GymSource, evaluate, ppo_batch
from textenv.gym.trl_environments import TrlEnvironment, TrlEnvironments
from textenv.gym.validation import EnvContractError

__all__ = [
    "ChatRenderer",
    "ChatTemplateError",
    "CompletionsLog",
    "ContextManager",
    "DummyContextManager",
    "Env",
    "EnvContractError",
    "EnvTimeoutError",
    "GymEpisode",
    "GymScheduler",
    "GymSource",
    "Message",
    "Messages",
    "RolloutInferRequest",
    "RolloutOutput",
    "RunStats",
    "ScriptedPolicy",
    "SimpleMathEnv",
    "SlidingWindowContextManager",
    "ToolEnv",
    "TrlEnvironment",
    "TrlEnvironments",
    "context_managers",
    "envs",
    "evaluate",
    "load_plugins",
    "load_rows",
    "make_request",
    "ppo_batch",
    "read_completions",
    "register_context_manager",
    "register_env",
    "resolve_context_manager",
    "resolve_env",
]
