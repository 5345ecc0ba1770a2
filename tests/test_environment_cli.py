"""`textenv rollout` and `textenv train` on the environment kinds the command line names beside Gym envs, with the
tiny random model: an OpenEnv environment (``--task openenv --env_id module:app``, or a server's URL; the apps of
tests/openenv_fixtures) and MCP tool servers (``--mcp_server COMMAND --reward_funcs FILE:FUNC``; the key-value
server of tests/mcp_fixtures and a reward file written here). Checked: the episodes in completions.jsonl (their kind,
rewards, no error), no server process left after a run, and the settings errors said in one line with exit status
2, those of a server that does not start before any model loads. Also the guide's (docs/guides/environments.md)
examples and its MCP command line, run as written from the repository's folder."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("openenv", reason="neither openenv (textenv[openenv]) nor openenv-core is installed")
pytest.importorskip("mcp", reason="the MCP SDK (textenv[mcp]) is not installed")

from tests.docs_blocks import ROOT, example_source  # noqa: E402
from tests.docs_commands import page_commands  # noqa: E402
from textenv.cli import main, run_command  # noqa: E402
from textenv.environments.openenv_server import OpenEnvServer  # noqa: E402
from textenv.gym import read_completions  # noqa: E402

from live_processes import live_processes, own_children  # noqa: E402
from mcp_play import KV_TOOLS, ServedKv  # noqa: E402
from openenv_fixtures.common import EVENTS  # noqa: E402
from openenv_fixtures.serving import served  # noqa: E402

TESTS = Path(__file__).resolve().parent
GUESS_APP = "openenv_fixtures.guess:app"
BROKEN_APP = "openenv_fixtures.broken_app:app"
KV_SERVER = TESTS / "mcp_fixtures" / "kv_server.py"
KV_COMMAND = shlex.join([sys.executable, str(KV_SERVER)])
TINY = ["--model_name_or_path", "tiny", "--max_new_tokens", "3", "--no_progress"]
ONE_STEP = ["--ppo_steps", "1", "--batch_size", "2", "--mini_batch_size", "2", "--max_concurrency", "2"]
OPENING = "Guess my number between 1 and 10. Reply with the number only."
REWARDS = '''
async def weight_and_pid(prompts, completions, environments, weight, log_extra, **kwargs):
    """The row's weight; logs the process id of the episode's own kv server."""
    log_extra("server_pid", [int(await environments[0].call_tool("pid"))])
    return [float(value) for value in weight]
'''
GUIDE = "guides/environments.md"


def server_processes() -> list[str]:
    """The command lines of this process's live children that are environment servers (OpenEnv or MCP)."""
    return [child.command for child in own_children() if "openenv_server" in child.command or "server.py" in child.command]


def gone(pid: int, seconds: float = 10.0) -> bool:
    """Whether process `pid` is gone (and reaped) within `seconds`."""
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not Path(f"/proc/{pid}").exists()


def write_rows(folder: Path, rows: list[dict]) -> Path:
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def by_row(path: Path) -> list[dict]:
    return sorted(read_completions(path), key=lambda record: record["row_index"])


@pytest.fixture()
def fixtures_on_path(monkeypatch):
    """openenv_fixtures importable here and, through the PYTHONPATH textenv gives it, in the server process."""
    monkeypatch.syspath_prepend(str(TESTS))


@pytest.fixture()
def rewards_file(tmp_path) -> Path:
    path = tmp_path / "kv_rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.fixture()
def no_model(monkeypatch):
    """Fail a command that loads its model (the settings errors below come before)."""

    def load_policy(*args, **kwargs):
        raise AssertionError("the command loaded a model before its settings error")

    monkeypatch.setattr("textenv.training.policy.load_policy", load_policy)


@pytest.fixture()
def guess_server():
    """The text game served by hand, for ``--env_id http://...`` (textenv then starts nothing)."""
    with served(GUESS_APP, max_sessions=2) as server:
        yield server


# ------------------------------------------------------------------------------------------- OpenEnv
def test_rollout_plays_an_openenv_app_and_stops_its_server(tmp_path, fixtures_on_path):
    rows = write_rows(tmp_path, [{"secret": 3}, {"secret": 8, "prompt": "Let's play."}])
    out = tmp_path / "completions.jsonl"
    summary = run_command(["rollout", *TINY, "--task", "openenv", "--env_id", GUESS_APP, "--dataset", str(rows), "--max_turns", "2",
                           "--max_concurrency", "2", "--output", str(out)])
    assert summary["episodes"] == 2 and summary["errors"] == 0
    records = by_row(out)
    assert [(record["env_kind"], record["env"], record["error"], record["finish_reason"]) for record in records] == [("openenv", GUESS_APP, None, "max_turns")] * 2
    assert [record["step_rewards"] for record in records] == [[0.0, 0.0]] * 2  # random replies never find the number
    assert [record["trajectory_infos"][0]["observation"]["metadata"]["secret"] for record in records] == [3, 8]  # the rows reached reset
    assert [record["messages"][0]["content"] for record in records] == [OPENING, f"Let's play.\n\n{OPENING}"]
    assert server_processes() == []


def test_train_on_an_openenv_server_by_its_url_closes_every_session(tmp_path, guess_server):
    rows = write_rows(tmp_path, [{"secret": 2}, {"secret": 9}])
    result = run_command(["train", "--task", "openenv", "--env_id", guess_server.url, "--dataset", str(rows), *TINY, *ONE_STEP,
                          "--max_turns", "2", "--output_dir", str(tmp_path)])
    assert result["steps"] == 1
    records = read_completions(tmp_path / "completions.jsonl")
    assert [(record["step"], record["env_kind"], record["env"], record["error"]) for record in records] == [(0, "openenv", guess_server.url, None)] * 2
    (step,) = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert step["kinds"] == {"openenv": {"episodes": 2, "reward_mean": 0.0, "accuracy": 0.0}}
    assert httpx.get(f"{guess_server.url}/test/sessions", timeout=10).json()["active"] == 0


def test_train_starts_the_openenv_server_once_for_all_its_steps_and_stops_it(tmp_path, fixtures_on_path, monkeypatch):
    launches = []
    launch = OpenEnvServer.launch

    def counted(server):
        launches.append(server.app)
        return launch(server)

    monkeypatch.setattr(OpenEnvServer, "launch", counted)
    rows = write_rows(tmp_path, [{"secret": 2}, {"secret": 9}])
    result = run_command(["train", "--task", "openenv", "--env_id", GUESS_APP, "--dataset", str(rows), *TINY, *ONE_STEP,
                          "--ppo_steps", "2", "--max_turns", "1", "--output_dir", str(tmp_path)])
    assert result["steps"] == 2
    assert launches == [GUESS_APP]  # one server for both steps (each step runs the scheduler once)
    assert server_processes() == []


# ------------------------------------------------------------------------------------------- Ctrl-C
def interrupt_when(command: list[str], ready, environment: dict, seconds: float = 120.0) -> subprocess.CompletedProcess:
    """Run ``textenv COMMAND`` in a process of its own, send it SIGINT (Ctrl-C) once ``ready()`` holds, and wait for
    it to end."""
    process = subprocess.Popen([str(Path(sys.executable).parent / "textenv"), *command], env={**os.environ, **environment},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + seconds
    while not ready() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert process.poll() is None, f"the command ended before it was interrupted: {process.stdout.read()[-2000:]}"
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, output)


def test_ctrl_c_during_an_openenv_rollout_closes_every_session_and_stops_the_server(tmp_path):
    events = tmp_path / "events.txt"
    rows = write_rows(tmp_path, [{"secret": index % 10 + 1} for index in range(400)])
    command = ["rollout", *TINY, "--task", "openenv", "--env_id", GUESS_APP, "--dataset", str(rows), "--max_turns", "5",
               "--max_concurrency", "2", "--output", str(tmp_path / "completions.jsonl")]
    opened = lambda: events.exists() and events.read_text().count("opened") >= 4  # noqa: E731 - a few episodes in
    result = interrupt_when(command, opened, {EVENTS: str(events), "PYTHONPATH": str(TESTS)})

    assert result.returncode != 0 and "KeyboardInterrupt" in result.stdout
    happened = [line.split() for line in events.read_text().splitlines()]  # "opened PID" / "closed PID"
    kinds = [event for event, _ in happened]
    assert kinds.count("opened") == kinds.count("closed") > 0, kinds  # every session closed by the client
    assert len({pid for _, pid in happened}) == 1 and gone(int(happened[0][1]))  # its one server


def test_ctrl_c_during_an_mcp_rollout_leaves_no_server_process(tmp_path, rewards_file):
    marker = str(tmp_path / "this-run")  # an argument the kv server ignores: this test's servers, among any others
    servers = lambda: [process.pid for process in live_processes() if marker in process.argv]  # noqa: E731
    rows = write_rows(tmp_path, [{"prompt": "Store a value.", "weight": 1.0}] * 400)
    command = ["rollout", *TINY, "--dataset", str(rows), "--mcp_server", f"{KV_COMMAND} {marker}", "--reward_funcs",
               f"{rewards_file}:weight_and_pid", "--max_turns", "3", "--max_concurrency", "2", "--output", str(tmp_path / "out.jsonl")]
    result = interrupt_when(command, lambda: len(servers()) >= 2, {})

    assert result.returncode != 0 and "KeyboardInterrupt" in result.stdout
    assert servers() == [], [(p.pid, p.parent, p.argv) for p in live_processes() if marker in p.argv]


# ------------------------------------------------------------------------------------------- MCP
def test_rollout_plays_mcp_servers_a_server_per_episode_with_the_reward_file(tmp_path, rewards_file):
    rows = write_rows(tmp_path, [{"prompt": "Store a value.", "weight": 0.5}, {"prompt": [{"role": "user", "content": "List the keys."}], "weight": 2}])
    out = tmp_path / "completions.jsonl"
    summary = run_command(["rollout", *TINY, "--dataset", str(rows), "--mcp_server", KV_COMMAND, "--reward_funcs", f"{rewards_file}:weight_and_pid",
                           "--num_generations", "2", "--max_turns", "2", "--output", str(out)])
    assert summary["episodes"] == 4 and summary["errors"] == 0
    records = by_row(out)
    assert [(record["env_kind"], record["env"], record["error"]) for record in records] == [("mcp", "kv_server", None)] * 4
    assert [record["total_reward"] for record in records] == [0.5, 0.5, 2.0, 2.0]
    assert all(record["trajectory_infos"][0]["tools"] == KV_TOOLS for record in records)
    pids = [record["trajectory_infos"][-1]["log_extra"]["server_pid"] for record in records]
    assert len(set(pids)) == 4  # each episode had a server of its own
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()] and server_processes() == []


def test_rollout_plays_a_running_server_by_its_url_a_session_per_episode(tmp_path, rewards_file):
    served = ServedKv(tmp_path, token=None)
    rows = write_rows(tmp_path, [{"prompt": "Store a value.", "weight": 1}])
    out = tmp_path / "completions.jsonl"
    try:
        with pytest.warns(UserWarning, match=r"the MCP server\(s\) '127-0-0-1' \(http://127.0.0.1:\d+/mcp\) run outside textenv"):
            summary = run_command(["rollout", *TINY, "--dataset", str(rows), "--mcp_server", served.url, "--reward_funcs",
                                   f"{rewards_file}:weight_and_pid", "--num_generations", "3", "--max_turns", "2", "--output", str(out)])
        assert served.process.poll() is None  # textenv did not start it, so it does not stop it
    finally:
        served.stop()
    assert summary["episodes"] == 3 and summary["errors"] == 0
    records = by_row(out)
    assert [(record["env_kind"], record["env"], record["total_reward"]) for record in records] == [("mcp", "127-0-0-1", 1.0)] * 3
    assert {record["trajectory_infos"][-1]["log_extra"]["server_pid"] for record in records} == {served.process.pid}


def test_train_grpo_on_mcp_servers(tmp_path, rewards_file):
    rows = write_rows(tmp_path, [{"prompt": "Store a value.", "weight": 1.0}])
    result = run_command(["train", "--task", "gym", "--dataset", str(rows), "--mcp_server", KV_COMMAND, "--reward_funcs", f"{rewards_file}:weight_and_pid",
                          *TINY, *ONE_STEP, "--algorithm", "grpo", "--num_generations", "2", "--output_dir", str(tmp_path / "out")])
    assert result["steps"] == 1 and result["reward_means"] == [1.0]
    records = read_completions(tmp_path / "out" / "completions.jsonl")
    assert [(record["step"], record["env_kind"], record["total_reward"], record["error"]) for record in records] == [(0, "mcp", 1.0, None)] * 2
    assert server_processes() == []


# ------------------------------------------------------------------------------------------- settings errors
SETTINGS_ERRORS = {
    "--mcp_server without --reward_funcs": (["rollout", "--dataset", "{rows}", "--mcp_server", KV_COMMAND], "--mcp_server needs --reward_funcs"),
    "--mcp_server with the calculator task": (["train", "--mcp_server", KV_COMMAND, "--reward_funcs", "{rewards}:weight_and_pid"],
                                              "--mcp_server goes with --task gym (the rows of --dataset played with MCP tool servers), not --task calculator"),
    "a reward file that is not there": (["rollout", "--dataset", "{rows}", "--mcp_server", KV_COMMAND, "--reward_funcs", "missing.py:f"], "missing.py"),
    "--max_sessions without --task openenv": (["rollout", "--dataset", "{rows}", "--gym_env", "math_env", "--max_sessions", "2"],
                                              "--max_sessions goes with --task openenv"),
    "--max_sessions below --max_concurrency": (["rollout", "--task", "openenv", "--env_id", GUESS_APP, "--dataset", "{rows}", "--max_sessions", "2"],
                                               "--max_sessions 2 is below --max_concurrency 64: each live episode holds one of the server's sessions"),
    "rollout --task openenv without --dataset": (["rollout", "--task", "openenv", "--env_id", GUESS_APP], "--task openenv needs --dataset"),
    "train --task openenv without --dataset": (["train", "--task", "openenv", "--env_id", GUESS_APP], "--task openenv needs --dataset"),
    "--task openenv without --env_id": (["rollout", "--task", "openenv", "--dataset", "{rows}"], "--task openenv needs --env_id"),
    "--env_args with --task openenv": (["rollout", "--task", "openenv", "--env_id", GUESS_APP, "--dataset", "{rows}", "--env_args", "{}"],
                                       "--env_args configures a verifiers environment"),
    "--env_id with --gym_env": (["rollout", "--task", "openenv", "--env_id", GUESS_APP, "--dataset", "{rows}", "--gym_env", "math_env"],
                                "--env_id (a verifiers or OpenEnv environment) chooses the env"),
}


def said_in_one_line(argv: list[str], capsys) -> str:
    """The error `textenv ARGV` ends with: asserted one line on stderr (no traceback of its own) and exit status 2."""
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"textenv {argv[0]}: error: ") and error.count("\n") == 1, error
    return error


def filled(argv: list[str], folder: Path, rewards_file: Path) -> list[str]:
    """`argv` with its placeholders replaced: {rows} by a rows file, {rewards} by the reward file, {port} by a free port."""
    rows = write_rows(folder, [{"secret": 3, "prompt": "Store a value."}])
    values = {"{rows}": str(rows), "{rewards}": str(rewards_file), "{port}": str(free_port())}
    for placeholder, value in values.items():
        argv = [argument.replace(placeholder, value) for argument in argv]
    return [*argv, "--model_name_or_path", "tiny", "--no_progress"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("name", SETTINGS_ERRORS)
def test_a_settings_error_is_one_line_before_any_model_loads(name, tmp_path, rewards_file, no_model, capsys):
    argv, message = SETTINGS_ERRORS[name]
    assert message in said_in_one_line(filled(argv, tmp_path, rewards_file), capsys)


EXITS = shlex.join([sys.executable, "-c", "import sys; sys.exit('no database at /nowhere')"])
SERVERS_THAT_DO_NOT_START = {
    "an MCP server that exits": (["train", "--task", "gym", "--dataset", "{rows}", "--mcp_server", EXITS, "--reward_funcs", "{rewards}:weight_and_pid"],
                                 "exited before answering the MCP handshake; its stderr ends: no database at /nowhere"),
    "an MCP server that is not there": (["rollout", "--dataset", "{rows}", "--mcp_server", "/no/such/server --db x", "--reward_funcs", "{rewards}:weight_and_pid"],
                                        "could not be started: FileNotFoundError"),
    "an OpenEnv app that fails to load": (["rollout", "--task", "openenv", "--env_id", BROKEN_APP, "--dataset", "{rows}"],
                                          f"--env_id {BROKEN_APP}: the OpenEnv server for '{BROKEN_APP}' exited with code 1 before it served"),
    "an OpenEnv URL where nothing answers": (["rollout", "--task", "openenv", "--env_id", "http://127.0.0.1:{port}", "--dataset", "{rows}"],
                                             "the OpenEnv server did not answer (ConnectError"),
}


@pytest.mark.parametrize("name", SERVERS_THAT_DO_NOT_START)
def test_a_server_that_does_not_start_is_a_settings_error_with_its_last_lines(name, tmp_path, rewards_file, fixtures_on_path, no_model, capsys):
    argv, message = SERVERS_THAT_DO_NOT_START[name]
    error = said_in_one_line(filled(argv, tmp_path, rewards_file), capsys)
    assert message in error
    if name == "an OpenEnv app that fails to load":
        assert error.rstrip().endswith("RuntimeError: the fixture's game data is missing")  # the server log's last line
    assert server_processes() == []


# ------------------------------------------------------------------------------------------- the guide
def test_the_guides_examples_run_as_written():
    """The guide's Python blocks, in order in one process from the repository's folder, examples/openenv on the path."""
    markers = ("<!-- example: environments-openenv -->", "<!-- example: environments-mcp -->", "<!-- example: environments-several -->")
    program = "\n\n".join(example_source(GUIDE, marker) for marker in markers)
    environment = {**os.environ, "PYTHONPATH": "examples/openenv"}
    completed = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    printed = [line for line in completed.stdout.splitlines() if line.startswith("kinds:")]
    assert printed == ["kinds: {'guess': 1, 'notes': 1}"], completed.stdout[-2000:]


def test_the_guides_mcp_line_runs_as_written(tmp_path):
    """The guide's MCP command line, typed in the repository's folder with .venv activated (`python` and `textenv`
    the environment's, as the pages assume)."""
    (command,) = [command for command in page_commands(ROOT / "docs" / GUIDE) if "--mcp_server" in command.argv and command.program == "rollout"]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    binaries = str(Path(sys.executable).parent)
    environment = {**os.environ, "PATH": f"{binaries}{os.pathsep}{os.environ['PATH']}"}
    completed = subprocess.run([f"{binaries}/textenv", command.program, *command.argv, "--no_progress"], cwd=tmp_path, env=environment,
                               capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0 and "Traceback" not in completed.stderr, completed.stderr[-4000:]
    records = read_completions(tmp_path / "completions.jsonl")
    assert len(records) == 8 and {(record["env_kind"], record["error"]) for record in records} == {("mcp", None)}
    assert {record["total_reward"] for record in records} <= {0.0, 1.0}
