"""Environment kinds: one declared adapter contract (`kind.EnvironmentKind`) and one module per kind.

- `kind`: `EnvironmentKind`, the contract every kind meets; `SimpleKind`, its defaults; `RoutedKinds`, several
  kinds in one run routed by each row's `env_kind` column;
- `choice`: `chosen_kind`, the kind a `GymScheduler` plays from its arguments; `verifiers_kind`, the adapter for a
  loaded verifiers environment (classic or v1);
- `trl`: `TrlEnvironments` / `TrlEnvironment`, TRL 1.x `environment_factory` classes, and the tool-call and reward
  code other kinds share (`run_tool_call`, `reward_funcs_total`); `environment_thread`: `EnvironmentThread`, the
  thread an episode's sync environment code runs on;
- `verifiers`: classic verifiers environments (0.3); `verifiers_v1`: verifiers v1 tasksets (0.4), with
  `verifiers_endpoint` (the OpenAI-compatible endpoint their harness asks) and `verifiers_messages` (messages
  between verifiers and textenv);
- `mcp`: `McpServers`, MCP tool servers as JSON tools, a session (its own server processes over stdio, or its own
  session on a server reached by URL) per episode; `mcp_config`: the `servers=` argument read; `mcp_session`:
  `McpSession`, one episode's connections;
- `openenv`: `OpenEnvEnvironments`, OpenEnv environments served by a local server process, a session per episode;
  `openenv_protocol`: what the server says, read (actions, observations as text, refusals); `openenv_server`: that
  server process.

The registered Gym `Env`s are the kind of `textenv.gym` (`textenv.gym.registry.RegisteredEnvs`); the modules
that were in `textenv.gym` (`textenv.gym.trl_environments`, `verifiers_envs`, `verifiers_v1`, ...) stay importable
there as aliases of these.

May import: textenv (lazy_exports), textenv.asyncio_bridge, textenv.checks, textenv.engine (finish reasons), textenv.episodes (EpisodeFailure), textenv.gym (Env and the Gym records; textenv.gym imports this package: a cycle), textenv.tools (tool-call records)
"""

from textenv import lazy_exports
from textenv.environments.kind import KIND_FIELD, EnvironmentKind, RoutedKinds, SimpleKind

# imported at first use: their modules import textenv.gym, which imports this package
_PUBLIC_NAMES = {"McpServers": "textenv.environments.mcp", "OpenEnvEnvironments": "textenv.environments.openenv"}

__all__ = ["KIND_FIELD", "EnvironmentKind", "McpServers", "OpenEnvEnvironments", "RoutedKinds", "SimpleKind"]

__getattr__ = lazy_exports("textenv.environments", _PUBLIC_NAMES, globals())
