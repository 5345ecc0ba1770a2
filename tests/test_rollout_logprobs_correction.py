"""PPOTrainer.step's opt-in truncated importance-sampling correction (``vllm_importance_sampling_correction``) of
the rollout's per-token log-probabilities, and the training loop that passes them on.

Tolerances (tests/numerics.py has the analysis):
- exact: two steps that run the same computation (the correction off, or on with weights of exactly 1: ``exp(0)``
  and ``x * 1.0`` are exact), so the statistics and the trained weights are bit-identical, and the value loss,
  which the weights do not touch; a clamped weight, which is the cap itself;
- importance weights against ``exp(-shift)`` (`ratio_rtol`): the rollout log-probabilities are built as
  ``old + shift`` and rounded, the trainer rounds ``old - rollout`` again in float32, and both sides' ``exp``
  is within 1 ulp (2u): relative ``u (|old| + 2 |rollout| + |shift| + 4)``; their masked mean adds ``(n + 1) u``
  (n positive terms summed, one division). The fraction of clipped tokens is ``k / n`` rounded once to float32
  (``pytest.approx``'s relative 1e-6 > u); no shift puts a ratio near the cap, so ``k`` is exact;
- the weighted policy loss by hand: a float64 model, so the ratio ``exp(new - old)`` of the training pass to the
  rollout pass (two reduction orders of one forward pass) is 1 within `reduction_tolerance` in float64 rather
  than float32's ~1e-3 (which would swamp the 1e-2 the weights move the loss by); it is compared with
  ``masked_mean(-advantages * weights)`` of the trainer's own weights (checked against ``exp(-shift)``
  separately) at that ratio tolerance times ``max |advantage * weight|``, plus the mean's float64 reduction
  and the float32 rounding of the reported statistic (`reported_float32`).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from textenv import TextHistory
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo import rollout_correction
from textenv.testing import tiny_causal_lm
from textenv.training import train
from textenv.training.sources import EpisodeBatch

from numerics import float64_model, forward_terms, reduction_tolerance, reported_float32, unit_roundoff

RATIO_MEAN = "objective/importance_sampling_ratio_mean"
RATIO_MAX = "objective/importance_sampling_ratio_max"
CLIPPED_FRAC = "objective/importance_sampling_clipped_frac"


# ------------------------------------------------------------------------------------------------
# PPOTrainer.step: truncated importance sampling
# ------------------------------------------------------------------------------------------------
PROMPT = torch.arange(100, 120)
QUERIES = [torch.cat([PROMPT, torch.tensor([7, 8])]), torch.cat([PROMPT, torch.tensor([9, 10, 11])]), torch.cat([PROMPT, torch.tensor([12])])]
RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
SCORES = [torch.tensor(1.0), torch.tensor(-1.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]
EXACT_STATS = ("ppo/loss/total", "ppo/loss/policy", "ppo/loss/value", "objective/kl", "ppo/policy/approxkl", "ppo/val/vpred")


def make_trainer(dtype=torch.float32, **config_kwargs):
    base = tiny_causal_lm(seed=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead(base)
    if dtype == torch.float64:
        model = float64_model(model)
    config = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 1, "learning_rate": 1e-3, "seed": 0, **config_kwargs}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(PPOConfig(**config), model)


def flat_weights(trainer):
    return torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).clone()


def run_step(rollout_logprobs=None, **config_kwargs):
    trainer = make_trainer(**config_kwargs)
    kwargs = {} if rollout_logprobs is None else {"rollout_logprobs": rollout_logprobs}
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS, **kwargs)
    return stats, flat_weights(trainer)


def trainer_old_logprobs(dtype=torch.float32, **config_kwargs) -> list[torch.Tensor]:
    """The trainer's own old log-probability of every response token, exactly as `step` computes them (read
    from the step of an identical trainer)."""
    trainer = make_trainer(dtype, vllm_importance_sampling_correction=True, **config_kwargs)
    seen = {}
    original = trainer._importance_weights

    def spy(rollout, queries, model_inputs, logprobs, masks):
        seen["logprobs"], seen["mask"] = logprobs.clone(), model_inputs["attention_mask"]
        return original(rollout, queries, model_inputs, logprobs, masks)

    trainer._importance_weights = spy
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS, rollout_logprobs=[torch.zeros(len(r)) for r in RESPONSES])
    first = seen["mask"].int().argmax(dim=1)
    starts = [int(first[row]) + len(query) - 1 for row, query in enumerate(QUERIES)]
    return [seen["logprobs"][row, start : start + len(response)].cpu() for row, (start, response) in enumerate(zip(starts, RESPONSES))]


def largest(tensors) -> float:
    return max(float(t.abs().max()) for t in tensors)


def ratio_rtol(old, rollout, shifts) -> float:
    """Relative error of the trainer's float32 ``exp(old - rollout)`` against ``exp(-shift)`` when the test built
    ``rollout = old + shift`` (rounded): ``old - rollout`` is ``-shift`` within ``u (|old| + 2 |rollout|)``
    (rounding ``old + shift``, then ``old`` and ``rollout`` to float32) plus ``u |shift|`` (the subtraction); the
    trainer's and the test's ``exp`` are each within 1 ulp (2u)."""
    return unit_roundoff(torch.float32) * (largest(old) + 2 * largest(rollout) + largest(shifts) + 4)


def assert_identical(first, second):
    (stats_a, weights_a), (stats_b, weights_b) = first, second
    for key in EXACT_STATS:
        assert stats_a[key] == stats_b[key], key
    assert torch.equal(weights_a, weights_b)


def test_config_defaults_off_and_checks_the_cap():
    config = PPOConfig()
    assert config.vllm_importance_sampling_correction is False
    assert config.vllm_importance_sampling_cap == 2.0
    with pytest.raises(ValueError, match="vllm_importance_sampling_cap"):
        PPOConfig(vllm_importance_sampling_cap=0.0)


def test_rollout_logprobs_are_ignored_when_the_correction_is_off():
    shifted = [torch.full((len(r),), -5.0) for r in RESPONSES]
    plain, given = run_step(), run_step(shifted)
    assert_identical(plain, given)
    assert RATIO_MEAN not in given[0] and CLIPPED_FRAC not in given[0]


@pytest.mark.parametrize("kl_penalty", ["kl", "full"])  # the packed fast path and the legacy forward path
def test_rollout_equal_to_old_logprobs_gives_the_uncorrected_update(kl_penalty):
    old = trainer_old_logprobs(kl_penalty=kl_penalty)
    rollout = [logprobs.masked_fill(mask == 0, float("nan")) for logprobs, mask in zip(old, MASKS)]  # NaN off-mask is fine
    off = run_step(kl_penalty=kl_penalty)
    on = run_step(rollout, kl_penalty=kl_penalty, vllm_importance_sampling_correction=True)
    assert_identical(off, on)
    assert on[0][RATIO_MEAN] == 1.0 and on[0][RATIO_MAX] == 1.0 and on[0][CLIPPED_FRAC] == 0.0


@pytest.mark.parametrize("kl_penalty", ["kl", "full"])
def test_weights_are_the_capped_ratio(kl_penalty):
    old = trainer_old_logprobs(kl_penalty=kl_penalty)
    shifts = [torch.tensor([-2.0, 0.5, 9.0, 9.0, -2.0, 0.5]), torch.tensor([0.5, 0.5, -0.25]), torch.tensor([-2.0] * 4 + [9.0] * 3 + [0.5] * 3)]
    rollout = [logprobs + shift for logprobs, shift in zip(old, shifts)]  # ratio = exp(-shift)
    stats, weights = run_step(rollout, kl_penalty=kl_penalty, vllm_importance_sampling_correction=True, vllm_importance_sampling_cap=2.0)
    trained = torch.cat([shift[mask.bool()] for shift, mask in zip(shifts, MASKS)])
    expected = [min(math.exp(-float(s)), 2.0) for s in trained]
    mean_rtol = ratio_rtol(old, rollout, shifts) + (len(trained) + 1) * unit_roundoff(torch.float32)  # a mean of n weights
    assert stats[RATIO_MEAN] == pytest.approx(sum(expected) / len(expected), rel=mean_rtol, abs=0)
    assert stats[RATIO_MAX] == 2.0  # clamped to the cap: the cap itself
    assert stats[CLIPPED_FRAC] == pytest.approx(sum(math.exp(-float(s)) > 2.0 for s in trained) / len(trained))
    off_stats, off_weights = run_step(kl_penalty=kl_penalty)
    assert not torch.equal(weights, off_weights)
    assert stats["ppo/loss/value"] == off_stats["ppo/loss/value"]  # the value loss is unweighted: the same computation


@pytest.mark.parametrize("kl_penalty", ["kl", "full"])
def test_weighted_policy_loss_by_hand(kl_penalty):
    """One mini-batch, one epoch: the loss is computed before any update (ratio 1), so the policy loss is
    ``masked_mean(-advantages * w)`` with ``w = min(exp(old - rollout), cap)`` per trained token. In float64 (see
    the module's docstring): the ratio is 1 only up to the reduction order of two forward passes."""
    old = trainer_old_logprobs(torch.float64, kl_penalty=kl_penalty)
    shifts = [torch.tensor([-2.0, 0.5, 9.0, 9.0, -1.0, 0.25]), torch.tensor([0.5, -3.0, -0.25]), torch.tensor([-2.0] * 4 + [9.0] * 3 + [0.5, 1.0, 0.0])]
    rollout = [logprobs + shift for logprobs, shift in zip(old, shifts)]
    trainer = make_trainer(torch.float64, kl_penalty=kl_penalty, vllm_importance_sampling_correction=True, vllm_importance_sampling_cap=1.5)
    seen = {}
    original = trainer._train_rows
    trainer._train_rows = lambda experience, rows, legacy: seen.update(experience) or original(experience, rows, legacy)
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS, rollout_logprobs=rollout)
    masks, advantages, weights = seen["masks"].cpu(), seen["advantages"].cpu(), seen["weights"].cpu()
    expected = torch.ones_like(weights)
    for row, (query, shift) in enumerate(zip(QUERIES, shifts)):  # right padding: response token j at len(query) - 1 + j
        expected[row, len(query) - 1 : len(query) - 1 + len(shift)] = torch.clamp(torch.exp(-shift), max=1.5)
    trained = masks > 0
    torch.testing.assert_close(weights[trained], expected[trained], rtol=ratio_rtol(old, rollout, shifts), atol=0)
    assert (weights[~trained] == 1.0).all()
    weighted = -advantages * weights * masks
    by_hand = float(weighted.sum() / masks.sum())
    unweighted = float((-advantages * masks).sum() / masks.sum())
    assert abs(by_hand - unweighted) > 1e-2
    length = max(len(q) + len(r) for q, r in zip(QUERIES, RESPONSES))
    ratio_error = reduction_tolerance(forward_terms(trainer.model.pretrained_model.config, length), largest(old), torch.float64)
    magnitude = float(weighted.abs().max())
    tolerance = magnitude * ratio_error + reduction_tolerance(int(masks.sum()), magnitude, torch.float64)
    assert stats["ppo/loss/policy"] == pytest.approx(by_hand, abs=reported_float32(tolerance, abs(by_hand)), rel=0)


def test_importance_weights_by_hand():
    old = torch.tensor([[0.0, -1.0, -2.0, -3.0]])
    rollout = torch.tensor([[float("nan"), -2.0, -1.0, -3.2]])
    masks = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    weights, stats = rollout_correction.importance_weights(old, rollout, masks, cap=1.5)
    expected = torch.tensor([[1.0, 1.5, math.exp(-1.0), math.exp(0.2)]])
    shifts = (rollout - old).nan_to_num()
    rtol = ratio_rtol([old], [rollout.nan_to_num()], [shifts])  # -3.2 is rounded like a built rollout
    torch.testing.assert_close(weights, expected, rtol=rtol, atol=0)
    mean_rtol = rtol + 4 * unit_roundoff(torch.float32)  # a mean of 3
    assert float(stats[RATIO_MEAN]) == pytest.approx((1.5 + math.exp(-1.0) + math.exp(0.2)) / 3, rel=mean_rtol, abs=0)
    assert float(stats[RATIO_MAX]) == 1.5 and float(stats[CLIPPED_FRAC]) == pytest.approx(1 / 3)  # the cap; 1/3 rounded once


def test_correction_without_rollout_logprobs_is_a_clear_error():
    trainer = make_trainer(vllm_importance_sampling_correction=True)
    with pytest.raises(ValueError, match="no rollout_logprobs.*vllm_importance_sampling_correction=False"):
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS)


@pytest.mark.parametrize(
    "rollout, message",
    [
        ([torch.zeros(6), torch.zeros(3)], r"rollout_logprobs has 2 entries for 3 responses"),
        ([torch.zeros(6), torch.zeros(4), torch.zeros(10)], r"rollout_logprobs\[1\] must be a 1-D tensor of the response's length \(3\)"),
        ([torch.zeros(6), torch.tensor([0.0, float("nan"), 0.0]), torch.zeros(10)], r"rollout_logprobs\[1\] is NaN on a trained token"),
    ],
)
def test_bad_rollout_logprobs_are_clear_errors(rollout, message):
    trainer = make_trainer(vllm_importance_sampling_correction=True)
    with pytest.raises(ValueError, match=message):
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS, rollout_logprobs=rollout)


def test_correction_refuses_an_overridden_loss():
    class CustomLoss(PPOTrainer):
        def loss(self, *args, **kwargs):
            return super().loss(*args, **kwargs)

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = CustomLoss(PPOConfig(batch_size=3, mini_batch_size=3, vllm_importance_sampling_correction=True), make_trainer().model)
    with pytest.raises(ValueError, match=r"\['loss'\] are overridden"):
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS, rollout_logprobs=[torch.zeros(len(r)) for r in RESPONSES])


# ------------------------------------------------------------------------------------------------
# the training loop
# ------------------------------------------------------------------------------------------------
class HistorySource:
    """Episodes made by hand, with engine log-probabilities on the model tokens."""

    def collect(self, step):
        histories = []
        for query, response, mask in zip(QUERIES[:2], RESPONSES[:2], MASKS[:2]):
            history = TextHistory("q", query)
            for token, trained in zip(response, mask):
                logprobs = torch.tensor([-0.25]) if trained else None
                history.append_segment("t", token.reshape(1), system=not bool(trained), logprobs=logprobs)
            history.reward = 1.0
            histories.append(history)
        split = [history.split_query_response_tokens() for history in histories]
        return EpisodeBatch(
            [q for q, _, _ in split], [r for _, r, _ in split], [torch.tensor(1.0)] * 2, [m for _, _, m in split],
            ["q"] * 2, ["r"] * 2, episodes=histories,
        )


@pytest.mark.parametrize("correction", [False, True])
def test_training_loop_passes_rollout_logprobs_only_with_the_correction(correction):
    trainer = make_trainer(batch_size=2, mini_batch_size=2, vllm_importance_sampling_correction=correction)
    calls = []
    original = trainer.step

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    trainer.step = spy
    (log,) = train(trainer, HistorySource(), 1, progress=False)
    if not correction:
        assert calls == [{}] and RATIO_MEAN not in log.stats
        return
    (rollout,) = [call["rollout_logprobs"] for call in calls]
    for logprobs, mask in zip(rollout, MASKS[:2]):
        assert (logprobs[mask.bool()] == -0.25).all() and logprobs[~mask.bool()].isnan().all()
    assert RATIO_MEAN in log.stats and log.stats[RATIO_MEAN] > 0


def test_episode_batch_rollout_logprobs_needs_histories():
    batch = EpisodeBatch([torch.tensor([1])], [torch.tensor([2])], [torch.tensor(0.0)], [torch.ones(1)], ["q"], ["r"], episodes=[])
    with pytest.raises(ValueError, match="one TextHistory per response"):
        batch.rollout_logprobs()
