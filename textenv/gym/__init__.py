"""The Gym front end: the ms-swift (>= 3.8) Gym interface and `GymScheduler`, which plays every environment kind
(`textenv.environments`: TRL 1.x, verifiers, OpenEnv, MCP) by the one episode driver on the engine entry.

- `env`: the contracts `Env` and `ContextManager`, and `RolloutInferRequest`, `RolloutOutput`, `Message(s)`;
- `registry`: `envs` / `context_managers` (name -> class), `register_env`, `register_context_manager`,
  `load_plugins`, `resolve_env`, `resolve_context_manager`;
- `builtin`: `SimpleMathEnv` (`math_env`), `ToolEnv` (`tool_env`), `DummyContextManager`,
  `SlidingWindowContextManager`;
- `scheduler`: `GymScheduler`: dataset rows -> episodes on the driver -> `GymEpisode`s (each also a
  `completions.jsonl` line); `RunStats`;
- `play`: `GymPlay`, one row's episode as the driver plays it (env, context manager, `textenv.chat.Transcript`);
- `episode`: `GymEpisode`, a finished episode with its `TextHistory`;
- `trl_environments`, `environment_thread`, `verifiers_envs`, `verifiers_v1`, `verifiers_endpoint`,
  `verifiers_messages`: aliases of the modules that moved to `textenv.environments` (`trl`, `verifiers`, ...),
  where every environment kind has its module; `TrlEnvironments` / `TrlEnvironment` are still re-exported here;
- `rows`: `load_rows`, `make_request`; `completions`: `CompletionsLog`, `read_completions`;
- `training`: `ppo_batch`, `GymSource` (the training loop's episode source), `evaluate`;
- `batching`: `BatchedGenerator`, the driver's generator around a batch function; `policy`: `ScriptedPolicy`;
- `validation`: `EnvContractError` and the checks on what envs and context managers return;
- `command`: `textenv rollout`.

The registered Gym envs (`RegisteredEnvs`) are one kind of the adapter contract of `textenv.environments.kind`;
`GymScheduler(environments=...)` plays any kind of that contract (TRL, verifiers, OpenEnv, MCP, or your own).

May import: textenv.asyncio_bridge, textenv.chat, textenv.checks, textenv.engine, textenv.environment (TextHistory, the tag syntax), textenv.environments (the adapter contract every kind here meets; a cycle), textenv.episodes, textenv.jsonl, textenv.logs, textenv.options (textenv rollout's options; a cycle), textenv.parsing (textenv rollout's parser and settings errors), textenv.tools, textenv.training (GymSource's batch and evaluation, the policy loader; a cycle), textenv.view (SOLVED_REWARD; a cycle)
"""

from textenv.chat.renderer import ChatRenderer, ChatTemplateError
from textenv.gym.completions import CompletionsLog, read_completions
from textenv.gym.env import ContextManager, Env, Message, Messages, RolloutInferRequest, RolloutOutput
from textenv.gym.builtin import DummyContextManager, SimpleMathEnv, SlidingWindowContextManager, ToolEnv
from textenv.gym.episode import GymEpisode
from textenv.gym.policy import ScriptedPolicy
from textenv.gym.registry import (
    RegisteredEnvs,
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
from textenv.environments.trl import TrlEnvironment, TrlEnvironments  # noqa: E402 - after textenv.gym's own modules (a cycle)
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
    "RegisteredEnvs",
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
