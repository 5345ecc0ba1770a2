"""The MCP SDK's high-level server for the fixture servers, chosen once: mcp 1.x's `FastMCP`, which mcp 2.x renamed
`MCPServer` (``mcp.server.mcpserver``; importing ``mcp.server.fastmcp`` raises there). What the fixtures use is the
same in both: the constructor's name and ``log_level``, the ``tool()`` decorator, a tool's `Context` (its
``session``), ``run()`` (stdio),
``streamable_http_app()`` (served by `serve`), and `ToolError`, whose text the client reads (mcp 2.x withholds the
text of any other exception a tool raises)."""

import importlib.util
import sys

if importlib.util.find_spec("mcp.server.mcpserver") is not None:  # mcp 2.x
    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver import MCPServer as ToolServer
    from mcp.server.mcpserver.exceptions import ToolError
else:  # mcp 1.x
    from mcp.server.fastmcp import Context
    from mcp.server.fastmcp import FastMCP as ToolServer
    from mcp.server.fastmcp.exceptions import ToolError

__all__ = ["Context", "ToolError", "ToolServer", "serve"]


def serve(server) -> None:
    """Serve over stdio, or with ``--http PORT [--token T]`` over streamable HTTP at ``http://127.0.0.1:PORT/mcp``,
    answering 401 to a request without the header ``Authorization: Bearer T``."""
    if "--http" not in sys.argv:
        server.run()
        return
    import uvicorn

    port = int(sys.argv[sys.argv.index("--http") + 1])
    token = sys.argv[sys.argv.index("--token") + 1] if "--token" in sys.argv else None
    app = server.streamable_http_app()
    uvicorn.run(_requiring(token, app) if token else app, host="127.0.0.1", port=port, log_level="warning")


def _requiring(token, app):
    """`app` behind a bearer token check (the lifespan passes through: it runs the SDK's session manager)."""
    expected = f"Bearer {token}".encode()

    async def checked(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
            return
        await app(scope, receive, send)

    return checked
