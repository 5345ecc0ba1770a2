"""A TRL 1.x environment class, as docs/guides/trl-environments.md shows it, for the command line:

    textenv rollout --model bundled --dataset examples/data/counter.jsonl --environment_factory examples/counter_env.py:CounterEnv
    textenv train --task gym --dataset examples/data/counter.jsonl --environment_factory examples/counter_env.py:CounterEnv --reward_funcs examples/counter_env.py:bonus

`CounterEnv` is the guide's class, unchanged (tests/test_docs_commands.py checks that they are the same): its
public method `increment` is the model's tool, `get_reward` the episode's reward. `bonus` is a TRL reward
function, added to it with ``--reward_funcs``.
"""


class CounterEnv:  # a TRL 1.x environment, unchanged
    def reset(self, **kwargs) -> str:  # called with the row's fields
        self.counter = kwargs["start"]
        return f" The counter is at {self.counter}."  # appended to the prompt's last message

    def increment(self, step: int) -> int:  # a public method: a tool
        """Increment the counter.

        Args:
            step: The value to add.

        Returns:
            The new value of the counter.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:  # called once, after the episode
        return float(self.counter)


def bonus(prompts, completions, **kwargs) -> list[float]:
    """TRL's reward-function signature: 0.5 for each episode whose model called a tool."""
    return [0.5 if any(message.get("role") == "tool" for message in completion) else 0.0 for completion in completions]
