"""The pure PPO math of `textenv.ppo.core`, part 2: the clipped policy and value losses, the KL controllers and the
running moments, checked against legacy TRL's test vectors and against direct re-computations (tolerances:
tests/ppo_core_helpers.py)."""

import numpy as np
import pytest
import torch

from textenv.ppo import core

from numerics import reduction_tolerance
from ppo_core_helpers import FLOAT64, VECTOR_ROUNDINGS, chain_tolerance


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------
def test_clipped_policy_loss_by_hand():
    ratio = torch.tensor([[0.5, 1.0, 1.5]])
    advantages = torch.tensor([[1.0, 2.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, clipfrac = core.clipped_policy_loss(ratio, advantages, mask, cliprange=0.2)
    # per token max(-A r, -A clip(r)): max(-0.5, -0.8) = -0.5; -2; max(-1.5, -1.2) = -1.2
    # float32 roundings: 1 - 0.2, 1 + 0.2, two additions, the division by 3 (and the expected value's)
    assert loss.item() == pytest.approx((-0.5 - 2.0 - 1.2) / 3, rel=0, abs=reduction_tolerance(VECTOR_ROUNDINGS, 3.7))
    assert clipfrac.item() == pytest.approx(1 / 3, rel=0, abs=reduction_tolerance(2, 1.0))  # 1 / 3 rounded


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 0.0]])
    old_values = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0]])
    loss, clipfrac = core.clipped_value_loss(vpreds, old_values, returns, torch.ones(1, 2), cliprange_value=0.2)
    # token 0: max(1, 0.04) = 1; token 1: max(1, 1) = 1
    assert loss.item() == 0.5  # exact arithmetic: 0.5 * (1 + 1) / 2
    assert clipfrac.item() == 0.0


def _loss_inputs(seed=0, batch=2, length=8, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    randn = lambda: torch.randn(batch, length, generator=generator, dtype=dtype)  # noqa: E731
    return dict(
        old_logprobs=randn() - 2,
        old_values=randn(),
        logprobs=randn() - 2,
        vpreds=randn(),
        entropy=randn().abs(),
        advantages=randn(),
        returns=randn(),
    )


LOSS_KWARGS = dict(cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)


def loss_magnitude(inputs) -> float:
    """A bound of the per-token terms of `core.ppo_loss`: |A| r (r up to 1.2 after the clip, unclipped where the
    min takes it) and squared value errors."""
    ratio = (inputs["logprobs"] - inputs["old_logprobs"]).exp().max().clamp(min=1.2)
    policy = ratio * inputs["advantages"].abs().max()
    value = (inputs["vpreds"].abs() + inputs["old_values"].abs() + inputs["returns"].abs()).max() ** 2
    return float(max(policy, value))


def test_ppo_loss_ignores_masked_positions_exactly():
    """Legacy `test_loss_trainer`: the masked loss equals the loss with the masked positions removed."""
    inputs = _loss_inputs()
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0, 1, 1]], dtype=torch.float)
    loss, stats, _ = core.ppo_loss(mask=mask, **inputs, **LOSS_KWARGS)

    # 1) garbage at masked positions changes nothing
    noisy = {k: torch.where(mask.bool(), v, v + 10 * torch.randn_like(v)) for k, v in inputs.items()}
    noisy_loss, noisy_stats, _ = core.ppo_loss(mask=mask, **noisy, **LOSS_KWARGS)
    assert noisy_loss.item() == loss.item()
    for key in ("loss/policy", "loss/value", "policy/entropy", "policy/approxkl", "val/error", "returns/var"):
        assert noisy_stats[key].item() == stats[key].item(), key

    # 2) physically removing the masked positions gives the same losses: other sums (16 terms with zeros,
    # against 8), so in float64, at the size of the largest per-token loss
    inputs = _loss_inputs(dtype=FLOAT64)
    mask = mask.double()
    loss, stats, _ = core.ppo_loss(mask=mask, **inputs, **LOSS_KWARGS)
    removed = {k: v[mask.bool()].unsqueeze(0) for k, v in inputs.items()}
    ones = torch.ones(1, int(mask.sum()), dtype=FLOAT64)
    removed_loss, removed_stats, _ = core.ppo_loss(mask=ones, **removed, **LOSS_KWARGS)
    tolerance = chain_tolerance(mask.numel(), loss_magnitude(inputs))
    torch.testing.assert_close(removed_loss, loss, rtol=0, atol=tolerance)
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "val/clipfrac", "val/var", "returns/mean"):
        torch.testing.assert_close(removed_stats[key], stats[key], rtol=0, atol=tolerance, msg=key)


def test_ppo_loss_value_stat_is_unscaled_and_total_combines():
    inputs = _loss_inputs(seed=3)
    loss, stats, skipped = core.ppo_loss(mask=torch.ones(2, 8), **inputs, **LOSS_KWARGS)
    assert not skipped
    # the same correctly rounded operations as ppo_losses: bit for bit
    assert torch.equal(stats["loss/total"], stats["loss/policy"] + 0.1 * stats["loss/value"])
    assert torch.equal(loss.detach(), stats["loss/total"])


def test_ppo_loss_ratio_threshold_zeroes_losses():
    inputs = _loss_inputs(seed=4)
    inputs["logprobs"] = inputs["old_logprobs"] + 3.0  # ratio e^3 ~ 20
    for key in ("logprobs", "vpreds"):
        inputs[key].requires_grad_(True)
    loss, stats, skipped = core.ppo_loss(mask=torch.ones(2, 8), ratio_threshold=10.0, **inputs, **LOSS_KWARGS)
    assert skipped
    assert loss.item() == 0.0 and stats["loss/policy"].item() == 0.0 and stats["loss/value"].item() == 0.0
    loss.backward()
    assert inputs["logprobs"].grad.abs().sum().item() == 0.0


# --------------------------------------------------------------------------------------------------
# controllers and running moments
# --------------------------------------------------------------------------------------------------
def test_adaptive_kl_controller():
    # python floats (float64): each update is ~6 roundings (7.2 / 6 - 1 is 0.2 only up to them), of values < 1.1
    tolerance = lambda updates: reduction_tolerance(6 * updates, 1.1, FLOAT64)  # noqa: E731
    controller = core.AdaptiveKLController(0.2, target=6.0, horizon=10000)
    controller.update(current=7.2, n_steps=256)  # error 0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000), rel=0, abs=tolerance(1))
    controller.update(current=100.0, n_steps=256)  # clipped to 0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000) ** 2, rel=0, abs=tolerance(2))
    controller.update(current=0.0, n_steps=1000)  # clipped to -0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000) ** 2 * (1 - 0.2 * 1000 / 10000), rel=0, abs=tolerance(3))
    restored = core.AdaptiveKLController(1.0, 1.0, 1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value and restored.target == 6.0


def test_fixed_kl_controller():
    controller = core.FixedKLController(0.3)
    controller.update(100.0, 1000)
    assert controller.value == 0.3


def test_running_moments_match_whole_data():
    """RunningMoments computes in float32 (from float64 data, rounded on the way in): its mean is within
    `reduction_tolerance` of n + 1 roundings of the data's mean size, its variance of 2n + 8 roundings of the
    largest squared value (data, deviations, the parallel update), the std half the variance's relative error."""
    rng = np.random.default_rng(0)
    first, second = rng.normal(3, 2, 16), rng.normal(-1, 5, 24)

    def assert_moments(mean, std, data):
        assert mean == pytest.approx(data.mean(), rel=0, abs=reduction_tolerance(len(data) + 1, float(np.abs(data).mean())))
        var_tolerance = reduction_tolerance(2 * len(data) + 8, float(np.abs(data).max()) ** 2)
        assert std == pytest.approx(data.std(ddof=1), rel=0, abs=var_tolerance / (2 * data.std(ddof=1)))

    moments = core.RunningMoments()
    assert_moments(*moments.update(torch.tensor(first, dtype=torch.float)), first)
    moments.update(torch.tensor(second, dtype=torch.float))
    assert_moments(moments.mean, moments.std, np.concatenate([first, second]))
