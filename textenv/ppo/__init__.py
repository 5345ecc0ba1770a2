"""Step-based PPO (the legacy TRL ``PPOTrainer.step`` workflow) on current torch / transformers / accelerate."""

import textenv.transformers_compat  # noqa: F401  (before anything reads transformers' modules)
from textenv.ppo.config import PPOConfig
from textenv.ppo.kl_control import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.offloaded_reference import OffloadedReference
from textenv.ppo.pretrained_wrapper import PreTrainedModelWrapper
from textenv.ppo.seq2seq_value_head import AutoModelForSeq2SeqLMWithValueHead
from textenv.ppo.trainer import PPOTrainer
from textenv.ppo.utils import LengthSampler, set_seed
from textenv.ppo.reference_model import create_reference_model
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, ValueHead

__all__ = [
    "AdaptiveKLController",
    "AutoModelForCausalLMWithValueHead",
    "AutoModelForSeq2SeqLMWithValueHead",
    "FixedKLController",
    "LengthSampler",
    "OffloadedReference",
    "PPOConfig",
    "PPOTrainer",
    "PreTrainedModelWrapper",
    "RunningMoments",
    "ValueHead",
    "create_reference_model",
    "set_seed",
]
