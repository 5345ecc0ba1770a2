"""The off-policy correction shared by PPO and GRPO (`textenv.off_policy`): TRL 1.16's four
``vllm_importance_sampling_mode``s and AReaL's decoupled PPO objective, their settings, and both trainers' use.

References:
- the modes: TRL computes its importance ratio inline in ``GRPOTrainer._generate_and_score_completions`` (not
  callable alone), so `trl_mode_reference` re-types those lines in float64 on the same float32 inputs;
- how GRPO applies the weight (``per_token_loss * importance_sampling_ratio`` before the KL term, which
  ``use_bias_correction_kl`` weights by the policy ratio only): TRL's own ``_compute_loss`` runs on a stand-in
  ``self`` (trl >= 1.16 only, as tests/test_grpo_formulas.py);
- the decoupled objective: AReaL's ``ppo_actor_loss_fn`` / ``compute_behave_imp_weight`` (inclusionAI/AReaL,
  ``areal/utils/functional/functional.py``, ``behave_imp_weight_mode="token_mask"``) re-typed in float64
  (`areal_decoupled_loss`);
- PPO's default: the implementation before the modes existed, kept verbatim in `legacy_ppo_weights`.

Tolerances (tests/numerics.py has the analysis):
- exact: two trainer steps that run the same computation (the correction off; on with weights of exactly 1,
  ``exp(0)``, or exactly 0, where the same tokens masked by a response mask give the same sums: dr_grpo's divisor
  does not count tokens), the legacy PPO weights (same float32 operations), bounds (a clamped weight is the
  bound), counts and their float32 fractions (``pytest.approx``'s relative 1e-6 > u);
- a float32 weight against the float64 reference (`weight_rtol`): the float32 ``old - rollout`` is rounded once
  (``u |d|``); a sequence sum of ``n`` of them adds at most ``(n - 1) u sum |d|`` (Higham's worst case); the
  argument's absolute error becomes exp's relative error, and float32 exp is within 1 ulp (2u). A mean of ``n``
  weights adds ``(n + 1) u`` (``n`` positive terms summed, one division). No test ratio lies within 10% of a
  bound, so the float32 and float64 sides truncate and mask the same units;
- float64 losses and gradients (the decoupled objective by hand, TRL's ``_compute_loss``): two orders of each
  token's chain and of the token sum (`reduction_tolerance` of ``PER_TOKEN_ROUNDINGS`` plus the tokens, at a bound
  of every per-token term).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import trl
from packaging.version import Version

from textenv import off_policy
from textenv.grpo import GRPOConfig, GRPOTrainer
from textenv.grpo import core as grpo_core
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo import rollout_correction
from textenv.ppo.core import masked_mean
from textenv.testing import tiny_causal_lm

from numerics import reduction_tolerance, unit_roundoff

U32 = unit_roundoff(torch.float32)
FLOAT64 = torch.float64
MEAN, MAX, CLIPPED, MASKED = off_policy.RATIO_MEAN, off_policy.RATIO_MAX, off_policy.CLIPPED_FRAC, off_policy.MASKED_FRAC
PER_TOKEN_ROUNDINGS = 20  # as tests/test_grpo_formulas.py, plus the weight's product


# ------------------------------------------------------------------------------------------------------------
# the modes, against TRL 1.16's formula
# ------------------------------------------------------------------------------------------------------------
NAN = float("nan")
# old - rollout per position (NaN: not trained, the rollout NaN there). Token ratios exp(d) and sequence ratios
# exp(sum d) sit on both sides of the bounds [0.5, 3.0] with a 10% margin; row 1 trains nothing.
DIFFERENCES = [
    [1.5, -1.0, NAN, 0.2, NAN, -0.1],  # tokens: 4.48 (> 3), 0.37 (< 0.5), 1.22, 0.90; sequence: exp(0.6) = 1.82
    [NAN] * 6,
    [0.4, 0.5, 0.3, 0.2, -0.1, 0.1],  # tokens inside; sequence: exp(1.4) = 4.06 (> 3)
    [-0.3, -0.3, -0.2, NAN, NAN, NAN],  # tokens inside; sequence: exp(-0.8) = 0.45 (< 0.5)
]
BOUNDS = [(None, 3.0), (0.5, 3.0), (0.5, None)]  # TRL's default, both, a lower bound only


def mode_case():
    """float32 `(old, rollout, mask)` of `DIFFERENCES`, old log-probabilities around -2.5."""
    differences = torch.tensor(DIFFERENCES, dtype=FLOAT64)
    mask = (~differences.isnan()).float()
    old = (-2.5 + 0.1 * torch.arange(differences.numel(), dtype=FLOAT64).view(differences.shape) / differences.numel()).float()
    rollout = (old.double() - differences.nan_to_num()).float().masked_fill(mask == 0, NAN)
    return old, rollout, mask


def trl_mode_reference(old, rollout, mask, mode, clip_min, clip_max) -> torch.Tensor:
    """TRL 1.16's importance ratio (``GRPOTrainer._generate_and_score_completions``, the ``vllm_importance_sampling_
    correction`` block) re-typed, in float64: `[B, T]` for token modes, `[B, 1]` for sequence modes."""
    per_token_logps_diff = ((old.double() - rollout.double()) * mask).nan_to_num(nan=0.0)
    if mode.startswith("sequence"):
        per_token_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(per_token_logps_diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def weight_rtol(old, rollout, mask, mode) -> float:
    """See the module docstring: a float32 weight's relative error."""
    differences = ((old.double() - rollout.double()) * mask).nan_to_num().abs()
    if mode.startswith("sequence"):
        chain = float((differences.sum(-1) * mask.sum(-1)).max())
    else:
        chain = float(differences.max())
    return U32 * (chain + 2)


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: f"min{b[0]}-max{b[1]}")
@pytest.mark.parametrize("mode", off_policy.MODES)
def test_weights_and_statistics_equal_trls_formula(mode, bounds):
    old, rollout, mask = mode_case()
    weights, tally = off_policy.importance_weights(old, rollout, mask, off_policy.Correction(mode, *bounds))
    reference = trl_mode_reference(old, rollout, mask, mode, *bounds)
    trained = mask > 0
    rtol = weight_rtol(old, rollout, mask, mode)
    torch.testing.assert_close(weights[trained].double(), reference.expand_as(old)[trained], rtol=rtol, atol=0)
    assert (weights[~trained] == 1.0).all()  # TRL broadcasts its weight there too; the mask zeroes both

    units = trained.any(-1) if mode.startswith("sequence") else trained
    expected = reference.squeeze(-1)[units] if mode.startswith("sequence") else reference[units]
    raw = trl_mode_reference(old, rollout, mask, mode.replace("truncate", "mask"), None, None)  # the unbounded ratio
    raw = raw.squeeze(-1)[units] if mode.startswith("sequence") else raw[units]
    changed = int((expected != raw).sum())
    stats = tally.stats()
    assert float(tally.units) == int(units.sum())
    assert float(stats[MEAN]) == pytest.approx(float(expected.mean()), rel=rtol + (len(expected) + 1) * U32, abs=0)
    assert float(stats[MAX]) == pytest.approx(float(expected.max()), rel=rtol, abs=0)
    truncating = mode.endswith("truncate")
    assert float(stats[CLIPPED]) == pytest.approx(changed / len(expected) if truncating else 0.0)
    assert float(stats[MASKED]) == pytest.approx(0.0 if truncating else changed / len(expected))
    assert changed > 0  # every case bounds something


@pytest.mark.parametrize("mode", ["token_mask", "token_truncate"])
def test_a_ratio_on_a_bound_is_kept_as_it_is(mode):
    """TRL masks ratios strictly outside ``[C_min, C_max]`` (and clamping a bound changes nothing): the bounds here
    are the float32 ratios themselves, computed by the same exp of the same (exact) difference."""
    old, rollout, mask = torch.zeros(1, 2), torch.tensor([[-0.7, 0.4]]), torch.ones(1, 2)
    ratios = torch.exp(old - rollout)
    weights, tally = off_policy.importance_weights(old, rollout, mask, off_policy.Correction(mode, float(ratios[0, 1]), float(ratios[0, 0])))
    assert torch.equal(weights, ratios)
    assert float(tally.masked) == float(tally.clipped) == 0.0


def test_a_batch_without_trained_tokens_has_neutral_statistics():
    old, rollout, mask = mode_case()
    weights, tally = off_policy.importance_weights(old, rollout, torch.zeros_like(mask), off_policy.Correction("sequence_mask", None, 3.0))
    assert (weights == 1.0).all()
    assert {key: float(value) for key, value in tally.stats().items()} == {MEAN: 1.0, MAX: 1.0, CLIPPED: 0.0, MASKED: 0.0}


def test_tallies_of_mini_batches_add_up_to_the_batchs():
    old, rollout, mask = mode_case()
    correction = off_policy.Correction("token_mask", 0.5, 3.0)
    _, whole = off_policy.importance_weights(old, rollout, mask, correction)
    _, first = off_policy.importance_weights(old[:2], rollout[:2], mask[:2], correction)
    _, second = off_policy.importance_weights(old[2:], rollout[2:], mask[2:], correction)
    merged = first + second
    for name in ("units", "masked", "clipped", "weight_max"):  # counts and a maximum: exact
        assert torch.equal(getattr(merged, name), getattr(whole, name)), name
    assert float(merged.weight_sum) == pytest.approx(float(whole.weight_sum), rel=(mask.sum().item() + 1) * U32)


class TwoProcesses:
    """An accelerator whose other process holds ``other`` (accelerate's `reduce` sums, `gather` concatenates)."""

    def __init__(self, other: off_policy.Tally):
        self.other = other

    def reduce(self, tensor, reduction="sum"):
        assert reduction == "sum"
        return tensor + torch.stack([self.other.units, self.other.weight_sum, self.other.clipped, self.other.masked])

    def gather(self, tensor):
        return torch.cat([tensor, self.other.weight_max.reshape(1)])


def test_a_tally_over_processes_sums_the_counts_and_takes_the_largest_weight():
    old, rollout, mask = mode_case()
    correction = off_policy.Correction("token_mask", 0.5, 3.0)
    _, first = off_policy.importance_weights(old[:2], rollout[:2], mask[:2], correction)
    _, second = off_policy.importance_weights(old[2:], rollout[2:], mask[2:], correction)
    reduced = first.reduced(TwoProcesses(second))
    for name in ("units", "weight_sum", "clipped", "masked", "weight_max"):
        assert torch.equal(getattr(reduced, name), getattr(first + second, name)), name
    assert float(reduced.weight_max) == max(float(first.weight_max), float(second.weight_max)) > float(first.weight_max)


# ------------------------------------------------------------------------------------------------------------
# PPO's default is the token truncation it had before the modes, bit for bit
# ------------------------------------------------------------------------------------------------------------
def legacy_ppo_weights(old_logprobs, rollout_logprobs, masks, cap):
    """`textenv.ppo.rollout_correction.importance_weights` before this change, verbatim."""
    trained = masks > 0
    ratio = torch.exp(old_logprobs.float() - rollout_logprobs.float())
    ratio = torch.where(trained, ratio, torch.ones_like(ratio))
    weights = torch.clamp(ratio, max=cap)
    mask = trained.float()
    stats = {MEAN: masked_mean(weights, mask), MAX: weights[trained].max(), CLIPPED: masked_mean((ratio > cap).float(), mask)}
    return weights, stats


@pytest.mark.parametrize("cap", [2.0, 1.5, 0.5])
def test_ppo_default_correction_is_the_legacy_truncation_bit_for_bit(cap):
    generator = torch.Generator().manual_seed(0)
    old = -3.0 * torch.rand(5, 9, generator=generator)
    rollout = old + torch.randn(5, 9, generator=generator)
    masks = (torch.rand(5, 9, generator=generator) > 0.3).float()
    config = PPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_cap=cap)
    assert off_policy.correction_of(config) == off_policy.Correction("token_truncate", None, cap)
    weights, tally = off_policy.importance_weights(old, rollout, masks, off_policy.correction_of(config))
    legacy_weights, legacy_stats = legacy_ppo_weights(old, rollout, masks, cap)
    trained = masks > 0
    assert torch.equal(weights[trained], legacy_weights[trained])
    if cap >= 1.0:  # below 1 the legacy code clamped the untrained positions' 1 to the cap too (unused: masked out)
        assert torch.equal(weights, legacy_weights)
    stats = tally.stats()
    for key, value in legacy_stats.items():
        assert torch.equal(stats[key], value), key
    assert float(stats[MASKED]) == 0.0
    assert torch.equal(rollout_correction.importance_weights(old, rollout, masks, cap)[0], weights)


# ------------------------------------------------------------------------------------------------------------
# settings
# ------------------------------------------------------------------------------------------------------------
def test_ppo_defaults_and_the_cap_alias():
    config = PPOConfig()
    assert (config.vllm_importance_sampling_correction, config.vllm_importance_sampling_mode) == (False, "token_truncate")
    assert config.vllm_importance_sampling_cap == config.vllm_importance_sampling_clip_max == 2.0
    assert config.vllm_importance_sampling_clip_min is None and config.off_policy_objective == "importance_sampling"
    assert PPOConfig(vllm_importance_sampling_cap=3.0).vllm_importance_sampling_clip_max == 3.0
    assert PPOConfig(vllm_importance_sampling_clip_max=3.0).vllm_importance_sampling_cap == 3.0
    assert PPOConfig(vllm_importance_sampling_cap=3.0, vllm_importance_sampling_clip_max=3.0).vllm_importance_sampling_clip_max == 3.0
    assert dataclasses.replace(PPOConfig(vllm_importance_sampling_cap=3.0), steps=10).vllm_importance_sampling_clip_max == 3.0
    assert PPOConfig(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=math.inf).vllm_importance_sampling_cap == math.inf
    with pytest.raises(ValueError, match=r"vllm_importance_sampling_cap \(3.0\) and vllm_importance_sampling_clip_max \(2.5\) differ"):
        PPOConfig(vllm_importance_sampling_cap=3.0, vllm_importance_sampling_clip_max=2.5)


def test_grpo_defaults_are_off_and_trls():
    config = GRPOConfig(batch_size=4, mini_batch_size=2, num_generations=2)
    assert config.vllm_importance_sampling_correction is False and off_policy.correction_of(config) is None
    assert (config.vllm_importance_sampling_mode, config.vllm_importance_sampling_clip_max, config.vllm_importance_sampling_clip_min) == (
        "sequence_mask", 3.0, None)
    assert (config.off_policy_objective, config.behave_imp_weight_cap) == ("importance_sampling", 5.0)
    if Version(trl.__version__) >= Version("1.16"):  # the lower-bound TRL has no modes
        trl_defaults = {field.name: field.default for field in dataclasses.fields(trl.GRPOConfig)}
        for name in ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min"):
            assert getattr(config, name) == trl_defaults[name], name


BAD_SETTINGS = [
    ({"vllm_importance_sampling_mode": "token"},
     r"vllm_importance_sampling_mode must be one of \['token_truncate', 'token_mask', 'sequence_truncate', 'sequence_mask'\], got 'token'"),
    ({"vllm_importance_sampling_clip_min": 3.0, "vllm_importance_sampling_clip_max": 2.0},
     r"vllm_importance_sampling_clip_min \(3.0\) must be less than vllm_importance_sampling_clip_max \(2.0\)"),
    ({"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 2.0}, "must be less than"),  # TRL: >= refused
    ({"vllm_importance_sampling_clip_max": -1.0}, "vllm_importance_sampling_clip_max must be positive"),
    ({"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": math.inf},
     "A \\*_truncate vllm_importance_sampling_mode needs vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max"),
    ({"off_policy_objective": "areal"}, r"off_policy_objective must be one of \['importance_sampling', 'decoupled'\]"),
    ({"behave_imp_weight_cap": 1.0, "vllm_importance_sampling_correction": True}, r"behave_imp_weight_cap must be > 1"),
    ({"off_policy_objective": "decoupled"}, "off_policy_objective='decoupled' .* set vllm_importance_sampling_correction=True"),
]


@pytest.mark.parametrize(("options", "message"), BAD_SETTINGS)
@pytest.mark.parametrize("config_class", ["ppo", "grpo"])
def test_bad_settings_are_refused_naming_the_field(config_class, options, message):
    with pytest.raises(ValueError, match=message):
        if config_class == "ppo":
            PPOConfig(**options)
        else:
            GRPOConfig(batch_size=4, mini_batch_size=2, num_generations=2, **options)


def test_grpo_truncation_without_any_bound_is_refused_as_trl_does():
    with pytest.raises(ValueError, match="needs vllm_importance_sampling_clip_min or vllm_importance_sampling_clip_max"):
        GRPOConfig(batch_size=4, mini_batch_size=2, num_generations=2, vllm_importance_sampling_correction=True,
                   vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=None)
    masking = GRPOConfig(batch_size=4, mini_batch_size=2, num_generations=2, vllm_importance_sampling_correction=True,
                         vllm_importance_sampling_clip_max=None, vllm_importance_sampling_clip_min=0.5)
    assert off_policy.correction_of(masking) == off_policy.Correction("sequence_mask", 0.5, None)  # masks below 0.5 only


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
    rounding of the rollout (``u |rollout|``) and of the float32 difference (``u |d|``), exp's 2u (see the module
    docstring), with ``|rollout| <= |old| + |log ratio|``."""
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


# ------------------------------------------------------------------------------------------------------------
# the decoupled objective by hand (AReaL) and GRPO's weighted loss against TRL's _compute_loss
# ------------------------------------------------------------------------------------------------------------
def areal_behaviour_weight(proximal, behaviour, mask, cap):
    """AReaL's ``compute_behave_imp_weight`` with ``behave_imp_weight_mode="token_mask"``."""
    behave_imp_weight = (proximal - behaviour).exp()
    behave_imp_weight = torch.where(behave_imp_weight > cap, 0.0, behave_imp_weight)
    return torch.where(mask, behave_imp_weight, 0.0)


def areal_decoupled_loss(logprobs, proximal, behaviour, advantages, eps_clip, eps_clip_higher, mask, cap):
    """AReaL's ``ppo_actor_loss_fn`` (token level, no dual clip) with ``behave_imp_weight_cap``; ``advantages``
    per token."""
    loss_mask_count = mask.count_nonzero() or 1
    ratio = torch.where(mask, torch.exp(logprobs - proximal), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_higher)
    pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
    pg_loss = pg_loss * areal_behaviour_weight(proximal, behaviour, mask, cap)
    return torch.where(mask, pg_loss, 0).sum() / loss_mask_count


def decoupled_case(seed=0):
    """float64 `(logprobs, proximal, behaviour, advantages, mask)`: ratios to the proximal policy on both sides of
    the clip range, behaviour weights on both sides of the cap 5 (exp(shift), shift in [-2.5, 2.5])."""
    generator = torch.Generator().manual_seed(seed)
    proximal = -0.2 - 3.0 * torch.rand(4, 7, generator=generator, dtype=FLOAT64)
    logprobs = proximal + 0.6 * (torch.rand(4, 7, generator=generator, dtype=FLOAT64) - 0.5)
    behaviour = proximal - 5.0 * (torch.rand(4, 7, generator=generator, dtype=FLOAT64) - 0.5)
    mask = torch.rand(4, 7, generator=generator) > 0.25
    advantages = torch.tensor([1.5, -0.7, 0.3, -1.2], dtype=FLOAT64)
    return logprobs, proximal, behaviour, advantages, mask


def test_decoupled_objective_equals_areals_by_hand():
    logprobs, proximal, behaviour, advantages, mask = decoupled_case()
    config = GRPOConfig(batch_size=4, mini_batch_size=4, num_generations=2, epsilon_high=0.28,
                        vllm_importance_sampling_correction=True, off_policy_objective="decoupled")
    weights, _ = off_policy.importance_weights(proximal, behaviour, mask.double(), off_policy.correction_of(config))
    leaf = logprobs.clone().requires_grad_(True)
    per_token_loss, _ = grpo_core.clipped_token_loss(leaf, proximal, advantages, config.epsilon_low, config.upper_epsilon, weights)
    tokens = float(mask.sum())
    loss = grpo_core.aggregate_loss(per_token_loss, mask.double(), "dapo", accumulation_steps=1, max_completion_length=7,
                                    tokens_per_optimizer_step=grpo_core.dapo_divisor(tokens, 1, 1, 1))
    (grad,) = torch.autograd.grad(loss, leaf)
    areal_leaf = logprobs.clone().requires_grad_(True)
    areal = areal_decoupled_loss(areal_leaf, proximal, behaviour, advantages[:, None].expand_as(logprobs), config.epsilon_low,
                                 config.upper_epsilon, mask, cap=config.behave_imp_weight_cap)
    (areal_grad,) = torch.autograd.grad(areal, areal_leaf)
    behaviour_weights = (proximal - behaviour).exp()[mask]
    assert (behaviour_weights > 5.0).any() and (behaviour_weights < 5.0).any()
    ratio = (logprobs - proximal).exp()[mask]
    assert (ratio > 1.28).any() and (ratio < 0.8).any()
    magnitude = float(advantages.abs().max()) * max(float(ratio.max()), 1.28) * 5.0
    tolerance = reduction_tolerance(PER_TOKEN_ROUNDINGS + int(tokens), magnitude, FLOAT64)
    assert abs(float(loss.detach()) - float(areal.detach())) <= tolerance
    torch.testing.assert_close(grad, areal_grad, rtol=0, atol=tolerance)
    assert (grad[mask] == 0).any() and (grad[mask] != 0).any()  # clipped or masked tokens, and trained ones


class _OneProcessAccelerator:
    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor


def trl_loss_self(logps, entropies, beta):
    """A stand-in ``self`` for TRL 1.16's ``GRPOTrainer._compute_loss`` (the attributes it reads, as in
    tests/test_grpo_formulas.py) with vLLM's importance sampling on: dapo, token level, TRL's other defaults."""
    return SimpleNamespace(
        loss_type="dapo", beta=beta, epsilon_low=0.2, epsilon_high=0.28,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1),
        importance_sampling_level="token", top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        use_vllm=True, vllm_importance_sampling_correction=True,
        _entropy_bonus_enabled=False, aux_loss_enabled=False, current_gradient_accumulation_steps=1, max_completion_length=7,
        model=SimpleNamespace(training=True), accelerator=_OneProcessAccelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, entropies, None),
    )


@pytest.mark.skipif(Version(trl.__version__) < Version("1.16"), reason="TRL 1.16's _compute_loss applies the modes' weights")
@pytest.mark.parametrize("mode", off_policy.MODES)
def test_grpo_weighted_loss_equals_trls_compute_loss(mode):
    """The weights multiply the clipped loss, not the KL term, which use_bias_correction_kl weights by the policy
    ratio alone: textenv's chain (`GRPOTrainer._mini_batch_loss`) against TRL's, on the same weights."""
    from trl import GRPOTrainer as TRLGRPOTrainer

    logprobs, old, rollout, advantages, mask = decoupled_case(seed=1)
    ref = logprobs + 0.3 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(2), dtype=FLOAT64)
    beta, correction = 0.04, off_policy.Correction(mode, 0.5, 3.0)
    weights, _ = off_policy.importance_weights(old, rollout, mask.double(), correction)
    trl_ratio = trl_mode_reference(old, rollout, mask.double(), mode, 0.5, 3.0)

    leaf = logprobs.clone().requires_grad_(True)
    per_token_loss, ratio = grpo_core.clipped_token_loss(leaf, old, advantages, 0.2, 0.28, weights)
    per_token_loss = per_token_loss + beta * grpo_core.reference_kl(leaf, ref, ratio)
    loss = grpo_core.aggregate_loss(per_token_loss, mask.double(), "dapo", accumulation_steps=1, max_completion_length=7,
                                    tokens_per_optimizer_step=float(mask.sum()))
    (grad,) = torch.autograd.grad(loss, leaf)

    trl_leaf = logprobs.clone().requires_grad_(True)
    completion_mask = torch.ones(mask.shape, dtype=torch.long)
    inputs = {"prompt_ids": torch.ones(4, 2, dtype=torch.long), "prompt_mask": torch.ones(4, 2, dtype=torch.long),
              "completion_ids": torch.ones(mask.shape, dtype=torch.long), "completion_mask": completion_mask,
              "tool_mask": mask.long(), "advantages": advantages, "num_items_in_batch": mask.sum().double(),
              "old_per_token_logps": old, "ref_per_token_logps": ref, "importance_sampling_ratio": trl_ratio}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trl_loss = TRLGRPOTrainer._compute_loss(trl_loss_self(trl_leaf, torch.zeros_like(logprobs), beta), None, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, trl_leaf)
    ratios = (logprobs - old).exp()[mask]
    kl = float((ref - logprobs).abs().max())
    magnitude = (float(advantages.abs().max()) * max(float(ratios.max()), 1.28) * 3.0
                 + beta * 2 * (math.exp(kl) + kl + 1) * max(float(ratios.max()), 1.0))
    tolerance = reduction_tolerance(PER_TOKEN_ROUNDINGS + int(mask.sum()), magnitude, FLOAT64)
    assert abs(float(loss.detach()) - float(trl_loss.detach())) <= tolerance
    torch.testing.assert_close(grad, trl_grad, rtol=0, atol=tolerance)
    unweighted, _ = grpo_core.clipped_token_loss(logprobs, old, advantages, 0.2, 0.28)
    assert (unweighted * (weights - 1)).abs()[mask].max() > 1e3 * tolerance  # the weights move the loss


# ------------------------------------------------------------------------------------------------------------
# PPOTrainer with the other modes
# ------------------------------------------------------------------------------------------------------------
PPO_PROMPT = torch.arange(100, 120)
PPO_QUERIES = [torch.cat([PPO_PROMPT, torch.tensor(task)]) for task in ([7, 8], [9, 10, 11], [12])]
PPO_RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
PPO_SCORES = [torch.tensor(1.0), torch.tensor(-1.0), torch.tensor(0.5)]
PPO_MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]


def ppo_step(rollout, **config):
    """`(stats, experience)` of one PPO step (one mini-batch, one epoch) on the batch above, with the correction."""
    torch.manual_seed(0)
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0))
    options = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 1, "learning_rate": 1e-3, "seed": 0,
               "vllm_importance_sampling_correction": True, **config}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(PPOConfig(**options), model)
    seen = {}
    train_rows, importance = trainer._train_rows, trainer._importance_weights
    trainer._train_rows = lambda experience, rows, legacy: seen.update(experience) or train_rows(experience, rows, legacy)

    def record(rollout_logprobs, queries, model_inputs, logprobs, masks):
        seen["old"], seen["attention_mask"] = logprobs.clone(), model_inputs["attention_mask"]
        return importance(rollout_logprobs, queries, model_inputs, logprobs, masks)

    trainer._importance_weights = record
    stats = trainer.step(PPO_QUERIES, PPO_RESPONSES, PPO_SCORES, PPO_MASKS, rollout_logprobs=rollout)
    return stats, seen


def ppo_old_logprobs() -> list[torch.Tensor]:
    """The trainer's old log-probability of every response token (read from an identical step)."""
    _, seen = ppo_step([torch.zeros(len(response)) for response in PPO_RESPONSES])
    first = seen["attention_mask"].int().argmax(dim=1)
    starts = [int(first[row]) + len(query) - 1 for row, query in enumerate(PPO_QUERIES)]
    return [seen["old"][row, start : start + len(response)].cpu() for row, (start, response) in enumerate(zip(starts, PPO_RESPONSES))]


def shifted_rtol(old, rollout, shifts, sequence: bool) -> float:
    """A weight's relative error against ``exp(-shift)`` (summed over a sequence's trained tokens) when the test
    built ``rollout = fl32(old + shift)``: per token ``u (|old| + 2 |rollout| + |shift|)`` (rounding the rollout,
    then the float32 difference; as tests/test_rollout_logprobs.py's `ratio_rtol`), a sequence sum of ``n`` of
    them adds ``(n - 1) u sum |shift|``, and exp's 2u."""
    chains = []
    for logprobs, built, shift, mask in zip(old, rollout, shifts, PPO_MASKS):
        per_token = (logprobs.abs() + 2 * built.abs() + shift.abs())[mask > 0]
        if sequence:
            chains.append(float(per_token.sum()) + int(mask.sum()) * float(shift[mask > 0].abs().sum()))
        else:
            chains.append(float(per_token.max()))
    return U32 * (max(chains) + 2)


@pytest.mark.parametrize("objective", ["sequence_mask", "decoupled"])
def test_ppo_step_weights_in_the_other_modes(objective):
    """Rollout = old + shift, so each token's ratio is exp(-shift) (9 on untrained tokens: unused): sequence_mask
    weights rows 0 and 1 by exp(0.5) and drops row 2 (exp(-3.2) < clip_min 0.1); decoupled zeroes the token above
    the cap 5 (exp(2) > 5)."""
    shifts = [torch.tensor([-0.15, -0.15, 9.0, 9.0, -0.1, -0.1]), torch.tensor([-2.0, 1.0, 0.5]), torch.tensor([0.8] * 4 + [9.0] * 3 + [0.0] * 3)]
    old = ppo_old_logprobs()
    rollout = [logprobs + shift for logprobs, shift in zip(old, shifts)]
    if objective == "decoupled":
        stats, seen = ppo_step(rollout, off_policy_objective="decoupled")
        expected = [[0.0 if math.exp(-s) > 5.0 else math.exp(-s) for s in shift[mask > 0].tolist()] for shift, mask in zip(shifts, PPO_MASKS)]
        units = sum(len(row) for row in expected)
        assert stats[MASKED] == pytest.approx(1 / units)  # row 1's exp(2)
    else:
        stats, seen = ppo_step(rollout, vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_min=0.1)
        sequence = [math.exp(-float(shift[mask > 0].sum())) for shift, mask in zip(shifts, PPO_MASKS)]
        expected = [[ratio if 0.1 <= ratio <= 2.0 else 0.0] * int(mask.sum()) for ratio, mask in zip(sequence, PPO_MASKS)]
        assert expected[2][0] == 0.0 and stats[MASKED] == pytest.approx(1 / 3)
    weights, masks = seen["weights"].cpu(), seen["masks"].cpu()
    rtol = shifted_rtol(old, rollout, shifts, sequence=objective == "sequence_mask")
    for row, row_expected in enumerate(expected):
        torch.testing.assert_close(weights[row][masks[row] > 0].double(), torch.tensor(row_expected, dtype=FLOAT64), rtol=rtol, atol=0)
    assert stats[CLIPPED] == 0.0 and MEAN in stats and MAX in stats
