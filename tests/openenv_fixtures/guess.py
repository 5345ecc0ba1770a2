"""Guess a number from 1 to 10 in plain text: an OpenEnv `Environment` with a typed action and observation.

The secret is the reset's `secret` (a dataset column), else drawn from `seed`. A guess of ``boom`` makes the step
raise (an environment error); ``sleep`` makes it take two seconds (to cancel an episode while it waits).
"""

import random
import time
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from openenv_fixtures.common import environment_closed, environment_opened, make_app


class GuessAction(Action):
    guess: str = Field(description="The number guessed, as text")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="What the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 0
        environment_opened()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, secret: Optional[int] = None,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = secret if secret is not None else random.Random(seed).randint(1, 10)
        return GuessObservation(feedback="Guess my number between 1 and 10. Reply with the number only.", reward=0.0,
                                metadata={"secret": self.secret})

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.guess.strip()
        if text == "boom":
            raise RuntimeError("the guess exploded")
        if text == "sleep":
            time.sleep(2.0)
        if text == str(self.secret):
            return GuessObservation(feedback="Correct!", reward=1.0, done=True)
        hint = "higher" if text.isdigit() and int(text) < self.secret else "lower"
        return GuessObservation(feedback=f"{text} is wrong; try {hint}.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        environment_closed()


app = make_app(GuessEnvironment, GuessAction, GuessObservation)
