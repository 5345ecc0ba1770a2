"""Off-policy correction of a PPO step: the glue between `PPOTrainer.step` and `textenv.off_policy`.

An inference engine (vLLM) samples with its own kernels and precision, and, when rollouts overlap training,
with older weights, so the episodes are off-policy. With ``PPOConfig.vllm_importance_sampling_correction``
(opt-in, TRL GRPO's name), `PPOTrainer.step` weights each trained token's policy-gradient term by an importance
weight of ``exp(old_logprob - rollout_logprob)``, where ``old_logprob`` is the trainer's log-probability of the
token in the step's forward pass before optimisation (no gradient; this is also AReaL's proximal policy) and
``rollout_logprob`` the engine's (``step(..., rollout_logprobs=...)``). How the ratio becomes a weight is
``vllm_importance_sampling_mode`` (default ``"token_truncate"``: ``min(ratio, vllm_importance_sampling_clip_max)``,
the clip max defaulting to ``vllm_importance_sampling_cap``'s 2.0) or ``off_policy_objective="decoupled"``; see
`textenv.off_policy`. The value loss is unchanged. The step then also reports, over the trained tokens of the
batch (sequences in sequence modes; averaged over processes, like every statistic),
``objective/importance_sampling_ratio_mean``, ``..._ratio_max``, ``..._clipped_frac`` and ``..._masked_frac``.

Off (the default), ``rollout_logprobs`` are ignored (not even checked) and the step is legacy's.
"""

from __future__ import annotations

from typing import Sequence

import torch

from textenv import off_policy
from textenv.off_policy import CLIPPED_FRAC, MASKED_FRAC, RATIO_MAX, RATIO_MEAN, check_rollout_logprobs

__all__ = ["CLIPPED_FRAC", "MASKED_FRAC", "RATIO_MAX", "RATIO_MEAN", "RolloutCorrectionMixin", "check_rollout_logprobs",
           "importance_weights", "place_rollout_logprobs"]
# Methods that must stay the built-in ones for the weights to reach the loss.
WEIGHTED_HOOKS = ("train_minibatch", "loss")


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
    """The ``"token_truncate"`` weights of a batch, ``min(exp(old - rollout), cap)`` on trained positions and 1
    elsewhere (`[B, T]`), and their statistics (see `textenv.off_policy.importance_weights`)."""
    weights, tally = off_policy.importance_weights(old_logprobs, rollout_logprobs, masks, off_policy.Correction("token_truncate", None, cap))
    return weights, tally.stats()


class RolloutCorrectionMixin:
    """The off-policy correction of [`PPOTrainer.step`] (methods of the trainer)."""

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
        """`(weights, stats)` of the batch (`textenv.off_policy.importance_weights` with the config's correction),
        or `(None, {})` without ``rollout_logprobs``."""
        if rollout_logprobs is None:
            return None, {}
        placed = place_rollout_logprobs(rollout_logprobs, queries, model_inputs["attention_mask"])
        placed = placed[:, : logprobs.shape[1]].to(logprobs.device)
        weights, tally = off_policy.importance_weights(logprobs.detach(), placed, masks, off_policy.correction_of(self.config))
        return weights, tally.stats()
