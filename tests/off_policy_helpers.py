"""Shared by the off-policy correction test modules (tests/test_off_policy_correction_*.py): the statistics' names,
TRL 1.16's importance ratio and AReaL's behaviour weight re-typed in float64.

References:
- the modes: TRL computes its importance ratio inline in ``GRPOTrainer._generate_and_score_completions`` (not
  callable alone), so `trl_mode_reference` re-types those lines in float64 on the same float32 inputs;
- how GRPO applies the weight (``per_token_loss * importance_sampling_ratio`` before the KL term, which
  ``use_bias_correction_kl`` weights by the policy ratio only): TRL's own ``_compute_loss`` runs on a stand-in
  ``self`` (trl >= 1.16 only, as tests/test_grpo_formulas_loss.py);
- the decoupled objective: AReaL's ``ppo_actor_loss_fn`` / ``compute_behave_imp_weight`` (inclusionAI/AReaL,
  ``areal/utils/functional/functional.py``, ``behave_imp_weight_mode="token_mask"``) re-typed in float64
  (`areal_decoupled_loss`, tests/test_off_policy_correction_losses.py);
- PPO's default: the implementation before the modes existed, kept verbatim in `legacy_ppo_weights`
  (tests/test_off_policy_correction_ppo.py).

Tolerances (tests/numerics.py has the analysis):
- exact: two trainer steps that run the same computation (the correction off; on with weights of exactly 1,
  ``exp(0)``, or exactly 0, where the same tokens masked by a response mask give the same sums: dr_grpo's divisor
  does not count tokens), the legacy PPO weights (same float32 operations), bounds (a clamped weight is the
  bound), counts and their float32 fractions (``pytest.approx``'s relative 1e-6 > u);
- a float32 weight against the float64 reference (`weight_rtol`): the float32 ``old - rollout`` is rounded once
  (``u |d|``); a sequence sum of ``n`` of them adds at most ``(n - 1) u sum |d|`` (Higham's worst case); the
  argument's absolute error becomes exp's relative error, and float32 exp is within 1 ulp (2u). A mean of ``n``
  weights adds ``(n + 1) u`` (``n`` positive terms summed, one division). No test ratio lies within 10% of a
  bound, so the float32 and float64 sides truncate and mask the same units;
- float64 losses and gradients (the decoupled objective by hand, TRL's ``_compute_loss``): two orders of each
  token's chain and of the token sum (`reduction_tolerance` of ``PER_TOKEN_ROUNDINGS`` plus the tokens, at a bound
  of every per-token term).
"""

from __future__ import annotations

import math

import torch

from textenv import off_policy

from numerics import unit_roundoff

U32 = unit_roundoff(torch.float32)
FLOAT64 = torch.float64
MEAN, MAX, CLIPPED, MASKED = off_policy.RATIO_MEAN, off_policy.RATIO_MAX, off_policy.CLIPPED_FRAC, off_policy.MASKED_FRAC
NAN = float("nan")


def trl_mode_reference(old, rollout, mask, mode, clip_min, clip_max) -> torch.Tensor:
    """TRL 1.16's importance ratio (``GRPOTrainer._generate_and_score_completions``, the ``vllm_importance_sampling_
    correction`` block) re-typed, in float64: `[B, T]` for token modes, `[B, 1]` for sequence modes."""
    per_token_logps_diff = ((old.double() - rollout.double()) * mask).nan_to_num(nan=0.0)
    if mode.startswith("sequence"):
        per_token_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(per_token_logps_diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def areal_behaviour_weight(proximal, behaviour, mask, cap):
    """AReaL's ``compute_behave_imp_weight`` with ``behave_imp_weight_mode="token_mask"``."""
    behave_imp_weight = (proximal - behaviour).exp()
    behave_imp_weight = torch.where(behave_imp_weight > cap, 0.0, behave_imp_weight)
    return torch.where(mask, behave_imp_weight, 0.0)
