"""The generation engine shared by TextEnvironment and the Gym scheduler."""

from textenv.engine.engine import Completion, RolloutEngine, left_pad, unwrap_model

__all__ = ["Completion", "RolloutEngine", "left_pad", "unwrap_model"]
