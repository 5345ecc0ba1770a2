"""The pure PPO math (textenv.ppo.core) and PPOConfig, checked against legacy TRL's test vectors and against
direct re-computations.

Tolerances (tests/numerics.py has the analysis; `reduction_tolerance(n, m, dtype)` is ``2 lambda sqrt(n) u m``,
which for the short chains here, n <= 100, is at least the worst-case bound ``2 n u m`` of two n-rounding
computations, Higham's gamma_n; exp and log count as 2 roundings, their vectorised versions being accurate to
1 ulp):
- legacy test vectors written with all their digits (``0.1``, ``0.005``) are compared in float32 within
  `reduction_tolerance` of the roundings involved (``VECTOR_ROUNDINGS``: the two input literals, the operation(s),
  the expected literal) at the inputs' magnitude;
- legacy vectors printed to 4 decimals (``3.7361``) within ``FOUR_DECIMALS`` (half a unit of the 4th decimal,
  the literal's own rounding) plus the float32 rounding of the full-KL chain (log-softmax and KL over 3 entries);
- a formula against a re-computation of it in another order (log-softmax + gather, Categorical's entropy, the
  GAE recursion, a masked loss against the loss of the masked positions removed, variances): in float64, within
  `reduction_tolerance` of the roundings on the longest chain (10 per entry of the largest reduction: shift, exp,
  sum, log, product, ...) at the magnitude of the values on it;
- exact (``==``, `torch.equal`): the same elementwise operations on the same values (IEEE operations are
  correctly rounded, so any kernel gives the same bits: ``-kl_coef * kl``, a total that is computed as the
  test computes it), values that only pass through exact arithmetic (sums of small integers, halvings: masked
  means of integer data, 0.125 = 0.5^3, a value loss of 1s), a masked-out garbage entry (it is multiplied by an
  exact 0, so the same additions run) and zeros of a KL of a distribution with itself;
- the running moments (float32 inside, from float64 data) and the KL controller (python floats) within
  `reduction_tolerance` of their sums and updates at the data's magnitude.
"""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from textenv.ppo import PPOConfig
from textenv.ppo import core

from numerics import reduction_tolerance

VECTOR_ROUNDINGS = 6  # two input literals, at most three operations (0.5 * d^2), the expected literal
FOUR_DECIMALS = 0.5e-4  # a literal printed to 4 decimals is within half a unit of its 4th decimal
FULL_KL_ROUNDINGS = 40  # over 3 entries: log (2), log-softmax (shift, exp 2, sum, log 2, subtract), KL (exp 2, subtract, product, sum)
FLOAT64 = torch.float64


def chain_tolerance(entries: int, magnitude: float, dtype=FLOAT64) -> float:
    """Two orders of a formula whose longest chain goes through at most 10 roundings per entry of its largest
    reduction (``entries`` long), of values of size ``magnitude``."""
    return reduction_tolerance(10 * entries, magnitude, dtype)

# --------------------------------------------------------------------------------------------------
# KL penalties (legacy test vectors, spec §3.5)
# --------------------------------------------------------------------------------------------------
LOGPROBS = torch.tensor([[0.5, 0.2, 0.1], [0.6, 0.2, 0.1]])
REF_LOGPROBS = torch.tensor([[0.4, 0.3, 0.0], [0.7, 0.1, 0.3]])


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("kl", [[0.1, -0.1, 0.1], [-0.1, 0.1, -0.2]]),
        ("abs", [[0.1, 0.1, 0.1], [0.1, 0.1, 0.2]]),
        ("mse", [[0.005, 0.005, 0.005], [0.005, 0.005, 0.02]]),
    ],
)
def test_kl_penalty_vectors(kind, expected):
    magnitude = float(torch.maximum(LOGPROBS.abs().max(), REF_LOGPROBS.abs().max()))
    torch.testing.assert_close(core.kl_penalty(LOGPROBS, REF_LOGPROBS, kind), torch.tensor(expected), rtol=0,
                               atol=reduction_tolerance(VECTOR_ROUNDINGS, magnitude))


def full_kl_literal_tolerance(*log_probabilities):
    """A 4-decimal literal against float32's full KL of these log-probabilities."""
    magnitude = max(float(lp.abs().max()) for lp in log_probabilities)
    return FOUR_DECIMALS + reduction_tolerance(FULL_KL_ROUNDINGS, magnitude)


def test_kl_penalty_full_on_log_probabilities_and_unknown_kind():
    p = torch.log(torch.tensor([[0.49, 0.02, 0.49], [0.49, 0.02, 0.49]]))
    ref = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.49, 0.02, 0.49]]))
    torch.testing.assert_close(core.kl_penalty(p, ref, "full"), torch.tensor([3.7361, 0.0]), rtol=0,
                               atol=full_kl_literal_tolerance(p, ref))
    # the log-softmax of full_kl_penalty renormalises: another rounding of the same values (float64 throughout:
    # float32 log-probabilities would sum to 1 only up to float32 rounding, which the renormalisation removes)
    p = torch.log(torch.tensor([[0.49, 0.02, 0.49], [0.49, 0.02, 0.49]], dtype=FLOAT64))
    ref = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.49, 0.02, 0.49]], dtype=FLOAT64))
    torch.testing.assert_close(core.kl_penalty(p, ref, "full"), core.full_kl_penalty(p, ref), rtol=0,
                               atol=chain_tolerance(3, float(torch.maximum(p.abs().max(), ref.abs().max()))))
    with pytest.raises(ValueError, match="Unknown kl_penalty"):
        core.kl_penalty(LOGPROBS, REF_LOGPROBS, "kld")


def test_full_kl_penalty_vectors():
    same = torch.log(torch.tensor([[[0.2, 0.3, 0.5]], [[0.1, 0.1, 0.8]]]))
    assert torch.equal(core.full_kl_penalty(same, same), torch.zeros(2, 1))  # log p - log p: exact zeros

    p = torch.log(torch.tensor([[0.98, 0.01, 0.01], [0.01, 0.98, 0.01]]))
    ref = torch.log(torch.tensor([[0.01, 0.01, 0.98], [0.01, 0.01, 0.98]]))
    torch.testing.assert_close(core.full_kl_penalty(p, ref), torch.tensor([4.4474, 4.4474]), rtol=0,
                               atol=full_kl_literal_tolerance(p, ref))

    p = torch.log(torch.tensor([[0.49, 0.02, 0.49], [0.49, 0.02, 0.49]]))
    ref = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.49, 0.02, 0.49]]))
    torch.testing.assert_close(core.full_kl_penalty(p, ref), torch.tensor([3.7361, 0.0]), rtol=0,
                               atol=full_kl_literal_tolerance(p, ref))


def test_full_kl_penalty_accepts_unnormalised_logits():
    logits, ref_logits = torch.randn(2, 3, 7, dtype=FLOAT64), torch.randn(2, 3, 7, dtype=FLOAT64)
    expected = F.kl_div(F.log_softmax(ref_logits, -1), F.log_softmax(logits, -1), log_target=True, reduction="none").sum(-1)
    magnitude = float(torch.maximum(logits.abs().max(), ref_logits.abs().max())) + 5.0  # the shifted logits
    torch.testing.assert_close(core.full_kl_penalty(logits + 5.0, ref_logits - 3.0), expected, rtol=0,
                               atol=chain_tolerance(7, magnitude))
    assert expected.min() > 0.01  # a KL of two different distributions: the comparison is not of zeros


# --------------------------------------------------------------------------------------------------
# logprobs / entropy
# --------------------------------------------------------------------------------------------------
def test_selective_logprobs_matches_log_softmax_gather():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=FLOAT64) * 4
    labels = torch.randint(0, 11, (3, 5))
    expected = F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(core.selective_logprobs(logits, labels), expected, rtol=0,
                               atol=chain_tolerance(11, float(logits.abs().max())))


def test_selective_logprobs_gradient_matches():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 9, dtype=FLOAT64, requires_grad=True)
    labels = torch.randint(0, 9, (2, 4))
    core.selective_logprobs(logits, labels).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).sum().backward()
    # one-hot minus softmax: probabilities, from exponentials of logits of this size
    torch.testing.assert_close(ours, logits.grad, rtol=0, atol=chain_tolerance(9, max(1.0, float(logits.detach().abs().max()))))


def test_entropy_from_logits_matches_categorical():
    logits = torch.randn(4, 6, 13, dtype=FLOAT64)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    magnitude = float(logits.abs().max()) + math.log(13)  # logsumexp and sum p x: of the logits' size
    torch.testing.assert_close(core.entropy_from_logits(logits), expected, rtol=0, atol=chain_tolerance(13, magnitude))


# --------------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------------
VALUES = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, -50.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
SELECTED = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def test_masked_mean_and_var_use_only_masked_entries():
    # exact arithmetic: sums of small integers (the masked 100 and -50 times an exact 0), 21 / 6 = 3.5
    assert core.masked_mean(VALUES, MASK).item() == SELECTED.mean().item() == 3.5
    assert torch.equal(core.masked_mean(VALUES, MASK, axis=1), torch.tensor([2.0, 5.0]))
    # the variances divide by 6 and 5 on the way: in float64, two orders of 8 squared deviations
    values, mask, selected = VALUES.double(), MASK.double(), SELECTED.double()
    tolerance = chain_tolerance(8, float(((selected - selected.mean()) ** 2).sum()))
    torch.testing.assert_close(core.masked_var(values, mask), selected.var(unbiased=True), rtol=0, atol=tolerance)
    torch.testing.assert_close(core.masked_var(values, mask, unbiased=False), selected.var(unbiased=False), rtol=0, atol=tolerance)


def test_masked_var_raises_on_empty_mask():
    with pytest.raises(ValueError, match="sum of the mask is zero"):
        core.masked_var(VALUES, torch.zeros_like(MASK))


def test_masked_whiten():
    """In float64: the whitened entries' mean is 0 and their variance var / (var + eps) in exact arithmetic."""
    values, mask, selected = VALUES.double(), MASK.double(), SELECTED.double()
    whitened = core.masked_whiten(values, mask)
    picked = whitened[mask.bool()]
    var = selected.var().item()
    tolerance = chain_tolerance(8, float(values.abs().max()) / math.sqrt(var))  # the largest whitened entry
    assert abs(picked.mean().item()) <= tolerance
    assert abs(picked.var(unbiased=True).item() - var / (var + core.WHITEN_EPS)) <= tolerance
    # masked-out entries are transformed with the same affine map
    scale = 1 / math.sqrt(var + core.WHITEN_EPS)
    assert abs(whitened[0, 3].item() - (100.0 - 3.5) * scale) <= tolerance
    kept_mean = core.masked_whiten(values, mask, shift_mean=False)
    assert abs(kept_mean[mask.bool()].mean().item() - 3.5) <= tolerance


# --------------------------------------------------------------------------------------------------
# rewards and advantages
# --------------------------------------------------------------------------------------------------
def test_compute_rewards_puts_score_on_last_trainable_position():
    kls = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0]])
    # row 0 ends with tool output (mask 0); row 1 has a tool segment in the middle
    masks = torch.tensor([[0, 1, 1, 0, 0], [0, 1, 0, 0, 1]], dtype=torch.float)
    rewards, non_score = core.compute_rewards(torch.tensor([10.0, -3.0]), kls, masks, kl_coef=0.5)
    assert torch.equal(non_score, -0.5 * kls)  # the same correctly rounded product
    expected = -0.5 * kls
    expected[0, 2] += 10.0
    expected[1, 4] += -3.0
    assert torch.equal(rewards, expected)  # and the same correctly rounded sums


def test_last_true_index():
    masks = torch.tensor([[1, 0, 0], [0, 1, 1], [1, 1, 0]])
    assert core.last_true_index(masks).tolist() == [0, 2, 1]


def _reference_gae(values, rewards, mask, gamma, lam):
    # Element-by-element recursion written independently of core.compute_advantages (python floats: float64).
    values = (values * mask).tolist()
    rewards = (rewards * mask).tolist()
    advantages = []
    for row_values, row_rewards in zip(values, rewards):
        row = [0.0] * len(row_values)
        running = 0.0
        for t in range(len(row_values) - 1, -1, -1):
            next_value = row_values[t + 1] if t + 1 < len(row_values) else 0.0
            running = row_rewards[t] + gamma * next_value - row_values[t] + gamma * lam * running
            row[t] = running
        advantages.append(row)
    advantages = torch.tensor(advantages, dtype=torch.float64)  # the python floats' precision
    returns = advantages + torch.tensor(values, dtype=torch.float64)
    return advantages, returns


def gae_magnitude(values, rewards):
    """A bound of every value on the GAE recursion's chain: a row's sum of |reward| + 2 |value|."""
    return float((rewards.abs() + 2 * values.abs()).sum(-1).max())


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5)])
def test_compute_advantages_matches_recursion_and_whitens(gamma, lam):
    """In float64 (the recursion's python floats are float64): the vectorised recursion against the scalar one."""
    torch.manual_seed(0)
    values, rewards = torch.randn(3, 7, dtype=FLOAT64), torch.randn(3, 7, dtype=FLOAT64)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=FLOAT64)
    out_values, advantages, returns = core.compute_advantages(values, rewards, mask, gamma, lam)
    raw, expected_returns = _reference_gae(values, rewards, mask, gamma, lam)
    assert torch.equal(out_values, values * mask)  # the same product
    tolerance = chain_tolerance(7, gae_magnitude(values, rewards))
    torch.testing.assert_close(returns, expected_returns, rtol=0, atol=tolerance)
    # whitening divides the recursion's difference by the advantages' std
    std = float(raw[mask.bool()].std())
    whitened_tolerance = tolerance / std + chain_tolerance(21, float(advantages.abs().max()))
    torch.testing.assert_close(advantages, core.masked_whiten(raw, mask), rtol=0, atol=whitened_tolerance)
    picked = advantages[mask.bool()]
    assert abs(picked.mean().item()) <= whitened_tolerance
    assert abs(picked.var().item() - std**2 / (std**2 + core.WHITEN_EPS)) <= whitened_tolerance


def test_gae_decays_across_masked_positions():
    # A reward after a masked (tool) gap still reaches earlier tokens, decayed by (gamma * lam) per position.
    values = torch.zeros(1, 4)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    raw, _ = _reference_gae(values, rewards, mask, 1.0, 0.5)
    assert raw[0, 0].item() == 0.125  # exact arithmetic: 1 halved three times
    _, _, returns = core.compute_advantages(values, rewards, mask, 1.0, 0.5)
    assert returns[0, 0].item() == 0.125


def test_whiten_rewards_option_changes_returns():
    torch.manual_seed(0)
    values, rewards, mask = torch.randn(2, 5, dtype=FLOAT64), torch.randn(2, 5, dtype=FLOAT64) * 3, torch.ones(2, 5, dtype=FLOAT64)
    _, _, plain = core.compute_advantages(values, rewards, mask, whiten_rewards=False)
    _, _, whitened = core.compute_advantages(values, rewards, mask, whiten_rewards=True)
    whitened_rewards = core.masked_whiten(rewards, mask, shift_mean=False)
    _, expected = _reference_gae(values, whitened_rewards, mask, 1.0, 0.95)
    torch.testing.assert_close(whitened, expected, rtol=0, atol=chain_tolerance(5, gae_magnitude(values, whitened_rewards)))
    assert (plain - whitened).abs().max() > 0.1  # whitening the rewards changes the returns


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


# --------------------------------------------------------------------------------------------------
# PPOConfig
# --------------------------------------------------------------------------------------------------
def test_config_defaults_match_legacy():
    config = PPOConfig()
    expected = dict(
        seed=0, log_with=None, model_name="gpt2", steps=20000, learning_rate=1.41e-5, adap_kl_ctrl=True,
        init_kl_coef=0.2, kl_penalty="kl", target=6.0, horizon=10000.0, gamma=1.0, lam=0.95, cliprange=0.2,
        cliprange_value=0.2, vf_coef=0.1, batch_size=128, mini_batch_size=128, gradient_accumulation_steps=1,
        ppo_epochs=4, max_grad_norm=None, optimize_device_cache=False, early_stopping=False, target_kl=1.0,
        compare_steps=1, ratio_threshold=10.0, use_score_scaling=False, use_score_norm=False, score_clip=None,
        whiten_rewards=False, gradient_checkpointing=False, tracker_project_name="trl",
        query_dataset="stanfordnlp/imdb", reward_model="sentiment-analysis:lvwerra/distilbert-imdb",
        remove_unused_columns=True,
    )
    for name, value in expected.items():
        assert getattr(config, name) == value, name
    assert config.backward_batch_size == 128
    assert config.total_ppo_epochs == math.ceil(20000 / 128)


def test_config_emits_no_future_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPOConfig(batch_size=4, mini_batch_size=2)


def test_config_batch_size_must_be_multiple_of_backward_batch():
    with pytest.raises(ValueError, match="multiple"):
        PPOConfig(batch_size=2, mini_batch_size=2, gradient_accumulation_steps=2)
    config = PPOConfig(batch_size=8, mini_batch_size=2, gradient_accumulation_steps=2)
    assert config.backward_batch_size == 4


def test_config_rejects_unknown_kl_penalty():
    with pytest.raises(ValueError, match="kl_penalty"):
        PPOConfig(kl_penalty="kld")
    assert PPOConfig(kl_penalty="full").kl_penalty == "full"


def test_config_legacy_aliases_are_honoured():
    config = PPOConfig(batch_size=8, forward_batch_size=4, optimize_cuda_cache=True)
    assert config.mini_batch_size == 4
    assert config.optimize_device_cache is True


def test_config_to_dict_is_flat():
    config = PPOConfig(accelerator_kwargs={"mixed_precision": "no"}, tracker_kwargs={"wandb": {"name": "x"}})
    flat = config.to_dict()
    assert flat["accelerator_kwargs/mixed_precision"] == "no"
    assert flat["tracker_kwargs/wandb/name"] == "x"
    assert flat["learning_rate"] == 1.41e-5
    assert not any(isinstance(v, dict) and v for v in flat.values())
