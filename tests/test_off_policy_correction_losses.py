"""The off-policy correction's losses: the decoupled objective equals AReaL's by hand, and GRPO's weighted loss equals
TRL 1.16's own `_compute_loss` (references and tolerances: tests/off_policy_helpers.py)."""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import trl
from packaging.version import Version

from textenv import off_policy
from textenv.grpo import GRPOConfig
from textenv.grpo import core as grpo_core

from numerics import reduction_tolerance
from off_policy_helpers import FLOAT64, areal_behaviour_weight, trl_mode_reference

PER_TOKEN_ROUNDINGS = 20  # as tests/test_grpo_formulas_loss.py, plus the weight's product


# ------------------------------------------------------------------------------------------------------------
# the decoupled objective by hand (AReaL) and GRPO's weighted loss against TRL's _compute_loss
# ------------------------------------------------------------------------------------------------------------
def areal_decoupled_loss(logprobs, proximal, behaviour, advantages, eps_clip, eps_clip_higher, mask, cap):
    """AReaL's ``ppo_actor_loss_fn`` (token level, no dual clip) with ``behave_imp_weight_cap``; ``advantages``
    per token."""
    loss_mask_count = mask.count_nonzero() or 1
    ratio = torch.where(mask, torch.exp(logprobs - proximal), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_higher)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    pg_loss = pg_loss * areal_behaviour_weight(proximal, behaviour, mask, cap)
    return torch.where(mask, pg_loss, 0).sum() / loss_mask_count


def decoupled_case(seed=0):
    """float64 `(logprobs, proximal, behaviour, advantages, mask)`: ratios to the proximal policy on both sides of
    the clip range, behaviour weights on both sides of the cap 5 (exp(shift), shift in [-2.5, 2.5])."""
    generator = torch.Generator().manual_seed(seed)
    proximal = -0.2 - 3.0 * torch.rand(4, 7, generator=generator, dtype=FLOAT64)
    logprobs = proximal + 0.6 * (torch.rand(4, 7, generator=generator, dtype=FLOAT64) - 0.5)
    behaviour = proximal - 5.0 * (torch.rand(4, 7, generator=generator, dtype=FLOAT64) - 0.5)
    mask = torch.rand(4, 7, generator=generator) > 0.25
    advantages = torch.tensor([1.5, -0.7, 0.3, -1.2], dtype=FLOAT64)
    return logprobs, proximal, behaviour, advantages, mask


def test_decoupled_objective_equals_areals_by_hand():
    logprobs, proximal, behaviour, advantages, mask = decoupled_case()
    config = GRPOConfig(batch_size=4, mini_batch_size=4, num_generations=2, epsilon_high=0.28,
                        vllm_importance_sampling_correction=True, off_policy_objective="decoupled")
    weights, _ = off_policy.importance_weights(proximal, behaviour, mask.double(), off_policy.correction_of(config))
    leaf = logprobs.clone().requires_grad_(True)
    per_token_loss, _ = grpo_core.clipped_token_loss(leaf, proximal, advantages, config.epsilon_low, config.upper_epsilon, weights)
    tokens = float(mask.sum())
    loss = grpo_core.aggregate_loss(per_token_loss, mask.double(), "dapo", accumulation_steps=1, max_completion_length=7,
                                    tokens_per_optimizer_step=grpo_core.dapo_divisor(tokens, 1, 1, 1))
    (grad,) = torch.autograd.grad(loss, leaf)
    areal_leaf = logprobs.clone().requires_grad_(True)
    areal = areal_decoupled_loss(areal_leaf, proximal, behaviour, advantages[:, None].expand_as(logprobs), config.epsilon_low,
                                 config.upper_epsilon, mask, cap=config.behave_imp_weight_cap)
    (areal_grad,) = torch.autograd.grad(areal, areal_leaf)
    behaviour_weights = (proximal - behaviour).exp()[mask]
    assert (behaviour_weights > 5.0).any() and (behaviour_weights < 5.0).any()
    ratio = (logprobs - proximal).exp()[mask]
    assert (ratio > 1.28).any() and (ratio < 0.8).any()
    magnitude = float(advantages.abs().max()) * max(float(ratio.max()), 1.28) * 5.0
    tolerance = reduction_tolerance(PER_TOKEN_ROUNDINGS + int(tokens), magnitude, FLOAT64)
    assert abs(float(loss.detach()) - float(areal.detach())) <= tolerance
    torch.testing.assert_close(grad, areal_grad, rtol=0, atol=tolerance)
    assert (grad[mask] == 0).any() and (grad[mask] != 0).any()  # clipped or masked tokens, and trained ones


class _OneProcessAccelerator:
    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor


def trl_loss_self(logps, entropies, beta):
    """A stand-in ``self`` for TRL 1.16's ``GRPOTrainer._compute_loss`` (the attributes it reads, as in
    tests/grpo_formulas_helpers.py) with vLLM's importance sampling on: dapo, token level, TRL's other defaults."""
    return SimpleNamespace(
        loss_type="dapo", beta=beta, epsilon_low=0.2, epsilon_high=0.28,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1),
        importance_sampling_level="token", top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        use_vllm=True, vllm_importance_sampling_correction=True,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, current_gradient_accumulation_steps=1, max_completion_length=7,
        model=SimpleNamespace(training=True), accelerator=_OneProcessAccelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, entropies, None),
    )


@pytest.mark.skipif(Version(trl.__version__) < Version("1.16"), reason="TRL 1.16's _compute_loss applies the modes' weights")
@pytest.mark.parametrize("mode", off_policy.MODES)
def test_grpo_weighted_loss_equals_trls_compute_loss(mode):
    """The weights multiply the clipped loss, not the KL term, which use_bias_correction_kl weights by the policy
    ratio alone: textenv's chain (`GRPOTrainer._mini_batch_loss`) against TRL's, on the same weights."""
    from trl import GRPOTrainer as TRLGRPOTrainer

    logprobs, old, rollout, advantages, mask = decoupled_case(seed=1)
    ref = logprobs + 0.3 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(2), dtype=FLOAT64)
    beta, correction = 0.04, off_policy.Correction(mode, 0.5, 3.0)
    weights, _ = off_policy.importance_weights(old, rollout, mask.double(), correction)
    trl_ratio = trl_mode_reference(old, rollout, mask.double(), mode, 0.5, 3.0)

    leaf = logprobs.clone().requires_grad_(True)
    per_token_loss, ratio = grpo_core.clipped_token_loss(leaf, old, advantages, 0.2, 0.28, weights)
    per_token_loss = per_token_loss + beta * grpo_core.reference_kl(leaf, ref, ratio)
    loss = grpo_core.aggregate_loss(per_token_loss, mask.double(), "dapo", accumulation_steps=1, max_completion_length=7,
                                    tokens_per_optimizer_step=float(mask.sum()))
    (grad,) = torch.autograd.grad(loss, leaf)

    trl_leaf = logprobs.clone().requires_grad_(True)
    completion_mask = torch.ones(mask.shape, dtype=torch.long)
    inputs = {"prompt_ids": torch.ones(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
              "completion_ids": torch.ones(mask.shape, dtype=torch.long), "completion_mask": completion_mask,
              "tool_mask": mask.long(), "advantages": advantages, "num_items_in_batch": mask.sum().double(),
              "old_per_token_logps": old, "ref_per_token_logps": ref, "importance_sampling_ratio": trl_ratio}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl_loss = TRLGRPOTrainer._compute_loss(trl_loss_self(trl_leaf, torch.zeros_like(logprobs), beta), None, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, trl_leaf)
    ratios = (logprobs - old).exp()[mask]
    kl = float((ref - logprobs).abs().max())
    magnitude = (float(advantages.abs().max()) * max(float(ratios.max()), 1.28) * 3.0
                 + beta * 2 * (math.exp(kl) + kl + 1) * max(float(ratios.max()), 1.0))
    tolerance = reduction_tolerance(PER_TOKEN_ROUNDINGS + int(mask.sum()), magnitude, FLOAT64)
    assert abs(float(loss.detach()) - float(trl_loss.detach())) <= tolerance
    torch.testing.assert_close(grad, trl_grad, rtol=0, atol=tolerance)
    unweighted, _ = grpo_core.clipped_token_loss(logprobs, old, advantages, 0.2, 0.28)
    assert (unweighted * (weights - 1)).abs()[mask].max() > 1e3 * tolerance  # the weights move the loss
