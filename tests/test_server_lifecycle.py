"""Servers never outlive textenv: `textenv serve` and the servers textenv starts for itself stop with all
their processes when textenv stops, on SIGTERM, SIGINT or SIGHUP, at start-up and while serving, and when
textenv is killed outright.

Most tests run a fake vLLM (`FAKE_SERVER`, put on PYTHONPATH as `vllm.entrypoints.openai.api_server`): like
the real one it ignores SIGTERM while it starts and has a helper process (an engine-core stand-in, which
ignores SIGTERM throughout), and it answers GET /health once ready. Two tests run the real vLLM of
`.venv-vllm` (skipped, with the reason, where there is none).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from live_processes import live_processes
from textenv.vllm.client import VLLMServerClient
from textenv.vllm.server import VLLMServer, find_vllm_python, free_port

GRACE = 2.0  # the fake's helper ignores SIGTERM: every stop waits this long, then SIGKILLs it
STOP_BOUND = 20.0  # seconds within which a stop must be complete
FAKE_SERVER = '''
import argparse, http.server, os, signal, subprocess, sys, threading, time

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int)
args, _ = parser.parse_known_args()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as vLLM does while it starts
helper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"])
print("fake vLLM: starting", flush=True)
time.sleep(float(os.environ.get("FAKE_VLLM_STARTUP_SECONDS", "1")))


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", args.port), Health)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print("fake vLLM: ready", flush=True)
if os.environ.get("FAKE_VLLM_EXIT_AFTER_SECONDS"):
    threading.Timer(float(os.environ["FAKE_VLLM_EXIT_AFTER_SECONDS"]), lambda: os._exit(3)).start()
server.serve_forever()
'''
LIBRARY_SCRIPT = '''
import sys, threading, time
from textenv.vllm.server import VLLMServer

server = VLLMServer(sys.argv[1], int(sys.argv[2]), "float32", vllm_python=sys.executable, grace=float(sys.argv[3]))
starter = threading.Thread(target=server.start)  # started from a worker thread that then ends
starter.start()
starter.join()
print("process group", server.process.pid, flush=True)
time.sleep(3600)
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch) -> dict[str, str]:
    """The environment of a process whose `python -m vllm.entrypoints.openai.api_server` is the fake."""
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("FAKE_VLLM_STARTUP_SECONDS", "1")
    return dict(os.environ)


# ------------------------------------------------------------------------------ helpers
def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies count as gone)."""
    return [process.pid for process in live_processes() if process.group == pgid]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections in TIME_WAIT do not hold it
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def assert_all_gone(pgid: int, port: int) -> None:
    wait_for(lambda: not group_members(pgid), STOP_BOUND, f"processes of group {pgid} still running: {group_members(pgid)}")
    assert port_is_free(port), f"port {port} is still held"


def start_serve(tmp_path: Path, environment: dict[str, str], *args: str, grace: float = GRACE, python: str = sys.executable,
                ignore_hangup: bool = False):
    """`textenv serve` as a subprocess on a free port: (process, port, its stdout file). It starts with SIGHUP and
    SIGINT at their default actions, as from a terminal, even when the tests run under `nohup` or as a shell's
    background job (which would otherwise pass on the ignored SIGHUP or SIGINT that `textenv serve` deliberately
    keeps); ``ignore_hangup``: started as under `nohup`."""
    port = free_port()
    output = tmp_path / f"serve-{port}.out"
    command = [sys.executable, "-m", "textenv.cli", "serve", "--port", str(port), "--vllm_python", python,
               "--stop_grace", str(grace), *args]
    hangup = signal.SIG_IGN if ignore_hangup else signal.SIG_DFL

    def as_from_a_terminal() -> None:
        signal.signal(signal.SIGHUP, hangup)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with open(output, "w") as stdout:
        process = subprocess.Popen(command, env=environment, stdout=stdout, stderr=subprocess.STDOUT,
                                   preexec_fn=as_from_a_terminal)
    return process, port, output


def process_group_of(process: subprocess.Popen, output: Path, timeout: float = 60.0) -> int:
    """The server's process group, from `textenv serve`'s log line."""
    def found():
        assert process.poll() is None, f"textenv serve exited early:\n{output.read_text()}"
        match = re.search(r"process group (\d+)", output.read_text())
        return match and int(match.group(1))

    return wait_for(found, timeout, "textenv serve's process group line")


def serving_fake(tmp_path, fake_vllm, startup_seconds: float):
    """`textenv serve` of the fake, once its server and helper run (3 processes in its group)."""
    environment = {**fake_vllm, "FAKE_VLLM_STARTUP_SECONDS": str(startup_seconds)}
    process, port, output = start_serve(tmp_path, environment, "--model", str(tmp_path), "--dtype", "float32")
    pgid = process_group_of(process, output)
    wait_for(lambda: len(group_members(pgid)) >= 3, 30, "the guard, the fake server and its helper")
    return process, port, output, pgid


# ------------------------------------------------------------------------------ textenv serve
@pytest.mark.parametrize("phase", ["start-up", "serving"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda signum: signal.Signals(signum).name)
def test_serve_stops_every_process_on_a_stop_signal(tmp_path, fake_vllm, phase, signum):
    process, port, output, pgid = serving_fake(tmp_path, fake_vllm, startup_seconds=600 if phase == "start-up" else 0.5)
    if phase == "serving":
        wait_for(lambda: "Ready after" in output.read_text(), 60, "the fake server ready")
    else:
        assert "Ready after" not in output.read_text()
    process.send_signal(signum)
    assert process.wait(STOP_BOUND) == 0, output.read_text()
    assert f"Got {signal.Signals(signum).name}: the server and all its processes are stopped." in output.read_text()
    assert not group_members(pgid), "textenv serve returned before its server's processes ended"
    assert_all_gone(pgid, port)


def test_serve_started_under_nohup_keeps_ignoring_sighup(tmp_path, fake_vllm):
    environment = {**fake_vllm, "FAKE_VLLM_STARTUP_SECONDS": "0.5"}
    process, port, output = start_serve(tmp_path, environment, "--model", str(tmp_path), "--dtype", "float32", ignore_hangup=True)
    pgid = process_group_of(process, output)
    wait_for(lambda: "Ready after" in output.read_text(), 60, "the fake server ready")
    process.send_signal(signal.SIGHUP)
    time.sleep(2 * GRACE)
    assert process.poll() is None, output.read_text()  # nohup's choice is kept
    process.send_signal(signal.SIGTERM)
    assert process.wait(STOP_BOUND) == 0, output.read_text()
    assert_all_gone(pgid, port)


@pytest.mark.parametrize("phase", ["start-up", "serving"])
def test_serve_killed_outright_still_stops_its_server(tmp_path, fake_vllm, phase):
    process, port, output, pgid = serving_fake(tmp_path, fake_vllm, startup_seconds=600 if phase == "start-up" else 0.5)
    if phase == "serving":
        wait_for(lambda: VLLMServerClient(f"http://127.0.0.1:{port}").healthy(), 60, "the fake server ready")
    process.kill()
    assert process.wait(10) == -signal.SIGKILL
    assert group_members(pgid), "the server's processes ended with textenv before its guard could stop them"
    assert_all_gone(pgid, port)


def test_a_server_that_exits_ends_serve_with_its_helpers(tmp_path, fake_vllm):
    environment = {**fake_vllm, "FAKE_VLLM_STARTUP_SECONDS": "0.5", "FAKE_VLLM_EXIT_AFTER_SECONDS": "2"}
    process, port, output = start_serve(tmp_path, environment, "--model", str(tmp_path), "--dtype", "float32")
    pgid = process_group_of(process, output)
    assert process.wait(60) == 1
    assert "The server exited with 3" in output.read_text()
    assert_all_gone(pgid, port)


def test_serve_logs_the_resolved_dtype_and_its_reason(tmp_path, fake_vllm):
    process, port, output, pgid = serving_fake(tmp_path, fake_vllm, startup_seconds=600)
    process.terminate()
    process.wait(STOP_BOUND)
    assert "--dtype float32 as asked" in output.read_text()
    assert_all_gone(pgid, port)


# ------------------------------------------------------------------------------ servers textenv starts for itself
def test_server_arguments_from_the_environment_reach_every_server(monkeypatch, tmp_path):
    monkeypatch.setenv("TEXTENV_VLLM_SERVER_ARGS", "--enforce-eager --max-model-len 2048")
    command = VLLMServer(str(tmp_path), 8123, "float32", vllm_python=sys.executable, extra_args=["--seed", "3"]).command
    assert command[-5:] == ["--enforce-eager", "--max-model-len", "2048", "--seed", "3"]
    monkeypatch.delenv("TEXTENV_VLLM_SERVER_ARGS")
    assert "--enforce-eager" not in VLLMServer(str(tmp_path), 8123, "float32", vllm_python=sys.executable).command


def test_stop_ends_the_whole_group_after_the_grace(tmp_path, fake_vllm):
    server = VLLMServer(str(tmp_path), free_port(), "float32", vllm_python=sys.executable, grace=GRACE).start(timeout=60)
    pgid = server.process.pid
    assert len(group_members(pgid)) >= 3
    started = time.monotonic()
    server.stop()
    assert GRACE - 0.5 < time.monotonic() - started < GRACE + 5  # the helper ignores SIGTERM until the SIGKILL
    assert not group_members(pgid)
    assert port_is_free(server.port)


def test_stop_with_a_shorter_grace_kills_the_group_itself(tmp_path, fake_vllm):
    server = VLLMServer(str(tmp_path), free_port(), "float32", vllm_python=sys.executable, grace=60).start(timeout=60)
    started = time.monotonic()
    server.stop(grace=0.5)
    assert time.monotonic() - started < 10
    assert_all_gone(server.process.pid, server.port)


def test_a_start_up_timeout_stops_the_group(tmp_path, fake_vllm, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_STARTUP_SECONDS", "600")
    server = VLLMServer(str(tmp_path), free_port(), "float32", vllm_python=sys.executable, grace=GRACE)
    with pytest.raises(RuntimeError, match="not ready after 3 s"):
        server.start(timeout=3)
    assert_all_gone(server.process.pid, server.port)


def test_a_process_killed_outright_takes_its_servers_with_it(tmp_path, fake_vllm):
    """A server started from a worker thread outlives that thread, and ends with the process (SIGKILL)."""
    script = tmp_path / "library_user.py"
    script.write_text(LIBRARY_SCRIPT)
    port, output = free_port(), tmp_path / "library_user.out"
    with open(output, "w") as stdout:
        process = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(port), str(GRACE)], stdout=stdout, stderr=subprocess.STDOUT)
    try:
        pgid = process_group_of(process, output)
        time.sleep(1.0)  # the starting thread has ended: the server must still answer
        assert VLLMServerClient(f"http://127.0.0.1:{port}").healthy(), output.read_text()
        process.kill()
        process.wait(10)
        assert_all_gone(pgid, port)
    finally:
        process.kill()


# ------------------------------------------------------------------------------ the real vLLM
@pytest.fixture(scope="module")
def vllm_python() -> str:
    try:
        return find_vllm_python()
    except FileNotFoundError as error:
        pytest.skip(str(error))


@pytest.mark.slow
def test_real_vllm_stops_on_sigterm_at_start_up(tmp_path, vllm_python):
    process, port, output = start_serve(tmp_path, dict(os.environ), "--model", "bundled", "--dtype", "float32", grace=10, python=vllm_python)
    pgid = process_group_of(process, output)
    # SIGTERM once vLLM has started its engine-core process (guard, API server, engine core), long before ready
    wait_for(lambda: len(group_members(pgid)) >= 3, 120, "vLLM's engine-core process")
    assert not VLLMServerClient(f"http://127.0.0.1:{port}").healthy()
    process.terminate()
    assert process.wait(60) == 0, output.read_text()
    assert "Got SIGTERM" in output.read_text()
    assert_all_gone(pgid, port)


@pytest.mark.slow
def test_real_vllm_stops_on_sigterm_while_serving(tmp_path, vllm_python):
    process, port, output = start_serve(tmp_path, dict(os.environ), "--model", "bundled", "--dtype", "float32", grace=10, python=vllm_python)
    pgid = process_group_of(process, output)
    try:
        wait_for(lambda: process.poll() is not None or "Ready after" in output.read_text(), 600, "vLLM ready")
        assert process.poll() is None, output.read_text()
        assert VLLMServerClient(f"http://127.0.0.1:{port}").healthy()
        members = group_members(pgid)
        assert len(members) >= 3, members
        process.terminate()
        assert process.wait(60) == 0, output.read_text()
        assert_all_gone(pgid, port)
    finally:
        process.kill()
