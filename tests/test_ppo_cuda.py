"""PPOTrainer on CUDA: bf16 mixed precision through accelerate and bf16 weights (skipped without a GPU).

Tolerances (tests/numerics.py has the analysis): the CUDA bf16 step's statistics against a CPU float32 step's,
within `rounding_tolerance` of the bf16 roundings on a value's chain (u = 2^-8) at the statistic's magnitude:
`autocast_roundings` (matrix products round inputs and outputs to bf16, accumulate in float32), plus one per
matrix product (9 a layer and the head) because cuBLAS may round split-K partial sums to bf16
(``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default). The float32 side's own
rounding and the CPU/CUDA kernel differences are float32-sized, 10^5 times smaller. Compared: statistics that
are sums of terms of one sign (a value loss, an entropy) at their own size, and the total loss (a policy loss
of either sign plus 0.1 value loss) at the size of its two parts.
"""

import copy
import math
import warnings

import pytest
import torch
from accelerate.state import AcceleratorState

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.testing import tiny_causal_lm

from numerics import autocast_roundings, rounding_tolerance

QUERIES = [torch.arange(1, 20), torch.arange(1, 24)]
RESPONSES = [torch.arange(30, 40), torch.arange(40, 46)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0)]
MASKS = [torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 1, 1]), torch.ones(6)]


def _trainer(model, **accelerator_kwargs):
    config = PPOConfig(batch_size=2, mini_batch_size=2, ppo_epochs=2, learning_rate=1e-3,
                       accelerator_kwargs=accelerator_kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(config, model)


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    AcceleratorState._reset_state(True)  # the device and mixed precision are process-wide state in accelerate
    yield
    AcceleratorState._reset_state(True)


def _magnitude(stats, key):
    """The size of the terms a statistic sums: the total loss is the policy loss (either sign) plus vf_coef (0.1)
    times the value loss."""
    if key == "ppo/loss/total":
        return abs(stats["ppo/loss/policy"]) + 0.1 * abs(stats["ppo/loss/value"])
    return abs(stats[key])


@pytest.mark.cuda
def test_bf16_mixed_precision_step_on_cuda():
    base = tiny_causal_lm(seed=0)
    torch.manual_seed(0)
    cpu_stats = _trainer(AutoModelForCausalLMWithValueHead(copy.deepcopy(base)), cpu=True).step(QUERIES, RESPONSES, SCORES, MASKS)
    AcceleratorState._reset_state(True)  # a second Accelerator with other settings is refused otherwise
    torch.manual_seed(0)
    trainer = _trainer(AutoModelForCausalLMWithValueHead(copy.deepcopy(base)), mixed_precision="bf16")
    assert trainer.current_device.type == "cuda"
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert next(trainer.model.parameters()).device.type == "cuda"
    roundings = autocast_roundings(base.config) + 9 * base.config.num_hidden_layers + 1
    for key in ("ppo/loss/total", "ppo/loss/value", "objective/entropy"):
        assert math.isfinite(stats[key])
        magnitude = max(_magnitude(run, key) for run in (stats, cpu_stats))
        assert abs(stats[key] - cpu_stats[key]) <= rounding_tolerance(roundings, magnitude, torch.bfloat16), key


@pytest.mark.cuda
def test_bf16_weights_step_on_cuda():
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0).to(torch.bfloat16))
    trainer = _trainer(model)
    before = model.v_head.summary.weight.detach().clone()
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert math.isfinite(stats["ppo/loss/total"])
    assert not torch.equal(model.v_head.summary.weight, before)
