"""The guessing game of examples/openenv/guess_game.py, counted for the tests: each instance's opening and closing and
each reset's secret are recorded (`/test/sessions`). A guess of ``boom`` makes the step raise (an environment error);
``sleep`` makes it take two seconds (to cancel an episode while it waits)."""

import sys
import time
from pathlib import Path
from typing import Any, Optional

from openenv_fixtures.common import environment_closed, environment_opened, make_app, reset_seen

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "openenv"))
from guess_game import GuessAction, GuessEnvironment, GuessObservation  # noqa: E402


class CountedGuessEnvironment(GuessEnvironment):
    def __init__(self):
        super().__init__()
        environment_opened()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, secret: Optional[int] = None,
              **kwargs: Any) -> GuessObservation:
        observation = super().reset(seed=seed, episode_id=episode_id, secret=secret, **kwargs)
        reset_seen(self.secret)
        return observation

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        text = action.guess.strip()
        if text == "boom":
            raise RuntimeError("the guess exploded")
        if text == "sleep":
            time.sleep(2.0)
        return super().step(action, timeout_s=timeout_s, **kwargs)

    def close(self) -> None:
        environment_closed()


app = make_app(CountedGuessEnvironment, GuessAction, GuessObservation)
