"""An MCP tool server, written with the MCP SDK as its documentation shows (FastMCP over stdio, which mcp 2.x
renamed MCPServer; nothing in it knows textenv): notes kept in a JSON file, the state a tool server keeps between
calls. ``--notes PATH`` names the file; textenv replaces ``{episode_dir}`` in a server's command line with each
episode's own folder, so every episode starts with no notes. From the repository's folder
(docs/guides/environments.md):

    textenv rollout --model bundled --dataset examples/data/notes.jsonl --mcp_server "python examples/mcp_servers/notes_server.py --notes {episode_dir}/notes.json" --reward_funcs examples/mcp_servers/rewards.py:saved_the_note --max_turns 3 --output completions.jsonl

``python`` is the environment's interpreter (with ``.venv`` activated); the episodes' reward is
`rewards.saved_the_note`.
"""

import argparse
import importlib.util
import json
from pathlib import Path

if importlib.util.find_spec("mcp.server.mcpserver") is not None:  # mcp 2.x: FastMCP renamed MCPServer
    from mcp.server.mcpserver import MCPServer as FastMCP
    from mcp.server.mcpserver.exceptions import ToolError
else:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP
    from mcp.server.fastmcp.exceptions import ToolError


def notes_server(notes_file: Path) -> FastMCP:
    """The server, its notes kept in `notes_file`."""
    server = FastMCP("notes", log_level="WARNING")

    def load_notes() -> dict:
        return json.loads(notes_file.read_text()) if notes_file.exists() else {}

    @server.tool()
    def save_note(title: str, text: str) -> str:
        """Save a note: its title and its text (a note saved under the same title before is replaced)."""
        notes = load_notes()
        notes[title] = text
        notes_file.write_text(json.dumps(notes))
        return f"saved the note {title!r}"

    @server.tool()
    def read_note(title: str) -> str:
        """The text of the note saved under a title."""
        notes = load_notes()
        if title not in notes:
            # a ToolError's text reaches the model (mcp 2.x withholds any other exception's)
            raise ToolError(f"no note is titled {title!r}; the titles are: {', '.join(sorted(notes)) or 'none'}")
        return notes[title]

    @server.tool()
    def list_titles() -> str:
        """The titles of the notes saved, one a line (empty when there is none)."""
        return "\n".join(sorted(load_notes()))

    return server


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An MCP server over stdio that keeps notes in a JSON file.")
    parser.add_argument("--notes", default="notes.json", help="the JSON file the notes are kept in")
    notes_server(Path(parser.parse_args().notes)).run()
