"""One real PPO step on the bundled SmolLM2-135M-Instruct with TextEnvironment output (calculator task).

Tolerances (tests/numerics.py has the analysis): before the update the policy and its reference hold the same
float32 weights (the reference shares the lower layers and copies the top two), but their log-probabilities come
from different passes: the policy's from the first training mini-batch's pass (gradients on, its rows in the
shuffled order, so another packed layout), the reference's from a no-grad pass in row order. They are equal only
in exact arithmetic: each log-probability within `assert_reordered_close` of `forward_terms` additions (the
135M model stays float32: float64 would double a slow test's memory and time), the KL (a row's sum of
log-probability differences, averaged over rows) within the trained tokens of a row times that. The scores are
0 or 1, so their mean over 2 episodes is exact in float32.
"""

import copy
import math
import warnings

import pytest
import torch

from textenv import TextEnvironment
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.tasks import calculator as task
from textenv.tools import Calculator

from numerics import assert_reordered_close, forward_terms, reduction_tolerance


@pytest.mark.slow
def test_real_step_on_bundled_model_with_text_environment(bundled):
    base, tokenizer = bundled
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead(copy.deepcopy(base))
    num_layers = model.config.num_hidden_layers
    # Share (and freeze) all but the top two layers with the reference: less memory and time, same code path.
    config = PPOConfig(batch_size=2, mini_batch_size=2, ppo_epochs=1, learning_rate=1e-4, seed=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(config, model, tokenizer=tokenizer, num_shared_layers=num_layers - 2)
    env = TextEnvironment(
        model, tokenizer, {"Calculator": Calculator()}, task.exact_match_reward, task.PROMPT, max_turns=2,
        generation_kwargs={"do_sample": False, "max_new_tokens": 20, "pad_token_id": tokenizer.pad_token_id},
    )
    tasks, answers = task.generate_tasks(2, seed=1)
    queries, responses, masks, rewards, histories = env.run(tasks, answers=answers)
    # the model called the calculator: its output is in the response and masked out
    assert any("<call>" in h.text[len(task.PROMPT):] for h in histories)
    assert any(int((m == 0).sum()) > 0 for m in masks)
    assert all(len(m) == len(r) for m, r in zip(masks, responses))

    top_layer = model.pretrained_model.model.layers[-1].mlp.down_proj.weight
    before = top_layer.detach().clone()
    stats = trainer.step(queries, responses, [torch.tensor(float(r)) for r in rewards], masks)
    # policy == reference before the update, up to the rounding of two passes in other layouts
    logprobs, ref_logprobs = torch.as_tensor(stats["objective/logprobs"]), torch.as_tensor(stats["objective/ref_logprobs"])
    terms = forward_terms(model.config, logprobs.shape[1] + 1)
    assert_reordered_close(logprobs, ref_logprobs, terms, "policy and reference log-probabilities")
    per_token = reduction_tolerance(terms, float(torch.maximum(logprobs.abs().max(), ref_logprobs.abs().max())))
    assert abs(stats["objective/kl"]) <= max(int(m.sum()) for m in masks) * per_token
    assert logprobs.abs().max() > 1.0  # real log-probabilities, not zeros
    for key in ("ppo/loss/total", "ppo/loss/value", "objective/entropy", "ppo/policy/entropy", "ppo/val/vpred"):
        assert math.isfinite(stats[key]), key
    assert stats["ppo/mean_scores"] == sum(float(r) for r in rewards) / 2
    assert not torch.equal(top_layer, before)
    assert top_layer is not trainer.ref_model.pretrained_model.model.layers[-1].mlp.down_proj.weight
    assert model.pretrained_model.model.layers[0].mlp.down_proj.weight is trainer.ref_model.pretrained_model.model.layers[0].mlp.down_proj.weight
