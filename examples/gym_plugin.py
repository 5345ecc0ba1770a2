"""A gym plugin: custom envs registered by name, loaded with ``--external_plugins examples/gym_plugin.py``.

`GuessNumberEnv` (``guess_number``) is the game `examples/gym_env.py` trains on: guess the row's secret
number, with "Higher." / "Lower." after each miss. `CapitalsEnv` (``capitals``) asks the model to write a
word from the dataset row in capitals; a miss gets a hint and another try. Any file that imports
`textenv.gym` and adds to `envs` / `context_managers` is a plugin.
"""

import asyncio
import re

from textenv.gym import ContextManager, Env, context_managers, envs


class CapitalsEnv(Env):
    """Asks the model to write the row's `word` in capital letters.

    Step reward: 1.0 when the reply contains the word in capitals (the episode ends), 0.5 when it
    contains the word in another case, else 0.0; after a miss the hint spells out the answer.

    `env_config` keys: `latency` (seconds each step waits, default 0: stands for a slow remote
    environment; other episodes keep generating meanwhile).
    """

    async def reset(self, config):
        self.word = str(config.data_dict["word"]).lower()
        self.tries = 0
        observation = f"Write the word {self.word} in capital letters."
        return observation, {"word": self.word}, "You are a helpful assistant that follows instructions exactly."

    async def step(self, action):
        await asyncio.sleep(float(self.env_config.get("latency", 0.0)))
        self.tries += 1
        reply = action[-1]["content"]
        shouted = re.search(rf"\b{re.escape(self.word.upper())}\b", reply) is not None
        said = re.search(rf"\b{re.escape(self.word)}\b", reply, flags=re.IGNORECASE) is not None
        reward = 1.0 if shouted else 0.5 if said else 0.0
        info = {"try": self.tries, "shouted": shouted, "said": said}
        if shouted:
            return None, reward, True, info
        return f"Not quite. Write exactly: {self.word.upper()}", reward, False, info

    async def close(self):
        self.word = None


class GuessNumberEnv(Env):
    """Guess the row's `secret` number between `low` and `high` (row keys, defaults 1 and 10).

    Step rewards: 1.0 for the hit (the episode ends); 0.2 for a miss that is still possible given the hints
    so far (inside the range the hints leave), at most 0.8 of such partial credit per game, so a game
    is won exactly when its total reward reaches 1.0; 0.0 otherwise. After a miss the observation says
    "Higher." or "Lower.", after a reply without a number "Answer with a number.".
    """

    PARTIAL_CREDIT = 0.2
    MAX_PARTIAL_CREDIT = 0.8

    async def reset(self, config):
        row = config.data_dict
        self.secret, self.low, self.high = int(row["secret"]), int(row.get("low", 1)), int(row.get("high", 10))
        self.guesses, self.partial_credit = [], 0.0
        observation = f"I am thinking of a number from {self.low} to {self.high}. Guess it."
        return observation, {"secret": self.secret}, "You play a number guessing game. Answer with one number only."

    async def step(self, action):
        number = re.search(r"-?\d+", action[-1]["content"])
        guess = int(number.group()) if number else None
        info = {"guess": guess, "try": len(self.guesses) + 1}
        if guess == self.secret:
            return None, 1.0, True, info
        possible = guess is not None and self.low <= guess <= self.high  # the range shrinks past every miss
        reward = min(self.PARTIAL_CREDIT, self.MAX_PARTIAL_CREDIT - self.partial_credit) if possible else 0.0
        self.partial_credit += reward
        self.guesses.append(guess)
        if guess is None:
            return "Answer with a number.", reward, False, info
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            return "Higher. Guess again.", reward, False, info
        self.high = min(self.high, guess - 1)
        return "Lower. Guess again.", reward, False, info

    async def close(self):
        self.guesses = []


class LastTurnOnly(ContextManager):
    """Shows the model the system prompt, the task, and only the latest hint (older tries are dropped)."""

    def manage_context(self, history, trajectory_id):
        head = 2 if history[0]["role"] == "system" else 1
        return history[:head] + history[head:][-2:]


envs["guess_number"] = GuessNumberEnv
envs["capitals"] = CapitalsEnv
context_managers["last_turn_only"] = LastTurnOnly
