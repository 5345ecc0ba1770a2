"""MCP tool servers as an environment kind (`textenv.environments.mcp.McpServers`), played by `GymScheduler`: a
session and server process per episode (state never leaks), tool errors answering the model, a dying server ending
its episode only, no process left behind, the tiny random model on the engine, a server from PyPI
(mcp-server-sqlite), and bad input refused before any episode. The servers are real processes over stdio."""

from __future__ import annotations

import ast
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK (textenv[mcp]) is not installed")

from live_processes import own_children  # noqa: E402
from mcp_play import KV, KV_TOOLS, call, row, scheduler, stored_keys, tool_results  # noqa: E402
from textenv.environments.mcp import McpServers  # noqa: E402
from textenv.environments.mcp_session import McpServerError, McpSession, ServerSpec  # noqa: E402
from textenv.gym import GymScheduler  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "mcp_fixtures"
BAD_SCHEMA = FIXTURES / "bad_schema_server.py"
SQLITE = Path(sys.executable).parent / "mcp-server-sqlite"  # mcp-server-sqlite==2025.4.25, installed by the set-up
SQLITE_DECORATORS = ("list_resources", "read_resource", "list_prompts", "get_prompt", "list_tools", "call_tool")  # what it uses
KV_COMMAND = shlex.join([sys.executable, str(KV)])


def processes_running(program: Path) -> list[int]:
    """The ids of this process's live children whose command line holds `program` (`make test` runs this module in
    two environments at once, from the same checkout: the other one's servers do not count)."""
    return [child.pid for child in own_children() if str(program) in child.argv]


@pytest.fixture(autouse=True)
def no_server_left():
    """Every test ends with none of its servers running."""
    yield
    assert processes_running(KV) == [] and processes_running(SQLITE) == []


@pytest.fixture(scope="module")
def kv():
    return McpServers(KV_COMMAND, reward_funcs=[stored_keys])


STORE = {"Store": ["\n".join([call("keys"), call("pid"), call("put", key="name", value="ada")]), "Done."]}


# ---------------------------------------------------------------- one session per episode
def test_each_episode_has_its_own_server_and_state_never_leaks(tokenizer, kv):
    sched = scheduler(tokenizer, kv, STORE)

    async def run_and_look():
        episodes = await sched.arun([row("Store a name."), row("Store another name.")], num_generations=2)
        return episodes, processes_running(KV)  # still in the run's loop: each episode's close ended its server

    episodes, left = asyncio.run(run_and_look())
    assert len(episodes) == 4 and left == []
    pids = set()
    for episode in episodes:
        assert not episode.errors and episode.finish_reason == "done" and episode.closed
        keys, pid, stored = tool_results(episode)
        assert keys == "(empty)" and stored == "stored name"  # a fresh store, though all four ran at once
        pids.add(int(pid))
        assert episode.total_reward == 1.0 == episode.final_reward  # the reward read the episode's own final store
        assert episode.env_kind == "mcp" and episode.env_name == "kv_server"
        assert episode.trajectory_infos[0] == {"mcp_servers": "kv_server", "scope": "episode", "tools": KV_TOOLS}
    assert len(pids) == 4
    assert sched.stats.envs_created == sched.stats.envs_closed == 4
    assert '"name": "put"' in episodes[0].prompt and "<tools>" in episodes[0].prompt


def test_with_scope_run_the_episodes_share_one_server_and_its_state(tokenizer):
    shared = McpServers(KV_COMMAND, reward_funcs=[stored_keys], scope="run")
    episodes = scheduler(tokenizer, shared, STORE, max_concurrency=1).run([row("Store a name."), row("Store it again.")])
    first, second = (tool_results(episode) for episode in episodes)
    assert first[0] == "(empty)" and second[0] == "name"  # the second episode sees the first one's key
    assert first[1] == second[1]  # one process
    assert [episode.trajectory_infos[0]["scope"] for episode in episodes] == ["run", "run"]


# ---------------------------------------------------------------- tool errors, dying servers, timeouts
def test_a_tool_error_answers_the_model_with_the_error_text(tokenizer, kv):
    first = "\n".join([call("get", key="missing"), call("put", key="only"), call("nope"), call("put", key="k", value="v")])
    sched = scheduler(tokenizer, kv, {"Look": [first, call("get", key="k"), "Done."]})
    (episode,) = sched.run([row("Look things up.")])
    missing, incomplete, unknown, stored, found = tool_results(episode)
    assert missing.startswith("Error executing tool get") and "no value stored under 'missing'" in missing
    assert "value" in incomplete and "Field required" in incomplete  # the server's own argument check
    assert unknown == str({"error": "Tool nope not found."})
    assert (stored, found) == ("stored k", "v")
    records = episode.trajectory_infos[1]["tool_calls"]
    assert [record["error"] is not None for record in records] == [True, True, True, False]
    assert records[0]["error"] == missing
    assert sched.stats.tool_calls == 5 and sched.stats.tool_errors == 3
    assert episode.finish_reason == "done" and not episode.errors and episode.total_reward == 1.0


def test_a_dying_server_ends_only_its_own_episode_with_the_reason(tokenizer, kv):
    plans = {**STORE, "Crash": [call("crash"), "Done."]}
    sched = scheduler(tokenizer, kv, plans)
    crashed, kept = sched.run([row("Crash the server."), row("Store a name.")])
    assert crashed.finish_reason == "error" and crashed.closed and crashed.num_turns == 1
    assert crashed.error["stage"] == "step" and crashed.error["type"] == "McpServerError"
    assert "exited during the call to its tool 'crash'" in crashed.error["message"]
    assert "its stderr ends: kv server: crashing on request" in crashed.error["message"]
    assert crashed.final_reward is None
    assert kept.finish_reason == "done" and not kept.errors and kept.total_reward == 1.0
    assert sched.stats.errors == 1 and sched.stats.envs_closed == 2


def test_a_call_past_the_step_timeout_ends_the_episode_and_close_still_stops_the_server(tokenizer, kv):
    sched = scheduler(tokenizer, kv, {"Wait": [call("slow", seconds=60), "Done."]}, step_timeout=4)  # a start fits in 4 s

    async def run_and_look():
        episodes = await sched.arun([row("Wait for it.")])
        return episodes, processes_running(KV)

    started = time.monotonic()
    (episode,), left = asyncio.run(run_and_look())
    assert episode.error["stage"] == "step" and "did not return within 4 s" in episode.error["message"]
    assert episode.closed and left == [] and time.monotonic() - started < 30  # the call in flight did not hold close up


# ---------------------------------------------------------------- models and servers from elsewhere
def test_the_tiny_random_model_plays_mcp_episodes_on_the_engine(tiny_model, tokenizer, kv):
    sched = GymScheduler(tiny_model, tokenizer, environments=kv, max_turns=2, loss_scale="all",
                         generation_kwargs={"max_new_tokens": 8, "do_sample": False})
    episodes = sched.run([row("Store a name."), row("Read a name.")])
    for episode in episodes:
        assert not episode.errors and episode.finish_reason in ("done", "max_turns") and episode.closed
        assert episode.trajectory_infos[0]["tools"] == KV_TOOLS and '"name": "crash"' in episode.prompt
        _, response, mask = episode.history.split_query_response_tokens()
        assert int(mask.sum()) > 0  # the model's own tokens are trained
        puts = [record for info in episode.trajectory_infos[1:] for record in info.get("tool_calls", []) if record["name"] == "put" and not record["error"]]
        assert episode.final_reward == float(len({record["arguments"]["key"] for record in puts}))


def skip_unless_mcp_runs_the_sqlite_server() -> None:
    """Skip (as `pytest.importorskip` would) where the installed mcp lacks what mcp-server-sqlite 2025.4.25 uses: the
    low-level `Server`'s decorators (``@server.list_tools()``, ...), which mcp 2.x replaced by constructor arguments
    (``Server(on_list_tools=...)``), though the package asks only for ``mcp>=1.6``."""
    from mcp.server.lowlevel import Server

    missing = [f"{name}()" for name in SQLITE_DECORATORS if not hasattr(Server, name)]
    if missing:
        pytest.skip(f"mcp-server-sqlite registers its handlers with decorators of mcp.server.lowlevel.Server that this mcp lacks: {', '.join(missing)}")


def test_a_server_from_pypi_mcp_server_sqlite_gets_a_fresh_database_per_episode(tokenizer):
    skip_unless_mcp_runs_the_sqlite_server()
    seen = []

    async def notes_count(prompts, completions, environments, **kwargs):
        episode = environments[0]
        seen.append((episode.session.directory, (Path(episode.session.directory) / "notes.db").exists()))
        rows = ast.literal_eval(await episode.call_tool("read_query", {"query": "SELECT COUNT(*) AS n FROM notes"}))
        return [float(rows[0]["n"])]

    sqlite = McpServers(f"{shlex.quote(str(SQLITE))} --db-path {{episode_dir}}/notes.db", reward_funcs=[notes_count])
    plans = {"Note": [call("create_table", query="CREATE TABLE notes (text TEXT)"),
                      call("write_query", query="INSERT INTO notes VALUES ('buy milk')"), "Done."]}
    episodes = scheduler(tokenizer, sqlite, plans).run([row("Note this down.")], num_generations=2)
    for episode in episodes:
        assert not episode.errors and episode.env_name == "mcp-server-sqlite"
        assert tool_results(episode) == ["Table created successfully", "[{'affected_rows': 1}]"]  # no table left from the other
        assert episode.total_reward == 1.0
    assert len({directory for directory, _ in seen}) == 2 and all(existed for _, existed in seen)
    assert not any(Path(directory).exists() for directory, _ in seen)  # each episode's folder is removed at close


def test_several_servers_from_a_config_file_prefix_their_tools(tokenizer, tmp_path):
    config = {"mcpServers": {"kv": {"command": sys.executable, "args": [str(KV)]}, "cache": KV_COMMAND}}
    (tmp_path / "mcp.json").write_text(json.dumps(config))

    async def kv_keys(prompts, completions, environments, **kwargs):
        return [float(await environments[0].call_tool("kv_keys") != "(empty)")]

    servers = McpServers(str(tmp_path / "mcp.json"), reward_funcs=kv_keys)
    assert servers.name == "kv+cache" and [spec.name for spec in servers.specs] == ["kv", "cache"]
    assert [schema["function"]["name"] for schema in servers.tool_schemas] == [f"{server}_{tool}" for server in ("kv", "cache") for tool in KV_TOOLS]
    plans = {"Use": ["\n".join([call("kv_put", key="a", value="1"), call("cache_keys"), call("kv_keys"), call("put", key="b", value="2")]), "Done."]}
    (episode,) = scheduler(tokenizer, servers, plans).run([row("Use both stores.")])
    assert tool_results(episode) == ["stored a", "(empty)", "a", str({"error": "Tool put not found."})]
    assert episode.total_reward == 1.0 and episode.env_name == "kv+cache"


# ---------------------------------------------------------------- bad input, before any episode
@pytest.mark.parametrize("servers, message", [
    ("  ", "the command line for the server is empty"),
    ({}, "the config names no server"),
    ({"mcpServers": {"web": {"args": ["x"]}}}, r"servers\['web'\]: give \{'command'"),
    ({"web": {"command": "srv", "type": "http"}}, r"a stdio server is described by \['command', 'args', 'env', 'cwd'\]; remove \['type'\]"),
    ({"web": {"url": "http://localhost:1234/mcp", "type": "sse"}}, "the SSE transport .* is not played; serve the server over streamable HTTP"),
    ({"web": {"url": "localhost:1234/mcp"}}, r"servers\['web'\]: 'url' must be an http:// or https:// address"),
    ({"web": {"url": "http://localhost:1234/mcp", "command": "srv"}}, r"described by \['url', 'headers'\] .*; remove \['command'\]"),
    ({"web": {"url": "http://localhost:1234/mcp", "headers": {"X-Retries": 3}}}, "'headers' must map names to strings"),
    ({"kv": {"command": "python", "args": "server.py"}}, "'args' must be a list of strings"),
    ({"kv": {"command": "python", "env": {"DEBUG": 1}}}, "'env' must map names to strings"),
    ({"my kv": "python a.py", "other": "python b.py"}, "use letters, digits, '_' and '-'"),
    (["python", "server.py"], "servers: a list; give a command line"),
])
def test_bad_server_configs_are_refused_with_the_fix(servers, message):
    with pytest.raises(ValueError, match=message):
        McpServers(servers, reward_funcs=stored_keys)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="reward_funcs: MCP servers give no reward"):
        McpServers(KV_COMMAND, reward_funcs=[])
    with pytest.raises(ValueError, match="scope='shared': use 'episode'"):
        McpServers(KV_COMMAND, reward_funcs=stored_keys, scope="shared")
    with pytest.raises(TypeError, match="reward_funcs: 'exact_match' is a str, not a function"):
        McpServers(KV_COMMAND, reward_funcs=["exact_match"])


def test_a_server_that_does_not_start_is_refused_with_its_stderr():
    exits = shlex.join([sys.executable, "-c", "import sys; print('loading kv.toml', file=sys.stderr); sys.exit('kv: no such config file kv.toml')"])
    with pytest.raises(McpServerError, match=r"exited before answering the MCP handshake; its stderr ends: loading kv.toml \| kv: no such config file kv.toml"):
        McpServers(exits, reward_funcs=stored_keys)
    with pytest.raises(McpServerError, match=r"'no-such-server' \(/nonexistent/no-such-server --flag\) could not be started: FileNotFoundError"):
        McpServers("/nonexistent/no-such-server --flag", reward_funcs=stored_keys)
    silent = shlex.join([sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    with pytest.raises(McpServerError, match="did not answer the MCP handshake within 1 s; its stderr is empty"):
        McpServers(silent, reward_funcs=stored_keys, start_timeout=1)
    assert time.monotonic() - started < 10  # the hung process is ended, not waited for


@pytest.mark.parametrize("schema, message", [
    ("typo", r"the tool 'lookup' of the MCP server 'bad_schema_server': its inputSchema is not a valid JSON schema \(at properties/term/type: 'strng' is not valid"),
    # mcp 1.x hands the tool over and textenv refuses it; mcp 2.x refuses the server's whole answer itself (it checks
    # results against the protocol's schema), naming the tool by its position: a ValueError naming the server on both
    ("array", r"the tool 'lookup' of the MCP server 'bad_schema_server': its inputSchema \{\"type\": \"array\".* is not a JSON schema object"
              r"|the MCP server 'bad_schema_server' answered tools/list with a list of tools that does not follow the MCP protocol, which "
              r"the mcp SDK refused \(at tools\.0\.inputSchema\.type: Input should be 'object', got 'array'\)"),
    # neither SDK takes an inputSchema that is not a JSON object: the same refusal on both
    ("text", r"the MCP server 'bad_schema_server' answered tools/list with a list of tools that does not follow the MCP protocol, which "
             r"the mcp SDK refused \(at tools\.0\.inputSchema: Input should be a valid dictionary.*, got 'a term'\); fix the tool's definition"),
])
def test_a_tool_without_a_valid_json_schema_object_is_refused(schema, message):
    with pytest.raises(ValueError, match=message):
        McpServers(shlex.join([sys.executable, str(BAD_SCHEMA), schema]), reward_funcs=stored_keys)


def test_more_concurrent_sessions_than_open_files_allow_are_refused_before_any_episode(tokenizer, kv):
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    too_many = limit  # three files a session: `limit` sessions cannot fit
    sched = scheduler(tokenizer, kv, STORE, max_concurrency=too_many)
    with pytest.raises(ValueError, match=rf"max_concurrency={too_many}: each episode holds 3 open files .* pass max_concurrency <= {(limit - 256) // 3}"):
        sched.run([row("Store a name.")])
    assert sched.stats.envs_created == 0
    kv.check(max_concurrency=8, num_generations=4)  # a run that fits passes


# ---------------------------------------------------------------- the session on its own
def test_a_session_closes_cleanly_from_other_tasks_and_after_a_failed_start():
    async def scenario():
        session = McpSession([ServerSpec("kv", sys.executable, (str(KV),)), ServerSpec("gone", "/nonexistent/server")], start_timeout=30)
        with pytest.raises(McpServerError, match="'gone'"):
            await asyncio.create_task(session.start())  # started in one task...
        assert session.connections["kv"].tools  # the other server did start
        assert len(processes_running(KV)) == 1  # what the other tests count: here, the one server running
        await asyncio.create_task(session.close())  # ...closed in another
        assert not Path(session.directory).exists() and processes_running(KV) == []
        await session.close()  # twice is harmless

    asyncio.run(scenario())
