"""Truncated importance sampling (TIS): correcting a PPO step for episodes sampled by another engine.

An inference engine (vLLM) samples with its own kernels and precision, so the log-probability it gives a
token differs from the trainer's: the episodes are slightly off-policy. With
``PPOConfig.vllm_importance_sampling_correction`` (opt-in, TRL GRPO's name), `PPOTrainer.step` weights each
trained token's policy-gradient term by

    w = min(exp(old_logprob - rollout_logprob), vllm_importance_sampling_cap)

where ``old_logprob`` is the trainer's log-probability of the token in the step's forward pass before
optimisation (no gradient) and ``rollout_logprob`` the engine's (``step(..., rollout_logprobs=...)``), as
TRL's GRPO (``vllm_importance_sampling_correction``) and verl's TIS do. The value loss is unchanged. The
step then also reports, over the trained tokens of the batch (averaged over processes, like every statistic):

- ``objective/importance_sampling_ratio_mean``: the mean weight ``w`` (capped);
- ``objective/importance_sampling_ratio_max``: the largest weight ``w`` (at most the cap);
- ``objective/importance_sampling_clipped_frac``: the fraction of tokens whose ratio exceeded the cap.

Off (the default), ``rollout_logprobs`` are ignored (not even checked) and the step is legacy's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from textenv.ppo import core

RATIO_MEAN = "objective/importance_sampling_ratio_mean"
RATIO_MAX = "objective/importance_sampling_ratio_max"
CLIPPED_FRAC = "objective/importance_sampling_clipped_frac"
# Methods that must stay the built-in ones for the weights to reach the loss.
WEIGHTED_HOOKS = ("train_minibatch", "loss")


def check_rollout_logprobs(
    rollout_logprobs: Sequence[torch.Tensor] | None,
    responses: Sequence[torch.Tensor],
    response_masks: Sequence[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """``rollout_logprobs`` as 1-D float tensors on each response's device.

    Raises:
        ValueError: naming the argument (and index) when they are missing, not one per response, not of
            their response's length, or NaN on a trained token (mask 1).
    """
    if rollout_logprobs is None:
        raise ValueError(
            "PPOConfig.vllm_importance_sampling_correction is on but step() got no rollout_logprobs: pass "
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


def place_rollout_logprobs(
    rollout_logprobs: Sequence[torch.Tensor], queries: Sequence[torch.Tensor], attention_mask: torch.Tensor
) -> torch.Tensor:
    """`[B, L - 1]`: each response token's rollout log-probability at the logprob position predicting it (after
    left padding and the query), NaN elsewhere."""
    batch, width = attention_mask.shape
    placed = torch.full((batch, width - 1), float("nan"), device=attention_mask.device)
    first_token = attention_mask.int().argmax(dim=1)  # [B] left padding
    for row, (logprobs, query) in enumerate(zip(rollout_logprobs, queries)):
        start = int(first_token[row]) + len(query) - 1
        placed[row, start : start + len(logprobs)] = logprobs.to(placed.device)
    return placed


def importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, masks: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The truncated importance weights of a batch and their statistics.

    Args:
        old_logprobs / rollout_logprobs / masks: `[B, T]`; only the positions where ``masks`` is 1 count.
        cap: the largest weight.

    Returns:
        `(weights, stats)`: `[B, T]` ``min(exp(old - rollout), cap)`` on trained positions and 1 elsewhere
        (finite everywhere), and the three statistics of this module.
    """
    trained = masks > 0
    ratio = torch.exp(old_logprobs.float() - rollout_logprobs.float())
    ratio = torch.where(trained, ratio, torch.ones_like(ratio))
    weights = torch.clamp(ratio, max=cap)
    if not bool(trained.any()):
        zero = torch.zeros((), device=weights.device)
        return weights, {RATIO_MEAN: zero + 1.0, RATIO_MAX: zero + 1.0, CLIPPED_FRAC: zero}
    mask = trained.float()
    stats = {
        RATIO_MEAN: core.masked_mean(weights, mask),
        RATIO_MAX: weights[trained].max(),
        CLIPPED_FRAC: core.masked_mean((ratio > cap).float(), mask),
    }
    return weights, stats


class RolloutCorrectionMixin:
    """The truncated importance sampling of [`PPOTrainer.step`] (methods of the trainer)."""

    def _checked_rollout_logprobs(self, rollout_logprobs, responses, response_masks) -> list[torch.Tensor] | None:
        """The checked ``rollout_logprobs`` when the correction is on, else ``None`` (they are ignored).

        Raises:
            ValueError: see `check_rollout_logprobs`; or the correction cannot apply (an encoder-decoder model,
                or an overridden ``train_minibatch`` / ``loss``, which would not receive the weights).
        """
        if not self.config.vllm_importance_sampling_correction:
            return None
        if self.is_encoder_decoder:
            raise ValueError("vllm_importance_sampling_correction supports decoder-only models only.")
        overridden = [name for name in WEIGHTED_HOOKS if self._is_overridden(name)]
        if overridden:
            raise ValueError(
                f"vllm_importance_sampling_correction weights the built-in loss, but {overridden} are overridden; "
                "apply the weights in your override or turn the correction off."
            )
        return check_rollout_logprobs(rollout_logprobs, responses, response_masks)

    def _importance_weights(self, rollout_logprobs, queries, model_inputs, logprobs, masks):
        """`(weights, stats)` of the batch (see `importance_weights`), or `(None, {})` without ``rollout_logprobs``."""
        if rollout_logprobs is None:
            return None, {}
        placed = place_rollout_logprobs(rollout_logprobs, queries, model_inputs["attention_mask"])
        placed = placed[:, : logprobs.shape[1]].to(logprobs.device)
        return importance_weights(logprobs.detach(), placed, masks, self.config.vllm_importance_sampling_cap)
