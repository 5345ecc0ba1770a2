"""An MCP server whose one tool has the input schema named on the command line: `typo` (a property typed "strng"),
`array` (not an object), `text` (not a schema at all), for tests/test_mcp_servers.py. It speaks the protocol's
JSON-RPC over stdio by hand, as a server in any language may: the SDK's servers (whose low-level API mcp 2.x
changed) are not the point, and a conforming SDK may refuse to send such a schema at all."""

import json
import sys

SCHEMAS = {
    "typo": {"type": "object", "properties": {"term": {"type": "strng"}}},
    "array": {"type": "array", "items": {"type": "string"}},
    "text": "a term",
}
TOOL = {"name": "lookup", "description": "Look a term up.", "inputSchema": SCHEMAS[sys.argv[1]]}


def result(request: dict) -> dict:
    if request["method"] == "initialize":  # the client's protocol version is accepted as it is
        info = {"name": "bad-schema", "version": "1.0"}
        return {"protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}}, "serverInfo": info}
    if request["method"] == "tools/list":
        return {"tools": [TOOL]}
    return {}


for line in sys.stdin:
    request = json.loads(line)
    if "id" in request:  # a request (notifications, such as notifications/initialized, need no answer)
        print(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result(request)}), flush=True)
