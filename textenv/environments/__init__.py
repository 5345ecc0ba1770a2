"""Environment kinds: one declared adapter contract (`kind.EnvironmentKind`) and one module per kind.

- `kind`: `EnvironmentKind`, the contract every kind meets; `SimpleKind`, its defaults; `RoutedKinds`, several
  kinds in one run routed by each row's `env_kind` column;
- `choice`: `chosen_kind`, the kind a `GymScheduler` plays from its arguments; `verifiers_kind`, the adapter for a
  loaded verifiers environment (classic or v1);
- `mcp`: `McpServers`, MCP tool servers over stdio as JSON tools, a session (its own server processes) per
  episode; `mcp_session`: `McpSession`, one episode's connections;
- `openenv`: `OpenEnvEnvironments`, OpenEnv environments served by a local server process, a session per episode;
  `openenv_server`: that server process.

The Gym `Env`s (`textenv.gym.registry.RegisteredEnvs`), TRL 1.x environment classes
(`textenv.gym.trl_environments.TrlEnvironments`) and verifiers' adapters (`textenv.gym.verifiers_envs`,
`textenv.gym.verifiers_v1`) are kinds of this contract; they live in `textenv.gym` until they move here.

May import: textenv (lazy_exports), textenv.asyncio_bridge, textenv.checks, textenv.gym (the kinds' adapters and their shared tool-call and reward code; textenv.gym imports this package: a cycle)
"""

from textenv import lazy_exports
from textenv.environments.kind import KIND_FIELD, EnvironmentKind, RoutedKinds, SimpleKind

# imported at first use: their modules import textenv.gym, which imports this package
_PUBLIC_NAMES = {"McpServers": "textenv.environments.mcp", "OpenEnvEnvironments": "textenv.environments.openenv"}

__all__ = ["KIND_FIELD", "EnvironmentKind", "McpServers", "OpenEnvEnvironments", "RoutedKinds", "SimpleKind"]

__getattr__ = lazy_exports("textenv.environments", _PUBLIC_NAMES, globals())
