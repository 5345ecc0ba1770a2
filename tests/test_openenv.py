"""OpenEnv environments run unchanged (textenv.environments.openenv): environments written with openenv's own server
classes (tests/openenv_fixtures), served by textenv as local processes, played by `GymScheduler` with a scripted
policy and with a tiny random model; every session closed whatever ended the episode (done, max_turns, an error,
a cancellation), the server process gone after the run; the bad inputs refused with the fix.

Two servers (the text game and the MCP tool game) are shared by the module (started once: about 5 s each on 2
cores, most of it openenv importing gradio); the tests of `serving` itself start their own."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import httpx
import pytest

pytest.importorskip("openenv", reason="neither openenv (textenv[openenv]) nor openenv-core is installed")

from textenv.environments.openenv import OpenEnvEnvironments  # noqa: E402
from textenv.environments.openenv_protocol import observation_text, opening_messages, text_field, tool_result_text  # noqa: E402
from textenv.environments.openenv_server import ServerStartError  # noqa: E402
from textenv.gym import GymScheduler, ScriptedPolicy  # noqa: E402

from openenv_fixtures.serving import served  # noqa: E402

GUESS_APP = "openenv_fixtures.guess:app"
TOOL_APP = "openenv_fixtures.tool_guess:app"
CAP = 4
TOOL_CALL = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.fixture(scope="module")
def guess_server():
    with served(GUESS_APP, max_sessions=CAP) as server:
        yield server


@pytest.fixture(scope="module")
def tool_server():
    with served(TOOL_APP, max_sessions=CAP) as server:
        yield server


def sessions(url: str) -> dict:
    return httpx.get(f"{url}/test/sessions", timeout=10).json()


def wait_for_sessions(url: str, count: int, seconds: float = 10.0) -> dict:
    deadline = time.monotonic() + seconds
    while (state := sessions(url))["active"] != count and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


def next_guess(context: str) -> int:
    """Binary search over the game's answers so far ("N is wrong; try higher/lower.")."""
    low, high = 1, 10
    for number, direction in re.findall(r"(\d+) is wrong; try (higher|lower)", context):
        if direction == "higher":
            low = max(low, int(number) + 1)
        else:
            high = min(high, int(number) - 1)
    return (low + high) // 2


def tool_call(name: str, **arguments) -> str:
    return TOOL_CALL.format(name=name, arguments=json.dumps(arguments))


# ---------------------------------------------------------------- a text environment
def test_a_text_game_is_played_to_its_reward_with_several_sessions_at_once(guess_server, tokenizer):
    httpx.post(f"{guess_server.url}/test/peak", timeout=10)
    environments = OpenEnvEnvironments(base_url=guess_server.url, max_sessions=CAP)
    policy = ScriptedPolicy(tokenizer, lambda context: str(next_guess(context)))
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy, environments=environments, max_turns=6, max_concurrency=CAP)
    rows = [{"secret": 3, "prompt": "Let's play."}, {"secret": 9}]
    episodes = scheduler.run(rows, num_generations=2)

    assert [episode.row_index for episode in episodes] == [0, 0, 1, 1]
    for episode in episodes:
        assert episode.errors == [] and episode.finish_reason == "done"
        assert episode.total_reward == 1.0 and episode.step_rewards[-1] == 1.0 and sum(episode.step_rewards[:-1]) == 0.0
        assert episode.env_name == guess_server.url and episode.env_kind == "openenv"
        secret = rows[episode.row_index]["secret"]
        assert episode.messages[-1] == {"role": "assistant", "content": str(secret)}
    opening = episodes[0].messages[0]["content"]
    assert opening == "Let's play.\n\nGuess my number between 1 and 10. Reply with the number only."
    assert episodes[2].messages[0]["content"] == "Guess my number between 1 and 10. Reply with the number only."
    assert [message["content"] for message in episodes[0].messages[2:4]] == ["5 is wrong; try lower.", "2"]
    assert scheduler.stats.envs_created == scheduler.stats.envs_closed == 4
    assert sorted(sessions(guess_server.url)["secrets"]) == [3, 3, 9, 9]  # the rows' column reached each reset
    state = wait_for_sessions(guess_server.url, 0)
    assert state["active"] == 0 and state["alive"] == 0
    assert 2 <= state["peak"] <= CAP  # the episodes held their sessions at the same time, within the cap


def test_each_session_closes_when_its_episode_ends_at_max_turns_on_an_error_or_done(guess_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=guess_server.url, max_sessions=CAP)
    open_sessions = []

    def reply(context: str) -> str:  # one episode at a time: only its own session may be open
        open_sessions.append(sessions(guess_server.url)["active"])
        row = re.search(r"row (\d)", context).group(1)
        return {"1": "1", "2": "boom"}.get(row) or str(next_guess(context))

    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, reply), environments=environments,
                             max_turns=2, max_concurrency=1)
    stuck, failing, solved, again = scheduler.run([{"secret": 10, "prompt": f"row {row}"} if row < 3 else
                                                   {"secret": 5, "prompt": f"row {row}"} for row in (1, 2, 3, 4)])

    assert stuck.finish_reason == "max_turns" and stuck.num_turns == 2 and stuck.errors == [] and stuck.total_reward == 0.0
    assert failing.finish_reason == "error" and failing.errors[0]["stage"] == "step"
    assert "the guess exploded" in failing.errors[0]["message"]
    assert solved.finish_reason == again.finish_reason == "done" and solved.num_turns == 1
    assert open_sessions == [1] * 5  # 2 turns, 1, 1 and 1: every earlier session was closed when its episode ended
    assert scheduler.stats.envs_closed == 4
    assert wait_for_sessions(guess_server.url, 0)["active"] == 0


def test_a_server_holding_fewer_sessions_than_declared_is_named_in_the_refused_episode(guess_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=guess_server.url, max_sessions=CAP + 1)  # the server holds CAP
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: str(next_guess(context))),
                             environments=environments, max_turns=6, max_concurrency=CAP + 1)
    episodes = scheduler.run([{"secret": 5}], num_generations=CAP + 1)
    refused = [episode for episode in episodes if episode.errors]
    assert refused and all(episode.total_reward == 1.0 for episode in episodes if not episode.errors)
    for episode in refused:
        assert episode.errors[0]["stage"] == "reset"
        # openenv 0.10 says why; openenv-core 0.3 sends it and closes the connection, which its client meets first
        said = rf"(Server at capacity: {CAP}/{CAP} sessions active|The server closed the session's connection before its reset)"
        assert re.search(rf"{said}.*fewer sessions than max_sessions={CAP + 1}: pass its app's own cap", episode.errors[0]["message"])
    assert wait_for_sessions(guess_server.url, 0)["active"] == 0


def test_a_cancelled_run_closes_its_sessions(guess_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=guess_server.url, max_sessions=CAP)
    policy = ScriptedPolicy(tokenizer, lambda context: "sleep")  # each step takes the server 2 s
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy, environments=environments, max_turns=3, max_concurrency=2)

    async def cancel_while_stepping():
        run = asyncio.create_task(scheduler.arun([{"secret": 4}, {"secret": 5}]))
        deadline = time.monotonic() + 20
        while (await asyncio.to_thread(sessions, guess_server.url))["active"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # both episodes are now waiting for their first step
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

        # the loop (and so each client's socket) lives on: the episodes' close (and openenv's client, which drops a
        # socket whose answer it stopped waiting for) end their sessions, which the server does once its step returns
        return await asyncio.to_thread(wait_for_sessions, guess_server.url, 0)

    assert asyncio.run(cancel_while_stepping())["active"] == 0
    assert scheduler.stats.envs_created == scheduler.stats.envs_closed == 2


def test_observations_can_be_rendered_by_the_user(guess_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=guess_server.url, max_sessions=CAP,
                                       observation_to_text=lambda observation: f"[game] {observation['feedback']}")
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "4"),
                             environments=environments, max_turns=2, max_concurrency=1)
    episode, = scheduler.run([{"secret": 2}])
    assert episode.messages[0]["content"] == "[game] Guess my number between 1 and 10. Reply with the number only."
    assert episode.messages[2]["content"] == "[game] 4 is wrong; try lower."

    environments.observation_to_text = lambda observation: observation  # a dict: not text
    episode, = scheduler.run([{"secret": 2}])
    assert episode.errors[0]["stage"] == "reset" and "observation_to_text returned a dict" in episode.errors[0]["message"]
    assert wait_for_sessions(guess_server.url, 0)["active"] == 0


# ---------------------------------------------------------------- an MCP environment
def test_an_mcp_game_offers_its_tools_and_is_played_with_tool_calls(tool_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=tool_server.url, max_sessions=CAP)
    contexts = []

    def reply(context: str) -> str:
        contexts.append(context)
        if len(contexts) == 1:  # the first turn: a tool that does not exist, then a wrong guess
            return tool_call("peek") + "\n" + tool_call("guess", number=2)
        return tool_call("guess", number=next_guess(context))  # 6, 8, 7

    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, reply), environments=environments,
                             max_turns=4, max_concurrency=1)
    episode, = scheduler.run([{"secret": 7, "prompt": "Find the secret number with your tools."}])

    assert episode.errors == [] and episode.finish_reason == "done" and episode.total_reward == 1.0
    assert "Guess the secret number." in contexts[0] and "Say whether the secret number is even or odd." in contexts[0]
    first_calls = episode.trajectory_infos[1]["tool_calls"]
    assert [call["name"] for call in first_calls] == ["peek", "guess"]
    assert first_calls[0]["error"] == "Unknown tool: 'peek'" and first_calls[0]["result"] == "Error: Unknown tool: 'peek'"
    assert first_calls[1] == {**first_calls[1], "arguments": {"number": 2}, "result": "2 is wrong; try higher.", "error": None}
    tool_messages = [message for message in episode.messages if message["role"] == "tool"]
    assert [message["content"] for message in tool_messages[:2]] == ["Error: Unknown tool: 'peek'", "2 is wrong; try higher."]
    assert episode.trajectory_infos[-1]["tool_calls"][-1]["result"] == "Correct!"
    assert scheduler.stats.tool_calls == sum(len(info.get("tool_calls", [])) for info in episode.trajectory_infos)
    assert scheduler.stats.tool_errors == 1
    assert wait_for_sessions(tool_server.url, 0)["active"] == 0


def test_a_reply_without_a_tool_call_ends_an_mcp_episode(tool_server, tokenizer):
    environments = OpenEnvEnvironments(base_url=tool_server.url, max_sessions=CAP)
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "I give up."),
                             environments=environments, max_turns=4, max_concurrency=2)
    episodes = scheduler.run([{"secret": 3}], num_generations=2)
    assert [(episode.finish_reason, episode.num_turns, episode.total_reward) for episode in episodes] == [("done", 1, 0.0)] * 2
    assert wait_for_sessions(tool_server.url, 0)["active"] == 0


# ---------------------------------------------------------------- a model
@pytest.mark.parametrize("which", ["text", "tools"])
def test_a_tiny_random_model_plays_both_games(which, guess_server, tool_server, tiny_model, tokenizer):
    url = guess_server.url if which == "text" else tool_server.url
    environments = OpenEnvEnvironments(base_url=url, max_sessions=CAP)
    scheduler = GymScheduler(tiny_model, tokenizer, environments=environments, max_turns=2, max_concurrency=CAP,
                             generation_kwargs={"max_new_tokens": 6, "do_sample": True})
    episodes = scheduler.run([{"secret": 4}, {"secret": 6}], num_generations=2)

    assert len(episodes) == 4
    for episode in episodes:
        assert episode.errors == [] and episode.finish_reason in ("done", "max_turns") and episode.num_turns >= 1
        history = episode.history
        assert history is not None and history.reward == episode.total_reward
        assert int(history.token_masks.sum()) >= 1  # the model's own tokens are marked for training
    assert wait_for_sessions(url, 0)["active"] == 0


# ---------------------------------------------------------------- serving: the process, discovery, failures
def fake_installed_package(root, monkeypatch) -> None:
    """An ``openenv-textenv-guess`` distribution (its dist-info and its module, laid out as ``openenv init`` writes
    one) on sys.path, so that openenv's discovery finds it as it finds a pip-installed environment."""
    package = root / "textenv_guess"
    (package / "server").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "server" / "__init__.py").write_text("")
    (package / "server" / "app.py").write_text("from openenv_fixtures.guess import app  # noqa: F401\n")
    info = root / "openenv_textenv_guess-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: openenv-textenv-guess\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("XDG_CACHE_HOME", str(root / "cache"))  # openenv's discovery cache
    monkeypatch.setattr("openenv.auto._discovery._global_discovery", None)  # a fresh discovery, dropped after the test


def test_an_installed_package_is_served_as_a_local_process_that_is_gone_after_the_run(tmp_path, monkeypatch, tokenizer):
    fake_installed_package(tmp_path, monkeypatch)
    environments = OpenEnvEnvironments("textenv_guess", max_sessions=2)
    assert environments.app == "textenv_guess.server.app:app"
    seen = {}

    def reply(context: str) -> str:
        server = environments.server
        seen.setdefault("process", server.process)
        seen["state"] = sessions(server.url)
        return str(next_guess(context))

    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, reply), environments=environments,
                             max_turns=5, max_concurrency=2)
    episodes = scheduler.run([{"secret": 6}], num_generations=2)

    assert [episode.total_reward for episode in episodes] == [1.0, 1.0]
    assert seen["state"]["max"] == 2 and seen["state"]["active"] >= 1  # the cap reached the app, sessions were open
    process = seen["process"]
    assert process.poll() is not None  # stopped, and reaped, when serving ended
    assert environments.server is None and environments.actions is None
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing of its process group is left


def test_serving_cancelled_while_the_server_starts_leaves_no_process():
    environments = OpenEnvEnvironments(app=GUESS_APP)

    async def cancel_while_starting():
        serving = asyncio.create_task(environments.serving().__aenter__())
        while environments.server is None or environments.server.process is None:
            await asyncio.sleep(0.01)
        process = environments.server.process
        await asyncio.sleep(0.5)  # the server is importing its app
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        return process

    process = asyncio.run(cancel_while_starting())
    assert process.poll() is not None and environments.server is None
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def test_a_server_that_does_not_start_is_reported_with_its_log(tokenizer):
    environments = OpenEnvEnvironments(app="openenv_fixtures.broken_app:app", start_timeout=60)
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "1"),
                             environments=environments, max_concurrency=1)
    with pytest.raises(ServerStartError) as raised:
        scheduler.run([{"secret": 1}])
    message = str(raised.value)
    assert "openenv_fixtures.broken_app:app" in message and "exited with code 1" in message
    assert "Traceback" in message and message.endswith("RuntimeError: the fixture's game data is missing")
    assert environments.server is None


def test_a_session_cap_below_the_concurrency_is_refused_before_any_episode(tokenizer):
    environments = OpenEnvEnvironments(base_url="http://127.0.0.1:9", max_sessions=2)  # nothing listens: never reached
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "1"),
                             environments=environments, max_concurrency=4)
    with pytest.raises(ValueError, match=r"^max_concurrency=4 is above the OpenEnv server's session cap \(max_sessions=2\).*"
                                         r"max_concurrency=2, or OpenEnvEnvironments\(\.\.\., max_sessions=4\)"):
        scheduler.run([{"secret": 1}])
    assert scheduler.stats.envs_created == 0


def test_an_environment_package_that_is_not_installed_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match=r"env_id='wordle': no installed OpenEnv environment package provides it.*"
                                                  r"pip install git\+https://huggingface.co/spaces/openenv/wordle_env "):
        OpenEnvEnvironments("wordle")
    with pytest.raises(ModuleNotFoundError, match=r"pip install git\+https://huggingface.co/spaces/someone/their_env "):
        OpenEnvEnvironments("someone/their_env")


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="give one of env_id"):
        OpenEnvEnvironments(app=GUESS_APP, base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1, got 0"):
        OpenEnvEnvironments(app=GUESS_APP, max_sessions=0)


def test_an_episode_outside_serving_says_how_to_play_it():
    episode = OpenEnvEnvironments(app=GUESS_APP).adapter({"secret": 1}, 0)
    with pytest.raises(RuntimeError, match="is not serving: play its episodes through GymScheduler"):
        asyncio.run(episode.reset(None))
    asyncio.run(episode.close())  # nothing was opened: closing does nothing


# ---------------------------------------------------------------- actions and observations as text
def test_the_text_field_comes_from_the_action_schema():
    schema = {"title": "MoveAction", "properties": {"metadata": {"type": "object"}, "move": {"type": "string"},
                                                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
              "required": ["move"]}
    assert text_field(schema, "move") == "move"
    with pytest.raises(ValueError, match=r"^action_field: MoveAction has 2 text fields \(\['move', 'note'\]\).*action_field='NAME'"):
        text_field(schema, None)
    with pytest.raises(ValueError, match=r"action_field='moves': MoveAction has no such field; its fields are \['move', 'note'\]"):
        text_field(schema, "moves")
    with pytest.raises(ValueError, match=r"MoveAction requires \['move'\] besides 'note'"):
        text_field(schema, "note")


def test_observations_and_tool_results_as_the_model_reads_them():
    assert observation_text({"feedback": "Hi", "metadata": {"secret": 3}, "reward": 1.0, "done": False}) == "Hi"
    assert observation_text({"board": [1, 2], "turn": "x", "metadata": {}}) == '{"board": [1, 2], "turn": "x"}'
    assert observation_text({"metadata": {"status": "ready"}}) == ""
    content = {"content": [{"type": "text", "text": "odd"}, {"type": "image", "data": "..."}], "is_error": False}
    assert tool_result_text({"tool_name": "hint", "result": content, "error": None}) == ("odd", None)
    failed = {"tool_name": "guess", "result": None, "error": {"error_type": "invalid_args", "message": "bad number"}}
    assert tool_result_text(failed) == ("Error: bad number", "bad number")
    assert tool_result_text({"tool_name": "raw", "result": {"n": 1}}) == ('{"n": 1}', None)
    assert opening_messages([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "obs") == [
        {"role": "system", "content": "S"}, {"role": "user", "content": "Q\n\nobs"}]
    assert opening_messages(None, "obs") == [{"role": "user", "content": "obs"}]
