"""The one training loop (`textenv.training.train`) on both front ends, with the tiny random model, a real
PPOTrainer and real environments; the Gym episode source; the one policy loader.

Tolerances: none; every comparison is exact. The logged reward mean is the batch's `reward_mean`, the same
python sum and division the test repeats; the logged KL is the trainer's statistic itself; scores are compared
with the episodes' own rewards; a loaded policy's weights are the saved or seeded ones (`torch.equal`). The one
inequality on floats, a value head drawn with std 1e-3 staying under 0.01, is 10 standard deviations.
"""

import dataclasses
import subprocess
import sys

import pytest
import torch

from textenv.environment import TextHistory
from textenv.gym import GymEpisode, GymScheduler, GymSource, read_completions
from textenv.ppo import AutoModelForCausalLMWithValueHead
from textenv.testing import tiny_causal_lm
from textenv.training import (
    Settings,
    StepLog,
    TextEnvironmentSource,
    build_calculator_environment,
    build_policy,
    build_trainer,
    calculator_task_batches,
    load_policy,
    train,
)

SETTINGS = Settings(
    model="tiny", ppo_steps=2, batch_size=2, mini_batch_size=1, learning_rate=1e-3, lora_layers=1,
    max_new_tokens=4, max_turns=2, generation_batch_size=2,
)
MATH_ROWS = [{"problem": "What is 2+2?", "solution": "4"}, {"problem": "What is 3+4?", "solution": "7"}]
BROKEN_ROW = {"no_problem": 1}  # math_env's reset fails on it


def gym_scheduler(model, tokenizer) -> GymScheduler:
    return GymScheduler(
        model, tokenizer, gym_env="math_env", max_turns=2, loss_scale="default",
        generation_kwargs={"max_new_tokens": 4, "do_sample": True},
    )


class ModeRecorder:
    """Wraps an episode source and records whether the policy was in train mode when each step's
    episodes were played."""

    def __init__(self, episodes, model):
        self.episodes, self.model, self.training = episodes, model, []

    def collect(self, step):
        self.training.append(self.model.training)
        return self.episodes.collect(step)


def run_front_end(name: str, tmp_path):
    """Train `SETTINGS.ppo_steps` steps on `name`'s episodes; returns the logs, what `on_step` saw, the
    recorder and whether the trained weights changed."""
    torch.manual_seed(0)
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    if name == "text_environment":
        env = build_calculator_environment(model, tokenizer, SETTINGS)
        episodes = TextEnvironmentSource(env, calculator_task_batches(SETTINGS.batch_size, seed=0))
    else:
        episodes = GymSource(gym_scheduler(model, tokenizer), MATH_ROWS, SETTINGS.batch_size, completions_path=tmp_path / "c.jsonl")
    recorder = ModeRecorder(episodes, model)
    trained = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trained]
    seen = []
    logs = train(trainer, recorder, SETTINGS.ppo_steps, on_step=seen.append, progress=False)
    changed = any(not torch.equal(b, p) for b, p in zip(before, trained))
    return logs, seen, recorder, changed


@pytest.fixture(scope="module")
def both_front_ends(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("front_ends")
    return {name: run_front_end(name, tmp_path) for name in ("text_environment", "gym")}, tmp_path


@pytest.mark.parametrize("name", ["text_environment", "gym"])
def test_the_loop_trains_and_calls_on_step_once_per_step(both_front_ends, name):
    logs, seen, recorder, changed = both_front_ends[0][name]
    assert [log.step for log in logs] == list(range(SETTINGS.ppo_steps))
    assert len(seen) == len(logs) and all(a is b for a, b in zip(seen, logs))  # once per step, in order
    assert recorder.training == [False] * SETTINGS.ppo_steps  # the policy plays in eval mode after a PPO step too
    assert changed  # a real PPO step moved the adapters / value head
    for log in logs:
        batch = log.batch
        assert len(batch.queries) == len(batch.responses) == len(batch.masks) == len(batch.scores) == SETTINGS.batch_size
        assert len(batch.query_texts) == len(batch.response_texts) == len(batch.episodes) == SETTINGS.batch_size
        assert all(len(mask) == len(response) for mask, response in zip(batch.masks, batch.responses))
        assert log.reward_mean == sum(float(s) for s in batch.scores) / SETTINGS.batch_size  # the same python arithmetic
        assert log.kl == float(log.stats["objective/kl"]) and log.kl_coef == float(log.stats["objective/kl_coef"])
        assert log.episode_seconds > 0 and log.ppo_seconds > 0


def test_both_front_ends_give_the_same_step_log_shape(both_front_ends):
    runs, tmp_path = both_front_ends
    text_log, gym_log = runs["text_environment"][0][-1], runs["gym"][0][-1]
    assert type(text_log) is type(gym_log) is StepLog
    for field in dataclasses.fields(StepLog):
        assert type(getattr(text_log, field.name)) is type(getattr(gym_log, field.name)), field.name
    assert set(text_log.stats) == set(gym_log.stats)
    assert set(text_log.stats) >= {"objective/kl", "objective/kl_coef", "ppo/loss/total"}


def test_each_front_end_keeps_its_own_episodes_and_scores(both_front_ends):
    runs, tmp_path = both_front_ends
    text_batch = runs["text_environment"][0][0].batch
    assert all(isinstance(history, TextHistory) for history in text_batch.episodes)
    assert [float(s) for s in text_batch.scores] == [float(h.reward) for h in text_batch.episodes]
    assert all(query.startswith("What is") for query in text_batch.query_texts)  # the task, not the 2-shot prompt

    gym_batch = runs["gym"][0][0].batch
    assert all(isinstance(episode, GymEpisode) and episode.trainable for episode in gym_batch.episodes)
    assert [float(s) for s in gym_batch.scores] == [e.total_reward for e in gym_batch.episodes]
    assert [query + response for query, response in zip(gym_batch.query_texts, gym_batch.response_texts)] == [
        e.history.text for e in gym_batch.episodes
    ]
    assert [r["step"] for r in read_completions(tmp_path / "c.jsonl")] == [0, 0, 1, 1]


# ------------------------------------------------------------------------------------------------ GymSource
def test_gym_source_replaces_failed_episodes_with_the_next_rows(tokenizer, tiny_model, tmp_path):
    log = tmp_path / "c.jsonl"
    batch = GymSource(gym_scheduler(tiny_model, tokenizer), [MATH_ROWS[0], BROKEN_ROW], 2, completions_path=log).collect(step=3)
    assert len(batch.episodes) == 2 and all(episode.trainable for episode in batch.episodes)
    records = read_completions(log)
    assert len(records) == 3 and [r["step"] for r in records] == [3, 3, 3]
    assert sum(r["error"] is not None for r in records) == 1  # the failed episode is logged, not trained on


def test_gym_source_gives_up_after_max_rounds(tokenizer, tiny_model, tmp_path):
    log = tmp_path / "c.jsonl"
    source = GymSource(gym_scheduler(tiny_model, tokenizer), [BROKEN_ROW], 2, completions_path=log, max_rounds=3)
    with pytest.raises(RuntimeError, match="only 0 of 2 episodes were trainable after 3 rounds") as raised:
        source.collect(step=0)
    assert "The most common error (6 episodes): KeyError at reset: " in str(raised.value)  # the cause, not only the file
    assert len(read_completions(log)) == 6


def test_gym_source_needs_rows(tokenizer, tiny_model):
    with pytest.raises(ValueError, match="at least one dataset row"):
        GymSource(gym_scheduler(tiny_model, tokenizer), [], 2)


# ------------------------------------------------------------------------------------------------ load_policy
def test_load_policy_tiny_with_lora_on_the_top_layer_and_a_small_value_head():
    model, tokenizer = load_policy("tiny", lora_rank=4, lora_layers=1, value_head_init_std=1e-3, seed=3)
    assert isinstance(model, AutoModelForCausalLMWithValueHead) and not model.training
    lora = [name for name, _ in model.named_parameters() if "lora_A" in name]
    assert lora and all(".layers.1." in name for name in lora)  # tiny has 2 layers; only the top one is adapted
    assert model.v_head.summary.weight.abs().max() < 0.01 and torch.all(model.v_head.summary.bias == 0)
    assert tokenizer.pad_token is not None
    base = tiny_causal_lm(seed=3)
    assert torch.equal(model.pretrained_model.get_input_embeddings().weight, base.get_input_embeddings().weight)


def test_load_policy_without_value_head_gives_the_plain_model():
    model, _ = load_policy("tiny", value_head=False, seed=1)
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training


def test_load_policy_without_value_head_takes_lora_adapters_for_grpo():
    model, _ = load_policy("tiny", value_head=False, lora_rank=4, lora_layers=1, seed=1)
    assert type(model).__name__ == "PeftModelForCausalLM" and not hasattr(model, "v_head")
    trainable = [name for name, param in model.named_parameters() if param.requires_grad]
    assert trainable and all("lora_" in name and ".layers.1." in name for name in trainable)


def test_load_policy_restores_a_saved_value_head(tmp_path, tokenizer):
    saved = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=2))
    torch.nn.init.normal_(saved.v_head.summary.weight, std=5.0)
    saved.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model, _ = load_policy(str(tmp_path), value_head_init_std=1e-3)
    assert torch.equal(model.v_head.summary.weight, saved.v_head.summary.weight)


def test_library_code_does_not_import_textenv_testing():
    code = (
        "import sys, textenv.cli, textenv.demo, textenv.gym, textenv.options, textenv.reporting\n"
        "from textenv.training import load_policy\n"
        "load_policy('tiny')\n"
        "assert 'textenv.testing' not in sys.modules, 'textenv.testing was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
