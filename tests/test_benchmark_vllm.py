"""`benchmarks/run.py --engine vllm` without a server: the third side's command lines (the server's URL and
process id, no --bf16), the rotated order, the gym's vLLM modes, and the report of recorded results (the
vLLM rows, their decoding path, token equality against legacy and the in-process engine, the one-time
costs printed apart). Also the server's CPU accounting, on a process group of its own."""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from textenv.engine.fast_path import LOOP
from textenv.vllm.engine import VLLMPath

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402
import run  # noqa: E402
import vllm_bench  # noqa: E402

URL = "http://127.0.0.1:8011"
VLLM_PATH = str(VLLMPath((URL,)))
SERVER = {"url": URL, "pid": 4321, "dtype": "float32", "startup_seconds": 95.0, "version": "vLLM 0.32.0"}


def test_the_vllm_side_runs_textenv_on_the_server_in_turn(monkeypatch):
    calls = []
    monkeypatch.setattr(run, "run_side", lambda side, workload, inputs, extra, threads: calls.append(extra) or {"extra": extra})
    sides = {"legacy": ("legacy-python", Path("legacy_side.py")), "textenv": ("python", Path("textenv_side.py"))}
    results = run.measure("rollout", sides, Path("inputs.json"), repeats=3, threads=1, bf16=True, server=SERVER)

    assert list(results) == ["legacy", "textenv", "vllm"]
    assert results["vllm"][0]["extra"] == ["--max-turns", "4", "--vllm-url", URL, "--vllm-pid", "4321"]  # no --bf16
    assert results["textenv"][0]["extra"] == ["--max-turns", "4", "--bf16"]
    firsts = [calls[index] for index in (0, 3, 6)]  # the side that opens each repeat
    assert firsts == [results["legacy"][0]["extra"], results["textenv"][0]["extra"], results["vllm"][0]["extra"]]


def test_the_gym_runs_both_front_ends_on_the_server(monkeypatch):
    calls = []
    monkeypatch.setattr(run, "run_side", lambda side, workload, inputs, extra, threads: calls.append(extra) or {})
    results = run.measure_gym(repeats=1, threads=1, script="chat", episodes=2, turns=1, server=SERVER)

    assert [mode for mode in results if isinstance(results[mode], list)] == ["naive", "scheduler", "text-env", "scheduler-vllm", "text-env-vllm", "client-loop"]
    on_vllm = [extra for extra in calls if "--vllm-url" in extra]
    assert [extra[1] for extra in on_vllm] == ["scheduler", "text-env", "client-loop"]
    assert all(extra[extra.index("--vllm-url") + 1] == URL for extra in on_vllm)


def episode(*model_turns):
    segments = [{"system": False, "ids": ids} for ids in model_turns]
    return {"segments": segments, "query_length": 3, "completed": True}


def rollout_result(path, episodes, seconds=2.0, **extra):
    run_record = {"max_turns": 4, "seconds": seconds, "seconds_cpu": 2 * seconds, "generated_tokens": 40, "turns": None, "episodes": episodes}
    return {"runs": [run_record], "peak_rss_mb": 900.0, "decoding_path": path, "versions": {}, **extra}


def recorded_run():
    legacy = [episode([5, 6], [7, 2]), episode([8, 9])]
    vllm = [episode([5, 6], [7, 2]), episode([8, 10])]  # the second episode differs from both others
    on_vllm = rollout_result(VLLM_PATH, vllm, seconds=1.0, sync_seconds=[0.7], prepare_seconds=1.5)
    on_vllm["runs"][0]["server_rss_mb"] = 2500.0
    return {
        "settings": {"engine": "vllm", "vllm_dtype": "float32", "rollout_queries": 2, "quick": False, "bf16": False, "threads": 2, "repeats": 1},
        "vllm": SERVER,
        "rollout": {"legacy": [rollout_result(None, legacy, seconds=4.0)], "textenv": [rollout_result(LOOP, legacy)], "vllm": [on_vllm]},
    }


def test_the_report_prints_the_vllm_rows_with_their_path_and_token_checks():
    args = argparse.Namespace(workloads=["rollout"], bf16=False, threads=2, quick=False, repeats=1)
    text = run.render(recorded_run(), 1, args)
    rows = [line for line in text.splitlines() if line.startswith("| rollout")]

    assert rows[0].startswith("| rollout (2 episodes, max_turns 4) |") and rows[0].endswith(f"| {LOOP} |")
    assert rows[1].startswith("| rollout (2 episodes, max_turns 4) on vLLM |") and rows[1].endswith("| vLLM server |")
    assert "| **4.00x** |" in rows[1]  # legacy 4 s against 1 s on vLLM
    assert "- rollout on vLLM against legacy: 1/2 episodes token-identical" in text
    assert "- rollout on vLLM against textenv's in-process engine: 1/2 episodes token-identical" in text
    assert f"- rollout on vLLM: {VLLM_PATH}" in text
    assert "--engine vllm" in text and "--rollout-queries 2" in text and "the vLLM server in float32" in text
    assert "ready after 95 s" in text and "the first weight sync took 0.70 s" in text and "2500 MiB" in text


def test_the_gym_table_has_a_row_on_vllm():
    def mode(path, replies, seconds):
        return [{"seconds": seconds, "tokens_per_second": 10 / seconds, "generated_tokens": 10, "turns": 2, "peak_rss_mb": 800.0,
                 "decoding_path": path, "replies": replies}]

    same, other = [[[1, 2]], [[3, 2]]], [[[1, 2]], [[4, 2]]]
    results = {"naive": mode("transformers generate", same, 4.0), "scheduler": mode(LOOP, same, 2.0), "text-env": mode(LOOP, same, 2.0),
               "scheduler-vllm": mode(VLLM_PATH, other, 1.0), "text-env-vllm": mode(VLLM_PATH, other, 1.0)}
    table = report.gym_table(results, episodes=2, turns=1)
    row = next(line for line in table.splitlines() if "on vLLM |" in line)

    assert row.endswith("| vLLM server / vLLM server |")
    assert "| **4.00x** |" in row
    assert "against the in-process GymScheduler: 1/2, against the naive loop: 1/2" in table
    assert "TextEnvironment on vLLM against GymScheduler on vLLM: 2/2" in table


def test_server_usage_counts_the_process_group():
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"
    process = subprocess.Popen([sys.executable, "-c", burn], start_new_session=True)
    try:
        deadline = time.time() + 20
        while vllm_bench.server_usage(process.pid)[0] < 0.25 and time.time() < deadline:
            time.sleep(0.1)
        cpu, rss = vllm_bench.server_usage(process.pid)
        assert 0.25 <= cpu < 5
        assert 1 < rss < 1000
        assert vllm_bench.server_usage(-1) == (0.0, 0.0)  # no such group
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("repeat, order", [(0, ["a", "b", "c"]), (1, ["b", "c", "a"]), (5, ["c", "a", "b"])])
def test_rotated(repeat, order):
    assert run.rotated(["a", "b", "c"], repeat) == order


# ------------------------------------------------------------------------------ textenv against a plain client loop
def test_the_gym_adds_the_plain_client_loop_on_the_server(monkeypatch):
    calls = []
    monkeypatch.setattr(run, "run_side", lambda side, workload, inputs, extra, threads: calls.append(extra) or {})
    results = run.measure_gym(repeats=1, threads=1, script="chat", episodes=2, turns=1, server=SERVER)

    assert [mode for mode in results if isinstance(results[mode], list)] == [*run.GYM_MODES, *run.GYM_VLLM_MODES, "client-loop"]
    loop = next(extra for extra in calls if extra[1] == "client-loop")
    assert loop[-4:] == ["--vllm-url", URL, "--vllm-pid", "4321"]  # the same server; its CPU time is recorded
    assert all("--vllm-pid" not in extra for extra in calls if extra[1] in run.GYM_MODES and "--vllm-url" not in extra)


def test_the_gym_modes_can_be_textenv_on_vllm_and_the_client_loop_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(run, "run_side", lambda side, workload, inputs, extra, threads: calls.append(extra) or {})
    results = run.measure_gym(repeats=2, threads=1, script="chat", episodes=8, turns=3, server={"url": URL}, modes=["scheduler-vllm", "client-loop"],
                              max_new_tokens=64)

    assert [extra[1] for extra in calls] == ["scheduler", "client-loop", "client-loop", "scheduler"]  # alternated
    assert all(extra[-2:] == ["--vllm-url", URL] for extra in calls)  # a server without a pid: no CPU accounting
    assert all(extra[extra.index("--max-new-tokens") + 1] == "64" for extra in calls)
    assert results["max_new_tokens"] == 64
    with pytest.raises(ValueError, match="need a vLLM server"):
        run.measure_gym(repeats=1, threads=1, script="chat", modes=["client-loop"])


def test_the_client_loop_table_puts_textenv_on_vllm_beside_the_loop():
    def mode(replies, seconds, **extra):
        return [{"seconds": s, "tokens_per_second": 10 / s, "generated_tokens": 10, "turns": 2, "peak_rss_mb": 800.0, "replies": replies, **extra}
                for s in seconds]

    same, other = [[[1, 2]], [[3, 2]]], [[[1, 2]], [[4, 2]]]
    raw = {
        "settings": {"engine": "vllm", "vllm_dtype": "float32", "quick": False, "bf16": False, "threads": 2, "repeats": 3},
        "vllm": SERVER,
        "gym": {"client-loop": mode(same, [4.0, 5.0, 6.0], client_seconds_cpu=0.2, server_seconds_cpu=9.0),
                "scheduler-vllm": mode(other, [4.0, 4.5, 9.0], client_seconds_cpu=1.5, server_seconds_cpu=8.0, sync_seconds=[0.7], prepare_seconds=1.5),
                "script": "chat", "episodes": 2, "turns": 1, "max_new_tokens": 32},
    }
    args = argparse.Namespace(workloads=["gym"], bf16=False, threads=2, quick=False, repeats=3)
    text = run.render(raw, run.saved_repeats(raw), args)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line}
    loop = next(row for label, row in rows.items() if "client loop" in label)
    textenv = next(row for label, row in rows.items() if "GymScheduler on vLLM" in label)

    assert loop[1:3] == ["5.0", "4.0, 5.0, 6.0"] and loop[5] == "1"
    assert textenv[1] == "4.5" and textenv[5] == "**0.900**"  # medians: 4.5 s against 5.0 s
    assert textenv[6:8] == ["1.5", "8.0"] and textenv[8].strip(" |") == "1/2"
    assert "3 alternated run(s) per side, each on an emptied prefix cache" in text
    assert "--gym-modes scheduler-vllm client-loop" in text and "| naive" not in text  # no in-process sides, no gym table


@pytest.fixture(scope="module")
def a_server():
    """A running vLLM server of the bundled model (tests/vllm_servers.py: shared by the session's modules)."""
    from tests.vllm_servers import bundled_servers

    return bundled_servers(1)[0]


@pytest.mark.slow
def test_the_client_loop_and_textenv_play_the_same_episodes_on_a_server(a_server):
    """Both sides for real, at a tiny size, on one server: the same token ids turn after turn."""
    process = getattr(a_server, "process", None)
    record = {"url": a_server.url, "pid": process.pid if process is not None else None}
    results = run.measure_gym(repeats=1, threads=1, script="chat", episodes=2, turns=2, server=record,
                              modes=["scheduler-vllm", "client-loop"], max_new_tokens=16)
    loop, textenv = results["client-loop"][0], results["scheduler-vllm"][0]

    assert loop["turns"] == textenv["turns"] == 4
    assert loop["replies"] == textenv["replies"] and loop["generated_tokens"] > 4
    assert loop["decoding_path"].startswith("vLLM /v1/chat/completions") and textenv["decoding_path"] == str(VLLMPath((a_server.url,)))
    assert loop["client_seconds_cpu"] >= 0 and ("server_seconds_cpu" in loop) == (process is not None)
    assert "| 2/2 |" in vllm_bench.client_loop_table(results, 2, 2)


def test_the_vllm_engine_has_as_many_requests_in_flight_as_its_batch_size(tiny_model, tokenizer):
    """The front ends set the engine's `batch_size` to theirs before each run (64 episodes: 64 requests in flight, as
    the client loop's 64 threads); the request threads follow it, whatever size the engine was made with."""
    import threading

    from textenv.vllm.client import ServedTurn
    from textenv.vllm.engine import VLLMEngine

    class CountingClient:
        url, mode = "http://fake", "server"

        def __init__(self):
            self.in_flight, self.most, self.lock = 0, 0, threading.Lock()

        def complete(self, prompt_ids, sampling):
            with self.lock:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            time.sleep(0.2)
            with self.lock:
                self.in_flight -= 1
            return ServedTurn([5, tokenizer.eos_token_id], [-0.5, -0.25], "eos")

    client = CountingClient()
    engine = VLLMEngine(tiny_model, tokenizer, [client], batch_size=2, sync_weights=False, check_model=False)
    contexts = [torch.tensor([1, 2, 3])] * 6
    try:
        engine.generate_batch(contexts, generation_kwargs={"max_new_tokens": 2})
        assert client.most == 2
        engine.batch_size = 6
        client.most = 0
        completions = engine.generate_batch(contexts, generation_kwargs={"max_new_tokens": 2})
        assert client.most == 6 and [c.token_ids.tolist() for c in completions] == [[5, tokenizer.eos_token_id]] * 6
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate_batch(contexts)
