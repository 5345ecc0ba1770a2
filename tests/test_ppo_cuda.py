"""PPOTrainer on CUDA: bf16 mixed precision through accelerate and bf16 weights (skipped without a GPU)."""

import copy
import math
import warnings

import pytest
import torch
from accelerate.state import AcceleratorState

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.testing import tiny_causal_lm

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
    for key in ("ppo/loss/total", "ppo/loss/value", "objective/entropy"):
        assert math.isfinite(stats[key])
        assert stats[key] == pytest.approx(cpu_stats[key], rel=5e-2, abs=5e-2), key


@pytest.mark.cuda
def test_bf16_weights_step_on_cuda():
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0).to(torch.bfloat16))
    trainer = _trainer(model)
    before = model.v_head.summary.weight.detach().clone()
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert math.isfinite(stats["ppo/loss/total"])
    assert not torch.equal(model.v_head.summary.weight, before)
