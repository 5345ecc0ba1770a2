"""Shared by the modules that check textenv's GRPO against TRL 1.16 (tests/test_grpo_formulas_*.py): a comparison
in float64, the advantages' tolerance, a one-process accelerator and TRL's `_compute_loss` on a stand-in
``self`` (`trl_loss_self`).
"""

import contextlib
from collections import defaultdict
from types import SimpleNamespace

import torch

from numerics import reduction_tolerance

FLOAT64 = torch.float64
EPSILON = 0.2
LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
EPSILON_HIGHS = (None, 0.28)  # None: TRL and textenv use epsilon (test_shared_defaults_and_epsilon_high_default_equal_trl)


def assert_close(actual, expected, tolerance, what=""):
    """Every entry of ``actual`` within ``tolerance`` (a number, or a tensor of one per entry) of ``expected``;
    both are compared in float64 (a float32 value converts exactly)."""
    actual, expected = torch.as_tensor(actual, dtype=FLOAT64), torch.as_tensor(expected, dtype=FLOAT64)
    assert actual.shape == expected.shape, f"{what}: shapes {tuple(actual.shape)} != {tuple(expected.shape)}"
    difference = (actual - expected).abs()
    assert bool((difference <= torch.as_tensor(tolerance, dtype=FLOAT64)).all()), (
        f"{what}: max |difference| {difference.max().item():.3g} (tolerance {torch.as_tensor(tolerance).max().item():.3g})"
        f"\ntextenv: {actual}\nTRL:     {expected}"
    )


def advantage_tolerance(rewards, num_generations, scale_rewards) -> torch.Tensor:
    """Part 2, one per episode: float32 group advantages ``(r - mean) / (std + 1e-4)`` in two orders: the sums of
    the mean and the variance over the group (the batch for ``"batch"``) and ~6 more roundings (the deviation,
    the square root, the division), of rewards of size max |r| scaled by 1 / (std + 1e-4)."""
    rewards = torch.as_tensor(rewards, dtype=FLOAT64)
    grouped = rewards.view(-1, num_generations)
    if scale_rewards == "batch":
        terms, size, divisor = len(rewards) + 6, rewards.abs().max().expand(len(rewards)), rewards.std() + 1e-4
    else:
        terms = num_generations + 6
        size = grouped.abs().amax(1).repeat_interleave(num_generations)
        divisor = (grouped.std(1) + 1e-4).repeat_interleave(num_generations) if scale_rewards == "group" else 1.0
    return reduction_tolerance(terms, 1.0, torch.float32) * size / divisor


class OneProcessAccelerator:
    """What `_compute_loss` and `_get_per_token_logps_and_entropies` call on `self.accelerator`, for one process
    (accelerate's own `reduce` and `gather` return the tensor unchanged on one process)."""

    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    def autocast(self):
        return contextlib.nullcontext()


def trl_loss_self(*, loss_type, beta, epsilon_low, epsilon_high, logps, entropies, accumulation_steps=1,
                  steps_per_generation=1, max_completion_length=8, use_bias_correction_kl=False):
    """A stand-in ``self`` for `TRLGRPOTrainer._compute_loss` with exactly the attributes it reads for the
    token-level GRPO losses (a `SimpleNamespace` raises on any other), in training mode; its
    `_get_per_token_logps_and_entropies` returns the given `logps` (a leaf requiring grad) and `entropies`.
    The other settings are a TRL trainer's defaults (test_stand_in_settings_are_trl_defaults) but
    `use_bias_correction_kl` (off here, so the plain KL term is checked too; on, with TRL's default, in
    test_kl_term_with_trl_default_bias_correction)."""

    def get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == logps.shape[1] and input_ids.shape[0] == logps.shape[0]
        return logps, entropies, None

    return SimpleNamespace(
        loss_type=loss_type,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=steps_per_generation),
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        current_gradient_accumulation_steps=accumulation_steps,
        max_completion_length=max_completion_length,
        model=SimpleNamespace(training=True),
        accelerator=OneProcessAccelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=get_per_token_logps_and_entropies,
    )
