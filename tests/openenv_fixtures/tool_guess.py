"""Guess a number from 1 to 10 with a tool: an OpenEnv `MCPEnvironment` whose FastMCP server offers `guess` and
`hint`. A correct `guess` ends the episode with reward 1 (set in `step_async`, as OpenEnv's own MCP environments
score their final tool call)."""

from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State

from openenv_fixtures.common import environment_closed, environment_opened, make_app, reset_seen


class ToolGuessEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        server = FastMCP("tool_guess")
        self.secret = 0

        @server.tool
        def guess(number: int) -> str:
            """Guess the secret number.

            Args:
                number: The number guessed, from 1 to 10.
            """
            if number == self.secret:
                return "Correct!"
            return f"{number} is wrong; try {'higher' if number < self.secret else 'lower'}."

        @server.tool
        def hint() -> str:
            """Say whether the secret number is even or odd."""
            return "even" if self.secret % 2 == 0 else "odd"

        super().__init__(server)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        environment_opened()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, secret: Optional[int] = None,
              **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret = secret if secret is not None else 7
        reset_seen(self.secret)
        return Observation(reward=0.0, metadata={"secret": self.secret})

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    async def step_async(self, action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        solved = (isinstance(action, CallToolAction) and action.tool_name == "guess"
                  and action.arguments.get("number") == self.secret)
        if solved:
            observation.reward, observation.done = 1.0, True
        return observation

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        environment_closed()
        super().close()


app = make_app(ToolGuessEnvironment, CallToolAction, CallToolObservation)
