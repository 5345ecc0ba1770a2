"""The transformers backend (`engine="transformers"`, transformers' continuous batching) against textenv's own
engine: exact ids through multi-turn episodes of both front ends, stop strings, log-probabilities, weight
updates between calls, the model's attention given back, `engine="auto"`, and every refusal.

Comparisons (tests/numerics.py has the analysis):
- greedy tokens of the two backends (paged attention against textenv's KV cache: another reduction order) go
  through `assert_greedy_histories_agree` / `assert_greedy_continuations_agree`: equal up to the first rounding tie
  of the top two logits, checked in float64;
- the backend's log-probabilities against a full forward pass here: two float32 orders, so `reduction_tolerance`
  of `forward_terms` at the largest ``|logit|`` of those positions;
- exact: where a turn stops (the first token completing a stop string), ids across turns (the next context is the
  previous one plus the sampled ids, never re-tokenised), and tokens before and after a weight change far from a tie.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.vllm_servers import GREEDY, calculator_env
from textenv.engine.backends import build_engine
from textenv.engine.interface import Engine
from textenv.engine.transformers_cb import TransformersEngine
from textenv.gym import GymScheduler, read_completions
from textenv.tasks import calculator as task

from numerics import assert_greedy_continuations_agree, assert_greedy_histories_agree, forward_terms, reduction_tolerance

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["What is 1+1?", "Compute 3-5, please, and explain.", "Hi"]
MATH_ROWS = [{"problem": f"What is {a}+{b}? Think, then answer.", "solution": str(a + b)} for a, b in [(2, 2), (13, 29), (7, 8)]]
NO_EOS = {"do_sample": False, "max_new_tokens": 12, "eos_token_id": -1}


def contexts(tokenizer):
    return [tokenizer(prompt, return_tensors="pt").input_ids[0] for prompt in PROMPTS]


def ids(completions):
    return [completion.token_ids.tolist() for completion in completions]


def both(model, tokenizer, generation_kwargs=NO_EOS):
    textenv_engine = build_engine("textenv", model, tokenizer, batch_size=8)
    textenv_engine.generation_kwargs = generation_kwargs
    return textenv_engine, build_engine("transformers", model, tokenizer, batch_size=8, generation_kwargs=generation_kwargs)


def test_both_backends_follow_the_one_engine_interface(tiny_model, tokenizer):
    textenv_engine, transformers_engine = both(tiny_model, tokenizer)
    assert isinstance(textenv_engine, Engine) and isinstance(transformers_engine, Engine)
    assert str(transformers_engine.decoding_path) == "transformers continuous batching (sdpa attention)"


def test_greedy_turns_equal_textenvs_and_the_model_gets_its_attention_back(tiny_model, tokenizer):
    textenv_engine, transformers_engine = both(tiny_model, tokenizer)
    batch = contexts(tokenizer)
    expected = textenv_engine.generate_batch(batch, stop_at_eos=False)
    served = transformers_engine.generate_batch(batch, stop_at_eos=False)
    assert_greedy_continuations_agree(tiny_model, batch, ids(expected), ids(served))
    assert [c.finish_reason for c in served] == ["length"] * 3 and all(len(c.token_ids) == 12 for c in served)
    assert tiny_model.config._attn_implementation == "sdpa" and transformers_engine._manager is None


def test_logprobs_are_the_models_logprobs_of_the_sampled_tokens(tiny_model, tokenizer):
    _, transformers_engine = both(tiny_model, tokenizer)
    context = contexts(tokenizer)[1]
    completion = transformers_engine.generate_batch([context], stop_at_eos=False)[0]
    full = torch.cat([context, completion.token_ids])
    with torch.no_grad():
        logits = tiny_model(full[None]).logits[0, len(context) - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(1, completion.token_ids[:, None])[:, 0]
    tolerance = reduction_tolerance(forward_terms(tiny_model.config, len(full)), float(logits.abs().max()))
    assert completion.logprobs.shape == completion.token_ids.shape
    assert (completion.logprobs - expected).abs().max() <= tolerance


def test_a_turn_stops_at_the_token_that_completes_its_stop_string(tiny_model, tokenizer):
    textenv_engine, transformers_engine = both(tiny_model, tokenizer)
    context = contexts(tokenizer)[1:2]
    free = textenv_engine.generate_batch(context, stop_at_eos=False)[0].token_ids
    stop = tokenizer.decode(free[4:6])
    expected = textenv_engine.generate_batch(context, stop_strings=[stop], stop_at_eos=False)[0]
    served = transformers_engine.generate_batch(context, stop_strings=[stop], stop_at_eos=False)[0]
    assert served.finish_reason == expected.finish_reason == "stop"
    assert served.token_ids.tolist() == expected.token_ids.tolist() and stop in served.text
    assert stop not in tokenizer.decode(served.token_ids[:-1])


def test_a_weight_update_between_calls_is_served(tiny_model, tokenizer):
    _, transformers_engine = both(tiny_model, tokenizer)
    batch = contexts(tokenizer)
    before = ids(transformers_engine.generate_batch(batch, stop_at_eos=False))
    with torch.no_grad():
        tiny_model.lm_head.weight.add_(torch.randn_like(tiny_model.lm_head.weight) * 0.5)
    after = ids(transformers_engine.generate_batch(batch, stop_at_eos=False))
    textenv_engine, _ = both(tiny_model, tokenizer)
    assert after != before
    assert_greedy_continuations_agree(tiny_model, batch, ids(textenv_engine.generate_batch(batch, stop_at_eos=False)), after)


@pytest.mark.parametrize("setting, named", [({"num_beams": 2}, "num_beams=2"), ({"min_new_tokens": 3}, "min_new_tokens=3"),
                                             ({"repetition_penalty": 1.3}, "repetition_penalty=1.3")])
def test_a_setting_it_cannot_keep_is_refused_before_any_episode(tiny_model, tokenizer, setting, named):
    with pytest.raises(ValueError, match=f"{named}.*--engine textenv"):
        GymScheduler(tiny_model, tokenizer, gym_env="math_env", engine="transformers", generation_kwargs={**GREEDY, **setting}).run(MATH_ROWS[:1])


def test_mixed_precision_and_a_model_without_continuous_batching_are_refused(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="torch_dtype=torch.bfloat16"):
        build_engine("transformers", tiny_model, tokenizer, batch_size=4, mixed_precision="bf16")
    with pytest.raises(ValueError, match="has no init_continuous_batching.*--engine textenv"):
        TransformersEngine(torch.nn.Linear(2, 2), tokenizer)


def test_an_attention_it_cannot_page_is_refused_with_the_loading_option(tiny_model, tokenizer):
    tiny_model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="cannot page the attention implementation 'flex_attention'.*attn_implementation='sdpa'"):
        build_engine("transformers", tiny_model, tokenizer, batch_size=4)


def test_a_transformers_without_cancellable_continuous_batching_is_refused_with_the_install(tiny_model, tokenizer, monkeypatch):
    from transformers.generation.continuous_batching import ContinuousBatchingManager

    monkeypatch.delattr(ContinuousBatchingManager, "cancel_request")
    with pytest.raises(ValueError, match=r"cannot cancel a request.*pip install 'transformers>=5.16'.*--engine textenv"):
        build_engine("transformers", tiny_model, tokenizer, batch_size=4)


def test_sampling_settings_change_while_turns_are_in_flight_is_refused(tiny_model, tokenizer):
    engine = TransformersEngine(tiny_model, tokenizer, {"do_sample": False, "max_new_tokens": 64, "eos_token_id": -1})
    try:
        engine._submit(contexts(tokenizer)[0], (), None, lambda result: None, stop_at_eos=False)
        with pytest.raises(ValueError, match="sampling settings changed while turns were in flight"):
            engine._submit(contexts(tokenizer)[0], (), {"do_sample": True}, lambda result: None, stop_at_eos=False)
    finally:
        engine.stop()


def test_auto_picks_textenvs_engine_on_a_cpu_and_says_why(tiny_model, tokenizer, caplog):
    with caplog.at_level(logging.WARNING):
        engine = build_engine("auto", tiny_model, tokenizer, batch_size=4)
    assert type(engine).__name__ == "GenerationEngine"
    assert "engine='auto' chose 'textenv': the model is on cpu" in caplog.text


def test_unknown_engine_names_the_choices(tiny_model, tokenizer):
    with pytest.raises(ValueError, match=r"engine must be one of \('textenv', 'transformers', 'vllm', 'auto'\)"):
        build_engine("tgi", tiny_model, tokenizer, batch_size=4)


@pytest.mark.slow
def test_gym_episodes_on_transformers_equal_textenvs_with_exact_ids_and_logprobs(bundled):
    model, tokenizer = bundled
    kwargs = dict(gym_env="math_env", max_turns=3, loss_scale="default", generation_kwargs=GREEDY)
    served = GymScheduler(model, tokenizer, engine="transformers", **kwargs).run(MATH_ROWS)
    in_process = GymScheduler(model, tokenizer, **kwargs).run(MATH_ROWS)
    assert_greedy_histories_agree(model, [e.history for e in served], [e.history for e in in_process])
    assert all(e.error is None for e in served) and max(e.num_turns for e in served) >= 2
    for episode in served:
        history = episode.history
        model_tokens = history.token_masks.bool()
        assert history.token_logprobs[model_tokens].isfinite().all() and (history.token_logprobs[model_tokens] <= 0).all()
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_text_environment_on_transformers_equals_textenvs(bundled):
    model, tokenizer = bundled
    questions, answers = task.generate_tasks(4, seed=5)
    *_, rewards, served = calculator_env(model, tokenizer, "transformers").run(questions, answers=answers)
    *_, local_rewards, in_process = calculator_env(model, tokenizer, "textenv").run(questions, answers=answers)
    if assert_greedy_histories_agree(model, served, in_process):
        assert [float(r) for r in rewards] == [float(r) for r in local_rewards]


@pytest.mark.parametrize("engine, path", [("transformers", "transformers continuous batching (sdpa attention)"), ("auto", "textenv decoding loop")])
def test_rollout_with_engine_plays_the_episodes_and_logs_the_path(engine, path, tmp_path, capsys):
    from textenv.cli import run_command

    out = tmp_path / "completions.jsonl"
    summary = run_command(["rollout", "--model", "tiny", "--dataset", "examples/data/guess_number.jsonl", "--external_plugins",
                               "examples/gym_plugin.py", "--gym_env", "guess_number", "--max_turns", "2", "--max_new_tokens", "3",
                           "--output", str(out), "--no_progress", "--temperature", "0", "--engine", engine])
    assert summary["errors"] == 0 and summary["episodes"] == len(read_completions(out)) > 0
    printed = capsys.readouterr()
    assert f"generation: {path}" in printed.out + printed.err


def test_a_next_turn_reuses_the_earlier_turns_pages_and_rows_admitted_together_compute_their_prompt(tiny_model, tokenizer, monkeypatch):
    """What docs/guides/gpu.md says of prefix reuse, counted where transformers matches a prompt against its cached pages."""
    import asyncio

    from transformers.generation.continuous_batching import cache as paged_cache

    matched = []
    search = paged_cache.PagedAttentionCache.search_prefix_match

    def recording(self, request_id, prompt_ids):
        tokens = search(self, request_id, prompt_ids)
        matched.append(tokens)
        return tokens

    monkeypatch.setattr(paged_cache.PagedAttentionCache, "search_prefix_match", recording)
    engine = TransformersEngine(tiny_model, tokenizer, {"do_sample": False, "max_new_tokens": 10, "eos_token_id": -1})
    context, fresh = (tokenizer(word * 70, return_tensors="pt").input_ids[0] for word in ("word ", "other "))

    async def episodes():
        first = await engine.generate(context)
        await engine.generate(torch.cat([context, first.token_ids, tokenizer(" more", return_tensors="pt").input_ids[0]]))
        await asyncio.gather(*[engine.generate(fresh) for _ in range(4)])

    engine.run_hosted(episodes())
    pages = (len(context) + 10) // 32  # complete 32-token pages of the first turn's prompt and reply
    assert matched[:3] == [0, 32 * pages, 0]
    # A fresh row admitted in the first fresh row's step computes the prompt again; one the manager admits a step
    # later (the four requests reach its thread one by one) reuses the prompt's complete pages.
    assert set(matched[3:]) <= {0, 32 * (len(fresh) // 32)} and len(matched) == 6


def test_train_with_engine_transformers_runs_its_steps_and_logs_the_path(tmp_path, capsys):
    from textenv.cli import run_command

    run_command(["train", "--task", "calculator", "--model_name_or_path", "tiny", "--ppo_steps", "2", "--batch_size", "2",
                 "--max_new_tokens", "3", "--no_progress", "--engine", "transformers", "--output_dir", str(tmp_path / "run")])
    printed = capsys.readouterr()
    steps = [line for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines() if line.strip()]
    assert len(steps) == 2 and "generation: transformers continuous batching" in printed.out + printed.err


def test_a_lora_value_head_policy_is_served_with_its_adapters(tiny_model, tokenizer):
    from peft import LoraConfig, get_peft_model

    from textenv.ppo import AutoModelForCausalLMWithValueHead

    peft_model = get_peft_model(tiny_model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    policy = AutoModelForCausalLMWithValueHead.from_pretrained(peft_model)
    textenv_engine, transformers_engine = both(policy, tokenizer)
    batch = contexts(tokenizer)
    with_adapters = ids(transformers_engine.generate_batch(batch, stop_at_eos=False))
    assert_greedy_continuations_agree(peft_model, batch, ids(textenv_engine.generate_batch(batch, stop_at_eos=False)), with_adapters)
    with peft_model.disable_adapter():
        assert ids(transformers_engine.generate_batch(batch, stop_at_eos=False)) != with_adapters


def test_sampled_turns_of_seeded_episodes_warn_once_that_seeds_are_not_kept_and_greedy_ones_do_not(tiny_model, tokenizer, caplog):
    from textenv.engine.transformers_cb import NOT_KEPT_SEEDS

    def play(generation_kwargs):
        GymScheduler(tiny_model, tokenizer, gym_env="math_env", max_turns=1, engine="transformers", generation_kwargs=generation_kwargs).run(MATH_ROWS)
        return caplog.text.count(NOT_KEPT_SEEDS)

    with caplog.at_level(logging.WARNING, logger="textenv.engine.transformers_cb"):
        assert play({**GREEDY, "max_new_tokens": 4}) == 0
        assert play({"do_sample": True, "max_new_tokens": 4}) == 1
