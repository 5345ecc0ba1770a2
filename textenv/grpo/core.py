"""GRPO's math as pure functions: group-relative advantages, the clipped per-token loss, the KL to the
reference, and the loss aggregations (TRL 1.16 `GRPOTrainer`'s formulas, tested against it).

Shapes: `B` episodes, `G` episodes per group (``num_generations``), `T` response positions (padded).
"""

from __future__ import annotations

import torch

STD_EPSILON = 1e-4  # TRL's: advantages / (std + 1e-4)


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str, all_rewards: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode's reward minus its group's mean, scaled by a reward std.

    Args:
        rewards (`torch.Tensor` of shape `[B]`): one reward per episode; the groups are consecutive runs of
            `num_generations` episodes.
        num_generations (`int`): `G`, episodes per group.
        scale_rewards (`str`): divide by the group's std (``"group"``), the batch's (``"batch"``) or not at all
            (``"none"``), each plus 1e-4.
        all_rewards (`torch.Tensor`, *optional*): the rewards of every process's batch, whose std ``"batch"``
            takes (as TRL gathers them); `None`: `rewards`.

    The stds are unbiased (TRL's `nanstd` on rewards without NaN; textenv's rewards are finite: `GRPOTrainer.step`
    refuses others).

    Returns:
        `(advantages, std_rewards)`, both `[B]`; `std_rewards` is the std the advantage was (or, for ``"none"``,
        would have been with ``"group"``) divided by, for the zero-std statistics.
    """
    grouped = rewards.view(-1, num_generations)  # [B / G, G]
    group_mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    if scale_rewards in ("group", "none"):
        std_rewards = grouped.std(dim=1).repeat_interleave(num_generations) if num_generations > 1 else torch.zeros_like(rewards)
    elif scale_rewards == "batch":
        all_rewards = rewards if all_rewards is None else all_rewards
        std_rewards = all_rewards.std().expand_as(rewards) if all_rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}.")
    advantages = rewards - group_mean
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + STD_EPSILON)
    return advantages, std_rewards


def clipped_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    epsilon_low: float,
    epsilon_high: float,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with the episode's advantage on every token.

    Args:
        logprobs (`torch.Tensor` of shape `[B, T]`): the policy's log-probabilities of the response tokens.
        old_logprobs (`torch.Tensor` of shape `[B, T]`): those of the policy that sampled them.
        advantages (`torch.Tensor` of shape `[B]`): one advantage per episode.
        epsilon_low (`float`), epsilon_high (`float`): the ratio is clipped to `[1 - epsilon_low, 1 + epsilon_high]`.
        importance_weights (`torch.Tensor` of shape `[B, T]`, *optional*): the off-policy correction's weights
            (`textenv.off_policy`, no gradient), multiplying each token's loss as TRL's
            ``per_token_loss * importance_sampling_ratio``.

    Returns:
        `(per_token_loss, ratio)`, both `[B, T]`: ``-min(ratio * A, clip(ratio) * A)`` (times the weights) and
        ``exp(logprobs - old_logprobs)``.
    """
    advantages = advantages.unsqueeze(1)  # [B, 1]
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    if importance_weights is not None:
        per_token_loss = per_token_loss * importance_weights
    return per_token_loss, ratio


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """The per-token KL estimate to the reference, ``exp(ref - logp) - (ref - logp) - 1`` (`[B, T]`, >= 0)."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def reference_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, ratio: torch.Tensor | None) -> torch.Tensor:
    """The KL term per token (`[B, T]`): `k3_kl`, times the probability `ratio` (with its gradient) when given,
    TRL's ``use_bias_correction_kl`` (an importance-sampling correction for samples of the old policy)."""
    per_token_kl = k3_kl(logprobs, ref_logprobs)
    return per_token_kl if ratio is None else per_token_kl * ratio


def dapo_divisor(batch_tokens: float, num_processes: int, accumulation_steps: int, mini_batches: int) -> float:
    """``dapo``'s divisor: the trained tokens of one optimizer step on one process, on average. As TRL: the
    batch's trained tokens over all processes (at least 1) / processes * accumulation steps / mini-batches."""
    return max(batch_tokens, 1.0) / num_processes * accumulation_steps / mini_batches


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: int,
    max_completion_length: int,
    tokens_per_optimizer_step: float,
) -> torch.Tensor:
    """One mini-batch's share of an optimizer step's loss (its gradients are accumulated over the step's mini-batches).

    Args:
        per_token_loss (`torch.Tensor` of shape `[B, T]`): the clipped loss (plus ``beta`` times the KL).
        mask (`torch.Tensor` of shape `[B, T]`): 1 on the tokens trained on (model tokens of the response).
        loss_type (`str`): ``"grpo"``: each episode's token mean, averaged over episodes; ``"dr_grpo"``: the token
            sum over ``B * max_completion_length``; ``"dapo"``: the token sum over the tokens of the whole
            optimizer step (a token mean across episodes).
        accumulation_steps (`int`): mini-batches per optimizer step (``grpo`` and ``dr_grpo`` divide by it).
        max_completion_length (`int`): the ``dr_grpo`` divisor.
        tokens_per_optimizer_step (`float`): the ``dapo`` divisor (`dapo_divisor`).

    Returns:
        The scalar loss to call backward on.
    """
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation_steps
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token_loss.size(0) * max_completion_length) / accumulation_steps
    if loss_type == "dapo":
        return masked.sum() / tokens_per_optimizer_step
    raise ValueError(f"loss_type must be 'grpo', 'dr_grpo' or 'dapo', got {loss_type!r}.")


def clip_fractions(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> dict[str, torch.Tensor]:
    """Sums over the masked tokens of where the clip was active: ``low`` (ratio below ``1 - epsilon_low`` with a
    negative advantage), ``high`` (above ``1 + epsilon_high``, positive advantage) and ``region`` (either); divide
    by the token count for TRL's ``clip_ratio/*_mean``."""
    advantages = advantages.unsqueeze(1)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    return {name: (clipped.float() * mask).sum() for name, clipped in (("low", low), ("high", high), ("region", low | high))}
