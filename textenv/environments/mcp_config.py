"""Reading the servers of `McpServers` (``servers=``): a command line, a URL, an MCP client config file or its
contents, into `ServerSpec`s, with a one-line error naming the field and the fix for anything else."""

from __future__ import annotations

import json
import os
import re
import shlex
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Union

from textenv.environments.mcp_session import ServerSpec

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # what a tool name may hold, so `<server>_<tool>` is one too
SPEC_KEYS = ("command", "args", "env", "cwd", "type")
URL_KEYS = ("url", "headers", "type")
HTTP_TYPES = ("http", "streamable-http", "streamableHttp")  # what MCP clients' configs call streamable HTTP
LAUNCHERS = ("uvx", "npx", "pipx")  # programs that start the package named after them (its name names the server)

ServersConfig = Union[str, Mapping[str, Any]]


def parse_servers(servers: ServersConfig) -> List[ServerSpec]:
    """The servers of `McpServers`' `servers` argument (see there).

    Raises:
        ValueError: an empty command or config, a server without a command, a bad field, or (with several servers)
            a name that is not letters, digits, ``_`` and ``-``.
    """
    if isinstance(servers, str):
        if servers.strip().endswith(".json") and os.path.isfile(servers.strip()):
            return parse_servers(json.loads(Path(servers.strip()).read_text(encoding="utf-8")))
        return [url_spec(None, {"url": servers.strip()}) if is_url(servers) else command_spec(None, servers)]
    if not isinstance(servers, Mapping):
        raise ValueError(f"servers: a {type(servers).__name__}; give a command line, a config file path, or a dict {{name: {{'command': ..., 'args': [...]}}}}.")
    entries = servers.get("mcpServers", servers)
    if not isinstance(entries, Mapping) or not entries:
        raise ValueError("servers: the config names no server; give {'mcpServers': {name: {'command': ..., 'args': [...]}}}.")
    specs = [entry_spec(str(name), entry) for name, entry in entries.items()]
    for spec in specs:
        if len(specs) > 1 and not SERVER_NAME.match(spec.name):
            raise ValueError(f"servers: the server name {spec.name!r} becomes part of its tools' names; use letters, digits, '_' and '-'.")
    return specs


def command_spec(name: Optional[str], command: str) -> ServerSpec:
    """A server from a command line; unnamed, it is named after its program (or its script, or its ``-m`` module)."""
    words = shlex.split(command)
    if not words:
        raise ValueError(f"servers: the command line for {name or 'the server'} is empty; give the program and its arguments, e.g. 'python server.py'.")
    return ServerSpec(name or program_name(words), words[0], tuple(words[1:]))


def entry_spec(name: str, entry: Any) -> ServerSpec:
    """A server from one entry of an MCP client config: a command line or URL, ``{"command", "args", "env", "cwd"}``,
    or ``{"url", "headers"}``."""
    if isinstance(entry, str):
        return url_spec(name, {"url": entry.strip()}) if is_url(entry) else command_spec(name, entry)
    where = f"servers[{name!r}]"
    if isinstance(entry, Mapping) and entry.get("type") == "sse":
        raise ValueError(f"{where}: the SSE transport (deprecated by the MCP specification) is not played; serve the server over streamable HTTP or stdio.")
    if isinstance(entry, Mapping) and "url" in entry:
        return url_spec(name, entry)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("command"), str) or not entry["command"].strip():
        raise ValueError(f"{where}: give {{'command': 'program', 'args': [...]}} (a stdio server), {{'url': 'http://host:port/mcp'}} "
                         "(streamable HTTP) or a command line string.")
    unknown = sorted(set(entry) - set(SPEC_KEYS))
    if unknown or entry.get("type", "stdio") != "stdio":
        raise ValueError(f"{where}: a stdio server is described by {list(SPEC_KEYS[:4])}; remove {unknown or ['type']}.")
    args, env, cwd = entry.get("args", []), entry.get("env", {}), entry.get("cwd")
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ValueError(f"{where}: 'args' must be a list of strings, got {args!r:.80}.")
    if not isinstance(env, Mapping) or not all(isinstance(value, str) for value in env.values()):
        raise ValueError(f"{where}: 'env' must map names to strings, got {env!r:.80}.")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"{where}: 'cwd' must be a folder path, got {cwd!r:.80}.")
    return ServerSpec(name, entry["command"], tuple(args), dict(env), cwd)


def is_url(text: str) -> bool:
    return text.strip().startswith(("http://", "https://"))


def url_spec(name: Optional[str], entry: Mapping[str, Any]) -> ServerSpec:
    """A server reached over streamable HTTP, from ``{"url", "headers", "type"}``; unnamed, it is named after its host."""
    where = f"servers[{name!r}]" if name else "servers"
    url, headers = entry["url"], entry.get("headers", {})
    unknown = sorted(set(entry) - set(URL_KEYS))
    if unknown or entry.get("type", "http") not in HTTP_TYPES:
        raise ValueError(f"{where}: a server reached by URL is described by {list(URL_KEYS[:2])} (type one of {list(HTTP_TYPES)}); remove {unknown or ['type']}.")
    host = urllib.parse.urlsplit(url).hostname if isinstance(url, str) and is_url(url) else None
    if not host:
        raise ValueError(f"{where}: 'url' must be an http:// or https:// address such as 'http://127.0.0.1:8000/mcp', got {url!r:.80}.")
    if not isinstance(headers, Mapping) or not all(isinstance(value, str) for value in headers.values()):
        raise ValueError(f"{where}: 'headers' must map names to strings, got {headers!r:.80}.")
    return ServerSpec(name or re.sub(r"[^A-Za-z0-9_-]", "-", host), url=url, headers=dict(headers))


def warn_shared_url_servers(specs: Sequence[ServerSpec], scope: str) -> None:
    """Warn that a server reached by URL keeps one state for every episode (textenv cannot start a fresh one)."""
    shared = [f"{spec.name!r} ({spec.url})" for spec in specs if spec.url]
    if shared and scope == "episode":
        warnings.warn(f"the MCP server(s) {', '.join(shared)} run outside textenv: each episode opens its own MCP session, but whatever "
                      "a server keeps outside its sessions is shared by every episode; start the server from its command instead "
                      "for a fresh one per episode.", stacklevel=3)


def program_name(words: Sequence[str]) -> str:
    """The name of a server started by `words`: ``python server.py`` -> ``server``, ``python -m pkg.mod`` -> ``mod``,
    ``uvx mcp-server-time`` or ``npx -y pkg`` -> the package, else the program (``mcp-server-sqlite``)."""
    program, rest = Path(words[0]).name, list(words[1:])
    if program.startswith("python") and "-m" in rest[:-1]:
        return rest[rest.index("-m") + 1].rsplit(".", 1)[-1]
    launched = next((word for word in rest if not word.startswith("-")), None)
    if launched and (program.startswith("python") and "-c" not in rest or program in LAUNCHERS):
        return Path(launched).stem if program.startswith("python") else launched
    return program
