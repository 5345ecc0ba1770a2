"""The pure PPO math (textenv.ppo.core) and PPOConfig, checked against legacy TRL's test vectors and against
direct re-computations."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from textenv.ppo import PPOConfig
from textenv.ppo import core

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
    torch.testing.assert_close(core.kl_penalty(LOGPROBS, REF_LOGPROBS, kind), torch.tensor(expected))


def test_kl_penalty_full_on_log_probabilities_and_unknown_kind():
    p = torch.log(torch.tensor([[0.49, 0.02, 0.49], [0.49, 0.02, 0.49]]))
    ref = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.49, 0.02, 0.49]]))
    torch.testing.assert_close(core.kl_penalty(p, ref, "full"), torch.tensor([3.7361, 0.0]), atol=1e-4, rtol=0)
    torch.testing.assert_close(core.kl_penalty(p, ref, "full"), core.full_kl_penalty(p, ref))
    with pytest.raises(ValueError, match="Unknown kl_penalty"):
        core.kl_penalty(LOGPROBS, REF_LOGPROBS, "kld")


def test_full_kl_penalty_vectors():
    same = torch.log(torch.tensor([[[0.2, 0.3, 0.5]], [[0.1, 0.1, 0.8]]]))
    torch.testing.assert_close(core.full_kl_penalty(same, same), torch.zeros(2, 1))

    p = torch.log(torch.tensor([[0.98, 0.01, 0.01], [0.01, 0.98, 0.01]]))
    ref = torch.log(torch.tensor([[0.01, 0.01, 0.98], [0.01, 0.01, 0.98]]))
    torch.testing.assert_close(core.full_kl_penalty(p, ref), torch.tensor([4.4474, 4.4474]), atol=1e-4, rtol=0)

    p = torch.log(torch.tensor([[0.49, 0.02, 0.49], [0.49, 0.02, 0.49]]))
    ref = torch.log(torch.tensor([[0.01, 0.98, 0.01], [0.49, 0.02, 0.49]]))
    torch.testing.assert_close(core.full_kl_penalty(p, ref), torch.tensor([3.7361, 0.0]), atol=1e-4, rtol=0)


def test_full_kl_penalty_accepts_unnormalised_logits():
    logits, ref_logits = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    expected = F.kl_div(F.log_softmax(ref_logits, -1), F.log_softmax(logits, -1), log_target=True, reduction="none").sum(-1)
    torch.testing.assert_close(core.full_kl_penalty(logits + 5.0, ref_logits - 3.0), expected)


# --------------------------------------------------------------------------------------------------
# logprobs / entropy
# --------------------------------------------------------------------------------------------------
def test_selective_logprobs_matches_log_softmax_gather():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 4
    labels = torch.randint(0, 11, (3, 5))
    expected = F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(core.selective_logprobs(logits, labels), expected)


def test_selective_logprobs_gradient_matches():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 9, requires_grad=True)
    labels = torch.randint(0, 9, (2, 4))
    core.selective_logprobs(logits, labels).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    F.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).sum().backward()
    torch.testing.assert_close(ours, logits.grad)


def test_entropy_from_logits_matches_categorical():
    logits = torch.randn(4, 6, 13)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    torch.testing.assert_close(core.entropy_from_logits(logits), expected)


# --------------------------------------------------------------------------------------------------
# masked statistics
# --------------------------------------------------------------------------------------------------
VALUES = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, -50.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
SELECTED = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def test_masked_mean_and_var_use_only_masked_entries():
    torch.testing.assert_close(core.masked_mean(VALUES, MASK), SELECTED.mean())
    torch.testing.assert_close(core.masked_var(VALUES, MASK), SELECTED.var(unbiased=True))
    torch.testing.assert_close(core.masked_var(VALUES, MASK, unbiased=False), SELECTED.var(unbiased=False))
    torch.testing.assert_close(core.masked_mean(VALUES, MASK, axis=1), torch.tensor([2.0, 5.0]))


def test_masked_var_raises_on_empty_mask():
    with pytest.raises(ValueError, match="sum of the mask is zero"):
        core.masked_var(VALUES, torch.zeros_like(MASK))


def test_masked_whiten():
    whitened = core.masked_whiten(VALUES, MASK)
    picked = whitened[MASK.bool()]
    torch.testing.assert_close(picked.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(picked.var(unbiased=True), torch.tensor(1.0), atol=1e-5, rtol=0)
    # masked-out entries are transformed with the same affine map
    scale = 1 / math.sqrt(SELECTED.var().item() + 1e-8)
    torch.testing.assert_close(whitened[0, 3], torch.tensor((100.0 - 3.5) * scale))
    kept_mean = core.masked_whiten(VALUES, MASK, shift_mean=False)
    torch.testing.assert_close(kept_mean[MASK.bool()].mean(), torch.tensor(3.5))


# --------------------------------------------------------------------------------------------------
# rewards and advantages
# --------------------------------------------------------------------------------------------------
def test_compute_rewards_puts_score_on_last_trainable_position():
    kls = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 1.0, 1.0, 1.0, 1.0]])
    # row 0 ends with tool output (mask 0); row 1 has a tool segment in the middle
    masks = torch.tensor([[0, 1, 1, 0, 0], [0, 1, 0, 0, 1]], dtype=torch.float)
    rewards, non_score = core.compute_rewards(torch.tensor([10.0, -3.0]), kls, masks, kl_coef=0.5)
    torch.testing.assert_close(non_score, -0.5 * kls)
    expected = -0.5 * kls
    expected[0, 2] += 10.0
    expected[1, 4] += -3.0
    torch.testing.assert_close(rewards, expected)


def test_last_true_index():
    masks = torch.tensor([[1, 0, 0], [0, 1, 1], [1, 1, 0]])
    assert core.last_true_index(masks).tolist() == [0, 2, 1]


def _reference_gae(values, rewards, mask, gamma, lam):
    # Element-by-element recursion written independently of core.compute_advantages.
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
    advantages = torch.tensor(advantages)
    returns = advantages + torch.tensor(values)
    return advantages, returns


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5)])
def test_compute_advantages_matches_recursion_and_whitens(gamma, lam):
    torch.manual_seed(0)
    values, rewards = torch.randn(3, 7), torch.randn(3, 7)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]], dtype=torch.float)
    out_values, advantages, returns = core.compute_advantages(values, rewards, mask, gamma, lam)
    raw, expected_returns = _reference_gae(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(out_values, values * mask)
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(advantages, core.masked_whiten(raw, mask))
    picked = advantages[mask.bool()]
    assert abs(picked.mean().item()) < 1e-6
    assert abs(picked.var().item() - 1.0) < 1e-4


def test_gae_decays_across_masked_positions():
    # A reward after a masked (tool) gap still reaches earlier tokens, decayed by (gamma * lam) per position.
    values = torch.zeros(1, 4)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    raw, _ = _reference_gae(values, rewards, mask, 1.0, 0.5)
    assert raw[0, 0].item() == pytest.approx(0.125)
    _, _, returns = core.compute_advantages(values, rewards, mask, 1.0, 0.5)
    assert returns[0, 0].item() == pytest.approx(0.125)


def test_whiten_rewards_option_changes_returns():
    torch.manual_seed(0)
    values, rewards, mask = torch.randn(2, 5), torch.randn(2, 5) * 3, torch.ones(2, 5)
    _, _, plain = core.compute_advantages(values, rewards, mask, whiten_rewards=False)
    _, _, whitened = core.compute_advantages(values, rewards, mask, whiten_rewards=True)
    _, expected = _reference_gae(values, core.masked_whiten(rewards, mask, shift_mean=False), mask, 1.0, 0.95)
    torch.testing.assert_close(whitened, expected)
    assert not torch.allclose(plain, whitened)


# --------------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------------
def test_clipped_policy_loss_by_hand():
    ratio = torch.tensor([[0.5, 1.0, 1.5]])
    advantages = torch.tensor([[1.0, 2.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, clipfrac = core.clipped_policy_loss(ratio, advantages, mask, cliprange=0.2)
    # per token max(-A r, -A clip(r)): max(-0.5, -0.8) = -0.5; -2; max(-1.5, -1.2) = -1.2
    assert loss.item() == pytest.approx((-0.5 - 2.0 - 1.2) / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 0.0]])
    old_values = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[0.0, 1.0]])
    loss, clipfrac = core.clipped_value_loss(vpreds, old_values, returns, torch.ones(1, 2), cliprange_value=0.2)
    # token 0: max(1, 0.04) = 1; token 1: max(1, 1) = 1
    assert loss.item() == pytest.approx(0.5 * 1.0)
    assert clipfrac.item() == 0.0


def _loss_inputs(seed=0, batch=2, length=8):
    generator = torch.Generator().manual_seed(seed)
    randn = lambda: torch.randn(batch, length, generator=generator)  # noqa: E731
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

    # 2) physically removing the masked positions gives the same losses
    removed = {k: v[mask.bool()].unsqueeze(0) for k, v in inputs.items()}
    ones = torch.ones(1, int(mask.sum()))
    removed_loss, removed_stats, _ = core.ppo_loss(mask=ones, **removed, **LOSS_KWARGS)
    torch.testing.assert_close(removed_loss, loss)
    for key in ("loss/policy", "loss/value", "policy/clipfrac", "val/clipfrac", "val/var", "returns/mean"):
        torch.testing.assert_close(removed_stats[key], stats[key])


def test_ppo_loss_value_stat_is_unscaled_and_total_combines():
    inputs = _loss_inputs(seed=3)
    loss, stats, skipped = core.ppo_loss(mask=torch.ones(2, 8), **inputs, **LOSS_KWARGS)
    assert not skipped
    torch.testing.assert_close(stats["loss/total"], stats["loss/policy"] + 0.1 * stats["loss/value"])
    torch.testing.assert_close(loss.detach(), stats["loss/total"])


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
    controller = core.AdaptiveKLController(0.2, target=6.0, horizon=10000)
    controller.update(current=7.2, n_steps=256)  # error 0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000))
    controller.update(current=100.0, n_steps=256)  # clipped to 0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000) ** 2)
    controller.update(current=0.0, n_steps=1000)  # clipped to -0.2
    assert controller.value == pytest.approx(0.2 * (1 + 0.2 * 256 / 10000) ** 2 * (1 - 0.2 * 1000 / 10000))
    restored = core.AdaptiveKLController(1.0, 1.0, 1.0)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value and restored.target == 6.0


def test_fixed_kl_controller():
    controller = core.FixedKLController(0.3)
    controller.update(100.0, 1000)
    assert controller.value == 0.3


def test_running_moments_match_whole_data():
    rng = np.random.default_rng(0)
    first, second = rng.normal(3, 2, 16), rng.normal(-1, 5, 24)
    moments = core.RunningMoments()
    batch_mean, batch_std = moments.update(torch.tensor(first, dtype=torch.float))
    assert batch_mean == pytest.approx(first.mean(), rel=1e-5)
    assert batch_std == pytest.approx(first.std(ddof=1), rel=1e-5)
    moments.update(torch.tensor(second, dtype=torch.float))
    everything = np.concatenate([first, second])
    assert moments.mean == pytest.approx(everything.mean(), rel=1e-4, abs=1e-5)
    assert moments.std == pytest.approx(everything.std(ddof=1), rel=1e-4)


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
