"""The main job's code path (`textenv demo --quick` on the tiny random model) and the training helpers."""

import re
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from textenv import demo, training
from textenv.tasks import calculator as task
from textenv.view import load_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_quick_demo_writes_the_curve_and_prints_the_accuracy_table(tmp_path, capsys):
    result = demo.main(["--quick", "--model", "tiny", "--output-dir", str(tmp_path), "--show", "1", "--no-progress"])
    out = capsys.readouterr().out

    curve = tmp_path / "reward_curve.png"
    assert curve.read_bytes()[:8] == PNG_MAGIC
    assert result["reward_curve"] == str(curve)
    assert len(result["train_rewards"]) == demo.QUICK_SETTINGS.ppo_steps
    for mode in ("sampled (temperature 1)", "greedy"):
        assert re.search(rf"^{re.escape(mode)}\s+\d+\.\d% ->\s+\d+\.\d%\s+\([+-]\d+\.\d points\)$", out, re.M), out
    assert f"held-out accuracy on {demo.QUICK_SETTINGS.eval_tasks} tasks" in out
    assert re.search(r"wall time: .* peak memory: \d+ MiB", out)
    assert "Reward:" in out  # episodes were shown with show_text
    for key in ("sampled_before", "sampled_after", "greedy_before", "greedy_after"):
        assert 0.0 <= result[key] <= 1.0
    # the run directory textenv view shows: every training and held-out episode, every step
    run = load_run(tmp_path)
    tasks, steps = demo.QUICK_SETTINGS.eval_tasks, demo.QUICK_SETTINGS.ppo_steps
    phases = Counter(episode["phase"] for episode in run.episodes)
    assert phases == {"train": steps * demo.QUICK_SETTINGS.batch_size, **{f"eval-{when}-{mode}": tasks for when in ("before", "after") for mode in ("sampled", "greedy")}}
    assert {episode["step"] for episode in run.episodes if episode["phase"].startswith("eval-after")} == {steps}
    assert [line["step"] for line in run.steps] == list(range(steps))
    assert f"textenv view {tmp_path}" in out


def test_quick_demo_with_json_tool_calls(tmp_path, capsys):
    result = demo.main(["--quick", "--model", "tiny", "--tool-format", "json", "--output-dir", str(tmp_path), "--show", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert "tool calls as json" in out and "<tools>" in out and '"name": "Calculator"' in out
    assert len(result["train_rewards"]) == demo.QUICK_SETTINGS.ppo_steps


def test_json_tool_format_settings():
    settings, _, _ = demo.parse(["--tool-format", "json"])
    assert settings.tool_format == "json" and settings.max_new_tokens == 48  # a JSON call needs about 34 tokens
    assert settings.ppo_steps == demo.DEMO_SETTINGS.ppo_steps and demo.parse([])[0].tool_format == "tags"
    assert demo.parse([])[0].max_new_tokens == 24


def test_small_env_var_selects_the_quick_settings(monkeypatch):
    monkeypatch.delenv(demo.SMALL_ENV_VAR, raising=False)
    assert demo.parse([])[0] == demo.DEMO_SETTINGS
    monkeypatch.setenv(demo.SMALL_ENV_VAR, "1")
    assert demo.parse([])[0] == demo.QUICK_SETTINGS
    monkeypatch.setenv(demo.SMALL_ENV_VAR, "0")
    assert demo.parse([])[0] == demo.DEMO_SETTINGS


def test_demo_options_override_its_settings_and_share_the_other_commands_spellings(tmp_path, monkeypatch):
    monkeypatch.delenv(demo.SMALL_ENV_VAR, raising=False)
    settings, args, command = demo.parse(["--quick", "--ppo_steps", "3", "--max-turns", "4", "--model", "tiny", "--budget-minutes", "5", "--log_level", "warning"])
    assert (settings.ppo_steps, settings.max_turns, settings.model) == (3, 4, "tiny")
    assert settings.batch_size == demo.QUICK_SETTINGS.batch_size  # the rest stays quick
    assert args.budget_minutes == 5 and command.log_level == "warning"
    config = tmp_path / "demo.yaml"
    config.write_text("learning_rate: 0.001\nlora_rank: 4\n")
    settings, _, _ = demo.parse(["--config", str(config), "--lora_rank", "8"])
    assert settings.learning_rate == 0.001 and settings.lora_rank == 8
    with pytest.raises(ValueError, match="--tool_format must be one of"):
        demo.parse(["--tool_format", "xml"])


def test_demo_evaluates_100_held_out_tasks():
    assert demo.DEMO_SETTINGS.eval_tasks == 100
    assert demo.DEMO_SETTINGS.threads == 2


def test_training_tasks_never_repeat_held_out_tasks():
    held_out, _ = task.generate_tasks(2000, seed=1234)  # about a quarter of all 7500 tasks
    batches = training.calculator_task_batches(64, seed=0, exclude=held_out)
    seen = set()
    for _ in range(20):
        queries, answers = next(batches)
        assert len(queries) == len(answers) == 64
        assert not set(queries) & set(held_out)
        seen.update(queries)
    assert len(seen) > 500  # really random, not one batch repeated


def test_training_task_answers_match_the_questions():
    queries, answers = next(training.calculator_task_batches(50, seed=3))
    for query, answer in zip(queries, answers):
        expression = re.search(r"What is (\d+[-+*]\d+)\?", query).group(1)
        assert eval(expression) == answer  # noqa: S307 - digits and one operator, from the regex


def test_training_task_batches_are_reproducible():
    first = next(training.calculator_task_batches(8, seed=5))
    again = next(training.calculator_task_batches(8, seed=5))
    other = next(training.calculator_task_batches(8, seed=6))
    assert first == again
    assert first != other


def test_evaluate_switches_decoding_and_restores_the_environment(tokenizer):
    settings = replace(demo.QUICK_SETTINGS, model="tiny", max_new_tokens=4, max_turns=1)
    model, _ = training.build_policy(settings)
    env = training.build_calculator_environment(model, tokenizer, settings)
    original = dict(env.generation_kwargs)
    queries, answers = task.generate_tasks(2, seed=0)

    seen = []
    generate = env.generate

    def spy(histories):
        seen.append(dict(env.generation_kwargs))
        return generate(histories)

    env.generate = spy
    greedy = training.evaluate(env, queries, answers, sample=False)
    sampled = training.evaluate(env, queries, answers, sample=True)

    assert seen[0]["do_sample"] is False and seen[-1]["do_sample"] is True
    assert seen[-1]["top_k"] == 0 and seen[-1]["top_p"] == 1.0 and seen[-1]["temperature"] == 1.0
    assert env.generation_kwargs == original
    assert len(greedy.histories) == len(sampled.rewards) == 2
    assert greedy.accuracy == sum(greedy.rewards) / 2


def test_lora_config_adapts_only_the_top_layers():
    config = training.lora_config(rank=8, layers=4, num_hidden_layers=30)
    assert list(config.layers_to_transform) == [26, 27, 28, 29]
    assert config.r == 8 and config.lora_alpha == 16
    assert training.lora_config(rank=8, layers=0, num_hidden_layers=30).layers_to_transform is None


@pytest.mark.parametrize("window, expected", [(1, [1.0, 0.0, 1.0]), (2, [1.0, 0.5, 0.5]), (3, [1.0, 0.5, 2 / 3])])
def test_moving_average(window, expected):
    assert demo.moving_average([1.0, 0.0, 1.0], window) == pytest.approx(expected)


class _StubModel:
    def __init__(self):
        self.eval_calls = 0

    def eval(self):
        self.eval_calls += 1
        return self


class _StubEnv:
    """Plays every episode as one prompt token and one response token with reward 1."""

    def run(self, queries, answers):
        import torch

        from textenv.environment import TextHistory

        histories = [TextHistory(query, torch.tensor([1])) for query in queries]
        ones = [torch.tensor([1]) for _ in queries]
        return ones, ones, ones, [1.0] * len(queries), histories


class _StubTrainer:
    def __init__(self):
        self.model = _StubModel()
        self.config = SimpleNamespace(log_with=None)  # no tracker
        self.steps = 0
        self.logged = []

    def step(self, queries, responses, scores, masks):
        self.steps += 1
        return {"objective/kl": 0.5, "objective/kl_coef": 0.1}

    def log_stats(self, stats, batch, rewards):
        self.logged.append((stats, batch["query"], [float(r) for r in rewards]))


def _stub_episodes():
    return training.TextEnvironmentSource(_StubEnv(), training.calculator_task_batches(3, seed=0))


def test_train_runs_every_step_without_a_deadline():
    trainer = _StubTrainer()
    logs = training.train(trainer, _stub_episodes(), steps=4, progress=False)
    assert [log.step for log in logs] == [0, 1, 2, 3]
    assert trainer.steps == 4 and len(trainer.logged) == 4 and trainer.model.eval_calls == 4
    assert all(log.reward_mean == 1.0 and log.kl == 0.5 and log.kl_coef == 0.1 for log in logs)
    assert trainer.logged[0][2] == [1.0, 1.0, 1.0]


def test_train_stops_at_the_deadline_after_at_least_one_step():
    import time

    trainer = _StubTrainer()
    logs = training.train(trainer, _stub_episodes(), steps=4, progress=False, deadline=time.perf_counter())
    assert len(logs) == 1 and trainer.steps == 1
