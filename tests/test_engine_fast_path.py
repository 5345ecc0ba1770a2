"""Which path decodes a model (`textenv.engine.fast_path`): decided by a probe forward, not by a parameter's
name; a model or a setting the loop cannot serve goes to `generate` with one logged warning and says so.

Comparisons (tests/numerics.py has the analysis):
- greedy tokens of the engine (a batch, padded, with a KV cache) against `generate` on one unpadded context:
  equal only in exact arithmetic, so `assert_greedy_continuations_agree` (equal up to the first rounding tie
  of the top two logits, checked in float64);
- exact: the random generator's state and draws, and the weights the probe must leave alone.
"""

import inspect
import logging

import pytest
import torch
from transformers import LlamaForCausalLM, MistralConfig, MistralForCausalLM

from textenv.engine import GenerationEngine
from textenv.engine.fast_path import CACHE_ARGUMENTS, GENERATE, LOOP, DecodingPath, decoding_path

from numerics import assert_greedy_continuations_agree

GREEDY = {"do_sample": False, "max_new_tokens": 6, "eos_token_id": -1}
FAST_PATH_LOGGER = "textenv.engine.fast_path"


class CacheOnlyThroughKwargs(LlamaForCausalLM):
    """A forward whose signature names no cache argument: it takes the cache through ``**kwargs`` (as a model
    with a deprecated name does)."""

    def forward(self, input_ids=None, **kwargs):
        return super().forward(input_ids=input_ids, **kwargs)


class IgnoresKnownCacheNames(LlamaForCausalLM):
    """A model from a transformers that renamed the cache argument again and silently drops the old names."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, kv_store=None, use_cache=None, logits_to_keep=0, **kwargs):
        for name in CACHE_ARGUMENTS:
            kwargs.pop(name, None)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, logits_to_keep=logits_to_keep, **kwargs)


def _same_weights(cls, model):
    copy = cls(model.config)
    copy.load_state_dict(model.state_dict())
    return copy.eval()


def tiny_sliding_window_model():
    config = MistralConfig(
        vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=16, bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )
    torch.manual_seed(0)
    return MistralForCausalLM(config).eval()


def contexts(tokenizer):
    return [torch.tensor(tokenizer(text).input_ids) for text in ("What is 1+1?", "Compute 12*7 please.")]


def hf_greedy(model, context):
    with torch.no_grad():
        output = model.generate(context[None], attention_mask=torch.ones(1, len(context), dtype=torch.long), pad_token_id=2, **GREEDY)
    return output[0, len(context) :].tolist()


def test_the_loop_serves_the_tiny_llama_through_the_argument_its_forward_names(tiny_model, tokenizer):
    path = decoding_path(tiny_model)
    assert path.fast and path.reason == "" and str(path) == LOOP
    assert path.cache_argument in inspect.signature(tiny_model.forward).parameters
    engine = GenerationEngine(tiny_model, tokenizer, GREEDY)
    assert engine.fast_path and engine.decoding_path is path


def test_a_forward_that_names_no_cache_argument_is_still_probed_onto_the_loop(tiny_model, tokenizer):
    model = _same_weights(CacheOnlyThroughKwargs, tiny_model)
    path = decoding_path(model)
    assert path.fast and path.cache_argument in CACHE_ARGUMENTS
    engine = GenerationEngine(model, tokenizer, GREEDY)
    got = [c.token_ids.tolist() for c in engine.generate_batch(contexts(tokenizer), stop_at_eos=False)]
    assert_greedy_continuations_agree(tiny_model, contexts(tokenizer), got, [hf_greedy(tiny_model, context) for context in contexts(tokenizer)])
    assert engine.prefix_cache.entries  # the loop ran: it keeps each row's KV


def test_a_model_that_drops_the_cache_is_refused_with_the_reason(tiny_model, caplog):
    model = _same_weights(IgnoresKnownCacheNames, tiny_model)
    with caplog.at_level(logging.WARNING, logger=FAST_PATH_LOGGER):
        path = decoding_path(model)
    assert not path.fast and path.cache_argument is None
    assert "held 0 of the 3 tokens" in path.reason and str(path).startswith(GENERATE)
    assert [r.getMessage() for r in caplog.records if "IgnoresKnownCacheNames" in r.getMessage()]


def test_a_sliding_window_model_falls_back_to_generate_with_one_warning(tokenizer, caplog):
    model = tiny_sliding_window_model()
    with caplog.at_level(logging.WARNING, logger=FAST_PATH_LOGGER):
        first = GenerationEngine(model, tokenizer, GREEDY)
        got = [c.token_ids.tolist() for c in first.generate_batch(contexts(tokenizer), stop_at_eos=False)]
        second = GenerationEngine(model, tokenizer, GREEDY)
        second.generate_batch(contexts(tokenizer)[:1], stop_at_eos=False)
    warnings = [r.getMessage() for r in caplog.records if r.name == FAST_PATH_LOGGER]
    assert len(warnings) == 1
    assert "DynamicSlidingWindowLayer" in warnings[0] and "Cost:" in warnings[0] and GENERATE in warnings[0]
    assert not first.fast_path and not second.fast_path and "sliding window" in first.decoding_path.reason
    assert_greedy_continuations_agree(model, contexts(tokenizer), got, [hf_greedy(model, context) for context in contexts(tokenizer)])
    assert not first.prefix_cache.entries  # generate keeps no KV


def test_an_unsupported_setting_is_served_by_generate_and_logged_once(tiny_model, tokenizer, caplog):
    engine = GenerationEngine(tiny_model, tokenizer, {**GREEDY, "repetition_penalty": 1.3})
    with caplog.at_level(logging.WARNING, logger="textenv.engine.engine"):
        engine.generate_batch(contexts(tokenizer), stop_at_eos=False)
        engine.generate_batch(contexts(tokenizer), stop_at_eos=False)
    warnings = [r.getMessage() for r in caplog.records if r.name == "textenv.engine.engine"]
    assert len(warnings) == 1 and "repetition_penalty=1.3" in warnings[0] and "Cost:" in warnings[0]
    assert engine.fast_path  # the model qualifies; that setting does not
    assert not engine.prefix_cache.entries


def test_the_probe_leaves_the_random_generator_and_the_weights_alone(tokenizer):
    from textenv.models import tiny_causal_lm

    model = tiny_causal_lm(seed=3).train()  # dropout would draw random numbers
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.manual_seed(5)
    state = torch.get_rng_state()
    assert decoding_path(model).fast
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


@pytest.mark.parametrize("model", [object(), torch.nn.Linear(2, 2)], ids=["not a module", "no config"])
def test_anything_but_a_transformers_decoder_is_not_for_the_loop(model):
    path = decoding_path(model)
    assert path == DecodingPath(fast=False, reason=path.reason) and path.reason


def test_both_front_ends_say_which_path_decodes_their_model(tiny_model, tokenizer):
    from textenv import TextEnvironment
    from textenv.gym import GymScheduler

    sliding = tiny_sliding_window_model()
    for model, fast in ((tiny_model, True), (sliding, False)):
        environment = TextEnvironment(model, tokenizer, {}, None, "", generation_kwargs=GREEDY)
        scheduler = GymScheduler(model, tokenizer, gym_env="math_env", generation_kwargs=GREEDY)
        assert environment.decoding_path is scheduler.decoding_path is decoding_path(model)
        assert environment.decoding_path.fast is fast
    assert "sliding window" in GymScheduler(sliding, tokenizer, gym_env="math_env").decoding_path.reason


def test_the_probe_never_undoes_a_random_draw_made_by_episodes_meanwhile(tiny_model, tokenizer):
    # The probe saves and restores torch's random state; while it ran in the decoding thread, a draw the episodes'
    # thread made meanwhile (an episode's run seed) was undone, and the next rollout repeated its randomness.
    import asyncio
    import time

    def slow_probe(module, args, kwargs):
        if not kwargs["input_ids"].any():  # the probe feeds zeros
            time.sleep(0.3)

    tiny_model.register_forward_pre_hook(slow_probe, with_kwargs=True)
    engine = GenerationEngine(tiny_model, tokenizer, GREEDY)

    async def episodes():
        await asyncio.sleep(0.05)
        drawn = torch.rand(1)
        await engine.generate(contexts(tokenizer)[0], episode=object())
        return drawn

    torch.manual_seed(0)
    drawn = engine.run_hosted(episodes())
    after = torch.rand(1)
    torch.manual_seed(0)
    expected = torch.rand(2)
    assert torch.equal(torch.cat([drawn, after]), expected)


def test_the_loop_on_a_cuda_device_warns_once_with_its_measured_cost(tiny_model, monkeypatch, caplog):
    from textenv.engine import fast_path

    model = _same_weights(LlamaForCausalLM, tiny_model)
    with caplog.at_level(logging.WARNING, logger=FAST_PATH_LOGGER):
        assert decoding_path(model).fast  # on the CPU: no warning
        assert not [record for record in caplog.records if "vllm" in record.getMessage()]
        cuda_model = _same_weights(LlamaForCausalLM, tiny_model)
        # The probe's forwards run where the weights are (the CPU); only the device it reports is a GPU's.
        monkeypatch.setattr(fast_path, "model_device", lambda model: torch.device("cuda"))
        assert decoding_path(cuda_model).fast and decoding_path(cuda_model).fast
    warnings_ = [record.getMessage() for record in caplog.records if "vllm" in record.getMessage()]
    assert len(warnings_) == 1 and "0.66-0.77x" in warnings_[0] and "--engine transformers" in warnings_[0] and 'engine="vllm"' in warnings_[0]
