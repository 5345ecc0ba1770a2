"""The off-policy correction shared by PPO and GRPO (`textenv.off_policy`): the weights and statistics of TRL
1.16's four ``vllm_importance_sampling_mode``s against TRL's formula, their tallies over mini-batches and processes,
and both trainers' settings (references and tolerances: tests/off_policy_helpers.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import trl
from packaging.version import Version

from textenv import off_policy
from textenv.grpo import GRPOConfig
from textenv.ppo import PPOConfig

from off_policy_helpers import CLIPPED, FLOAT64, MASKED, MAX, MEAN, NAN, U32, trl_mode_reference


# ------------------------------------------------------------------------------------------------------------
# the modes, against TRL 1.16's formula
# ------------------------------------------------------------------------------------------------------------
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


def weight_rtol(old, rollout, mask, mode) -> float:
    """See tests/off_policy_helpers.py: a float32 weight's relative error."""
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
