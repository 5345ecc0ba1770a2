"""The one episode driver every front end (TextEnvironment, GymScheduler) plays its episodes with.

- `driver`: `Episode` (a front end subclasses it: `reset`, `context`, `react`, `close`, `stop_rules`),
  `play` (reset -> (context -> generate -> react) until a `StopRule` -> close; an error ends only its episode,
  recorded as `EpisodeFailure`), `play_all` (many episodes at once on one generator), `Timeouts`, the finish
  reasons;
- `lockstep`: `LockstepGenerator`, legacy TRL's turn order (every live episode's turn in one batch call).

May import: textenv.engine (Completion, RandomStream)
"""

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
