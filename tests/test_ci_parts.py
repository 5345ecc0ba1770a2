"""`.ci/test-parts`, which `make test` runs: the two halves at once (the main one at one torch thread), the vLLM
part as soon as either ends, each
part's time and log, a non-zero exit when any part fails, and every part stopped on Ctrl-C or SIGTERM. A stand-in
for `make` (a script that records when each part starts and ends) takes the place of the real suites."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "test-parts"

# Called as `make --no-print-directory TARGET [VAR=VALUE]`: records "start/end TARGET ARGS" and sleeps as asked.
FAKE_MAKE = """#!/usr/bin/env bash
shift
target=$1; shift
echo "start $target $* (threads ${OMP_NUM_THREADS:-default})" >>"$EVENTS"
seconds_var="SECONDS_${target//-/_}"; status_var="STATUS_${target//-/_}"
sleep "${!seconds_var:-0}"
echo "output of $target"
echo "end $target" >>"$EVENTS"
exit "${!status_var:-0}"
"""


@pytest.fixture
def fake_checkout(tmp_path):
    """A checkout holding the script and, unless removed, the stamp saying .venv-vllm was built."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "test-parts").write_bytes(SCRIPT.read_bytes())
    (tmp_path / ".ci" / "test-parts").chmod(0o755)
    (tmp_path / ".venv-vllm").mkdir()
    (tmp_path / ".venv-vllm" / ".textenv-installed").touch()
    fake = tmp_path / "fake-make"
    fake.write_text(FAKE_MAKE)
    fake.chmod(0o755)
    return tmp_path


def run_parts(checkout: Path, **settings: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    environment = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}  # as make test's own
    environment.update(MAKE=str(checkout / "fake-make"), EVENTS=str(checkout / "events"), **settings)
    completed = subprocess.run([str(checkout / ".ci" / "test-parts")], env=environment, capture_output=True, text=True, timeout=60)
    return completed, (checkout / "events").read_text().splitlines()


def test_the_vllm_part_starts_when_the_first_half_ends_and_all_pass(fake_checkout):
    completed, events = run_parts(fake_checkout, SECONDS_test_main="2", SECONDS_test_lower="0.2", SECONDS_test_vllm="0.2")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    # the main half at one torch thread (the lower half's recipe sets its own)
    assert sorted(events[:2]) == ["start test-lower LOWER_ARGS=--without-vllm (threads default)",
                                  "start test-main MAIN_ARGS=--main-half --without-vllm (threads 1)"]
    assert events[2:] == ["end test-lower", "start test-vllm  (threads default)", "end test-vllm", "end test-main"]
    for part in ("main", "lower", "vllm"):
        assert (fake_checkout / "test-logs" / f"{part}.log").read_text().strip() == f"output of test-{part}"
    assert re.search(r"== lower: passed in 0 min 0[01] s \(log: test-logs/lower.log\)", completed.stdout)
    assert "======== main: passed; lower: passed; vllm: passed" in completed.stdout


def test_a_failed_part_fails_the_run_and_is_named(fake_checkout):
    completed, events = run_parts(fake_checkout, STATUS_test_vllm="1")
    assert completed.returncode == 1
    assert "======== main: passed; lower: passed; vllm: FAILED" in completed.stdout
    assert "output of test-vllm" in completed.stdout  # its log is printed


def test_without_the_vllm_environment_the_halves_keep_its_modules(fake_checkout):
    (fake_checkout / ".venv-vllm" / ".textenv-installed").unlink()
    completed, events = run_parts(fake_checkout)
    assert completed.returncode == 0
    assert sorted(event for event in events if event.startswith("start")) == [
        "start test-lower LOWER_ARGS= (threads default)", "start test-main MAIN_ARGS=--main-half  (threads 1)"]
    assert "vLLM could not be installed" in completed.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_stops_every_part(fake_checkout, signum):
    environment = {**os.environ, "MAKE": str(fake_checkout / "fake-make"), "EVENTS": str(fake_checkout / "events"),
                   "SECONDS_test_main": "300", "SECONDS_test_lower": "300"}
    process = subprocess.Popen([str(fake_checkout / ".ci" / "test-parts")], env=environment, stdout=subprocess.DEVNULL,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    deadline = time.monotonic() + 20
    while len(psutil.Process(process.pid).children(recursive=True)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)  # two parts, each a fake make and its sleep
    parts = psutil.Process(process.pid).children(recursive=True)
    assert len(parts) >= 4
    process.send_signal(signum)
    assert process.wait(10) == 130
    gone, alive = psutil.wait_procs(parts, timeout=10)
    assert not alive, f"parts left running: {alive}"
