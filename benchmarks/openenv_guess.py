"""The OpenEnv environment of `openenv_side.py`: the guessing game of examples/openenv/guess_game.py (written with
openenv's own classes as an environment's author writes them: a typed action and observation, an `Environment`, its
FastAPI app, served by uvicorn as ``openenv_guess:app``), with the typed client an environment's ``client.py`` adds
(`GuessEnv`, an `EnvClient`: what OpenEnv's documentation plays an environment with).

The secret is the reset's `secret`. The guess is the reply's last number: a correct one ends the episode with reward 1;
a wrong one (or none) answers with a hint and reward 0. Sessions: up to ``$MAX_CONCURRENT_ENVS`` at once (the variable
OpenEnv's own apps read; textenv's server sets it from `max_sessions`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import State

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "openenv"))
from guess_game import OPENING, GuessAction, GuessObservation, app  # noqa: E402

__all__ = ["OPENING", "GuessAction", "GuessEnv", "GuessObservation", "app"]


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
