"""The adapter contract (`textenv.environments.kind`): every kind the Gym scheduler plays meets `EnvironmentKind`,
a kind written outside textenv plays through it alone, and several kinds share one run, routed by `env_kind`."""

import contextlib

import pytest

from textenv.environments import KIND_FIELD, EnvironmentKind, RoutedKinds, SimpleKind
from textenv.gym import Env, GymScheduler, RegisteredEnvs, ScriptedPolicy, TrlEnvironments, read_completions


class Counter:
    """A TRL environment: no tools, a reward of 0.5."""

    def reset(self, **row):
        return None

    def get_reward(self):
        return 0.5


class CountdownEnv(Env):
    """Observation "left N"; done after env_config["turns"] steps; reward 1 per step."""

    async def reset(self, config):
        self.left = self.env_config.get("turns", 2)
        return f"left {self.left}", {}, None

    async def step(self, action):
        self.left -= 1
        return f"left {self.left}", 1.0, self.left == 0, {}

    async def close(self):
        return None


class CountdownKind(SimpleKind):
    """A kind written outside textenv: records when its run's serving starts and ends, refuses a concurrency."""

    kind = "countdown"

    def __init__(self, most_sessions=64):
        self.events = []
        self.most_sessions = most_sessions

    def env_name(self, row):
        return "countdown"

    def adapter(self, row, index):
        self.events.append(("adapter", index))
        return CountdownEnv({"turns": row.get("turns", 2)})

    @contextlib.asynccontextmanager
    async def _serving(self):
        self.events.append("serving")
        try:
            yield
        finally:
            self.events.append("stopped")

    def serving(self):
        return self._serving()

    def check(self, max_concurrency, num_generations):
        if max_concurrency > self.most_sessions:
            raise ValueError(f"max_concurrency={max_concurrency} is over the {self.most_sessions} sessions the server allows; pass max_concurrency <= {self.most_sessions}.")


def policy(tokenizer):
    return ScriptedPolicy(tokenizer, lambda context: "ok")


def test_every_kind_textenv_ships_meets_the_contract():
    kinds = [RegisteredEnvs("math_env"), TrlEnvironments(Counter), CountdownKind()]
    assert all(isinstance(kind, EnvironmentKind) for kind in kinds)
    assert [kind.kind for kind in kinds] == ["gym", "trl", "countdown"]
    assert not isinstance(object(), EnvironmentKind)


def test_a_kind_written_outside_textenv_plays_its_rows_between_serving_and_its_end(tokenizer):
    kind = CountdownKind()
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy(tokenizer), environments=kind, max_concurrency=1)
    episodes = scheduler.run([{"turns": 1}, {"turns": 3}])
    assert [episode.num_turns for episode in episodes] == [1, 3]
    assert [episode.total_reward for episode in episodes] == [1.0, 3.0]
    assert {episode.env_kind for episode in episodes} == {"countdown"}
    assert kind.events == ["serving", ("adapter", 0), ("adapter", 1), "stopped"]


def test_a_kinds_check_refuses_the_run_before_any_episode(tokenizer):
    kind = CountdownKind(most_sessions=2)
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy(tokenizer), environments=kind, max_concurrency=4)
    with pytest.raises(ValueError, match="max_concurrency=4 is over the 2 sessions"):
        scheduler.run([{"turns": 1}])
    assert kind.events == []


def test_gym_trl_and_an_outside_kind_share_one_run_routed_by_env_kind(tokenizer, tmp_path):
    countdown = CountdownKind()
    kinds = {"math": RegisteredEnvs("math_env"), "trl": TrlEnvironments(Counter), "countdown": countdown}
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "The answer is \\boxed{4}"),
                             environments=kinds, max_turns=3)
    rows = [
        {KIND_FIELD: "math", "problem": "2+2?", "solution": "4"},
        {KIND_FIELD: "trl", "prompt": [{"role": "user", "content": "count"}]},
        {KIND_FIELD: "countdown", "turns": 2},
        {KIND_FIELD: "math", "problem": "1+1?", "solution": "2"},
    ]
    log = tmp_path / "completions.jsonl"
    episodes = scheduler.run(rows, completions_path=log)
    assert [episode.env_kind for episode in episodes] == ["math", "trl", "countdown", "math"]
    assert [episode.total_reward for episode in episodes] == [1.0, 0.5, 2.0, 0.0]
    assert all(not episode.errors for episode in episodes)
    stats = scheduler.stats.kinds
    assert {name: (counts.episodes, counts.total_reward) for name, counts in stats.items()} == {"math": (2, 1.0), "trl": (1, 0.5), "countdown": (1, 2.0)}
    assert stats["math"].mean_reward == 0.5
    assert sorted(record["env_kind"] for record in read_completions(log)) == ["countdown", "math", "math", "trl"]
    assert countdown.events[0] == "serving" and countdown.events[-1] == "stopped"


def test_a_row_that_names_no_known_kind_ends_only_its_episode_with_the_fix(tokenizer):
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy(tokenizer), environments={"countdown": CountdownKind()})
    episodes = scheduler.run([{KIND_FIELD: "countdown", "turns": 1}, {KIND_FIELD: "chess"}, {"turns": 1}])
    assert [episode.finish_reason for episode in episodes] == ["done", "error", "error"]
    assert episodes[1].errors[0]["stage"] == "config"
    assert "env_kind='chess'" in episodes[1].errors[0]["message"] and "['countdown']" in episodes[1].errors[0]["message"]
    assert "has no 'env_kind' column" in episodes[2].errors[0]["message"]
    assert scheduler.stats.kinds["chess"].errors == 1


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(environments=object()), TypeError, "environments: a object is not an environment kind"),
        (dict(environments={}), ValueError, "the dict is empty"),
        (dict(environments={"a": "math_env"}), TypeError, r"environments\['a'\] is a str"),
        (dict(environments=CountdownKind(), gym_env="math_env"), ValueError, "leave gym_env, environment_factory and verifiers_env out"),
    ],
)
def test_bad_environments_are_refused_with_the_fix(tokenizer, kwargs, error, message):
    with pytest.raises(error, match=message):
        GymScheduler(tokenizer=tokenizer, policy=policy(tokenizer), **kwargs)


def test_routed_kinds_serve_every_kind_and_stop_them_all_when_one_fails_to_start(tokenizer):
    class Broken(CountdownKind):
        @contextlib.asynccontextmanager
        async def _serving(self):
            raise RuntimeError("the server did not start")
            yield

    first = CountdownKind()
    routed = RoutedKinds({"first": first, "broken": Broken()})
    scheduler = GymScheduler(tokenizer=tokenizer, policy=policy(tokenizer), environments=routed)
    with pytest.raises(RuntimeError, match="did not start"):
        scheduler.run([{KIND_FIELD: "first"}])
    assert first.events == ["serving", "stopped"]


def test_a_batch_of_several_kinds_logs_each_kinds_mean_reward():
    from types import SimpleNamespace

    import torch

    from textenv.gym import GymEpisode
    from textenv.training.loop import kind_rewards

    episodes = [GymEpisode(row_index=i, env_kind=kind) for i, kind in enumerate(["math", "math", "game"])]
    batch = SimpleNamespace(episodes=episodes, scores=[torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.25)])
    assert kind_rewards(batch) == {"math": 0.5, "game": 0.25}
    one_kind = SimpleNamespace(episodes=episodes[:2], scores=batch.scores[:2])
    assert kind_rewards(one_kind) == {}
