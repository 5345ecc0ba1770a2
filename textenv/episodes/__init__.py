"""The one episode driver both front ends (TextEnvironment, GymScheduler) play their episodes with."""

from textenv.episodes.driver import (
    FINISH_ERROR,
    FINISH_MAX_LENGTH,
    FINISH_MAX_TURNS,
    MAX_TURNS,
    EnvTimeoutError,
    Episode,
    EpisodeFailure,
    StopRule,
    Timeouts,
    play,
    play_all,
)

__all__ = [
    "FINISH_ERROR", "FINISH_MAX_LENGTH", "FINISH_MAX_TURNS", "MAX_TURNS", "EnvTimeoutError", "Episode",
    "EpisodeFailure", "StopRule", "Timeouts", "play", "play_all",
]
