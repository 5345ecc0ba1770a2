"""Several environment kinds in one run, as `textenv view` and the step log show them: each kind's episodes, mean
reward and accuracy in `step_summary` (the `steps.jsonl` line), a table per kind and a kind filter on the page
(headless Chromium, skipped only where it cannot start)."""

from __future__ import annotations

import pytest

from test_environment_kinds import CountdownKind, Counter
from test_view_browser import browser, open_page, shown  # noqa: F401 - the page fixtures
from textenv.environments import KIND_FIELD
from textenv.gym import GymScheduler, RegisteredEnvs, ScriptedPolicy, TrlEnvironments, read_completions
from textenv.view.data import load_run
from textenv.view.record import step_summary

ROWS = [
    {KIND_FIELD: "math", "problem": "2+2?", "solution": "4"},
    {KIND_FIELD: "math", "problem": "1+1?", "solution": "2"},
    {KIND_FIELD: "trl", "prompt": [{"role": "user", "content": "count"}]},
    {KIND_FIELD: "countdown", "turns": 2},
]


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """A completions.jsonl of one run that played three kinds (math: rewards 1 and 0; trl: 0.5; countdown: 2)."""
    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer()
    kinds = {"math": RegisteredEnvs("math_env"), "trl": TrlEnvironments(Counter), "countdown": CountdownKind()}
    scheduler = GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "The answer is \\boxed{4}"),
                             environments=kinds, max_turns=3)
    path = tmp_path_factory.mktemp("mixed") / "completions.jsonl"
    scheduler.run(ROWS, completions_path=path)
    return path


def test_the_step_summary_has_each_kinds_episodes_reward_and_accuracy(mixed_run):
    records = load_run(mixed_run).episodes
    assert sorted(record["env_kind"] for record in records) == ["countdown", "math", "math", "trl"]
    kinds = step_summary(records)["kinds"]
    assert kinds == {"math": {"episodes": 2, "reward_mean": 0.5, "accuracy": 0.5},
                     "trl": {"episodes": 1, "reward_mean": 0.5, "accuracy": 0.0},
                     "countdown": {"episodes": 1, "reward_mean": 2.0, "accuracy": 1.0}}
    assert "kinds" not in step_summary([{**record, "env_kind": None} for record in records])


def test_the_page_has_a_table_per_kind_and_a_kind_filter(open_page, mixed_run):  # noqa: F811
    page = open_page(mixed_run)
    rows = page.eval_on_selector_all("#env_kind-table tr", "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))")
    assert rows[0][:3] == ["environment kind", "episodes", "mean reward"]
    assert {row[0]: row[1] for row in rows[1:]} == {"math": "2", "trl": "1", "countdown": "1"}
    assert shown(page) == 4
    for kind, count in (("math", 2), ("trl", 1), ("countdown", 1)):
        page.select_option("#filter-kind", kind)
        assert shown(page) == count
    page.click("#filter-reset")
    assert shown(page) == 4
    assert len(read_completions(mixed_run)) == 4


def test_a_run_of_one_kind_has_no_kind_filter_nor_table(open_page, tmp_path):  # noqa: F811
    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer()
    path = tmp_path / "completions.jsonl"
    GymScheduler(tokenizer=tokenizer, policy=ScriptedPolicy(tokenizer, lambda context: "ok"), environments=CountdownKind()).run(
        [{"turns": 1}], completions_path=path)
    page = open_page(path)
    assert page.locator("#filter-kind").count() == 0 and page.locator("#env_kind-table").count() == 0
    assert shown(page) == 1
