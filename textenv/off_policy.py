"""Off-policy correction of a policy-gradient step, shared by `PPOTrainer` and `GRPOTrainer`.

The episodes a step trains on were sampled by a behaviour policy μ: an inference engine (vLLM) with its own
kernels and precision and, when rollouts overlap training, weights up to K versions older than the trainer's.
``step(..., rollout_logprobs=...)`` gives μ's log-probability of every response token. With
``vllm_importance_sampling_correction=True`` each trained token's policy-gradient term is multiplied by an
importance weight built from ``old - rollout``, where ``old`` is the trainer's old policy (the weights before the
step: PPO's no-grad experience pass; GRPO's old log-probabilities, or its own detached ones when on-policy). The
value loss and the KL term are not weighted (as in TRL).

``off_policy_objective="importance_sampling"`` (the default): TRL 1.16's ``vllm_importance_sampling_mode``
(``GRPOTrainer._generate_and_score_completions``), with ``C_min = vllm_importance_sampling_clip_min`` and
``C_max = vllm_importance_sampling_clip_max`` (``None``: no bound on that side):

- ``"token_truncate"``: ``w_t = clamp(exp(old_t - rollout_t), C_min, C_max)``;
- ``"token_mask"``: ``w_t = exp(old_t - rollout_t)``, or 0 where it is outside ``[C_min, C_max]``;
- ``"sequence_truncate"``: one weight per sequence, ``clamp(exp(sum_t (old_t - rollout_t)), C_min, C_max)``
  over the sequence's trained tokens, on each of them;
- ``"sequence_mask"``: that sequence ratio, or 0 for the whole sequence where it is outside ``[C_min, C_max]``.

``off_policy_objective="decoupled"``: the decoupled PPO objective of AReaL (Fu et al., *AReaL: A Large-Scale
Asynchronous Reinforcement Learning System for Language Reasoning*, 2025; ``ppo_actor_loss_fn`` and
``compute_behave_imp_weight`` in inclusionAI/AReaL ``areal/utils/functional/functional.py`` before commit
bc9f00988, with its defaults ``behave_imp_weight_cap=5.0`` and ``behave_imp_weight_mode="token_mask"``; since then
``rejection_sampling: {level: token, action: mask, metric: ratio, upper: 5.0}``). The PPO ratio is taken, and
clipped, against the proximal policy π_prox (the weights before the step, from a no-grad forward pass before
optimisation), and each token's loss is multiplied by the behaviour weight ``π_prox / μ = exp(old_t -
rollout_t)``, set to 0 where it exceeds ``behave_imp_weight_cap`` (no lower bound). Its weights are those of
``"token_mask"`` with ``C_min = None`` and ``C_max = behave_imp_weight_cap``; what it adds is that π_prox is
always a separate pass (GRPO runs one even when on-policy; PPO's old log-probabilities already are one).

Statistics (`Tally.stats`), over the units weighted (trained tokens in token modes, sequences with at least one
trained token in sequence modes; TRL's sequence statistics count every sequence):

- ``objective/importance_sampling_ratio_mean`` / ``..._ratio_max``: the mean and largest weight as applied
  (truncated, or 0 where masked);
- ``objective/importance_sampling_clipped_frac``: the fraction truncated (ratio outside the bounds; 0 in mask modes);
- ``objective/importance_sampling_masked_frac``: the fraction masked to 0 (0 in truncate modes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
OBJECTIVES = ("importance_sampling", "decoupled")
RATIO_MEAN = "objective/importance_sampling_ratio_mean"
RATIO_MAX = "objective/importance_sampling_ratio_max"
CLIPPED_FRAC = "objective/importance_sampling_clipped_frac"
MASKED_FRAC = "objective/importance_sampling_masked_frac"


@dataclass(frozen=True)
class Correction:
    """How importance ratios become weights: a `MODES` entry and its bounds (``None``: unbounded on that side)."""

    mode: str
    clip_min: float | None = None
    clip_max: float | None = None

    @property
    def sequence_level(self) -> bool:
        return self.mode.startswith("sequence")

    @property
    def truncates(self) -> bool:
        return self.mode.endswith("truncate")


def correction_of(config: Any) -> Correction | None:
    """The `Correction` a `PPOConfig` or `GRPOConfig` asks for, or ``None`` when the correction is off."""
    if not config.vllm_importance_sampling_correction:
        return None
    if config.off_policy_objective == "decoupled":
        return Correction("token_mask", None, config.behave_imp_weight_cap)
    return Correction(config.vllm_importance_sampling_mode, config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max)


def needs_proximal_pass(config: Any) -> bool:
    """Whether the decoupled objective asks for π_prox from a no-grad pass before optimisation."""
    return bool(config.vllm_importance_sampling_correction) and config.off_policy_objective == "decoupled"


def check_settings(config: Any) -> None:
    """Validate the off-policy settings of a `PPOConfig` or `GRPOConfig` (TRL 1.16's checks and AReaL's).

    Raises:
        ValueError: naming the field: an unknown mode or objective, a non-positive upper bound,
            ``clip_min >= clip_max``, a ``*_truncate`` mode without either bound, ``behave_imp_weight_cap <= 1``,
            or the decoupled objective without the correction (it needs the rollout log-probabilities).
    """
    if config.vllm_importance_sampling_mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {list(MODES)}, got {config.vllm_importance_sampling_mode!r}.")
    if config.off_policy_objective not in OBJECTIVES:
        raise ValueError(f"off_policy_objective must be one of {list(OBJECTIVES)}, got {config.off_policy_objective!r}.")
    low, high = config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max
    if high is not None and not high > 0:
        raise ValueError(f"vllm_importance_sampling_clip_max must be positive (or None: no upper bound), got {high!r}.")
    if low is not None and high is not None and low >= high:
        raise ValueError(f"vllm_importance_sampling_clip_min ({low}) must be less than vllm_importance_sampling_clip_max ({high}).")
    if config.vllm_importance_sampling_mode.endswith("truncate") and low is None and (high is None or math.isinf(high)):
        raise ValueError(
            "A *_truncate vllm_importance_sampling_mode needs vllm_importance_sampling_clip_min or "
            "vllm_importance_sampling_clip_max (a finite bound to truncate to)."
        )
    if not config.behave_imp_weight_cap > 1.0:
        raise ValueError(f"behave_imp_weight_cap must be > 1 (AReaL's check), got {config.behave_imp_weight_cap!r}.")
    if config.off_policy_objective == "decoupled" and not config.vllm_importance_sampling_correction:
        raise ValueError(
            "off_policy_objective='decoupled' weights each token by the behaviour policy's log-probabilities: set "
            "vllm_importance_sampling_correction=True (and pass rollout_logprobs to step), or use the default objective."
        )


def check_rollout_logprobs(
    rollout_logprobs: Sequence[torch.Tensor] | None,
    responses: Sequence[torch.Tensor],
    response_masks: Sequence[torch.Tensor] | None,
    config_name: str = "PPOConfig",
) -> list[torch.Tensor]:
    """``rollout_logprobs`` as 1-D float tensors on each response's device.

    Raises:
        ValueError: naming the argument (and index) when they are missing, not one per response, not of
            their response's length, or NaN on a trained token (mask 1).
    """
    if rollout_logprobs is None:
        raise ValueError(
            f"{config_name}.vllm_importance_sampling_correction is on but step() got no rollout_logprobs: pass "
            "rollout_logprobs=[history.response_logprobs() for history in histories] (the engine's "
            "log-probability of every response token), or set vllm_importance_sampling_correction=False."
        )
    if len(rollout_logprobs) != len(responses):
        raise ValueError(f"rollout_logprobs has {len(rollout_logprobs)} entries for {len(responses)} responses; give one per response.")
    checked = []
    for index, (logprobs, response) in enumerate(zip(rollout_logprobs, responses)):
        logprobs = torch.as_tensor(logprobs, dtype=torch.float).to(response.device)
        if logprobs.dim() != 1 or len(logprobs) != len(response):
            raise ValueError(
                f"rollout_logprobs[{index}] must be a 1-D tensor of the response's length ({len(response)}), "
                f"got shape {tuple(logprobs.shape)}."
            )
        trained = response_masks[index].to(logprobs.device) > 0 if response_masks is not None else torch.ones_like(logprobs, dtype=torch.bool)
        if bool(logprobs[trained].isnan().any()):
            raise ValueError(
                f"rollout_logprobs[{index}] is NaN on a trained token (mask 1): the engine reported no "
                "log-probability for it (e.g. the in-process engine); the correction needs the engine's "
                "log-probabilities (the vLLM backend) or vllm_importance_sampling_correction=False."
            )
        checked.append(logprobs)
    return checked


@dataclass
class Tally:
    """Sums over the weighted units of one or more mini-batches, for the statistics (0-d tensors).

    Attributes:
        units: trained tokens (token modes) or sequences with a trained token (sequence modes).
        weight_sum / weight_max: sum and largest of their weights (``-inf`` with no unit).
        clipped / masked: how many were truncated / masked to 0.
    """

    units: torch.Tensor
    weight_sum: torch.Tensor
    weight_max: torch.Tensor
    clipped: torch.Tensor
    masked: torch.Tensor

    def __add__(self, other: "Tally") -> "Tally":
        sums = {name: getattr(self, name) + getattr(other, name) for name in ("units", "weight_sum", "clipped", "masked")}
        return Tally(weight_max=torch.maximum(self.weight_max, other.weight_max), **sums)

    def reduced(self, accelerator) -> "Tally":
        """The tally over every process: sums summed, the maximum the largest."""
        sums = torch.stack([self.units, self.weight_sum, self.clipped, self.masked])
        units, weight_sum, clipped, masked = accelerator.reduce(sums, reduction="sum")
        weight_max = accelerator.gather(self.weight_max.reshape(1)).max()
        return Tally(units, weight_sum, weight_max, clipped, masked)

    def stats(self) -> dict[str, torch.Tensor]:
        """The four statistics of this module; with no unit, weights of 1 and nothing clipped or masked."""
        if not float(self.units) > 0:
            one = torch.ones((), dtype=self.weight_sum.dtype, device=self.weight_sum.device)
            return {RATIO_MEAN: one, RATIO_MAX: one, CLIPPED_FRAC: one * 0, MASKED_FRAC: one * 0}
        return {
            RATIO_MEAN: self.weight_sum / self.units,
            RATIO_MAX: self.weight_max,
            CLIPPED_FRAC: self.clipped / self.units,
            MASKED_FRAC: self.masked / self.units,
        }


def importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, masks: torch.Tensor, correction: Correction
) -> tuple[torch.Tensor, Tally]:
    """The importance weights of a batch and the tally of their statistics.

    Args:
        old_logprobs (`torch.Tensor` of shape `[B, T]`): the trainer's old policy (no gradient).
        rollout_logprobs (`torch.Tensor` of shape `[B, T]`): the behaviour policy's; anything (NaN) off the mask.
        masks (`torch.Tensor` of shape `[B, T]`): 1 on the trained tokens; only they count.
        correction (`Correction`): the mode and its bounds.

    Returns:
        `(weights, tally)`: `[B, T]` weights on the trained tokens and 1 elsewhere (finite off the mask whatever
        the inputs), computed in float32 (float64 inputs stay float64), and their `Tally`.
    """
    trained = masks > 0
    dtype = torch.promote_types(old_logprobs.dtype, torch.float32)
    difference = old_logprobs.detach().to(dtype) - rollout_logprobs.to(dtype)
    difference = torch.where(trained, difference, torch.zeros_like(difference))
    if correction.sequence_level:  # [B, 1]: one ratio per sequence, over its trained tokens
        units, ratio = trained.any(dim=-1, keepdim=True), torch.exp(difference.sum(dim=-1, keepdim=True))
    else:
        units, ratio = trained, torch.exp(difference)
    low = -math.inf if correction.clip_min is None else correction.clip_min
    high = math.inf if correction.clip_max is None else correction.clip_max
    outside = (ratio < low) | (ratio > high)
    if correction.truncates:
        applied = torch.clamp(ratio, min=correction.clip_min, max=correction.clip_max)
        tally = _tally(applied, units, clipped=outside, masked=torch.zeros_like(outside))
    else:
        applied = ratio.masked_fill(outside, 0.0)
        tally = _tally(applied, units, clipped=torch.zeros_like(outside), masked=outside)
    weights = torch.where(trained, applied.expand_as(difference), torch.ones_like(difference))
    return weights, tally


def _tally(weights: torch.Tensor, units: torch.Tensor, clipped: torch.Tensor, masked: torch.Tensor) -> Tally:
    mask = units.to(weights.dtype)
    counted = weights[units]
    weight_max = counted.max() if counted.numel() else torch.tensor(-math.inf, dtype=weights.dtype, device=weights.device)
    return Tally(
        units=mask.sum(),
        weight_sum=(weights * mask).sum(),
        weight_max=weight_max,
        clipped=(clipped.to(weights.dtype) * mask).sum(),
        masked=(masked.to(weights.dtype) * mask).sum(),
    )
