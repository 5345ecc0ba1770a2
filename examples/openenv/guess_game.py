"""An OpenEnv environment, written as OpenEnv documents them (a typed action and observation, an `Environment`, the
app of `openenv.core.env_server.create_app`; nothing in it knows textenv): guess a number from 1 to 10 in plain
text (the reply's last number), with a hint after each wrong guess; the reward is 1 when the number is found, which
ends the episode.

The secret is the reset's `secret` (a dataset column: each row's columns go to ``reset``), else drawn from `seed`.
textenv serves the app in a process of its own; from the repository's folder (docs/guides/environments.md):

    PYTHONPATH=examples/openenv textenv rollout --model bundled --task openenv --env_id guess_game:app --dataset examples/data/guess_number.jsonl --max_turns 3 --max_new_tokens 8 --max_concurrency 4 --output completions.jsonl
"""

import os
import random
import re
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

OPENING = "Guess my number between 1 and 10. Reply with the number only."


class GuessAction(Action):
    guess: str = Field(description="The number guessed, as text")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="What the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own instance

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.secret = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, secret: Optional[int] = None,
              **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = secret if secret is not None else random.Random(seed).randint(1, 10)
        return GuessObservation(feedback=OPENING, reward=0.0, metadata={"secret": self.secret})  # metadata: never shown

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        numbers = re.findall(r"\d+", action.guess)
        if not numbers:
            return GuessObservation(feedback="Reply with a number.", reward=0.0)
        guess = int(numbers[-1])  # the reply's last number
        if guess == self.secret:
            return GuessObservation(feedback="Correct!", reward=1.0, done=True)
        return GuessObservation(feedback=f"{guess} is wrong; try {'higher' if guess < self.secret else 'lower'}.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


# MAX_CONCURRENT_ENVS: the session cap, as OpenEnv's own apps read it (textenv passes its max_sessions there)
app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_game",
                 max_concurrent_envs=int(os.environ.get("MAX_CONCURRENT_ENVS", "1")))
