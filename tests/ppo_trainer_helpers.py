"""Shared by the PPOTrainer test modules (tests/test_ppo_trainer_*.py): a tiny random Llama with a value head, a
trainer of it (float32 Adam, or a float64 copy with SGD), a hand-made batch.

Tolerances (tests/numerics.py has the analysis):
- exact: the same computation repeated (masks of ones against no masks take the same path), parameters that
  must not move, a saved and reloaded model, token ids;
- float64 with SGD, at `float64_sgd_tolerance` / `assert_stats_close`: results that agree only in exact
  arithmetic because the batches are padded or split differently (tool tokens removed, mini-batch size,
  gradient accumulation, left padding). Adam would turn a rounding-level gradient difference on a near-zero
  gradient into a step of up to 2 lr, so trained float32 weights cannot be compared below the update itself;
- `assert_reordered_close` in float64: forward passes of differently padded batches;
- KL of a policy against itself: the two passes run the same kernels on the same inputs, so exactly zero;
- scalars the test computes by hand from a few float32 operations (a learning rate, a scaled score):
  ``pytest.approx``'s relative 1e-6 (8 float32 ulps), 1e-5 where a running standard deviation is involved.
"""

import copy
import warnings

import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.testing import tiny_causal_lm

from numerics import float64_model, sgd

QUERY = torch.tensor([504, 3616, 339, 2691, 288, 260, 216])  # 7 tokens, like legacy's "This morning I went to the "
RESPONSE = torch.tensor([1201, 2234, 30, 976, 314, 253, 1070])


_BASE_MODELS = {}


def tiny_lm(seed=0):
    """A fresh copy of the tiny Llama of this seed (building one takes seconds; copying it, milliseconds)."""
    if seed not in _BASE_MODELS:
        _BASE_MODELS[seed] = tiny_causal_lm(seed=seed)
    return copy.deepcopy(_BASE_MODELS[seed])


def make_model(seed=0):
    base = tiny_lm(seed)
    torch.manual_seed(seed)  # after tiny_lm: the value head's initialisation must not depend on the cache
    return AutoModelForCausalLMWithValueHead(base)


def make_trainer(model=None, tokenizer=None, **config_kwargs):
    config_kwargs = {"batch_size": 2, "mini_batch_size": 1, "seed": 42, "ppo_epochs": 1, **config_kwargs}
    trainer_kwargs = {k: config_kwargs.pop(k) for k in list(config_kwargs) if k in ("ref_model", "num_shared_layers", "optimizer", "lr_scheduler", "dataset")}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(PPOConfig(**config_kwargs), model if model is not None else make_model(), tokenizer=tokenizer, **trainer_kwargs)


def float64_trainer(learning_rate=1e-3, **config_kwargs):
    """A trainer of a float64 copy of the tiny model, with SGD (see the module's docstring)."""
    model = float64_model(make_model())
    return make_trainer(model=model, optimizer=sgd(model, learning_rate), **config_kwargs)


def batch(n=2):
    return [QUERY.clone() for _ in range(n)], [RESPONSE.clone() for _ in range(n)], [torch.tensor(1.0) for _ in range(n)]


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
