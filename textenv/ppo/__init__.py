"""Step-based PPO (the legacy TRL ``PPOTrainer.step`` workflow) on current torch / transformers / accelerate."""

from textenv.ppo.config import PPOConfig
from textenv.ppo.core import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.offloaded_reference import OffloadedReference
from textenv.ppo.trainer import PPOTrainer
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, ValueHead, create_reference_model

__all__ = [
    "AdaptiveKLController",
    "AutoModelForCausalLMWithValueHead",
    "FixedKLController",
    "OffloadedReference",
    "PPOConfig",
    "PPOTrainer",
    "RunningMoments",
    "ValueHead",
    "create_reference_model",
]
