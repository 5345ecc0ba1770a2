"""Kinds of different libraries in one run (TRL's dict form and a row column): a classic verifiers environment
whose rubric scores each row's episodes together, an OpenEnv environment served by textenv, and registered Gym
envs, routed by each row's `env_kind`; the verifiers groups are scored as verifiers does while the other kinds'
episodes finish on their own, and the counts are per kind."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv", reason="neither openenv (textenv[openenv]) nor openenv-core is installed")
pytest.importorskip("verifiers.legacy", reason="the classic verifiers tests need verifiers 0.3 (textenv[verifiers])")

from textenv.environments import KIND_FIELD, OpenEnvEnvironments  # noqa: E402
from textenv.environments.choice import verifiers_kind  # noqa: E402
from textenv.gym import GymScheduler, RegisteredEnvs, ScriptedPolicy  # noqa: E402
from tests.test_verifiers_adapter import guess_env  # noqa: E402


def test_verifiers_openenv_and_gym_rows_share_a_run_each_scored_by_its_own_kind(tokenizer):
    verifiers = guess_env()  # answers 7 and 3; solved_reward + 0.5 x the group's fewest guesses
    rows = [{**row, KIND_FIELD: "verifiers"} for row in verifiers.get_dataset()]
    rows += [{KIND_FIELD: "openenv", "secret": 7}, {KIND_FIELD: "math", "problem": "3+4?", "solution": "7"}]
    kinds = {"verifiers": verifiers_kind(verifiers), "openenv": OpenEnvEnvironments(app="openenv_fixtures.guess:app", max_sessions=8),
             "math": RegisteredEnvs("math_env")}
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "7"), environments=kinds, max_concurrency=8)
    episodes = scheduler.run(rows, num_generations=2)
    assert [episode.errors for episode in episodes] == [[]] * 8
    got = [(episode.env_kind, episode.total_reward, episode.num_turns) for episode in episodes]
    # verifiers asks the model once more after "Correct!" (its stop conditions run before env_response), as in its own loop
    assert got == [("verifiers", 1.5, 2)] * 2 + [("verifiers", 0.5, 4)] * 2 + [("openenv", 1.0, 1)] * 2 + [("math", 1.0, 1)] * 2
    assert all("metrics" in episode.trajectory_infos[-1] for episode in episodes[:4])  # verifiers' rubric scored them
    assert {name: (counts.episodes, counts.total_reward) for name, counts in scheduler.stats.kinds.items()} == {
        "verifiers": (4, 4.0), "openenv": (2, 2.0), "math": (2, 2.0)}


def test_a_verifiers_kind_among_others_refuses_a_run_wide_max_turns(tokenizer):
    kinds = {"verifiers": verifiers_kind(guess_env()), "math": RegisteredEnvs("math_env")}
    with pytest.raises(ValueError, match="max_turns=3 with a verifiers kind among environments"):
        GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "7"), environments=kinds, max_turns=3)
