"""OpenEnv environments, run unchanged: ``GymScheduler(model, tokenizer, environments=OpenEnvEnvironments("echo_env"))``.

An OpenEnv environment is a server (a FastAPI app around an `openenv` `Environment`) that clients talk to over a
WebSocket, one session per connection: ``reset`` and ``step(action)`` answer with a step result (observation,
reward, done). `OpenEnvEnvironments` is its environment kind:

- `serving` starts the environment's app as a local process (`textenv.environments.openenv_server`: uvicorn on a
  free port, no Docker), waits until it answers, reads its action schema (``GET /schema``) and, for an MCP
  environment, its tools, and stops the process when the run ends, whatever happened. With ``base_url`` it uses a
  server that is already running (a container, a Space) and starts nothing.
- each episode is one session of openenv's own `GenericEnvClient`, opened in `reset` (``reset(**row)``: the server
  passes the columns its environment's ``reset`` takes) and closed in `close`, which the episode driver calls once
  whatever ended the episode (done, `max_turns`, an error, a cancellation).
- a text environment (an action with one text field, found in its schema) gets each reply's text in that field;
  an MCP environment (`MCPEnvironment`: ``CallToolAction``) offers its tools to the model as JSON tool calls
  (`tool_schemas`), and each call the model writes is one ``call_tool`` step. A reply without a tool call ends an
  MCP episode.
- observations become text: the observation's only text field, else its fields as JSON (``metadata`` goes to the
  episode's info, not to the model), or what ``observation_to_text`` makes of them; a tool result is its text
  content. The opening is the row's ``prompt`` (a string or messages, optional) followed by the reset
  observation's text. Rewards and ``done`` are the server's.

The protocol is openenv's own clients' (`GenericEnvClient` for episodes, `MCPToolClient` to list tools, its
discovery for `env_id`); textenv adds only the local process and the translation to chat. openenv is imported
when a kind is used, not with this module (``pip install 'textenv[openenv]'``). `openenv_protocol` reads what the
server says.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from typing import Any, AsyncIterator, Callable, Dict, Iterator, Mapping, Optional, Tuple

from textenv.asyncio_bridge import run_sync
from textenv.checks import check_positive_int
from textenv.environments.kind import KIND_FIELD, SimpleKind
from textenv.environments.openenv_protocol import (
    ServedActions,
    installed_app,
    observation_text,
    opening_messages,
    read_actions,
    refused_session,
    tool_result_text,
)
from textenv.environments.openenv_server import OpenEnvServer
from textenv.gym.env import Env, Messages, RolloutInferRequest
from textenv.environments.trl import run_tool_call

NOT_RESET_COLUMNS = (KIND_FIELD, "env_config", "ctx_config")  # textenv's own columns, not the environment's


class OpenEnvEnvironments(SimpleKind):
    """An OpenEnv environment as an environment kind (see the module docstring).

    Give one of `env_id`, `app` and `base_url`.

    Args:
        env_id (`str`, *optional*): an installed OpenEnv environment package, by the name openenv's `AutoEnv`
            discovery knows it (``"echo"``, ``"echo_env"``, or a Hub id ``"openenv/echo_env"`` once installed);
            its app ``<module>.server.app:app`` is served.
        app (`str`, *optional*): the environment's FastAPI app, ``module:attribute``, served locally.
        base_url (`str`, *optional*): a server that is already running; nothing is started.
        max_sessions (`int`, defaults to 1): the sessions the server accepts at once (openenv's default is 1). A
            served app gets it as ``MAX_CONCURRENT_ENVS``, which OpenEnv's own apps read; runs with a higher
            `max_concurrency` are refused before any episode.
        action_field (`str`, *optional*): the action field a reply fills; default: the action's only string field.
        observation_to_text (`Callable[[dict], str]`, *optional*): what the model reads of an observation (its fields
            as the server sent them); default: `observation_text`.
        start_timeout (`float`, defaults to 120): seconds a served app may take to answer.
        message_timeout (`float`, defaults to 60): seconds a session waits for each answer of the server.
        name (`str`, *optional*): the name episodes are logged under; default: `env_id`, `app` or `base_url`.

    Raises:
        ImportError: openenv is not installed.
        ValueError: not exactly one of `env_id`, `app` and `base_url`, or a bad `max_sessions`.
        ModuleNotFoundError: `env_id` names no installed OpenEnv environment (the message gives the install command).
    """

    kind = "openenv"

    def __init__(self, env_id: Optional[str] = None, *, app: Optional[str] = None, base_url: Optional[str] = None,
                 max_sessions: int = 1, action_field: Optional[str] = None,
                 observation_to_text: Optional[Callable[[Dict[str, Any]], str]] = None, start_timeout: float = 120.0,
                 message_timeout: float = 60.0, name: Optional[str] = None):
        if importlib.util.find_spec("openenv") is None:
            raise ImportError("OpenEnvEnvironments needs openenv, which is not installed: pip install 'textenv[openenv]'.")
        if sum(source is not None for source in (env_id, app, base_url)) != 1:
            raise ValueError("OpenEnvEnvironments: give one of env_id (an installed OpenEnv package), app ('module:attribute' "
                             "of its FastAPI app) and base_url (a server already running).")
        check_positive_int("max_sessions", max_sessions)
        self.app = installed_app(env_id) if env_id is not None else app
        self.base_url = base_url.rstrip("/") if base_url is not None else None
        self.max_sessions = max_sessions
        self.action_field = action_field
        self.observation_to_text = observation_to_text or observation_text
        self.start_timeout = start_timeout
        self.message_timeout = message_timeout
        self.name = name or env_id or app or base_url
        self.server: Optional[OpenEnvServer] = None
        self.kept_url: Optional[str] = None  # the server `kept_running` keeps
        self.actions: Optional[ServedActions] = None

    def env_name(self, row: Mapping[str, Any]) -> Optional[str]:
        return self.name

    def adapter(self, row: Mapping[str, Any], index: int) -> "OpenEnvEpisode":
        return OpenEnvEpisode(self, row)

    def check(self, max_concurrency: int, num_generations: int) -> None:
        if max_concurrency > self.max_sessions:
            raise ValueError(
                f"max_concurrency={max_concurrency} is above the OpenEnv server's session cap (max_sessions={self.max_sessions}): "
                f"each live episode holds a session. Pass max_concurrency={self.max_sessions}, or "
                f"OpenEnvEnvironments(..., max_sessions={max_concurrency}) for an environment that supports concurrent sessions.")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Start the app's server (unless `base_url`) and read its actions; stop it on exit, whatever happened.

        Raises:
            RuntimeError: the kind is already serving (one run at a time).
            ServerStartError: the server exited or did not answer in time (with its log's last lines).
            ValueError: an action the replies cannot fill (see `text_field`), or an MCP server without tools.
        """
        if self.actions is not None or self.server is not None:
            raise RuntimeError(f"OpenEnvEnvironments({self.name!r}) is already serving a run; build one kind per concurrent run.")
        try:
            url = self.base_url or self.kept_url
            if url is None:
                self.server = OpenEnvServer(self.app, max_sessions=self.max_sessions, start_timeout=self.start_timeout)
                url = self.server.launch()
                await self.server.wait_until_ready()
            self.actions = await read_actions(url, self.action_field)
            yield
        finally:
            self.actions = None
            if self.server is not None:
                self.server.stop()
                self.server = None


    @contextlib.contextmanager
    def kept_running(self) -> Iterator[str]:
        """Keep the app's server running across runs (a training command's steps each run the scheduler once):
        while inside, `serving` reads the actions of this one server instead of starting its own. Yields its URL.

        Raises:
            ServerStartError: the server exited or did not answer in time (with its log's last lines).
        """
        if self.base_url is not None:
            yield self.base_url
            return
        server = OpenEnvServer(self.app, max_sessions=self.max_sessions, start_timeout=self.start_timeout)
        try:
            self.kept_url = server.launch()
            run_sync(server.wait_until_ready())
            yield self.kept_url
        finally:
            self.kept_url = None
            server.stop()


class OpenEnvEpisode(Env):
    """One episode of an OpenEnv environment: one session of openenv's `GenericEnvClient` (see the module docstring).

    Args:
        environments (`OpenEnvEnvironments`): the kind, serving (its server's URL and actions).
        row (`Mapping`): the dataset row; its columns (but textenv's own) are the reset's arguments.

    Attributes:
        tool_schemas (`list[dict]`, *optional*): the MCP environment's tools (after `reset`).
    """

    def __init__(self, environments: OpenEnvEnvironments, row: Mapping[str, Any]):
        super().__init__({"name": environments.name})
        self.environments = environments
        self.row = dict(row)
        self.client = None
        self.actions: Optional[ServedActions] = None

    async def reset(self, config: RolloutInferRequest) -> Tuple[Messages, Dict[str, Any], None]:
        from openenv.core.generic_client import GenericEnvClient

        self.actions = self.environments.actions
        if self.actions is None:
            raise RuntimeError(f"OpenEnvEnvironments({self.environments.name!r}) is not serving: play its episodes through "
                               "GymScheduler(environments=...), or inside `async with environments.serving():`.")
        self.client = GenericEnvClient(base_url=self.actions.url, message_timeout_s=self.environments.message_timeout)
        await self.client.connect()
        arguments = {column: value for column, value in self.row.items() if column not in NOT_RESET_COLUMNS}
        try:
            result = await self.client.reset(**arguments)
        except Exception as error:  # noqa: BLE001 - a refused session is named; anything else goes on as it was
            refusal = refused_session(error, self.environments.max_sessions)
            if refusal is None:
                raise
            raise refusal from error
        self.tool_schemas = copy.deepcopy(self.actions.tool_schemas)
        opening = opening_messages(self.row.get("prompt"), self._text(result.observation))
        return opening, {"environment": self.environments.name, "observation": result.observation}, None

    async def step(self, action: Messages) -> Tuple[Any, float, bool, Dict[str, Any]]:
        if self.actions.tool_schemas is None:
            result = await self.client.step({self.actions.text_field: action[-1].get("content") or ""})
            return self._text(result.observation), _reward(result.reward), bool(result.done), {"observation": result.observation}
        calls = action[-1].get("tool_calls")
        if not calls:
            return None, 0.0, True, {"ended": "a reply without a tool call"}
        messages, records, outcome = [], [], {"reward": 0.0, "done": False}

        async def call_tool(name: str, arguments: Any) -> Tuple[str, Optional[str]]:
            result = await self.client.step({"type": "call_tool", "tool_name": name, "arguments": arguments})
            outcome["reward"] += _reward(result.reward)
            outcome["done"] = bool(result.done)
            return tool_result_text(result.observation)

        for index, call in enumerate(calls):  # each call is one step; a step that ends the episode ends the reply's calls
            record = await run_tool_call(call, index, call_tool)
            records.append(record.as_dict())
            messages.append({"role": "tool", "tool_call_id": record.id, "name": record.name, "content": record.result})
            if outcome["done"]:
                break
        return messages, outcome["reward"], outcome["done"], {"tool_calls": records}

    def _text(self, observation: Dict[str, Any]) -> str:
        text = self.environments.observation_to_text(observation)
        if not isinstance(text, str):
            raise TypeError(f"observation_to_text returned a {type(text).__name__}; it must return the text the model reads.")
        return text

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.close()


def _reward(value: Any) -> float:
    return 0.0 if value is None else float(value)
