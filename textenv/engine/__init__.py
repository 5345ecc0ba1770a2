"""The generation engine shared by TextEnvironment and the Gym scheduler."""

from textenv.engine.engine import Completion, GenerationEngine, RolloutEngine, unwrap_model

__all__ = ["Completion", "GenerationEngine", "RolloutEngine", "unwrap_model"]
