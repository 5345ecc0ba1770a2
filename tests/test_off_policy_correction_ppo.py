"""The off-policy correction in PPO: its default is the token truncation PPO had before the modes, bit for bit,
and PPOTrainer applies the other modes' weights (references and tolerances: tests/off_policy_helpers.py)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from textenv import off_policy
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo import rollout_correction
from textenv.ppo.core import masked_mean
from textenv.testing import tiny_causal_lm

from off_policy_helpers import CLIPPED, FLOAT64, MASKED, MAX, MEAN, U32


# ------------------------------------------------------------------------------------------------------------
# PPO's default is the token truncation it had before the modes, bit for bit
# ------------------------------------------------------------------------------------------------------------
def legacy_ppo_weights(old_logprobs, rollout_logprobs, masks, cap):
    """`textenv.ppo.rollout_correction.importance_weights` before this change, verbatim."""
    trained = masks > 0
    ratio = torch.exp(old_logprobs.float() - rollout_logprobs.float())
    ratio = torch.where(trained, ratio, torch.ones_like(ratio))
    weights = torch.clamp(ratio, max=cap)
    mask = trained.float()
    stats = {MEAN: masked_mean(weights, mask), MAX: weights[trained].max(), CLIPPED: masked_mean((ratio > cap).float(), mask)}
    return weights, stats


@pytest.mark.parametrize("cap", [2.0, 1.5, 0.5])
def test_ppo_default_correction_is_the_legacy_truncation_bit_for_bit(cap):
    generator = torch.Generator().manual_seed(0)
    old = -3.0 * torch.rand(5, 9, generator=generator)
    rollout = old + torch.randn(5, 9, generator=generator)
    masks = (torch.rand(5, 9, generator=generator) > 0.3).float()
    config = PPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_cap=cap)
    assert off_policy.correction_of(config) == off_policy.Correction("token_truncate", None, cap)
    weights, tally = off_policy.importance_weights(old, rollout, masks, off_policy.correction_of(config))
    legacy_weights, legacy_stats = legacy_ppo_weights(old, rollout, masks, cap)
    trained = masks > 0
    assert torch.equal(weights[trained], legacy_weights[trained])
    if cap >= 1.0:  # below 1 the legacy code clamped the untrained positions' 1 to the cap too (unused: masked out)
        assert torch.equal(weights, legacy_weights)
    stats = tally.stats()
    for key, value in legacy_stats.items():
        assert torch.equal(stats[key], value), key
    assert float(stats[MASKED]) == 0.0
    assert torch.equal(rollout_correction.importance_weights(old, rollout, masks, cap)[0], weights)


# ------------------------------------------------------------------------------------------------------------
# PPOTrainer with the other modes
# ------------------------------------------------------------------------------------------------------------
PPO_PROMPT = torch.arange(100, 120)
PPO_QUERIES = [torch.cat([PPO_PROMPT, torch.tensor(task)]) for task in ([7, 8], [9, 10, 11], [12])]
PPO_RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
PPO_SCORES = [torch.tensor(1.0), torch.tensor(-1.0), torch.tensor(0.5)]
PPO_MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]


def ppo_step(rollout, **config):
    """`(stats, experience)` of one PPO step (one mini-batch, one epoch) on the batch above, with the correction."""
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0))
    options = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 1, "learning_rate": 1e-3, "seed": 0,
               "vllm_importance_sampling_correction": True, **config}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(PPOConfig(**options), model)
    seen = {}
    train_rows, importance = trainer._train_rows, trainer._importance_weights
    trainer._train_rows = lambda experience, rows, legacy: seen.update(experience) or train_rows(experience, rows, legacy)

    def record(rollout_logprobs, queries, model_inputs, logprobs, masks):
        seen["old"], seen["attention_mask"] = logprobs.clone(), model_inputs["attention_mask"]
        return importance(rollout_logprobs, queries, model_inputs, logprobs, masks)

    trainer._importance_weights = record
    stats = trainer.step(PPO_QUERIES, PPO_RESPONSES, PPO_SCORES, PPO_MASKS, rollout_logprobs=rollout)
    return stats, seen


def ppo_old_logprobs() -> list[torch.Tensor]:
    """The trainer's old log-probability of every response token (read from an identical step)."""
    _, seen = ppo_step([torch.zeros(len(response)) for response in PPO_RESPONSES])
    first = seen["attention_mask"].int().argmax(dim=1)
    starts = [int(first[row]) + len(query) - 1 for row, query in enumerate(PPO_QUERIES)]
    return [seen["old"][row, start : start + len(response)].cpu() for row, (start, response) in enumerate(zip(starts, PPO_RESPONSES))]


def shifted_rtol(old, rollout, shifts, sequence: bool) -> float:
    """A weight's relative error against ``exp(-shift)`` (summed over a sequence's trained tokens) when the test
    built ``rollout = fl32(old + shift)``: per token ``u (|old| + 2 |rollout| + |shift|)`` (rounding the rollout,
    then the float32 difference; as tests/test_rollout_logprobs_correction.py's `ratio_rtol`), a sequence sum of
    ``n`` of them adds ``(n - 1) u sum |shift|``, and exp's 2u."""
    chains = []
    for logprobs, built, shift, mask in zip(old, rollout, shifts, PPO_MASKS):
        per_token = (logprobs.abs() + 2 * built.abs() + shift.abs())[mask > 0]
        if sequence:
            chains.append(float(per_token.sum()) + int(mask.sum()) * float(shift[mask > 0].abs().sum()))
        else:
            chains.append(float(per_token.max()))
    return U32 * (max(chains) + 2)


@pytest.mark.parametrize("objective", ["sequence_mask", "decoupled"])
def test_ppo_step_weights_in_the_other_modes(objective):
    """Rollout = old + shift, so each token's ratio is exp(-shift) (9 on untrained tokens: unused): sequence_mask
    weights rows 0 and 1 by exp(0.5) and drops row 2 (exp(-3.2) < clip_min 0.1); decoupled zeroes the token above
    the cap 5 (exp(2) > 5)."""
    shifts = [torch.tensor([-0.15, -0.15, 9.0, 9.0, -0.1, -0.1]), torch.tensor([-2.0, 1.0, 0.5]), torch.tensor([0.8] * 4 + [9.0] * 3 + [0.0] * 3)]
    old = ppo_old_logprobs()
    rollout = [logprobs + shift for logprobs, shift in zip(old, shifts)]
    if objective == "decoupled":
        stats, seen = ppo_step(rollout, off_policy_objective="decoupled")
        expected = [[0.0 if math.exp(-s) > 5.0 else math.exp(-s) for s in shift[mask > 0].tolist()] for shift, mask in zip(shifts, PPO_MASKS)]
        units = sum(len(row) for row in expected)
        assert stats[MASKED] == pytest.approx(1 / units)  # row 1's exp(2)
    else:
        stats, seen = ppo_step(rollout, vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_min=0.1)
        sequence = [math.exp(-float(shift[mask > 0].sum())) for shift, mask in zip(shifts, PPO_MASKS)]
        expected = [[ratio if 0.1 <= ratio <= 2.0 else 0.0] * int(mask.sum()) for ratio, mask in zip(sequence, PPO_MASKS)]
        assert expected[2][0] == 0.0 and stats[MASKED] == pytest.approx(1 / 3)
    weights, masks = seen["weights"].cpu(), seen["masks"].cpu()
    rtol = shifted_rtol(old, rollout, shifts, sequence=objective == "sequence_mask")
    for row, row_expected in enumerate(expected):
        torch.testing.assert_close(weights[row][masks[row] > 0].double(), torch.tensor(row_expected, dtype=FLOAT64), rtol=rtol, atol=0)
    assert stats[CLIPPED] == 0.0 and MEAN in stats and MAX in stats
