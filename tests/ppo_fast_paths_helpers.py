"""Shared by the PPO fast-path test modules (tests/test_ppo_fast_paths_*.py): a batch of three rows around a
30-token shared prompt, a tiny model and trainer, one step's results, and the two ways two steps are compared.

Tolerances (tests/numerics.py has the analysis):
- exact (`assert_identical_step`: every compared statistic ``==``, the weights ``torch.equal``, after the
  default fused-Adam float32 step): paths that run the same kernels on the same tensors (same shapes, same
  packed layout, same process and thread count), so no rounding can differ: the optimizer step fused into
  backward (each parameter gets the same gradient and the same element-wise Adam update, only earlier),
  gradient checkpointing (the recomputed forward is the same forward), the memory-mapped reference (the same
  float32 weights). Also exact: an offloaded reference's weights, passes that must not depend on the model's
  mode, weights that must not move;
- float64 with SGD (`assert_same_float64_step`: `assert_stats_close` on the statistics, `float64_sgd_tolerance`
  on the weights, with a check that the weights moved by more than 1000 times it): steps that agree only in
  exact arithmetic because the rows are laid out differently (packed around a shared prefix or padded; the
  first mini-batch's pass run with gradients in the shuffled row order, or without, separately). Adam would
  turn a rounding-level gradient difference on a near-zero gradient into a step difference of up to 2 lr, so
  float32 Adam-trained weights cannot be compared below the update itself; float64 SGD leaves differences of
  lr x steps x the gradients' float64 rounding (about 1e-12 here);
- `assert_reordered_close` in float64: forward passes (logits, values) and the tied embedding's gradient
  computed with another layout or kernel (packed rows; the sparse gradient), `forward_terms` /
  `backward_terms` additions of the tiny model. With ``attn_implementation="eager"`` the padded passes run
  transformers' eager attention, whose softmax is taken in float32 even for a float64 model; the
  `float64_eager_softmax` fixture takes it in float64 so that the comparison is float64 throughout (the packed
  passes use SDPA, float64 already);
- the full KL against a *different* reference, in float64: positive by far more than its rounding bound
  (against the policy's own copy it is exactly 0 and would not show a sign error).
"""

import warnings

import numpy as np
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.testing import tiny_causal_lm

from numerics import assert_stats_close, float64_model, float64_sgd_tolerance, forward_terms, sgd

PROMPT = torch.arange(100, 130)  # 30 tokens every row starts with
QUERIES = [torch.cat([PROMPT, torch.tensor([7, 8])]), torch.cat([PROMPT, torch.tensor([9, 10, 11])]), torch.cat([PROMPT, torch.tensor([12])])]
RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]
COMPARED_STATS = ("ppo/loss/total", "ppo/loss/value", "ppo/loss/policy", "objective/kl", "objective/entropy",
                  "ppo/val/vpred", "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/returns/mean")
# The longest sequence a forward pass sums over (the packed row: the prompt once, then every row's rest) and the
# trained (mask 1) positions of the batch: the sizes of the float64 tolerances.
PACKED_LENGTH = len(PROMPT) + sum(len(q) + len(r) - len(PROMPT) for q, r in zip(QUERIES, RESPONSES))
TRAINED_POSITIONS = int(sum(m.sum() for m in MASKS))


def make_model(seed=0, attn_implementation="sdpa"):
    base = tiny_causal_lm(seed=seed)
    base.config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return AutoModelForCausalLMWithValueHead(base)


def make_trainer(model=None, **config_kwargs):
    config_kwargs = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 2, "learning_rate": 1e-3, "seed": 0, **config_kwargs}
    trainer_kwargs = {k: config_kwargs.pop(k) for k in list(config_kwargs) if k in ("ref_model", "num_shared_layers", "optimizer")}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(PPOConfig(**config_kwargs), model if model is not None else make_model(), **trainer_kwargs)


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def step_results(**config_kwargs):
    trainer = make_trainer(**config_kwargs)
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    return trainer, stats, flat_weights(trainer.model)


def float64_step_results(model=None, learning_rate=1e-3, steps=1, **config_kwargs):
    """`step_results` of a float64 copy of ``model`` (default `make_model()`) trained with SGD, ``steps`` steps."""
    model = float64_model(model if model is not None else make_model())
    trainer = make_trainer(model=model, optimizer=sgd(model, learning_rate), **config_kwargs)
    for _ in range(steps):
        stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    return trainer, stats, flat_weights(trainer.model)


def assert_identical_step(first, second):
    """The same statistics and weights, bit for bit (the same kernels on the same tensors)."""
    (_, stats_a, weights_a), (_, stats_b, weights_b) = first, second
    for key in COMPARED_STATS:
        assert stats_b[key] == stats_a[key], key
    assert torch.equal(weights_b, weights_a)
    assert not torch.equal(weights_a, flat_weights(make_model()))  # it trained


def assert_same_float64_step(first, second, learning_rate=1e-3, optimizer_steps=2, initial=None):
    """Float64 SGD steps that differ by the order of their reductions: statistics within `assert_stats_close`
    (log-probabilities of size log V summed), weights within `float64_sgd_tolerance` of ``optimizer_steps``
    optimizer steps; and the weights moved from ``initial`` (default: `make_model()`'s) far beyond it."""
    (trainer, stats_a, weights_a), (_, stats_b, weights_b) = first, second
    config = trainer.model.config
    assert_stats_close(stats_b, stats_a, COMPARED_STATS, forward_terms(config, PACKED_LENGTH) + TRAINED_POSITIONS,
                       magnitude=float(np.log(config.vocab_size)))
    tolerance = float64_sgd_tolerance(config, PACKED_LENGTH, TRAINED_POSITIONS, learning_rate, optimizer_steps)
    torch.testing.assert_close(weights_b, weights_a, rtol=0, atol=tolerance)
    initial = flat_weights(float64_model(make_model())) if initial is None else initial
    assert (weights_a - initial).abs().max() > 1e3 * tolerance  # it trained, far beyond the tolerance
