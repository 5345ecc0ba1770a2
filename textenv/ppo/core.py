"""PPO math as pure functions: log-probabilities, KL penalties, masked statistics, per-token rewards, GAE,
the clipped losses, and the KL-coefficient controllers.

Conventions: ``B`` = batch, ``T`` = logprob positions (``input_len - 1``: position ``t`` predicts token
``t + 1``), ``V`` = vocabulary. A ``mask`` is 1 where a position is trained on (a model-written response
token) and 0 elsewhere (query, padding, tool output). The arithmetic follows legacy TRL (v0.11.4) exactly
so that losses and statistics agree with it to float tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WHITEN_EPS = 1e-8
LOGIT_CHUNK = 64  # positions per vocabulary-sized temporary in log-softmax statistics

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "LengthSampler",
    "RunningMoments",
    "add_suffix",
    "clip_by_value",
    "compute_advantages",
    "compute_rewards",
    "convert_to_scalar",
    "entropy_from_logits",
    "flatten_dict",
    "full_kl_penalty",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pad_to_size",
    "ppo_loss",
    "ppo_losses",
    "respond_to_batch",
    "selective_logprobs",
    "set_seed",
    "stack_dicts",
    "stats_to_np",
    "top_k_top_p_filtering",
    "upcast_half",
    "whiten",
]


# --------------------------------------------------------------------------------------------------
# log-probabilities and entropy
# --------------------------------------------------------------------------------------------------
def upcast_half(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in float32 if it is in a half-precision dtype (bfloat16, float16), else unchanged.

    The step's log-softmax statistics need at least float32; a float64 model keeps float64 (legacy TRL's
    ``.float()`` rounded it to float32, against its own comment "upcast in fp32 if logits are in half-precision").
    """
    return tensor.float() if tensor.is_floating_point() and torch.finfo(tensor.dtype).bits < 32 else tensor


def selective_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., label]`` without materialising the full log-softmax.

    Computed as ``logit[label] - logsumexp(logits)``, ``LOGIT_CHUNK`` positions at a time, so the only
    vocabulary-sized temporary is that many positions' worth.

    Args:
        logits: `[..., V]` float tensor (`[B, T, V]`, or `[K, V]` for selected positions).
        labels: `[...]` token ids.

    Returns:
        `[...]` log-probabilities in the dtype of ``logits``.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])  # [N, V]
    picked = flat_logits.gather(-1, labels.reshape(-1, 1)).squeeze(-1)  # [N]
    normalisers = torch.cat([torch.logsumexp(chunk, dim=-1) for chunk in flat_logits.split(LOGIT_CHUNK)])
    return (picked - normalisers).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution at every position: `[..., V]` -> `[...]`."""
    probs = F.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor | None, gather: bool = True) -> torch.Tensor:
    """``log_softmax`` over the vocabulary of `[B, T, V]` logits; with ``gather`` the log-probability of each
    label `[B, T]`, else the full `[B, T, V]` log-probabilities."""
    logp = F.log_softmax(logits, dim=2)
    if not gather:
        return logp
    return torch.gather(logp, 2, labels.unsqueeze(2)).squeeze(-1)


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor | float, tensor_max: torch.Tensor | float) -> torch.Tensor:
    """Element-wise ``min(max(x, tensor_min), tensor_max)`` with tensor bounds."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


def whiten(values: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardise with the mean and unbiased variance of all entries; ``shift_mean=False`` adds the mean back."""
    mean, var = torch.mean(values), torch.var(values)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# --------------------------------------------------------------------------------------------------
# KL penalties
# --------------------------------------------------------------------------------------------------
def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference.

    Args:
        logprob, ref_logprob: `[..., T]` log-probabilities of the sampled tokens, or for ``"full"`` `[..., T, V]`
            log-probabilities over the whole vocabulary.
        kind: ``"kl"`` (``lp - ref``), ``"abs"`` (``|lp - ref|``), ``"mse"`` (``0.5 (lp - ref)^2``) or ``"full"``
            (``sum_v exp(lp) (lp - ref)`` over the vocabulary; for raw logits use [`full_kl_penalty`]).
    """
    if kind == "kl":
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kind == "full":
        return F.kl_div(ref_logprob, logprob, log_target=True, reduction="none").sum(-1)
    raise ValueError(f"Unknown kl_penalty {kind!r}; expected 'kl', 'abs', 'mse' or 'full'")


def full_kl_penalty(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || p_ref) summed over the vocabulary at every position: `[B, T, V]` x2 -> `[B, T]`.

    ``logits`` may be unnormalised (they are log-softmaxed first); log-probabilities work as well.
    """
    return kl_penalty(F.log_softmax(upcast_half(logits), dim=-1), F.log_softmax(upcast_half(ref_logits), dim=-1), "full")


# --------------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------------
def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1 (over ``axis`` if given)."""
    if axis is not None:
        return (values * mask).sum(axis=axis) / mask.sum(axis=axis)
    return (values * mask).sum() / mask.sum()


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the masked positions (Bessel-corrected when ``unbiased``).

    Raises:
        ValueError: the mask is all zeros.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        mask_sum = mask.sum()
        if mask_sum == 0:
            raise ValueError(
                "The sum of the mask is zero, which can happen when `mini_batch_size=1`; try increasing "
                "`mini_batch_size` or `gradient_accumulation_steps`"
            )
        variance = variance * (mask_sum / (mask_sum - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardise ``values`` with the mean and unbiased variance of the masked positions; with
    ``shift_mean=False`` the mean is added back (only the scale changes). Applied to every position."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# --------------------------------------------------------------------------------------------------
# rewards and advantages
# --------------------------------------------------------------------------------------------------
def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in every row of a `[B, T]` 0/1 mask (rows must contain a 1) -> `[B]`."""
    positions = torch.arange(mask.shape[-1], device=mask.device)
    return torch.where(mask.bool(), positions, -1).amax(dim=-1)


def compute_rewards(
    scores: torch.Tensor, kls: torch.Tensor, masks: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: ``-kl_coef * kl`` everywhere, plus the episode score on the last trainable
    position (the last position whose mask is 1 — the last model-written token).

    Args:
        scores: `[B]` one scalar score per episode.
        kls: `[B, T]` per-token KL penalty (see [`kl_penalty`]).
        masks: `[B, T]` trainable positions; every row needs at least one 1.
        kl_coef: current KL coefficient.

    Returns:
        `(rewards, non_score_rewards)`, both `[B, T]`.
    """
    non_score_rewards = -kl_coef * kls  # [B, T]
    rewards = non_score_rewards.clone()
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    last = last_true_index(masks)  # [B]
    rewards[rows, last] += scores.to(rewards.dtype)
    return rewards, non_score_rewards


def compute_advantages(
    values: torch.Tensor,
    rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    whiten_rewards: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the full padded length.

    Values and rewards are zeroed outside the mask, but masked positions are not skipped: they still
    decay the running advantage by ``gamma * lam`` (legacy behaviour). Advantages are whitened over the
    masked positions.

    Args:
        values: `[B, T]` value predictions.
        rewards: `[B, T]` per-token rewards.
        mask: `[B, T]` trainable positions.

    Returns:
        `(values, advantages, returns)`, each `[B, T]`, detached; ``values`` are the masked values.
    """
    values = values * mask
    rewards = rewards * mask
    if whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    length = rewards.shape[-1]
    last_advantage = torch.zeros_like(rewards[:, 0])  # [B]
    reversed_advantages = []
    for t in reversed(range(length)):
        next_values = values[:, t + 1] if t < length - 1 else 0.0
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_advantage = delta + gamma * lam * last_advantage
        reversed_advantages.append(last_advantage)
    advantages = torch.stack(reversed_advantages[::-1], dim=1)  # [B, T]
    returns = advantages + values
    advantages = masked_whiten(advantages, mask)
    return values.detach(), advantages.detach(), returns.detach()


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------
def clipped_value_loss(
    vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * masked_mean(max((v - R)^2, (clip(v, V_old +- c) - R)^2))`` and the clipped fraction."""
    vpreds_clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpreds_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.max(unclipped, clipped), mask)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)
    return loss, clipfrac


def clipped_policy_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, cliprange: float,
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``masked_mean(max(-A r, -A clip(r, 1 +- c)))`` and the clipped fraction; with ``importance_weights``
    (finite, same shape) each token's term is multiplied by its weight before the mean."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.max(unclipped, clipped)
    if importance_weights is not None:
        per_token = per_token * importance_weights
    loss = masked_mean(per_token, mask)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), mask)
    return loss, clipfrac


def ppo_losses(
    old_logprobs: torch.Tensor,
    old_values: torch.Tensor,
    logprobs: torch.Tensor,
    vpreds: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    cliprange: float,
    cliprange_value: float,
    vf_coef: float,
    ratio_threshold: float = float("inf"),
    importance_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], bool]:
    """The PPO objective of one mini-batch.

    All tensors are `[mb, T]`; ``logprobs`` and ``vpreds`` carry gradients, ``entropy`` is per-token entropy
    (statistic only). If the masked mean ratio exceeds ``ratio_threshold`` the losses are multiplied by 0
    (the batch is skipped but backward still runs). ``importance_weights`` (optional, no gradient) multiply
    each token's policy-gradient term (the off-policy correction, see `textenv.off_policy`);
    the value loss and the statistics are unchanged.

    Returns:
        `(pg_loss, scaled_vf_loss, stats, skipped)`, as legacy ``PPOTrainer.loss``: the policy loss, ``vf_coef *
        vf_loss``, the legacy train statistics (``loss/value`` is the unscaled value loss, ``loss/total`` the sum)
        and whether the ratio threshold was hit.
    """
    vf_loss, vf_clipfrac = clipped_value_loss(vpreds, old_values, returns, mask, cliprange_value)
    ratio = torch.exp(logprobs - old_logprobs)  # [mb, T]
    pg_loss, pg_clipfrac = clipped_policy_loss(ratio, advantages, mask, cliprange, importance_weights)
    loss = pg_loss + vf_coef * vf_loss

    skipped = bool(masked_mean(ratio, mask).item() > ratio_threshold)
    if skipped:
        pg_loss, vf_loss, loss = pg_loss * 0.0, vf_loss * 0.0, loss * 0.0

    with torch.no_grad():
        stats = {
            "loss/policy": pg_loss.detach(),
            "loss/value": vf_loss.detach(),
            "loss/total": loss.detach(),
            "policy/entropy": masked_mean(entropy, mask),
            "policy/approxkl": 0.5 * masked_mean((logprobs - old_logprobs) ** 2, mask),
            "policy/policykl": masked_mean(old_logprobs - logprobs, mask),
            "policy/clipfrac": pg_clipfrac.detach(),
            "policy/advantages": advantages.detach(),
            "policy/advantages_mean": masked_mean(advantages, mask),
            "policy/ratio": ratio.detach(),
            "returns/mean": masked_mean(returns, mask),
            "returns/var": masked_var(returns, mask),
            "val/vpred": masked_mean(vpreds, mask),
            "val/error": masked_mean((vpreds - returns) ** 2, mask),
            "val/clipfrac": vf_clipfrac.detach(),
            "val/mean": masked_mean(old_values, mask),
            "val/var": masked_var(old_values, mask),
        }
    return pg_loss, vf_coef * vf_loss, stats, skipped




def ppo_loss(*args, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor], bool]:
    """[`ppo_losses`] with the two losses summed: `(pg_loss + vf_coef * vf_loss, stats, skipped)`."""
    pg_loss, scaled_vf_loss, stats, skipped = ppo_losses(*args, **kwargs)
    return pg_loss + scaled_vf_loss, stats, skipped


# --------------------------------------------------------------------------------------------------
# legacy names that lived in ``trl.core`` / ``trl.trainer.utils``
# --------------------------------------------------------------------------------------------------
from textenv.ppo.kl_control import AdaptiveKLController, FixedKLController, RunningMoments  # noqa: E402,F401
from textenv.ppo.utils import (  # noqa: E402,F401
    LengthSampler,
    add_suffix,
    convert_to_scalar,
    flatten_dict,
    pad_to_size,
    respond_to_batch,
    set_seed,
    stack_dicts,
    stats_to_np,
    top_k_top_p_filtering,
)
