"""The generation engine shared by TextEnvironment and the Gym scheduler."""

import textenv.transformers_compat  # noqa: F401  (before anything reads transformers' modules)
from textenv.engine.engine import Completion, GenerationEngine, RolloutEngine, unwrap_model

__all__ = ["Completion", "GenerationEngine", "RolloutEngine", "unwrap_model"]
