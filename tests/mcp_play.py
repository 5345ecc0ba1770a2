"""Playing MCP episodes with scripted replies, for the MCP test modules (stdio servers in test_mcp_servers,
servers reached by URL in test_mcp_http and test_environment_cli): the reply of each turn, the rows, what the tools
answered, and the key-value server served over streamable HTTP (`ServedKv`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from textenv.gym import GymScheduler, ScriptedPolicy
from textenv.vllm.server import free_port

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
KV = Path(__file__).resolve().parent / "mcp_fixtures" / "kv_server.py"
KV_TOOLS = ["put", "get", "keys", "pid", "session", "slow", "crash"]  # its tools


def call(name: str, **arguments) -> str:
    """A reply calling tool `name`, in the bundled template's tool-call format."""
    return CALL.format(name=name, arguments=json.dumps(arguments))


async def stored_keys(prompts, completions, environments, **kwargs):
    """The reward: how many keys the episode's own store holds at the end (read from the server)."""
    keys = await environments[0].call_tool("keys")
    return [0.0 if keys == "(empty)" else float(len(keys.split(",")))]


def scripted(tokenizer, plans):
    """A policy whose k-th reply in an episode is ``plans[word][k]`` (the last one repeated), `word` being the first
    word of the row's user message."""

    def reply(context: str) -> str:
        word = context.split("<|im_start|>user\n", 1)[1].split()[0]
        turn = context.count("<|im_start|>assistant") - 1
        replies = plans[word]
        return replies[min(turn, len(replies) - 1)]

    return ScriptedPolicy(tokenizer, reply)


def scheduler(tokenizer, kind, plans, **kwargs):
    kwargs.setdefault("max_turns", 4)
    return GymScheduler(None, tokenizer, policy=scripted(tokenizer, plans), environments=kind, loss_scale="all", **kwargs)


def row(text: str) -> dict:
    return {"prompt": [{"role": "user", "content": text}]}


def tool_results(episode) -> list[str]:
    return [message["content"] for message in episode.messages if message["role"] == "tool"]


class ServedKv:
    """The key-value server over streamable HTTP at `url`, in its own process, until `stop`; with `token`, it answers
    only requests that send ``Authorization: Bearer <token>``."""

    def __init__(self, tmp_path: Path, token: Optional[str]):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.log = tmp_path / f"kv-{port}.log"
        with self.log.open("w") as log:
            guard = ["--token", token] if token else []
            self.process = subprocess.Popen([sys.executable, str(KV), "--http", str(port), *guard], stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not self._accepts(port):
            assert self.process.poll() is None and time.monotonic() < deadline, f"the server did not start: {self.log.read_text()}"
            time.sleep(0.1)

    def config(self, token: str) -> dict:
        return {"mcpServers": {"kv": {"url": self.url, "headers": {"Authorization": f"Bearer {token}"}}}}

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
