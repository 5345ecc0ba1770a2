"""The OpenEnv environment of `openenv_side.py`: guess a number from 1 to 10 in plain text, written with openenv's own
classes as an environment's author writes them (`openenv init`'s layout, in one module): a typed action and
observation, an `Environment`, its FastAPI app (``openenv_guess:app``, served by uvicorn) and its typed client
(`GuessEnv`, an `EnvClient`, what OpenEnv's documentation plays an environment with).

The secret is the reset's `secret`, else drawn from its `seed`. The guess is the reply's last number: a correct one
ends the episode with reward 1; a wrong one (or none) answers "N is wrong; try higher/lower." with reward 0. Sessions: up to ``$MAX_CONCURRENT_ENVS`` at once
(the variable OpenEnv's own apps read; textenv's server sets it from `max_sessions`).
"""

from __future__ import annotations

import os
import random
import re
from typing import Any, Dict, Optional
from uuid import uuid4

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

OPENING = "Guess my number between 1 and 10. Reply with the number only."


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

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, secret: Optional[int] = None,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = secret if secret is not None else random.Random(seed).randint(1, 10)
        return GuessObservation(feedback=OPENING, reward=0.0, metadata={"secret": self.secret})

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        numbers = re.findall(r"\d+", action.guess)
        if numbers and int(numbers[-1]) == self.secret:
            return GuessObservation(feedback="Correct!", reward=1.0, done=True)
        if not numbers:
            return GuessObservation(feedback="Reply with a number.", reward=0.0)
        hint = "higher" if int(numbers[-1]) < self.secret else "lower"
        return GuessObservation(feedback=f"{numbers[-1]} is wrong; try {hint}.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class GuessEnv(EnvClient[GuessAction, GuessObservation, State]):
    """The game's typed client (an environment's ``client.py``)."""

    def _step_payload(self, action: GuessAction) -> Dict[str, Any]:
        return {"guess": action.guess}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[GuessObservation]:
        fields = payload.get("observation", {})
        observation = GuessObservation(feedback=fields.get("feedback", ""), metadata=fields.get("metadata") or {},
                                       done=payload.get("done", False), reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict[str, Any]) -> State:
        return State(**payload)


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                 max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "1")))
