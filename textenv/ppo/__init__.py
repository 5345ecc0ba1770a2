"""Step-based PPO (the legacy TRL ``PPOTrainer.step`` workflow) on current torch / transformers / accelerate."""

from textenv.ppo.config import PPOConfig
from textenv.ppo.kl_control import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.offloaded_reference import OffloadedReference
from textenv.ppo.trainer import PPOTrainer
from textenv.ppo.utils import LengthSampler, set_seed
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, ValueHead, create_reference_model

__all__ = [
    "AdaptiveKLController",
    "AutoModelForCausalLMWithValueHead",
    "FixedKLController",
    "LengthSampler",
    "OffloadedReference",
    "PPOConfig",
    "PPOTrainer",
    "RunningMoments",
    "ValueHead",
    "create_reference_model",
    "set_seed",
]
