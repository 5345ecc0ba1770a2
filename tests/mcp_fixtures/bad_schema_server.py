"""An MCP server (the SDK's low-level `Server`, stdio) whose one tool has the input schema named on the command
line: `typo` (a property typed "strng"), `array` (not an object), for tests/test_mcp_servers.py."""

import asyncio
import sys

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

SCHEMAS = {
    "typo": {"type": "object", "properties": {"term": {"type": "strng"}}},
    "array": {"type": "array", "items": {"type": "string"}},
}
server = Server("bad-schema")


@server.list_tools()
async def list_tools() -> list:
    return [types.Tool(name="lookup", description="Look a term up.", inputSchema=SCHEMAS[sys.argv[1]])]


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    asyncio.run(main())
