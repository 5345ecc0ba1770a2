"""A test plugin: registers a number-guessing env and a context manager that keeps only the last round."""

from textenv.gym import ContextManager, Env, context_managers, envs


class GuessEnv(Env):
    """Guess the row's secret number; the observation says 'higher' or 'lower'. Reward 1 for a hit."""

    closed_count = 0

    async def reset(self, config):
        self.secret = int(config.data_dict["secret"])
        return "Guess my number between 1 and 10.", {"secret": self.secret}, "You are a guesser."

    async def step(self, action):
        reply = action[-1]["content"]
        digits = "".join(ch for ch in reply if ch.isdigit())
        guess = int(digits) if digits else -1
        if guess == self.secret:
            return None, 1.0, True, {"guess": guess}
        return ("higher" if guess < self.secret else "lower"), 0.0, False, {"guess": guess}

    async def close(self):
        type(self).closed_count += 1


class KeepLastRound(ContextManager):
    """Keeps the opening messages and the last assistant reply + observation."""

    def manage_context(self, history, trajectory_id):
        head = 2 if history[0]["role"] == "system" else 1
        return history[:head] + history[head:][-2:]


envs["guess_env"] = GuessEnv
context_managers["keep_last_round"] = KeepLastRound
