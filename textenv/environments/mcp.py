"""MCP tool servers as an environment kind: `McpServers` ("train on any MCP server").

Each episode gets its own session: its own server processes over stdio, started in `reset` in a fresh temporary
folder of their own, so a tool with state (a database, a key-value store, files) starts fresh in every episode and
nothing leaks between episodes, also between concurrent ones. (verifiers' MCP environment shares one read-only
server across rollouts; ``scope="run"`` does the same here, one session for the whole run, for servers without
state.) A server that keeps its state in files must be pointed at the episode's folder: ``{episode_dir}`` in its
command, arguments, environment or working folder is replaced by it (also in ``$TEXTENV_EPISODE_DIR``).

A server already running elsewhere is reached by its URL over streamable HTTP (``http://host:port/mcp``, or
``{"url": ..., "headers": {...}}`` in a config). textenv does not start it, so it cannot give each episode a fresh
one: each episode opens its own MCP session to it, and whatever the server keeps outside its sessions is shared by
every episode (a warning says so once).

- The rows are TRL rows: `prompt` (chat messages, or a string) opens the episode; the other columns go to the
  reward functions.
- The servers' tools (listed from each episode's session) are offered as JSON tools through the chat template,
  named ``<server>_<tool>`` when there are several servers; each reply's calls run through the session's
  `call_tool`, and their text content comes back as tool messages. A tool error (the server's ``isError`` result,
  or its JSON-RPC error answer) answers the model with the error's text; an unknown tool or an unreadable call
  answers as TRL does (``{'error': ...}``). A reply without a call ends the episode.
- A server that exits during the episode ends that episode only, with the reason and its stderr's last lines.
- The episode's reward comes from TRL reward functions ``f(prompts, completions, **kwargs) -> list[float]``, called
  as TRL calls them (`textenv.environments.trl.reward_funcs_total`); ``environments=[episode]`` is this
  episode's `McpEpisode`, whose `call_tool` lets an async reward function read the server's final state.
- `close` ends the session and the processes (stdin closed, then SIGTERM, then SIGKILL: the SDK's shutdown).

The transport and the session are the `mcp` SDK's (`textenv.environments.mcp_session`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import resource
from typing import Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from textenv.asyncio_bridge import run_sync
from textenv.environments.kind import SimpleKind
from textenv.environments.mcp_config import ServersConfig, parse_servers, warn_shared_url_servers
from textenv.environments.mcp_session import McpServerError, McpSession
from textenv.gym.env import Env, Messages, RolloutInferRequest
from textenv.environments.environment_thread import EnvironmentThread
from textenv.environments.trl import as_functions, call_environment_code, opening_messages, reward_funcs_total, run_tool_calls

SCOPES = ("episode", "run")
DEFAULT_START_TIMEOUT = 60.0  # seconds a server may take to start (a Python server imports for about a second)
FILES_PER_SERVER = 3  # measured: the server's stdin and stdout pipes and its stderr file, in this process
FILES_KEPT_FREE = 256  # for the rest of the run (model files, the engine, logs)


class McpServers(SimpleKind):
    """MCP servers as the environment kind ``"mcp"`` (see the module docstring); give it to
    ``GymScheduler(environments=...)``.

    The servers are started once here to check them (they start, answer the handshake, and describe every tool
    with a valid JSON schema object), then stopped; each episode starts its own (measured on 2 cores: a Python
    server starts in about 0.9 s and holds about 57 MB, so `max_concurrency` bounds the memory too). With
    ``scope="run"``, a server that exits ends every episode that calls it afterwards.

    Args:
        servers (`str` or `dict`): one server's command line (``"python server.py --flag"``, split as a shell
            would) or URL (``"http://host:port/mcp"``, streamable HTTP), the path of an MCP client config file
            (``.json``), or its contents: ``{"mcpServers": {name: {"command", "args", "env", "cwd"} or {"url",
            "headers"}}}`` (the ``"mcpServers"`` level may be left out; a server may also be a command line or a
            URL string).
        reward_funcs (`Callable` or `list[Callable]`): TRL reward functions; their sum is each episode's reward.
        scope (`str`, defaults to `"episode"`): `"episode"`: a session (and processes) per episode; `"run"`: one
            session for the whole run, shared by every episode (state is then shared too).
        start_timeout (`float`, defaults to 60): seconds a server may take to start and answer the handshake.

    Attributes:
        specs (`list[ServerSpec]`): the servers.
        name (`str`): the name episodes are logged under (the servers' names joined by ``+``).
        tool_schemas (`list[dict]`): the tools as offered to the model (from the check).

    Raises:
        ValueError: bad `servers`, `scope` or `start_timeout`, no reward function, or a tool whose input schema is
            not a valid JSON schema object (naming the server and the tool; one the mcp SDK itself refuses, which
            2.x does more often than 1.x, is named by its position: `mcp_session.InvalidToolListing`).
        TypeError: a reward function that is not callable.
        McpServerError: a server that does not start or answer (its command and its stderr's last lines).
    """

    kind = "mcp"

    def __init__(self, servers: ServersConfig, reward_funcs: Union[Callable, Sequence[Callable]], *, scope: str = "episode",
                 start_timeout: float = DEFAULT_START_TIMEOUT):
        self.specs = parse_servers(servers)
        self.reward_funcs = as_functions(reward_funcs, "reward_funcs")
        if not self.reward_funcs:
            raise ValueError("reward_funcs: MCP servers give no reward; pass reward_funcs=[f, ...] (f(prompts, completions, **kwargs) -> list[float]).")
        if scope not in SCOPES:
            raise ValueError(f"scope={scope!r}: use 'episode' (a session per episode, state never shared) or 'run' (one session shared by the run).")
        if not start_timeout or start_timeout <= 0:
            raise ValueError(f"start_timeout={start_timeout!r}: give the seconds a server may take to start, a positive number.")
        self.scope = scope
        self.start_timeout = float(start_timeout)
        self.name = "+".join(spec.name for spec in self.specs)
        warn_shared_url_servers(self.specs, scope)
        self.shared_session: Optional[McpSession] = None
        self.tool_schemas = run_sync(self._probe())

    def env_name(self, row: Mapping[str, Any]) -> str:
        return self.name

    def adapter(self, row: Mapping[str, Any], index: int) -> "McpEpisode":
        return McpEpisode(self, row)

    def new_session(self) -> McpSession:
        """A session to every server, not started."""
        return McpSession(self.specs, self.start_timeout)

    def offered_tools(self, session: McpSession) -> Tuple[Dict[str, Tuple[str, str]], List[dict]]:
        """`offered_tools` of a started session, prefixed with the server names when there are several."""
        return offered_tools(session.tools, prefixed=len(self.specs) > 1)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """With ``scope="run"``, the run's one session; nothing otherwise."""
        if self.scope != "run":
            yield
            return
        session = self.new_session()
        try:
            await session.start()
            self.shared_session = session
            yield
        finally:
            self.shared_session = None
            await session.close()

    def check(self, max_concurrency: int, num_generations: int) -> None:
        """Refuse a run whose concurrent sessions would need more open files than this process may hold.

        Raises:
            ValueError: `max_concurrency` too high for ``ulimit -n``, with the highest that fits.
        """
        sessions = 1 if self.scope == "run" else max_concurrency
        per_session = len(self.specs) * FILES_PER_SERVER
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit != resource.RLIM_INFINITY and sessions * per_session + FILES_KEPT_FREE > limit:
            fits = max(1, (limit - FILES_KEPT_FREE) // per_session)
            raise ValueError(
                f"max_concurrency={max_concurrency}: each episode holds {per_session} open files for its {len(self.specs)} MCP server(s), "
                f"more than this process's limit of {limit} (ulimit -n) allows at once; pass max_concurrency <= {fits}, raise the "
                "limit (ulimit -n), or share one session with scope='run' for servers without state."
            )

    async def _probe(self) -> List[dict]:
        session = self.new_session()
        try:
            await session.start()
            return self.offered_tools(session)[1]
        finally:
            await session.close()


class McpEpisode(Env):
    """One episode's session to the MCP servers, as a Gym `Env` (see the module docstring).

    Args:
        servers (`McpServers`): the kind (servers, reward functions, scope).
        row (`Mapping`): the dataset row.

    Attributes:
        session (`McpSession`, *optional*): the episode's session (after `reset`).
        routes (`dict[str, tuple[str, str]]`): each offered tool name -> `(server, tool)`.
        opening (`list[dict]`): the opening messages; the rest of the conversation is the completion.
        reward_info (`dict`): what the reward functions logged (`log_extra`, `log_metric`).
    """

    def __init__(self, servers: McpServers, row: Mapping[str, Any]):
        super().__init__({"name": servers.name})
        self.servers = servers
        self.row = dict(row)
        self.session: Optional[McpSession] = None
        self.routes: Dict[str, Tuple[str, str]] = {}
        self.opening: Messages = []
        self.reward_info: Dict[str, Any] = {}
        self._own_session = servers.scope == "episode"
        self._thread = EnvironmentThread()

    async def reset(self, config: RolloutInferRequest) -> Tuple[Messages, Dict[str, Any], None]:
        self.opening = opening_messages(self.row.get("prompt"), None, "McpServers")
        if self._own_session:
            self.session = self.servers.new_session()
            await self.session.start()
        elif self.servers.shared_session is None:
            raise RuntimeError("McpServers(scope='run'): the run's session is not open; play the episodes with GymScheduler(environments=...), which opens it.")
        else:
            self.session = self.servers.shared_session
        self.routes, schemas = self.servers.offered_tools(self.session)
        self.tool_schemas = schemas or None
        return copy.deepcopy(self.opening), {"mcp_servers": self.servers.name, "scope": self.servers.scope, "tools": list(self.routes)}, None

    async def step(self, action: Messages) -> Tuple[Optional[Messages], float, bool, Dict[str, Any]]:
        calls = action[-1].get("tool_calls")
        if not calls:
            return None, 0.0, True, {}
        messages, records = await run_tool_calls(calls, self._invoke, passes=(McpServerError,))
        return messages, 0.0, False, {"tool_calls": records}

    async def final_reward(self, messages: Messages, completion_ids: Optional[List[int]] = None, step: int = 0) -> float:
        """The sum of the reward functions, called as TRL calls them, with ``environments=[self]``."""
        prompt, completion = messages[: len(self.opening)], messages[len(self.opening) :]
        return await reward_funcs_total(self.servers.reward_funcs, self._call, prompt=prompt, completion=completion, completion_ids=completion_ids,
                                        row=self.row, step=step, reward_info=self.reward_info, environment=self)

    async def call_tool(self, name: str, arguments: Optional[Dict[str, Any]] = None) -> str:
        """Call one of the episode's tools by the name the model sees, e.g. from an async reward function reading the
        server's final state (``await environments[0].call_tool("get", {"key": "a"})``).

        Raises:
            ValueError: an unknown tool.
            RuntimeError: the tool answered with an error.
            McpServerError: the server exited.
        """
        text, error = await self._invoke(name, arguments or {})
        if error is not None:
            raise RuntimeError(f"the MCP tool {name!r} answered with an error: {error}")
        return text

    async def close(self) -> None:
        self._thread.stop()
        if self._own_session and self.session is not None:
            await self.session.close()

    async def _invoke(self, name: str, arguments: Any) -> Tuple[str, Optional[str]]:
        if name not in self.routes:
            raise ValueError(f"Tool {name} not found.")
        if not isinstance(arguments, dict):
            raise TypeError(f"the arguments of {name} must be a JSON object, not {type(arguments).__name__} {arguments!r:.60}.")
        server, tool = self.routes[name]
        text, is_error = await self.session.call_tool(server, tool, arguments)
        return text, (text if is_error else None)

    async def _call(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        return await call_environment_code(self._thread, function, *args, **kwargs)


def offered_tools(tools: Mapping[str, List[dict]], prefixed: bool) -> Tuple[Dict[str, Tuple[str, str]], List[dict]]:
    """The servers' tools as the chat template takes them.

    Args:
        tools (`dict[str, list[dict]]`): each server's tools as the protocol writes them.
        prefixed (`bool`): name each tool ``<server>_<tool>``.

    Returns:
        `(routes, schemas)`: each offered name -> `(server, tool)`, and the JSON schemas
        (``{"type": "function", "function": {"name", "description", "parameters"}}``).

    Raises:
        ValueError: a tool whose input schema is not a valid JSON schema object, or two tools offered under one name.
    """
    routes: Dict[str, Tuple[str, str]] = {}
    schemas = []
    for server, server_tools in tools.items():
        for tool in server_tools:
            check_input_schema(server, tool)
            name = f"{server}_{tool['name']}" if prefixed else tool["name"]
            if name in routes:
                raise ValueError(f"the MCP servers offer two tools named {name!r} ({routes[name][0]!r} and {server!r}); rename a server or a tool.")
            routes[name] = (server, tool["name"])
            function = {"name": name, "description": tool.get("description") or "", "parameters": tool["inputSchema"]}
            schemas.append({"type": "function", "function": function})
    return routes, schemas


def check_input_schema(server: str, tool: Mapping[str, Any]) -> None:
    """Refuse a tool whose `inputSchema` is not a JSON schema object (``{"type": "object", ...}``, valid under its
    own meta-schema).

    Raises:
        ValueError: naming the server, the tool and the problem.
    """
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import validator_for

    schema = tool.get("inputSchema")
    where = f"the tool {tool.get('name')!r} of the MCP server {server!r}"
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ValueError(f"{where}: its inputSchema {json.dumps(schema)[:120]} is not a JSON schema object ({{\"type\": \"object\", ...}}); fix the tool's definition in the server.")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as error:
        at = "/".join(str(part) for part in error.path) or "the top"
        raise ValueError(f"{where}: its inputSchema is not a valid JSON schema (at {at}: {error.message}); fix the tool's definition in the server.") from None
