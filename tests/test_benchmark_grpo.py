"""`benchmarks/run.py --workloads grpo-vs-trl` at smoke sizes: the workload's registration and alternation, the one
settings mapping both sides are built from, the task's environment (TRL's environment_factory protocol) and rows,
what TRL needs to accept the task, the report's two columns, and both sides' runs on a tiny random model."""

import argparse
import sys
from pathlib import Path

import pytest
import trl
from packaging.version import Version

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import grpo_bench  # noqa: E402
import grpo_side  # noqa: E402
import grpo_task  # noqa: E402
import run  # noqa: E402

# The TRL side is TRL 1.16's GRPOTrainer(environment_factory=...): its tests need that TRL (the lower-bound
# environment has trl 0.23, which has neither environment_factory nor max_tool_calling_iterations).
needs_trl_1_16 = pytest.mark.skipif(
    Version(trl.__version__) < Version("1.16"), reason="the grpo-vs-trl TRL side is TRL 1.16's GRPOTrainer(environment_factory=...)"
)

SMOKE = {"steps": 1, "batch_size": 4, "num_generations": 2, "mini_batch_size": 2, "max_new_tokens": 6, "max_turns": 2}


# ------------------------------------------------------------------------------ registration
def test_the_workload_is_named_on_the_command_line_only(monkeypatch):
    assert run.GRPO_WORKLOAD == "grpo-vs-trl"
    assert run.GRPO_WORKLOAD in run.ALL_WORKLOADS and run.GRPO_WORKLOAD not in run.WORKLOADS
    monkeypatch.setattr(sys, "argv", ["run.py", "--workloads", "grpo-vs-trl", "--grpo-steps", "2", "--grpo-episodes", "8"])
    args = run.parse_args()
    assert args.workloads == ["grpo-vs-trl"]
    settings = grpo_bench.settings(args)
    assert (settings["steps"], settings["batch_size"], settings["num_generations"]) == (2, 8, 4)
    monkeypatch.setattr(sys, "argv", ["run.py"])
    assert "grpo-vs-trl" not in run.parse_args().workloads


def test_the_sides_alternate_in_fresh_processes(monkeypatch, tmp_path):
    calls = []
    fake_run_side = lambda side, workload, inputs, extra, threads: calls.append((side[1].name, extra)) or {"extra": extra}  # noqa: E731
    inputs = grpo_bench.write_inputs(tmp_path, {**grpo_side.DEFAULTS, **SMOKE}, eval_rows=3)
    results = grpo_bench.measure(repeats=3, threads=1, inputs=inputs, run_side=fake_run_side, rotated=run.rotated)

    assert {script for script, _ in calls} == {"grpo_side.py"}
    assert [extra[1] for _, extra in calls] == ["trl", "textenv", "textenv", "trl", "trl", "textenv"]
    assert all(extra[2:] == ["--inputs", str(inputs)] for _, extra in calls)
    assert len(results["trl"]) == len(results["textenv"]) == 3
    assert results["settings"]["batch_size"] == 4 and results["eval_rows"] == 3


def test_the_inputs_are_the_steps_prompts_and_held_out_rows_apart(tmp_path):
    content = run.workload.read_json(grpo_bench.write_inputs(tmp_path, {**grpo_side.DEFAULTS, "steps": 3, "batch_size": 8, "num_generations": 4}, eval_rows=40))
    train_questions = [row["prompt"][-1]["content"] for row in content["train_rows"]]
    held_out_questions = [row["prompt"][-1]["content"] for row in content["eval_rows"]]

    assert len(train_questions) == 3 * 8 // 4 and len(held_out_questions) == 40
    assert not set(train_questions) & set(held_out_questions)
    assert content["train_rows"] == grpo_task.make_rows(6, seed=0)  # seeded
    with pytest.raises(ValueError, match="multiple"):
        grpo_bench.write_inputs(tmp_path, {**grpo_side.DEFAULTS, "batch_size": 6, "mini_batch_size": 4})


# ------------------------------------------------------------------------------ settings
@needs_trl_1_16
def test_both_sides_get_the_same_settings_and_one_optimizer_step_per_batch(tmp_path):
    import trl

    from textenv.grpo import GRPOConfig

    settings = {**grpo_side.DEFAULTS, "steps": 5}
    mapping = grpo_side.settings_mapping(settings)
    ours, scheduler = mapping["textenv"]["GRPOConfig"], mapping["textenv"]["GymScheduler"]
    theirs = trl.GRPOConfig(output_dir=str(tmp_path), **mapping["trl"]["GRPOConfig"])
    config = GRPOConfig(**ours)

    for name in ("num_generations", "learning_rate", "beta", "loss_type", "epsilon", "scale_rewards", "max_grad_norm",
                 "temperature", "seed", "num_iterations", "mask_truncated_completions", "gradient_checkpointing"):
        assert getattr(config, name) == getattr(theirs, name), name
    assert (config.batch_size, theirs.generation_batch_size) == (16, 16)
    assert config.on_policy and config.gradient_accumulation_steps == config.mini_batches == 4
    assert theirs.per_device_train_batch_size * theirs.gradient_accumulation_steps == 16
    assert theirs.steps_per_generation == theirs.gradient_accumulation_steps  # one optimizer step per generation
    assert config.mini_batch_size == theirs.per_device_train_batch_size
    assert theirs.max_steps == 5 and config.total_steps == 5
    assert theirs.lr_scheduler_type == "constant" and theirs.warmup_steps == 0 and theirs.weight_decay == 0.0
    assert not theirs.bf16 and not theirs.fp16 and theirs.use_cpu and not theirs.shuffle_dataset
    sampling = scheduler["generation_kwargs"]
    assert (sampling["temperature"], sampling["top_k"], sampling["top_p"]) == (theirs.temperature, theirs.top_k, theirs.top_p) == (1.0, 0, 1.0)
    assert sampling["max_new_tokens"] == theirs.generation_kwargs["max_new_tokens"] == 64
    assert theirs.max_tool_calling_iterations == scheduler["max_turns"] - 1 == 2
    assert theirs.max_completion_length == scheduler["max_turns"] * sampling["max_new_tokens"]


def test_the_printed_mapping_shows_what_each_side_is_given():
    rows = {row[0]: row[1:] for row in grpo_side.mapping_rows({"learning_rate": 3e-5, "num_generations": 8})}
    assert rows["learning rate"][0].startswith("learning_rate=3e-05") and rows["learning rate"][1].startswith("learning_rate=3e-05")
    assert rows["group"] == ["num_generations=8", "num_generations=8"]
    assert "gradient_accumulation_steps=4" in rows["episodes per step, one optimizer step"][1]
    with pytest.raises(ValueError, match="multiple"):
        grpo_side.settings_mapping({"batch_size": 12, "num_generations": 8})


# ------------------------------------------------------------------------------ the task
def test_the_environment_follows_trls_protocol():
    from transformers.utils import get_json_schema

    from textenv.gym.trl_environments import defines, tool_methods

    env = grpo_task.CalculatorEnv()
    assert env.reset(prompt=[], answer=23.0) is None
    assert sorted(tool.__name__ for tool in tool_methods(env)) == ["calculate", "submit_answer"]  # what TRL offers as tools
    assert defines(env, "get_reward")
    assert [get_json_schema(tool)["function"]["name"] for tool in tool_methods(env)] == ["calculate", "submit_answer"]
    assert env.calculate("49-26") == "23" and env.calculate("7/2") == "3.5" and env.calculate("__import__('os')").startswith("Error")
    assert env.get_reward() == 0.0  # nothing submitted
    assert env.submit_answer("22") == "Answer received." and env.get_reward() == 0.0
    env.submit_answer(23.004)
    assert env.get_reward() == 1.0
    assert env.submit_answer("x").startswith("Error") and env.get_reward() == 1.0  # a bad submission keeps the last answer
    env.reset(answer=5)
    assert env.submitted is None and env.get_reward() == 0.0


def test_trl_gets_the_same_prompt_text_as_textenv(tokenizer):
    """TRL stores the rows in a `datasets.Dataset` (Arrow): the prompt it renders must not change (no `null` argument
    added to a tool call, no extra message field shown)."""
    from datasets import Dataset

    from textenv.chat.templates import CHATML_TOOLS_TEMPLATE
    from textenv.gym.trl_environments import tool_methods, tool_schemas

    rows = grpo_task.make_rows(3, seed=0)
    schemas = tool_schemas(tool_methods(grpo_task.CalculatorEnv()), "env")
    for plain, stored in zip(rows, Dataset.from_list(rows)):
        texts = [tokenizer.apply_chat_template(row["prompt"], tools=schemas, chat_template=CHATML_TOOLS_TEMPLATE, tokenize=False,
                                               add_generation_prompt=True) for row in (plain, stored)]
        assert texts[0] == texts[1]
        assert '{"name": "calculate", "arguments": {"expression": "13-3"}}' in texts[0] and "null" not in texts[0]


@needs_trl_1_16
def test_trl_needs_a_tool_template_and_a_response_parser():
    from trl.chat_template_utils import parse_response, supports_tool_calling

    from textenv.models import bundled_model_path

    tokenizer, needed = grpo_side.trl_tokenizer(str(bundled_model_path()))
    assert len(needed) == 2 and "supports_tool_calling" in needed[0] and "add_response_schema" in needed[1]
    assert supports_tool_calling(tokenizer)
    reply = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>'
    prefix = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True, tokenize=True, return_dict=False)
    parsed = parse_response(tokenizer, tokenizer(reply, add_special_tokens=False).input_ids, prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "calculate", "arguments": {"expression": "2+2"}}


# ------------------------------------------------------------------------------ the report
def side_result(seconds, prompt, before=(1.0, 0.0), after=(1.0, 1.0), **extra):
    def evaluation(rewards):
        return {"greedy": {"accuracy": sum(r >= 1 for r in rewards) / len(rewards), "rewards": list(rewards), "seconds": 1.0,
                           "decoding_path": "textenv decoding loop"}}

    steps = [{"seconds": seconds, "seconds_cpu": 2 * seconds, "rollout_seconds": seconds / 4, "episodes": 4, "generated_tokens": 50,
              "reward_mean": 0.25}, {"seconds": seconds, "seconds_cpu": 2 * seconds, "rollout_seconds": seconds / 4, "episodes": 4,
                                     "generated_tokens": 70, "reward_mean": 0.5}]
    return {"steps": steps, "step_seconds_median": seconds, "seconds": 2 * seconds, "seconds_cpu": 4 * seconds, "episodes": 8,
            "generated_tokens": 120, "model_turns": 16, "peak_rss_mb": 3000.0, "peak_rss_before_training_mb": 1500.0, "before": evaluation(before),
            "after": evaluation(after), "first_prompt_ids": prompt, "versions": {"trl": "1.16.0"}, **extra}


def recorded(textenv_prompt=(1, 2, 3)):
    settings = {**grpo_side.DEFAULTS, "steps": 2, "batch_size": 4}
    return {
        "settings": {"bf16": False, "threads": 2, "quick": False, "repeats": 1},
        run.GRPO_WORKLOAD: {
            "trl": [side_result(40.0, [1, 2, 3], decoding_path=grpo_side.TRL_PATH, trl_needed=["a template", "a parser"])],
            "textenv": [side_result(10.0, list(textenv_prompt), after=(1.0, 0.0), decoding_path="textenv decoding loop")],
            "settings": settings, "eval_rows": 2,
        },
    }


def test_the_report_prints_both_sides_and_the_ratio():
    args = argparse.Namespace(workloads=[run.GRPO_WORKLOAD], bf16=False, threads=2, quick=False, repeats=1)
    text = run.render(recorded(), 1, args)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| grpo-vs-trl"))

    assert header == ("| grpo-vs-trl (2 steps x 4 episodes, groups of 4; calculator tool task, 2 shots; all (full fine-tuning)) "
                      "| TRL 1.16.0 GRPOTrainer | textenv GRPO | textenv / TRL |")
    assert "| wall s per step (median over the steps) | 40 | 10 | 0.25x |" in lines
    assert "| peak RSS MiB after training | 3000 | 3000 | 1.00x |" in lines
    assert "| model turns per episode (mean) | 2 | 2 | 1.00x |" in lines
    assert "| mean reward, first -> last step | 0.25 -> 0.50 | 0.25 -> 0.50 |  |" in lines
    assert "| held-out greedy accuracy, before -> after (2 rows) | 0.50 -> 1.00 | 0.50 -> 0.50 |  |" in lines
    assert "| training turns decoded by | transformers generate | textenv decoding loop |  |" in lines
    assert "textenv / TRL: a textenv step took 0.25x the time of a trl step (**4.00x** the speed)" in text
    assert "same token ids on every side: True (3 tokens)" in text
    assert "What TRL needed to run this task: a template; a parser." in text
    assert "| learning rate | learning_rate=1e-05, constant |" in text  # the settings table
    assert "--workloads grpo-vs-trl" in text and "--grpo-steps 2 --grpo-episodes 4" in text


def test_the_report_says_when_the_prompts_differ():
    args = argparse.Namespace(workloads=[run.GRPO_WORKLOAD], bf16=False, threads=2, quick=False, repeats=1)
    assert "same token ids on every side: False" in run.render(recorded(textenv_prompt=(1, 2, 4)), 1, args)


def test_the_report_compares_packed_textenv_with_padded_textenv():
    results = recorded()
    workload = results[run.GRPO_WORKLOAD]
    workload["textenv-padded"] = [side_result(25.0, [1, 2, 3], decoding_path="textenv decoding loop")]
    workload["settings"].update(sides=["trl", "textenv", "textenv-padded"], lora_layers=8, shots=3)
    args = argparse.Namespace(workloads=[run.GRPO_WORKLOAD], bf16=False, threads=2, quick=False, repeats=1)
    text = run.render(results, 1, args)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| grpo-vs-trl"))
    assert header.endswith("3 shots; LoRA r=16 on the top 8 layers) | TRL 1.16.0 GRPOTrainer | textenv GRPO "
                           "| textenv GRPO, padded (share_prompt_prefix=False) | textenv / TRL | textenv packed / padded |")
    assert "| wall s per step (median over the steps) | 40 | 10 | 25 | 0.25x | 0.40x |" in lines
    assert "textenv packed / padded: a textenv step took 0.40x the time of a textenv-padded step (**2.50x** the speed)" in text
    assert "--grpo-shots 3 --grpo-lora-layers 8 --grpo-sides trl,textenv,textenv-padded" in text


# ------------------------------------------------------------------------------ both sides on a tiny model
@pytest.fixture()
def tiny_inputs(monkeypatch):
    from textenv.models import bundled_model_path, load_tokenizer
    from textenv.testing import tiny_causal_lm

    path = str(bundled_model_path())
    monkeypatch.setattr(grpo_side, "load", lambda model_path: (tiny_causal_lm(seed=0).eval(), load_tokenizer(path)))
    train_rows, eval_rows = grpo_task.train_and_held_out_rows(2, 2)
    return {"model_path": path, "settings": {**grpo_side.DEFAULTS, **SMOKE}, "train_rows": train_rows, "eval_rows": eval_rows}


@needs_trl_1_16
def test_both_sides_train_a_tiny_model_on_the_same_prompts(tiny_inputs):
    import torch

    torch.manual_seed(0)
    trl_result = grpo_side.run_trl(tiny_inputs)
    textenv_result = grpo_side.run_textenv(tiny_inputs)

    for result in (trl_result, textenv_result):
        assert len(result["steps"]) == 1 and result["episodes"] == 4
        assert result["generated_tokens"] > 0 and result["seconds"] > 0 and result["peak_rss_mb"] > 0
        assert result["model_turns"] == 4  # a random model calls no tool: one turn per episode
        assert result["steps"][0]["reward_mean"] == 0.0  # a random model submits no answer
        assert result["before"]["greedy"]["rewards"] == [0.0, 0.0]
    assert trl_result["first_prompt_ids"] == textenv_result["first_prompt_ids"] and len(trl_result["first_prompt_ids"]) > 500
    assert trl_result["decoding_path"] == grpo_side.TRL_PATH and textenv_result["decoding_path"] == "textenv decoding loop"
    assert len(trl_result["trl_needed"]) == 2


@needs_trl_1_16
def test_every_side_trains_lora_adapters_on_the_top_layers(tiny_inputs):
    import torch

    tiny_inputs["settings"].update(lora_layers=1, lora_rank=4, shots=1, sides=list(grpo_side.SIDE_NAMES))
    torch.manual_seed(0)
    results = {"trl": grpo_side.run_trl(tiny_inputs), "textenv": grpo_side.run_textenv(tiny_inputs),
               "textenv-padded": grpo_side.run_textenv(tiny_inputs, share_prompt_prefix=False)}
    assert results["textenv"]["packed"] and not results["textenv-padded"]["packed"]
    assert len({str(result["first_prompt_ids"]) for result in results.values()}) == 1
    for result in results.values():
        assert result["episodes"] == 4 and result["generated_tokens"] > 0


def test_lora_settings_put_the_adapters_on_the_top_layers():
    from textenv.testing import tiny_causal_lm

    model = tiny_causal_lm(seed=0)
    assert grpo_side.lora_settings(model, {}) is None  # full fine-tuning by default
    config = grpo_side.lora_settings(model, {"lora_layers": 1, "lora_rank": 4})
    assert config.r == 4 and config.layers_to_transform == [model.config.num_hidden_layers - 1]
    adapted = grpo_side.with_lora(model, {"lora_layers": 1, "lora_rank": 4})
    trained = {name for name, parameter in adapted.named_parameters() if parameter.requires_grad}
    assert trained and all(f"layers.{model.config.num_hidden_layers - 1}." in name for name in trained)
