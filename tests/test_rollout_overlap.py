"""Rollouts played ahead of training (`train(max_staleness=K)`, `textenv.training.overlap`): the serving gate,
the pipeline's admission bound, hand-over and stopping (with fake servers: these tests are about the pipeline's
logic; tests/test_vllm_overlap.py runs the same path on real vLLM servers), the loop's ``K=0`` identity with a
hand-written legacy loop on the tiny model, policy versions in every record, and the refusals.

Tolerances: none. Weights and statistics of ``K=0`` against the hand-written loop are compared exactly (the same
operations in the same order on the same inputs; only the wall-clock `time/` statistics differ); versions and
counts are integers.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from textenv.gym import GymScheduler, GymSource, read_completions
from textenv.training import Settings, TextEnvironmentSource, build_calculator_environment, build_policy, build_trainer, calculator_task_batches, train
from textenv.training.overlap import EpisodePipeline, staleness
from textenv.training.sources import EpisodeBatch
from textenv.vllm.gate import RolloutsStopped, ServingGate

SETTINGS = Settings(
    model="tiny", ppo_steps=3, batch_size=2, mini_batch_size=1, learning_rate=1e-3, lora_layers=1,
    max_new_tokens=4, max_turns=2, generation_batch_size=2,
)
MATH_ROWS = [{"problem": "What is 2+2?", "solution": "4"}, {"problem": "What is 3+4?", "solution": "7"}]


# ------------------------------------------------------------------------------------------------ the gate
def test_a_pause_waits_for_the_turn_in_flight_and_the_waiting_turn_gets_the_new_version():
    gate = ServingGate(version=0)
    release, versions, paused = threading.Event(), {}, threading.Event()

    def turn(name: str, hold: threading.Event | None = None) -> None:
        with gate.turn() as version:
            versions[name] = version
            if hold is not None:
                hold.wait(5)

    in_flight = threading.Thread(target=turn, args=("in flight", release))
    in_flight.start()
    while "in flight" not in versions:
        time.sleep(0.01)
    pauser = threading.Thread(target=lambda: (gate.pause(), paused.set()))
    pauser.start()
    time.sleep(0.1)
    assert not paused.is_set()  # the turn in flight holds the pause
    waiting = threading.Thread(target=turn, args=("waiting",))
    waiting.start()
    release.set()
    assert paused.wait(5)
    time.sleep(0.1)
    assert "waiting" not in versions  # no turn starts while the weights load
    gate.resume(1)
    for thread in (in_flight, pauser, waiting):
        thread.join(5)
    assert versions == {"in flight": 0, "waiting": 1}
    assert len(gate.pause_seconds) == 1 and gate.pause_seconds[0] >= 0.1
    assert gate.busy_seconds >= 0.1  # the turn in flight was held 0.1 s


def test_a_closed_gate_refuses_turns_until_reopened():
    gate = ServingGate(version=3)
    gate.close()
    with pytest.raises(RolloutsStopped):
        with gate.turn():
            pass
    gate.reopen()
    with gate.turn() as version:
        assert version == 3


# ------------------------------------------------------------------------------------------------ the pipeline
class FakeServers:
    """An engine with its own copy of the weights: turns pass its gate; `publish_weights` loads a version."""

    supports_overlap = True

    def __init__(self):
        self.gate = ServingGate()
        self.auto_sync = True
        self.published: list[int] = []

    @property
    def policy_version(self):
        return self.gate.version

    @policy_version.setter
    def policy_version(self, version):
        self.gate.version = version

    def prepare(self) -> None:
        pass

    def publish_weights(self, version: int) -> tuple[float, float]:
        pause = self.gate.pause()
        time.sleep(0.01)  # the sync
        self.published.append(version)
        self.gate.resume(version)
        return pause, 0.01


class TurnSource:
    """Plays `batch_size` episodes of `turns` turns each through the engine's gate; records, per step, the
    version the servers held when the batch was started. `fail_at`: the step whose batch raises."""

    def __init__(self, engine, turns=3, batch_size=2, turn_seconds=0.02, fail_at=None):
        self.scheduler = SimpleNamespace(engine=engine, policy=None)
        self.engine, self.turns, self.batch_size, self.turn_seconds, self.fail_at = engine, turns, batch_size, turn_seconds, fail_at
        self.started: dict[int, int] = {}
        self.drawn = 0

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def collect(self, step: int) -> EpisodeBatch:
        self.started[step] = self.engine.policy_version
        self.drawn += 1
        if step == self.fail_at:
            raise RuntimeError(f"batch {step} failed")
        episodes = [SimpleNamespace(turn_policy_versions=[]) for _ in range(self.batch_size)]
        for _ in range(self.turns):
            for episode in episodes:
                with self.engine.gate.turn() as version:
                    time.sleep(self.turn_seconds / self.batch_size)
                    episode.turn_policy_versions.append(version)
        one = [torch.tensor([1])] * self.batch_size
        return EpisodeBatch(one, one, [torch.tensor(float(step))] * self.batch_size, one, [""] * self.batch_size, [""] * self.batch_size, episodes)


def run_pipeline(max_staleness: int, steps: int = 6, train_seconds: float = 0.05, **source_options):
    engine = FakeServers()
    source = TurnSource(engine, **source_options)
    arrivals = []
    with EpisodePipeline(source, steps, max_staleness=max_staleness, batch_size=source.batch_size) as pipeline:
        for step in range(steps):
            arrivals.append(pipeline.next_batch(step))
            time.sleep(train_seconds)  # the trainer's step
            pipeline.publish(step + 1)
    return engine, source, arrivals, pipeline


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_no_batch_starts_before_its_bound_allows_and_no_turn_is_staler_than_k(max_staleness):
    engine, source, arrivals, _ = run_pipeline(max_staleness)
    assert [float(a.batch.scores[0]) for a in arrivals] == list(range(6))  # in order, each step's own batch
    assert all(version >= step - max_staleness for step, version in source.started.items())
    ages = [staleness(arrival.batch, step) for step, arrival in enumerate(arrivals)]
    assert max(age_max for _, age_max in ages) <= max_staleness
    assert any(version < step for step, version in source.started.items())  # batches were played ahead
    assert engine.published == list(range(1, 7)) and engine.auto_sync
    assert [a.source_state for a in arrivals] == [{"drawn": n} for n in range(1, 7)]


def test_an_episode_spanning_an_update_records_each_turns_version():
    _, _, arrivals, _ = run_pipeline(1, turns=6, turn_seconds=0.2, train_seconds=0.0)
    versions = [episode.turn_policy_versions for arrival in arrivals for episode in arrival.batch.episodes]
    assert any(len(set(turns)) > 1 for turns in versions)
    assert all(turns == sorted(turns) for turns in versions)


def test_a_failed_batch_reaches_the_trainer_and_nothing_hangs():
    engine = FakeServers()
    source = TurnSource(engine, fail_at=2)
    with EpisodePipeline(source, 5, max_staleness=1, batch_size=2) as pipeline:
        for step in range(2):
            pipeline.next_batch(step)
            pipeline.publish(step + 1)
        with pytest.raises(RuntimeError, match="batch 2 failed"):
            pipeline.next_batch(2)
    assert pipeline._thread is None and engine.auto_sync


def test_stopping_early_discards_and_counts_the_episodes_played_ahead():
    engine = FakeServers()
    source = TurnSource(engine, turns=2)
    pipeline = EpisodePipeline(source, 10, max_staleness=2, batch_size=2)
    pipeline.next_batch(0)
    time.sleep(0.5)  # batches 1 and 2 are played ahead (version 0 admits up to step 2)
    assert pipeline.close() == 4
    assert sorted(source.started) == [0, 1, 2]
    with engine.gate.turn() as version:  # the gate is open again for evaluations
        assert version == 0


def test_max_staleness_is_refused_when_negative_or_on_an_engine_that_cannot_overlap():
    engine = FakeServers()
    with pytest.raises(ValueError, match="max_staleness must be an integer >= 0"):
        EpisodePipeline(TurnSource(engine), 2, max_staleness=-1)
    engine.supports_overlap = False
    with pytest.raises(ValueError, match="max_staleness=1 needs rollouts on vLLM"):
        EpisodePipeline(TurnSource(engine), 2, max_staleness=1)


# ------------------------------------------------------------------------------------------------ the loop
def manual_legacy_loop(steps: int):
    """Legacy TRL's loop by hand: env.run, then trainer.step, step after step."""
    torch.manual_seed(0)
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    env = build_calculator_environment(model, tokenizer, SETTINGS)
    tasks = calculator_task_batches(SETTINGS.batch_size, seed=0)
    stats, texts = [], []
    for _ in range(steps):
        model.eval()
        queries, answers = next(tasks)
        query_tokens, responses, masks, rewards, histories = env.run(queries, answers=answers)
        stats.append(trainer.step(query_tokens, responses, [torch.tensor(float(r)) for r in rewards], masks))
        texts.append([history.text for history in histories])
    return model, stats, texts


def train_in_step(steps: int, **options):
    torch.manual_seed(0)
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    env = build_calculator_environment(model, tokenizer, SETTINGS)
    logs = train(trainer, TextEnvironmentSource(env, calculator_task_batches(SETTINGS.batch_size, seed=0)), steps, progress=False, **options)
    return model, logs


def without_times(stats: dict) -> dict:
    return {key: value for key, value in stats.items() if not key.startswith("time/")}


def test_max_staleness_0_is_the_legacy_loop_bit_for_bit():
    legacy_model, legacy_stats, legacy_texts = manual_legacy_loop(SETTINGS.ppo_steps)
    model, logs = train_in_step(SETTINGS.ppo_steps, max_staleness=0)
    assert [[h.text for h in log.batch.episodes] for log in logs] == legacy_texts
    for log, stats in zip(logs, legacy_stats):
        assert without_times(log.stats).keys() == without_times(stats).keys()
        for key, value in without_times(stats).items():
            assert torch.equal(torch.as_tensor(log.stats[key]), torch.as_tensor(value)), key
    for (name, trained), legacy in zip(model.named_parameters(), legacy_model.parameters()):
        assert torch.equal(trained, legacy), name
    assert all(log.staleness_max == 0 and log.wait_seconds == 0 and log.pause_seconds == 0 for log in logs)


def test_the_in_process_engine_refuses_max_staleness_naming_the_option():
    with pytest.raises(ValueError, match="max_staleness=1 needs rollouts on vLLM"):
        train_in_step(1, max_staleness=1)


def test_every_turn_records_the_version_of_its_weights_in_histories_and_logs(tmp_path):
    torch.manual_seed(0)
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    scheduler = GymScheduler(model, tokenizer, gym_env="math_env", max_turns=2, loss_scale="all", generation_kwargs={"max_new_tokens": 4, "do_sample": True})
    source = GymSource(scheduler, MATH_ROWS, SETTINGS.batch_size, completions_path=tmp_path / "completions.jsonl")
    logs = train(trainer, source, 2, progress=False, run_dir=tmp_path)
    for log in logs:
        for episode in log.batch.episodes:
            assert episode.turn_policy_versions == [log.step] * episode.num_turns
            assert episode.history.policy_versions == [log.step] * episode.num_turns  # loss_scale "all": every turn trained
    lines = read_completions(tmp_path / "completions.jsonl")
    assert [line["turn_policy_versions"] for line in lines] == [[line["step"]] * line["num_turns"] for line in lines]
    records = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert records and all(record["policy_versions"] == [record["step"]] * len(record["policy_versions"]) for record in records)
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(s["staleness_max"], s["wait_seconds"], s["pause_seconds"]) for s in steps] == [(0, 0.0, 0.0)] * 2


def test_textenv_train_refuses_a_negative_max_staleness():
    from textenv.cli import run_command

    with pytest.raises(ValueError, match="--max_staleness must be >= 0"):
        run_command(["train", "--model", "tiny", "--max_staleness", "-1", "--steps", "2", "--batch_size", "2", "--mini_batch_size", "1"])
