"""The defaults of the commands, the demo, the examples and the front ends agree (docs/guides/cli.md, "Defaults that
agree"): every task and algorithm parses with the command's own defaults, any batch size gets a mini-batch that
divides it, the run length is one rule, one generation batch default, the turn limits the page states, and
GRPO's off-policy correction the same however GRPO is built."""

from __future__ import annotations

import inspect
import re

import pytest

from textenv import options
from textenv.training.command import parse

ROOT_PAGE = "docs/guides/cli.md"
TASK_OPTIONS = {
    "calculator": [],
    "gym": ["--task", "gym", "--dataset", "rows.jsonl", "--gym_env", "guess_number"],
    "gym with a TRL environment": ["--task", "gym", "--dataset", "rows.jsonl", "--environment_factory", "env.py:Env"],
    "verifiers": ["--task", "verifiers", "--env_id", "arithmetic"],
}


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
@pytest.mark.parametrize("task", TASK_OPTIONS)
def test_train_defaults_work_together_on_every_task_and_algorithm(task, algorithm):
    train = parse([*TASK_OPTIONS[task], "--algorithm", algorithm])
    ppo = train.ppo
    assert (ppo.batch_size, ppo.mini_batch_size, ppo.ppo_epochs, ppo.total_ppo_epochs) == (16, 4, 1, 20)  # the demo's
    if algorithm == "grpo":
        assert (train.grpo.batch_size, train.grpo.mini_batch_size, train.grpo.total_steps) == (16, 4, 20)


@pytest.mark.parametrize("gradient_accumulation_steps", [1, 2])
@pytest.mark.parametrize("batch_size", range(1, 21))
def test_any_batch_size_gets_a_mini_batch_that_divides_it(batch_size, gradient_accumulation_steps):
    argv = ["--batch_size", str(batch_size), "--gradient_accumulation_steps", str(gradient_accumulation_steps)]
    if batch_size % gradient_accumulation_steps:
        with pytest.raises(ValueError, match="must be a multiple of `mini_batch_size \\* gradient_accumulation_steps`"):
            parse(argv)
        return
    ppo = parse(argv).ppo
    per_step = batch_size // gradient_accumulation_steps
    assert per_step % ppo.mini_batch_size == 0
    assert ppo.mini_batch_size == max(size for size in (1, 2, 3, 4) if per_step % size == 0)


def test_a_given_mini_batch_is_kept_and_checked(tmp_path):
    assert parse(["--batch_size", "12", "--mini_batch_size", "6"]).ppo.mini_batch_size == 6
    assert parse(["--batch_size", "12", "--forward_batch_size", "2"]).ppo.mini_batch_size == 2  # legacy alias
    with pytest.raises(ValueError, match="must be a multiple"):
        parse(["--batch_size", "12", "--mini_batch_size", "5"])
    config = tmp_path / "run.yaml"
    config.write_text("batch_size: 12\nmini_batch_size: 12\nppo_steps: 3\n")
    ppo = parse(["--config", str(config)]).ppo
    assert (ppo.mini_batch_size, ppo.total_ppo_epochs) == (12, 3)  # a config file's values count as given


def test_one_run_length_rule():
    assert parse(["--ppo_steps", "5", "--batch_size", "4"]).ppo.steps == 20
    assert parse(["--steps", "40", "--batch_size", "8"]).ppo.total_ppo_epochs == 5
    assert parse(["--batch_size", "8"]).ppo.total_ppo_epochs == options.DEFAULT_TRAINING_STEPS
    with pytest.raises(ValueError, match="give one"):
        parse(["--steps", "40", "--ppo_steps", "5"])


def test_train_starts_the_value_head_and_the_adapters_as_the_demo_does():
    from textenv.training import Settings
    from textenv.training.policy import LORA_TARGET_MODULES

    train = parse(["--use_peft"])
    assert train.run.value_head_init_std == Settings().value_head_init_std == 1e-3
    assert train.model.lora_target_modules == list(LORA_TARGET_MODULES)
    assert parse(["--use_peft", "--lora_target_modules", "q_proj", "v_proj"]).model.lora_target_modules == ["q_proj", "v_proj"]


def test_the_demo_and_the_examples_follow_the_same_mini_batch_rule():
    from textenv.demo import parse as parse_demo
    from textenv.training import Settings

    assert Settings().mini_batch_size == 4 and Settings(batch_size=6).mini_batch_size == 3
    settings, _, _ = parse_demo(["--batch_size", "6"])
    assert (settings.batch_size, settings.mini_batch_size, settings.ppo_steps, settings.ppo_epochs) == (6, 3, 20, 1)
    assert parse_demo(["--batch_size", "6", "--mini_batch_size", "2"])[0].mini_batch_size == 2


def test_one_generation_batch_default():
    from textenv.engine.backends import DEFAULT_GENERATION_BATCH_SIZE
    from textenv.engine.engine import GenerationEngine
    from textenv.environment import TextEnvironment
    from textenv.gym import GymScheduler
    from textenv.vllm.engine import VLLMEngine

    defaults = {front_end.__name__: inspect.signature(front_end).parameters["batch_size"].default
                for front_end in (TextEnvironment, GymScheduler, GenerationEngine, VLLMEngine)}
    defaults["--generation_batch_size"] = options.EpisodeArguments().generation_batch_size
    assert set(defaults.values()) == {DEFAULT_GENERATION_BATCH_SIZE} == {32}, defaults


def turn_limits_on_the_page() -> dict[str, str]:
    from tests.docs_blocks import ROOT

    text = (ROOT / ROOT_PAGE).read_text()
    rows = re.findall(r"^\s*\| (`TextEnvironment`|`GymScheduler`|`textenv train`[^|]*) \| ([^|]+) \|", text, re.MULTILINE)
    return {where.split("`")[1]: limit.strip() for where, limit in rows}


def test_the_turn_limits_are_those_the_page_states(tmp_path):
    from textenv.environment import TextEnvironment
    from textenv.gym import GymScheduler
    from textenv.models import tiny_causal_lm
    from textenv.training.calculator import build_calculator_environment

    page = turn_limits_on_the_page()
    assert page["TextEnvironment"].startswith(str(inspect.signature(TextEnvironment).parameters["max_turns"].default))
    assert inspect.signature(GymScheduler).parameters["max_turns"].default is None and page["GymScheduler"].startswith("`None`")
    episode = options.EpisodeArguments()
    assert episode.max_turns == options.DEFAULT_MAX_TURNS and page["textenv train"].startswith(str(options.DEFAULT_MAX_TURNS))
    assert options.GymArguments()._max_turns(options.EpisodeArguments(max_turns=0)) is None  # 0: no limit for Gym episodes
    with pytest.raises(ValueError, match="the calculator task needs a limit"):
        build_calculator_environment(tiny_causal_lm(), None, options.EpisodeArguments(max_turns=0))


@pytest.mark.parametrize("given, mode, clip_max", [
    ([], "sequence_mask", 3.0),
    (["--vllm_importance_sampling_mode", "token_truncate"], "token_truncate", 3.0),
    (["--vllm_importance_sampling_cap", "2.5"], "sequence_mask", 2.5),
    (["--vllm_importance_sampling_clip_max", "4.0", "--vllm_importance_sampling_mode", "sequence_truncate"], "sequence_truncate", 4.0),
])
def test_grpo_corrects_the_same_way_however_it_is_built(given, mode, clip_max):
    from textenv.grpo import GRPOConfig
    from textenv.ppo import PPOConfig
    from textenv.training import Settings

    built = parse(["--algorithm", "grpo", "--vllm_importance_sampling_correction", *given]).grpo
    assert (built.vllm_importance_sampling_correction, built.vllm_importance_sampling_mode, built.vllm_importance_sampling_clip_max) == (
        True, mode, clip_max)
    if given:
        return
    direct = GRPOConfig(vllm_importance_sampling_correction=True)
    settings = Settings(algorithm="grpo", vllm_importance_sampling_correction=True)
    from_settings = GRPOConfig.from_ppo_config(PPOConfig(batch_size=16, mini_batch_size=4, vllm_importance_sampling_correction=True),
                                               settings.grpo_arguments())
    for config in (direct, from_settings):
        assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_clip_max) == (mode, clip_max)
