"""The MCP SDK's high-level server for the fixture servers, chosen once: mcp 1.x's `FastMCP`, which mcp 2.x renamed
`MCPServer` (``mcp.server.mcpserver``; importing ``mcp.server.fastmcp`` raises there). What the fixtures use is the
same in both: the constructor's name and ``log_level``, the ``tool()`` decorator, ``run()`` (stdio), and `ToolError`,
whose text the client reads (mcp 2.x withholds the text of any other exception a tool raises)."""

import importlib.util

if importlib.util.find_spec("mcp.server.mcpserver") is not None:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as ToolServer
    from mcp.server.mcpserver.exceptions import ToolError
else:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as ToolServer
    from mcp.server.fastmcp.exceptions import ToolError

__all__ = ["ToolError", "ToolServer"]
