"""A key-value store served over MCP (the SDK's FastMCP or MCPServer, see `sdk_server`; stdio): state that must
never leak from one episode to another, and tools that fail, hang or end the server, for tests/test_mcp_servers.py (and tests/test_mcp_http.py, served
over streamable HTTP with ``--http PORT``)."""

import asyncio
import os
import sys

from sdk_server import Context, ToolError, ToolServer, serve

server = ToolServer("kv", log_level="WARNING")
store: dict = {}


@server.tool()
def put(key: str, value: str) -> str:
    """Store a value under a key."""
    store[key] = value
    return f"stored {key}"


@server.tool()
def get(key: str) -> str:
    """The value stored under a key."""
    if key not in store:
        raise ToolError(f"no value stored under {key!r}")  # its text reaches the client (any other exception's may not)
    return store[key]


@server.tool()
def keys() -> str:
    """Every key stored, comma-separated, or (empty)."""
    return ",".join(sorted(store)) or "(empty)"


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def session(ctx: Context) -> str:
    """An id of the MCP session this call came on (each client connection opens its own)."""
    return str(id(ctx.session))


@server.tool()
async def slow(seconds: float) -> str:
    """Answer after some seconds (the server keeps reading its input meanwhile)."""
    await asyncio.sleep(seconds)
    return "finally"


@server.tool()
def crash() -> str:
    """End the server at once, as a crash would."""
    print("kv server: crashing on request", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    serve(server)
