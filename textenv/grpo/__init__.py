"""Group Relative Policy Optimisation beside PPO: the same episodes, a plain causal LM, TRL 1.16's formulas."""

from textenv.grpo.config import ALGORITHMS, AlgorithmArguments, GRPOArguments, GRPOConfig
from textenv.grpo.trainer import GRPOTrainer

__all__ = ["ALGORITHMS", "AlgorithmArguments", "GRPOArguments", "GRPOConfig", "GRPOTrainer"]
