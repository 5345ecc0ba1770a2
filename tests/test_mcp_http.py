"""MCP servers reached by URL over streamable HTTP (`McpServers("http://host:port/mcp")`): the key-value server of
tests/mcp_fixtures served by uvicorn in a process of its own (behind a bearer token), played by `GymScheduler` with
scripted replies. Checked: a session per episode on the one server, whose state the episodes share (as the warning
says), tool errors, the headers sent, a server that cannot be reached or that stops during an episode, and
``textenv rollout --mcp_server URL``."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("mcp", reason="the MCP SDK (textenv[mcp]) is not installed")

from mcp_play import KV_TOOLS, ServedKv, call, row, scheduler, stored_keys, tool_results  # noqa: E402
from textenv.environments.mcp import McpServers  # noqa: E402
from textenv.environments.mcp_session import McpServerError  # noqa: E402
from textenv.gym import GymScheduler, ScriptedPolicy  # noqa: E402

TOKEN = "test-token"
SHARED = "run outside textenv: each episode opens its own MCP session"


@pytest.fixture
def served(tmp_path):
    server = ServedKv(tmp_path, token=TOKEN)
    yield server
    server.stop()


def url_servers(config) -> McpServers:
    with pytest.warns(UserWarning, match=SHARED):
        return McpServers(config, reward_funcs=[stored_keys])


STORE = {"Store": ["\n".join([call("keys"), call("pid"), call("session"), call("put", key="name", value="ada")]), "Done."],
         "Read": [call("get", key="name"), "Done."]}


def test_each_episode_opens_its_own_session_on_the_one_server_whose_state_they_share(tokenizer, served):
    servers = url_servers(served.config(TOKEN))
    assert servers.tool_schemas[0]["function"]["name"] == "put" and len(servers.tool_schemas) == len(KV_TOOLS)
    sched = scheduler(tokenizer, servers, STORE, max_concurrency=2)
    first, second = sched.run([row("Store a name."), row("Store another name.")])
    sessions = set()
    for episode in (first, second):
        assert not episode.errors and episode.finish_reason == "done" and episode.closed
        keys, pid, session, stored = tool_results(episode)
        assert int(pid) == served.process.pid and stored == "stored name"
        sessions.add(session)
        assert episode.env_kind == "mcp" and episode.env_name == "kv"
        assert episode.trajectory_infos[0] == {"mcp_servers": "kv", "scope": "episode", "tools": KV_TOOLS}
        assert episode.total_reward == 1.0  # the reward read the server's store: one key, written by both
    assert len(sessions) == 2  # two sessions at once, on one server
    (later,) = scheduler(tokenizer, servers, STORE).run([row("Read the name.")])
    assert tool_results(later) == ["ada"]  # what earlier episodes stored is still there: the state is the server's


def test_a_tool_error_answers_the_model_and_a_url_string_is_a_server(tokenizer, served):
    with pytest.raises(McpServerError, match=r"'127-0-0-1' \(http://127\.0\.0\.1:\d+/mcp\) could not be reached .*: "
                                             r"(HTTPStatusError: Client error '401 Unauthorized'|MCPError: Server returned an error response)"):
        url_servers(served.url)  # a URL alone sends no token
    servers = url_servers(served.config(TOKEN))
    (episode,) = scheduler(tokenizer, servers, {"Look": [call("get", key="missing"), "Done."]}).run([row("Look it up.")])
    (missing,) = tool_results(episode)
    assert missing.startswith("Error executing tool get") and "no value stored under 'missing'" in missing
    assert episode.finish_reason == "done" and not episode.errors


def test_a_wrong_token_and_a_server_that_is_not_running_are_refused_before_any_episode(served):
    with pytest.raises(McpServerError, match="could not be reached"):
        url_servers(served.config(token="wrong"))
    served.stop()
    with pytest.raises(McpServerError, match=r"could not be reached \(is it running\? are the URL and its headers right\?\): ConnectError"):
        url_servers(served.config(TOKEN))


def test_a_server_that_stops_during_an_episode_ends_it_with_the_reason(tokenizer, served):
    servers = url_servers(served.config(TOKEN))

    def reply(context: str) -> str:
        if context.count("<|im_start|>assistant") == 2:  # the second turn: the server is gone before its call
            served.stop()
        return call("keys")

    sched = GymScheduler(None, tokenizer, policy=ScriptedPolicy(tokenizer, reply), environments=servers, max_turns=4, loss_scale="all")
    (episode,) = sched.run([row("Stop the server.")])
    assert episode.finish_reason == "error" and episode.closed and episode.num_turns == 2
    assert episode.error["stage"] == "step" and episode.error["type"] == "McpServerError"  # not the step timeout
    assert re.search(r"'kv' \(http://\S+\) stopped answering during the call to its tool 'keys' \((ConnectError|MCPError)", episode.error["message"])
    assert sched.stats.errors == 1 and sched.stats.envs_closed == 1
