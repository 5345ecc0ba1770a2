"""OpenEnv environments for tests/test_openenv.py, written with openenv's own server classes as an environment's
author writes them (`openenv init`'s layout: models, an `Environment`, a FastAPI app), each served by textenv in a
process of its own:

- `guess`: guess a number (1-10) in plain text; the reward is 1 when it is found;
- `tool_guess`: the same game as an MCP environment (`MCPEnvironment` with a FastMCP `guess` tool);
- `broken_app`: an app module that fails while it loads (a server that does not start).

Each app adds one test-only route, ``GET /test/sessions``: how many sessions its `HTTPEnvServer` holds.
"""
