"""Every episode samples from its own random stream, so a run's episodes (and torch's global RNG after it) do
not depend on how their turns were batched; LoRA policies decode on the engine's own loop.

Comparisons (tests/numerics.py has the analysis):
- exact: a stream's draws (integer hashing); the same path run twice; torch's RNG state;
- the inverse-CDF frequencies: 20000 draws of a fixed stream, so the counts are the same on every machine
  (float64 cumulative sums of 5 numbers); ``abs=0.015`` is 4.6 binomial standard deviations for the 0.7
  token (sqrt(0.7 * 0.3 / 20000) = 0.0032), more for the others, so another stream would pass too;
- the LoRA loop's greedy tokens against PEFT's `generate`: `assert_greedy_continuations_agree` (equal up to a
  rounding tie of the top two logits, checked in float64);
- sampled episodes at three generation batch sizes: the batches are padded differently, so the
  probabilities differ by rounding and a draw that lands within that of a token boundary of the cumulative
  distribution picks a neighbour (about 1e-7 per draw in float32). The policy runs in float64: the engine
  rounds the logits to float32, and two float64 orders differ by ~1e-16, so a sample flips only where a
  logit sits on a float32 rounding boundary and the draw on a token boundary (~1e-12 per draw).
"""

import collections

import pytest
import torch

from textenv.engine.engine import RolloutEngine, decoding_model
from textenv.engine.fast_path import decoding_path
from textenv.engine.sampling import RandomStream, inverse_cdf
from textenv.environment import TextEnvironment
from textenv.tasks import calculator as task
from textenv.tools import Calculator
from textenv.training.policy import load_policy

from numerics import assert_greedy_continuations_agree, float64_model


def test_a_stream_is_a_function_of_its_seed_and_draw_count():
    first, again, other = RandomStream(7), RandomStream(7), RandomStream(8)
    draws = [first.next_uniform() for _ in range(5)]
    assert draws == [again.next_uniform() for _ in range(5)]
    assert draws != [other.next_uniform() for _ in range(5)]
    assert all(0.0 <= draw < 1.0 for draw in draws) and len(set(draws)) == 5
    assert RandomStream(7).spawn(0).next_uniform() != RandomStream(7).spawn(1).next_uniform()


def test_inverse_cdf_draws_follow_the_distribution_and_skip_impossible_tokens():
    probabilities = torch.tensor([[0.1, 0.0, 0.2, 0.7, 0.0]])
    stream = RandomStream(3)
    draws = 20000
    chosen = [inverse_cdf(probabilities, torch.tensor([stream.next_uniform()], dtype=torch.float64)).item() for _ in range(draws)]
    counts = collections.Counter(chosen)
    assert set(counts) == {0, 2, 3}
    for token, expected in ((0, 0.1), (2, 0.2), (3, 0.7)):
        assert counts[token] / draws == pytest.approx(expected, abs=0.015)
    top = inverse_cdf(probabilities, torch.tensor([1 - 2**-53], dtype=torch.float64)).item()
    assert top == 3  # the largest uniform still lands on a possible token


def _lora_policy():
    model, tokenizer = load_policy("tiny", lora_rank=4, seed=1)
    with torch.no_grad():  # LoRA's B starts at zero: give the adapters an effect to keep
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return model, tokenizer


def test_a_lora_policy_decodes_on_the_engine_loop_with_its_adapters():
    model, tokenizer = _lora_policy()
    inner = decoding_model(model)
    assert inner is not model.pretrained_model and decoding_path(inner).fast
    context = [torch.tensor(tokenizer("What is 2+2?").input_ids)]
    greedy = {"do_sample": False, "max_new_tokens": 8, "eos_token_id": -1}
    fast = RolloutEngine(model, tokenizer, greedy).generate_batch(context, stop_at_eos=False)[0].token_ids.tolist()
    peft_model = model.pretrained_model
    with torch.no_grad():
        reference = peft_model.generate(input_ids=context[0][None], attention_mask=torch.ones(1, len(context[0]), dtype=torch.long), **greedy)
    assert_greedy_continuations_agree(peft_model, context, [fast], [reference[0, len(context[0]) :]])
    with peft_model.disable_adapter():
        without = RolloutEngine(model, tokenizer, greedy).generate_batch(context, stop_at_eos=False)[0].token_ids.tolist()
    assert without != fast  # the adapters act in the loop, and disabling them does too


def _sampled_run(model, tokenizer, generation_batch_size, seed=11):
    env = TextEnvironment(
        model, tokenizer, {task.TOOL_NAME: Calculator()}, task.exact_match_reward, task.PROMPT, max_turns=2,
        generation_kwargs={"do_sample": True, "top_k": 0, "top_p": 1.0, "max_new_tokens": 6}, batch_size=generation_batch_size,
    )
    queries, answers = task.generate_tasks(6, seed=4)
    torch.manual_seed(seed)
    _, responses, masks, _, _ = env.run(queries, answers=answers)
    return [r.tolist() for r in responses], [m.tolist() for m in masks], torch.get_rng_state()


def test_sampled_episodes_do_not_depend_on_the_generation_batch_size():
    model, tokenizer = _lora_policy()
    model = float64_model(model)  # see the module's docstring
    runs = [_sampled_run(model, tokenizer, size) for size in (6, 4, 1)]
    for responses, masks, rng_state in runs[1:]:
        assert responses == runs[0][0] and masks == runs[0][1]
        assert torch.equal(rng_state, runs[0][2])  # the run drew the same from torch's generator
    assert _sampled_run(model, tokenizer, 6, seed=12)[0] != runs[0][0]  # another seed, other episodes
