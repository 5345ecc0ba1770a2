"""The off-policy correction in GRPOTrainer: what each mode and the decoupled objective weight in a real step,
against the uncorrected step, masking by hand and AReaL's weights (references and tolerances:
tests/off_policy_helpers.py)."""

from __future__ import annotations

import math

import pytest
import torch

from textenv import off_policy
from textenv.grpo import GRPOConfig, GRPOTrainer
from textenv.grpo import core as grpo_core
from textenv.testing import tiny_causal_lm

from off_policy_helpers import CLIPPED, FLOAT64, MASKED, MAX, MEAN, NAN, U32, areal_behaviour_weight


# ------------------------------------------------------------------------------------------------------------
# GRPOTrainer
# ------------------------------------------------------------------------------------------------------------
VOCAB = 512
GRPO_QUERIES = [torch.tensor([5, 6, 7]), torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11]), torch.tensor([8, 9, 10, 11])]
GRPO_RESPONSES = [torch.arange(20, 26), torch.arange(30, 34), torch.arange(40, 47), torch.arange(50, 55)]
GRPO_MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(4), torch.tensor([1, 1, 1, 0, 1, 1, 1]), torch.tensor([1, 0, 1, 1, 1])]
GRPO_SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5), torch.tensor(2.0)]
OFF_POLICY = {"gradient_accumulation_steps": 1}  # two optimizer steps per batch: the old log-probabilities get a pass


def grpo_trainer(**config) -> GRPOTrainer:
    options = dict(batch_size=4, mini_batch_size=2, num_generations=2, learning_rate=1e-2, seed=0, **config)
    return GRPOTrainer(GRPOConfig(**options), tiny_causal_lm(vocab_size=VOCAB, seed=0))


def trained_weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def grpo_step(masks=GRPO_MASKS, rollout=None, **config):
    """`(stats, weights after the step, calls)`: ``calls`` records every `core.clipped_token_loss` call's old
    log-probabilities and importance weights with the mini-batch's rows, and `proximal` the old-logprob pass."""
    trainer = grpo_trainer(**config)
    calls = {"rows": [], "old": [], "weights": [], "proximal": None}
    mini_batch_loss, clipped_token_loss, without_grad = trainer._mini_batch_loss, grpo_core.clipped_token_loss, trainer._logprobs_without_grad

    def record_rows(mini_batch, rows, *args, **kwargs):
        calls["rows"].append(rows.clone())
        return mini_batch_loss(mini_batch, rows, *args, **kwargs)

    def record_loss(logprobs, old, advantages, low, high, importance_weights=None):
        calls["old"].append(old.detach().clone())
        calls["weights"].append(None if importance_weights is None else importance_weights.clone())
        return clipped_token_loss(logprobs, old, advantages, low, high, importance_weights)

    def record_proximal(model, batch, timings, name):
        result = without_grad(model, batch, timings, name)
        calls["proximal"] = result.clone() if name == "old_logprobs" else calls["proximal"]
        return result

    trainer._mini_batch_loss, trainer._logprobs_without_grad = record_rows, record_proximal
    grpo_core.clipped_token_loss = record_loss
    try:
        kwargs = {} if rollout is None else {"rollout_logprobs": rollout}
        stats = trainer.step(GRPO_QUERIES, GRPO_RESPONSES, GRPO_SCORES, masks, **kwargs)
    finally:
        grpo_core.clipped_token_loss = clipped_token_loss
    return stats, trained_weights(trainer), calls


def batch_rows(calls, key) -> torch.Tensor:
    """`[B, T]`: the recorded per-mini-batch tensors of ``key`` put back in the batch's row order."""
    rows = torch.cat(calls["rows"])
    values = torch.cat(calls[key])
    placed = torch.empty_like(values)
    placed[rows] = values
    return placed


def per_response(batch_tensor: torch.Tensor, masks=GRPO_MASKS) -> list[torch.Tensor]:
    """The `[B, T]` layout back to one 1-D tensor per response, NaN on its untrained tokens (allowed there)."""
    return [batch_tensor[row, : len(mask)].float().masked_fill(mask == 0, NAN) for row, mask in enumerate(masks)]


def numeric_stats(stats: dict) -> dict:
    return {key: value for key, value in stats.items() if not key.startswith("time/")}


def assert_same_step(first, second):
    (stats_a, weights_a, _), (stats_b, weights_b, _) = first, second
    assert torch.equal(weights_a, weights_b)
    a, b = numeric_stats(stats_a), numeric_stats(stats_b)
    for key in a.keys() & b.keys():
        torch.testing.assert_close(torch.as_tensor(a[key]), torch.as_tensor(b[key]), rtol=0, atol=0, equal_nan=True, msg=key)


def test_grpo_correction_off_ignores_rollout_logprobs_and_runs_no_extra_pass():
    plain = grpo_step()
    given = grpo_step(rollout=[torch.full((3,), -9.0)])  # not even checked: one entry, wrong length
    assert_same_step(plain, given)
    assert not any("importance_sampling" in key for key in given[0]) and "time/grpo/old_logprobs" not in given[0]
    assert all(weights is None for weights in given[2]["weights"])


@pytest.mark.parametrize("policy", [{}, OFF_POLICY], ids=["on_policy", "off_policy"])
@pytest.mark.parametrize("objective", list(off_policy.MODES) + ["decoupled"])
def test_grpo_rollout_equal_to_the_trainers_old_logprobs_changes_nothing(objective, policy):
    """On-policy the old log-probabilities are the training pass's own (detached), off-policy (and decoupled) the
    no-grad pass's: recorded from an identical trainer's step, they are bit-identical in the next, so every
    weight is exp(0) = 1 and the step is the uncorrected one. On-policy decoupled adds the proximal pass, which the
    uncorrected step does not run: compared with the off-policy-configured uncorrected step instead."""
    settings = {"off_policy_objective": "decoupled"} if objective == "decoupled" else {"vllm_importance_sampling_mode": objective}
    if objective == "decoupled" and not policy:
        old = grpo_step(**OFF_POLICY)[2]["proximal"]  # what the decoupled step's proximal pass will compute
    else:
        plain = grpo_step(**policy)
        old = batch_rows(plain[2], "old")
    corrected = grpo_step(rollout=per_response(old), vllm_importance_sampling_correction=True, **settings, **policy)
    weights = batch_rows(corrected[2], "weights")
    assert (weights == 1.0).all()
    assert (corrected[0][MEAN], corrected[0][MAX], corrected[0][CLIPPED], corrected[0][MASKED]) == (1.0, 1.0, 0.0, 0.0)
    if objective == "decoupled" and not policy:
        assert "time/grpo/old_logprobs" in corrected[0]  # the proximal policy's pass
        assert torch.equal(batch_rows(corrected[2], "old"), corrected[2]["proximal"])
        return
    assert_same_step(plain, corrected)


def own_logprobs_with(ratio_of, **policy) -> list[torch.Tensor]:
    """Rollout log-probabilities whose ratio to the trainer's own old log-probabilities is ``ratio_of(row, j)``
    at trained token ``j`` of response ``row`` (exactly 1 where it returns None)."""
    old = batch_rows(grpo_step(**policy)[2], "old")
    rollout = per_response(old)
    for row, mask in enumerate(GRPO_MASKS):
        for column in mask.nonzero().flatten().tolist():
            ratio = ratio_of(row, column)
            if ratio is not None:
                rollout[row][column] = float(old[row, column]) - math.log(ratio)
    return rollout


RATIO_FIVE = {(0, 1), (2, 4), (3, 0)}  # tokens whose ratio is 5: above clip_max 3 (token modes)


def built_rtol(old: torch.Tensor, ratio: float) -> float:
    """A weight's relative error against ``ratio`` when the rollout was built as ``fl32(old - log ratio)``: the
    rounding of the rollout (``u |rollout|``) and of the float32 difference (``u |d|``), exp's 2u (see
    tests/off_policy_helpers.py), with ``|rollout| <= |old| + |log ratio|``."""
    largest, log_ratio = float(old.abs().max()), abs(math.log(ratio))
    return U32 * (largest + 2 * log_ratio + 2)


def token_ratio(row, column):
    return 5.0 if (row, column) in RATIO_FIVE else None


def sequence_ratio(row, column):
    """Row 2's trained tokens each 5^(1/6) = 1.31 (inside the bounds), together 5 (above them)."""
    return 5.0 ** (1 / int(GRPO_MASKS[2].sum())) if row == 2 else None


def masks_without(tokens) -> list[torch.Tensor]:
    masks = [mask.clone() for mask in GRPO_MASKS]
    for row, column in tokens:
        masks[row][column] = 0
    return masks


DR_GRPO = {"loss_type": "dr_grpo", "max_completion_length": 8}  # a divisor that does not count the trained tokens


@pytest.mark.parametrize(
    ("mode", "ratio_of", "dropped"),
    [
        ("token_mask", token_ratio, RATIO_FIVE),
        ("sequence_mask", sequence_ratio, {(2, column) for column in GRPO_MASKS[2].nonzero().flatten().tolist()}),
    ],
    ids=["token_mask", "sequence_mask"],
)
def test_grpo_mask_modes_drop_exactly_the_out_of_bound_tokens(mode, ratio_of, dropped):
    """Every other token's ratio is exactly 1, so masking tokens by their importance weight trains what masking
    them by the response mask trains (dr_grpo: a divisor that does not count the trained tokens)."""
    rollout = own_logprobs_with(ratio_of, **DR_GRPO)
    corrected = grpo_step(rollout=rollout, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=mode, **DR_GRPO)
    masked_by_hand = grpo_step(masks=masks_without(dropped), **DR_GRPO)
    assert torch.equal(corrected[1], masked_by_hand[1])
    assert corrected[0]["grpo/loss/policy"] == masked_by_hand[0]["grpo/loss/policy"]
    weights = batch_rows(corrected[2], "weights")
    for row, mask in enumerate(GRPO_MASKS):
        for column in mask.nonzero().flatten().tolist():
            assert float(weights[row, column]) == (0.0 if (row, column) in dropped else 1.0), (row, column)
    units = len(GRPO_MASKS) if mode == "sequence_mask" else int(sum(mask.sum() for mask in GRPO_MASKS))
    dropped_units = 1 if mode == "sequence_mask" else len(dropped)
    assert corrected[0][MASKED] == pytest.approx(dropped_units / units) and corrected[0][CLIPPED] == 0.0
    assert corrected[0][MAX] == 1.0


def test_grpo_token_mask_keeps_the_tokens_whose_sequence_sequence_mask_drops():
    rollout = own_logprobs_with(sequence_ratio)
    stats, _, calls = grpo_step(rollout=rollout, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_mask")
    weights, old = batch_rows(calls, "weights"), batch_rows(calls, "old")
    ratio = sequence_ratio(2, 0)
    kept = weights[2][GRPO_MASKS[2] > 0]
    torch.testing.assert_close(kept.double(), torch.full_like(kept, ratio, dtype=FLOAT64), rtol=built_rtol(old, ratio), atol=0)
    assert stats[MASKED] == 0.0 and stats[MAX] == pytest.approx(ratio, rel=built_rtol(old, ratio), abs=0)


def test_grpo_truncation_statistics():
    rollout = own_logprobs_with(token_ratio)
    stats, _, calls = grpo_step(rollout=rollout, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode="token_truncate")
    tokens = int(sum(mask.sum() for mask in GRPO_MASKS))
    weights = batch_rows(calls, "weights")
    assert all(float(weights[row, column]) == 3.0 for row, column in RATIO_FIVE)  # the bound itself
    assert stats[CLIPPED] == pytest.approx(len(RATIO_FIVE) / tokens) and stats[MASKED] == 0.0 and stats[MAX] == 3.0
    expected_mean = (tokens - len(RATIO_FIVE) + 3.0 * len(RATIO_FIVE)) / tokens  # the other weights are exactly 1
    assert stats[MEAN] == pytest.approx(expected_mean, rel=(tokens + 1) * U32, abs=0)


def test_grpo_decoupled_weights_are_areals_on_the_proximal_pass():
    """On-policy, the decoupled objective runs the proximal pass anyway, clips the ratio around it (the old
    log-probabilities the loss gets) and weights each token by exp(prox - behaviour), 0 above the cap (5)."""
    shifts = {(0, 0): 1.0, (0, 5): -2.0, (1, 2): 1.9, (2, 6): 0.5, (3, 4): -0.4}  # behaviour = prox - shift: weight exp(shift)
    proximal = grpo_step(**OFF_POLICY)[2]["proximal"]
    behaviour = per_response(proximal)
    for (row, column), shift in shifts.items():
        behaviour[row][column] = float(proximal[row, column]) - shift
    stats, _, calls = grpo_step(rollout=behaviour, vllm_importance_sampling_correction=True, off_policy_objective="decoupled")
    assert "time/grpo/old_logprobs" in stats
    assert torch.equal(batch_rows(calls, "old"), calls["proximal"])
    weights = batch_rows(calls, "weights")
    trained = torch.zeros_like(weights, dtype=torch.bool)
    for row, mask in enumerate(GRPO_MASKS):
        trained[row, : len(mask)] = mask > 0
    behaviour_padded = torch.full_like(proximal, NAN)
    for row, logprobs in enumerate(behaviour):
        behaviour_padded[row, : len(logprobs)] = logprobs
    expected = areal_behaviour_weight(calls["proximal"].double(), behaviour_padded.double(), trained, cap=5.0)
    rtol = U32 * (max(abs(shift) for shift in shifts.values()) + 3)  # the float32 difference (|d| <= |shift| + 1e-6), exp
    torch.testing.assert_close(weights[trained].double(), expected[trained], rtol=rtol, atol=0)
    assert float(weights[1, 2]) == 0.0 and float(weights[0, 5]) > 0.0  # exp(1.9) > 5: masked; exp(-2): no lower bound
    assert stats[MASKED] == pytest.approx(1 / int(trained.sum()))


def test_grpo_step_refuses_missing_or_bad_rollout_logprobs():
    trainer = grpo_trainer(vllm_importance_sampling_correction=True)
    args = (GRPO_QUERIES, GRPO_RESPONSES, GRPO_SCORES, GRPO_MASKS)
    with pytest.raises(ValueError, match=r"GRPOConfig.vllm_importance_sampling_correction is on but step\(\) got no rollout_logprobs: "
                                         r"pass rollout_logprobs=.*or set vllm_importance_sampling_correction=False"):
        trainer.step(*args)
    good = [torch.zeros(len(response)) for response in GRPO_RESPONSES]
    with pytest.raises(ValueError, match="rollout_logprobs has 3 entries for 4 responses"):
        trainer.step(*args, rollout_logprobs=good[:3])
    with pytest.raises(ValueError, match=r"rollout_logprobs\[1\] must be a 1-D tensor of the response's length \(4\)"):
        trainer.step(*args, rollout_logprobs=[good[0], torch.zeros(5), *good[2:]])
    with pytest.raises(ValueError, match=r"rollout_logprobs\[0\] is NaN on a trained token"):
        trainer.step(*args, rollout_logprobs=[torch.full((6,), NAN), *good[1:]])
    nan_on_tool_tokens = [good[0].masked_fill(GRPO_MASKS[0] == 0, NAN), *good[1:]]
    assert MEAN in trainer.step(*args, rollout_logprobs=nan_on_tool_tokens)
