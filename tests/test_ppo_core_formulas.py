"""The pure PPO math of `textenv.ppo.core`, part 1: the KL penalties, log-probabilities and entropy, masked
statistics, rewards and advantages, checked against legacy TRL's test vectors and against direct re-computations
(tolerances: tests/ppo_core_helpers.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from textenv.ppo import core

from numerics import reduction_tolerance
from ppo_core_helpers import FLOAT64, VECTOR_ROUNDINGS, chain_tolerance

FOUR_DECIMALS = 0.5e-4  # a literal printed to 4 decimals is within half a unit of its 4th decimal
FULL_KL_ROUNDINGS = 40  # over 3 entries: log (2), log-softmax (shift, exp 2, sum, log 2, subtract), KL (exp 2, subtract, product, sum)


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
