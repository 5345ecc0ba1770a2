"""Step-based PPO (the legacy TRL ``PPOTrainer.step`` workflow) on current torch / transformers / accelerate."""

from textenv.ppo.config import PPOConfig
from textenv.ppo.core import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.trainer import PPOTrainer
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, ValueHead, create_reference_model

__all__ = [
    "AdaptiveKLController",
    "AutoModelForCausalLMWithValueHead",
    "FixedKLController",
    "PPOConfig",
    "PPOTrainer",
    "RunningMoments",
    "ValueHead",
    "create_reference_model",
]
