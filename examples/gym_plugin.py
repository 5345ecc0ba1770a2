"""A gym plugin: a custom env registered by name, loaded with ``--external_plugins examples/gym_plugin.py``.

`CapitalsEnv` asks the model to write a word from the dataset row in capitals and checks the reply; a
miss gets a hint and another try. Any file that imports `textenv.gym` and adds to `envs` / `context_managers` is a
plugin.
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


class LastTurnOnly(ContextManager):
    """Shows the model the system prompt, the task, and only the latest hint (older tries are dropped)."""

    def manage_context(self, history, trajectory_id):
        head = 2 if history[0]["role"] == "system" else 1
        return history[:head] + history[head:][-2:]


envs["capitals"] = CapitalsEnv
context_managers["last_turn_only"] = LastTurnOnly
