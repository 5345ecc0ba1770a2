"""MCP client sessions: `McpSession`, one connection to each of a set of servers, each connection
(`ServerConnection`: the server's process over stdio, or its URL over streamable HTTP, and the SDK's client
session) owned by a task of its own.

The `mcp` SDK's `stdio_client` and `ClientSession` are anyio task groups: they must be entered and exited in the
same task. The episode driver runs an env's `reset`, `step` and `close` as separate tasks (each under the
scheduler's timeout), so each connection is entered and exited by its owner task, which holds it open until
`close`; tool calls are requests on the open session, which any task may make. The servers of a session start at
once (a Python server takes about a second).

Written against what mcp 1.x and 2.x share (the tests run on 1.30 and on 2.3): `stdio_client`,
`StdioServerParameters`, `streamable_http_client(url, http_client=create_mcp_http_client(headers=...))` (whose
streams are the first two items it yields: 1.x adds a third; the factory's module is private in both, and makes the
client of the HTTP library each uses: httpx, httpx2), `ClientSession.initialize / list_tools(params=...) /
call_tool(name, arguments)`, and the protocol's camelCase field names through ``model_dump(by_alias=True)`` (2.x
renamed the Python attributes: ``input_schema``, ``is_error``). Where they differ, it is handled explicitly: the
SDK's error answer (1.x ``McpError``, 2.x ``MCPError``) is read through what both carry, its ``error``
(``ErrorData``: ``code``, ``message``); and 2.x checks every result against the protocol's schema before returning
it, so it refuses a list of tools that 1.x hands over (a tool whose ``inputSchema`` is not ``{"type": "object",
...}``): `list_tools` names that refusal, on both versions, as `InvalidToolListing`. Only the standard library,
anyio, pydantic and mcp are imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Awaitable, Dict, List, Mapping, Optional, Sequence, Tuple

import anyio
import pydantic
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CONNECTION_CLOSED, PaginatedRequestParams

EPISODE_DIR = "{episode_dir}"  # replaced, in a server's command, args, env and cwd, by the session's own folder
EPISODE_DIR_VARIABLE = "TEXTENV_EPISODE_DIR"  # the same folder, in every server's environment
STDERR_LINES = 8  # the last lines of a server's stderr an error quotes
CLOSED_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)  # + ConnectionLost, below


class McpServerError(RuntimeError):
    """A server that did not start, or exited (its connection closed) during a session."""


class ConnectionLost(ConnectionError):
    """The connection to a server ended while a request waited for its answer."""


class InvalidToolListing(ValueError):
    """A server whose list of tools the SDK refused as not following the MCP protocol (see the module docstring)."""


@dataclass(frozen=True)
class ServerSpec:
    """One MCP server, as MCP clients' config files write it: a program textenv starts and talks to over stdio, or
    (with `url`) a server already running, reached over streamable HTTP.

    Attributes:
        name (`str`): the server's name (tool names are prefixed with it when a session has several servers).
        command (`str`): the program (empty for a `url`).
        args (`tuple[str]`): its arguments.
        env (`dict[str, str]`): variables added to the SDK's default environment (``HOME``, ``PATH``, ...: the
            server does not inherit the caller's whole environment).
        cwd (`str`, *optional*): its working folder (default: the caller's).
        url (`str`, *optional*): the endpoint of a server reached over streamable HTTP (``http://host:port/mcp``).
        headers (`dict[str, str]`): HTTP headers sent to `url` (an ``Authorization`` token).
    """

    name: str
    command: str = ""
    args: Tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    url: Optional[str] = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """The command line, quoted as a shell would need it, or the URL."""
        return self.url or shlex.join([self.command, *self.args])

    def parameters(self, episode_dir: str) -> StdioServerParameters:
        """The SDK's parameters, with `EPISODE_DIR` replaced by `episode_dir` everywhere."""

        def fill(text: str) -> str:
            return text.replace(EPISODE_DIR, episode_dir)

        env = {key: fill(value) for key, value in self.env.items()}
        env[EPISODE_DIR_VARIABLE] = episode_dir
        return StdioServerParameters(command=fill(self.command), args=[fill(arg) for arg in self.args], env=env,
                                     cwd=fill(self.cwd) if self.cwd else None)


class McpSession:
    """A connection to each of `servers` (one process each), started together by `start` and closed by `close`,
    both callable from any task. The servers share a fresh temporary folder (`EPISODE_DIR`), removed at `close`.

    Args:
        servers (`list[ServerSpec]`): the servers.
        start_timeout (`float`): seconds each server may take to start and answer the handshake.

    Attributes:
        tools (`dict[str, list[dict]]`): each server's tools as the protocol writes them (``name``,
            ``description``, ``inputSchema``, ...), after `start`.
        directory (`str`): the session's own folder.
    """

    def __init__(self, servers: Sequence[ServerSpec], start_timeout: float):
        self.connections = {spec.name: ServerConnection(spec, start_timeout) for spec in servers}
        self.directory = ""

    @property
    def tools(self) -> Dict[str, List[dict]]:
        return {name: connection.tools for name, connection in self.connections.items()}

    async def start(self) -> None:
        """Start every server at once and list its tools.

        Raises:
            McpServerError: the first server (in order) that could not be started, exited, or did not answer
                within `start_timeout`, with its command and the last lines of its stderr.
        """
        self.directory = tempfile.mkdtemp(prefix="textenv-mcp-")
        outcomes = await asyncio.gather(*(connection.start(self.directory) for connection in self.connections.values()), return_exceptions=True)
        failure = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
        if failure is not None:
            raise failure

    async def call_tool(self, server: str, tool: str, arguments: Dict[str, Any]) -> Tuple[str, bool]:
        """`ServerConnection.call_tool` on `server`."""
        return await self.connections[server].call_tool(tool, arguments)

    async def close(self) -> None:
        """Close every connection (also after a failed start), then remove the folder.

        Raises:
            Exception: the first error closing a connection raised.
        """
        outcomes = await asyncio.gather(*(connection.close() for connection in self.connections.values()), return_exceptions=True)
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        failure = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
        if failure is not None:
            raise failure


class ServerConnection:
    """One server's process and client session, entered and exited by a task of its own (the owner), which holds
    them open until `close`.

    Args:
        spec (`ServerSpec`): the server.
        start_timeout (`float`): seconds it may take to start and answer the handshake.
    """

    def __init__(self, spec: ServerSpec, start_timeout: float):
        self.spec = spec
        self.start_timeout = start_timeout
        self.tools: List[dict] = []
        self._session: Optional[ClientSession] = None
        self._stderr: Optional[IO[str]] = None
        self._failure: Optional[Exception] = None  # what `_connect` raised (the SDK's task groups may wrap it on the way out)
        self._broken: Optional[Exception] = None  # what ended the connection during the session
        self._owner: Optional[asyncio.Task] = None
        self._ready: Optional[asyncio.Future] = None
        self._stop = asyncio.Event()

    async def start(self, directory: str) -> None:
        """Start the server in `directory` (`EPISODE_DIR`) and list its tools.

        Raises:
            McpServerError: it could not be started, exited, or did not answer within `start_timeout`.
        """
        self._ready = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(directory), name=f"textenv-mcp-{self.spec.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.start_timeout)
        except asyncio.TimeoutError:
            raise self._error(f"did not answer the MCP handshake within {self.start_timeout:g} s") from None

    async def call_tool(self, tool: str, arguments: Dict[str, Any]) -> Tuple[str, bool]:
        """Call the server's `tool`.

        Returns:
            `(text, is_error)`: the result's content as text (`content_text`), and whether the server marked it an
            error (a JSON-RPC error answer counts as one, its message as the text).

        Raises:
            McpServerError: the server exited (its connection closed) before answering.
        """
        try:
            result = await self._answer(self._session.call_tool(tool, arguments))
        except Exception as error:  # noqa: BLE001 - sorted: a closed connection, or the server's own error answer
            if connection_closed(error):
                cause = f" ({first_cause(error)})" if self.spec.url else ""  # a process's exit says it all; a URL's failure may not
                raise self._error(f"{self._lost} during the call to its tool {tool!r}{cause}") from error
            # the SDK's exception for a JSON-RPC error answer, renamed (1.x McpError, 2.x MCPError), carries `error` in both
            if getattr(error, "error", None) is None:  # not an error answer: the SDK or the server broke
                raise
            return f"Error: {error}", True
        answer = result.model_dump(by_alias=True, mode="json")
        return content_text(answer), bool(answer.get("isError"))

    async def _answer(self, request: Awaitable[Any]) -> Any:
        """What `request` returns, or `ConnectionLost` once the connection's owner task has ended (mcp 1.x leaves a
        request to a URL server waiting forever when the connection fails: its transport ends the owner instead)."""
        call = asyncio.ensure_future(request)
        try:
            await asyncio.wait({call, self._owner}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                raise ConnectionLost("the connection closed") from self._broken
            return call.result()
        finally:
            call.cancel()  # unless done: the owner ended first, or this wait was cancelled (a step timeout)

    async def close(self) -> None:
        """End the session and the server (the SDK closes its stdin, then sends SIGTERM, then SIGKILL). Safe after
        a failed start, or none.

        Raises:
            Exception: what exiting the SDK's session or transport raised.
        """
        owner = self._owner
        if owner is None:
            return
        self._stop.set()
        if not self._ready.done():
            owner.cancel()  # still starting (a hung handshake): unwind what was entered
        await asyncio.wait({owner})
        if not owner.cancelled() and owner.exception() is not None:
            raise owner.exception()

    def stderr_tail(self) -> str:
        """``"; its stderr ends: ..."`` with the server's last stderr lines, or ``"; its stderr is empty"``."""
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        lines = [line.rstrip() for line in self._stderr.read().splitlines() if line.strip()]
        return f"; its stderr ends: {' | '.join(lines[-STDERR_LINES:])}" if lines else "; its stderr is empty"

    def _error(self, what: str) -> McpServerError:
        return McpServerError(f"the MCP server {self.spec.name!r} ({self.spec.describe()}) {what}{self.stderr_tail()}")

    async def _own(self, directory: str) -> None:
        """The owner task: enter the transport and the session, wait for `close`, exit them, all in this task."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                await self._connect(stack, directory)
                self._ready.set_result(None)
                await self._stop.wait()
        except Exception as error:  # noqa: BLE001 - a start failure goes to `start`, a teardown failure to `close`
            if not self._ready.done():
                self._ready.set_exception(self._failure or self._start_failure(error))
            elif self._stop.is_set():
                raise
            else:
                # the connection broke during the session (a URL server's transport fails its task group): the call
                # waiting on it, or the next one, reports it (`_answer`), not `close`
                self._broken = error
        finally:
            if not self._ready.done():  # cancelled while starting: nobody waits for the outcome any more
                self._ready.cancel()

    async def _connect(self, stack: contextlib.AsyncExitStack, directory: str) -> None:
        try:
            read, write = await self._transport(stack, directory)
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            self.tools = await list_tools(session, self.spec.name)
        except InvalidToolListing as error:  # the server runs, but its tools are wrong: a ValueError, as textenv's checks
            self._failure = error
            raise
        except Exception as error:  # noqa: BLE001 - named with the server, its command and its stderr
            self._failure = self._start_failure(error)
            raise self._failure from error
        self._session = session

    def _start_failure(self, error: BaseException) -> McpServerError:
        if connection_closed(error):
            return self._error(f"{self._lost} before answering the MCP handshake")
        failed = "could not be reached (is it running? are the URL and its headers right?)" if self.spec.url else "could not be started"
        return self._error(f"{failed}: {first_cause(error)}")

    @property
    def _lost(self) -> str:
        """What losing the connection means: a process that exited, or a URL that no longer answers."""
        return "stopped answering" if self.spec.url else "exited"

    async def _transport(self, stack: contextlib.AsyncExitStack, directory: str) -> Tuple[Any, Any]:
        """The read and write streams to the server: its process's stdio, or its URL."""
        if self.spec.url:
            client = await stack.enter_async_context(create_mcp_http_client(headers=dict(self.spec.headers)))
            streams = await stack.enter_async_context(streamable_http_client(self.spec.url, http_client=client))
            return streams[0], streams[1]
        # append mode: the server's writes land at the end whatever offset `stderr_tail` left (the offset is shared)
        self._stderr = stack.enter_context(tempfile.TemporaryFile("a+", encoding="utf-8", errors="replace"))
        return await stack.enter_async_context(stdio_client(self.spec.parameters(directory), errlog=self._stderr))


async def list_tools(session: ClientSession, server: str) -> List[dict]:
    """Every tool `session`'s server (named `server`) offers (all pages), as the protocol writes them (camelCase
    fields).

    Raises:
        InvalidToolListing: the SDK refused an answer as not following the protocol, with where and why.
    """
    tools, cursor = [], None
    while True:
        try:
            page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        except pydantic.ValidationError as error:
            # mcp 2.x validates the answer against the protocol's schema, which 1.x does less strictly (1.x returns a
            # tool whose inputSchema is a JSON array schema, and `check_input_schema` in textenv.environments.mcp
            # refuses it; 2.x refuses the whole answer here, naming the tool by its position only).
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise InvalidToolListing(
                f"the MCP server {server!r} answered tools/list with a list of tools that does not follow the MCP protocol, "
                f"which the mcp SDK refused (at {where}: {first['msg']}, got {first.get('input')!r:.80}); fix the tool's definition in the server."
            ) from None
        answer = page.model_dump(by_alias=True, mode="json", exclude_none=True)
        tools += answer.get("tools", [])
        cursor = answer.get("nextCursor")
        if not cursor:
            return tools


def content_text(answer: Mapping[str, Any]) -> str:
    """A tool result as the text the model reads: its text blocks (and embedded text resources), one per line;
    a block of another kind (an image, audio, a resource link) is named in brackets, since the model reads text
    only; without content, the structured result as JSON."""
    parts = []
    for block in answer.get("content") or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind == "resource" and "text" in (block.get("resource") or {}):
            parts.append(block["resource"]["text"])
        else:
            parts.append(f"[{kind} content: {block.get('mimeType') or block.get('uri') or 'not text'}]")
    if not parts and answer.get("structuredContent") is not None:
        return json.dumps(answer["structuredContent"])
    return "\n".join(parts)


def first_cause(error: BaseException) -> str:
    """``"Type: first line of the message"`` of `error`, or of the first error inside it when it is a task group's
    exception group."""
    if isinstance(error, ConnectionLost) and error.__cause__ is not None:
        error = error.__cause__
    while getattr(error, "exceptions", None):  # an exception group (a builtin from Python 3.11 only)
        error = error.exceptions[0]
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip()


def connection_closed(error: BaseException) -> bool:
    """Whether `error` says the server's connection closed (the SDK's CONNECTION_CLOSED error, a closed stream, or
    `ConnectionLost`)."""
    return isinstance(error, (*CLOSED_ERRORS, ConnectionLost)) or getattr(getattr(error, "error", None), "code", None) == CONNECTION_CLOSED
