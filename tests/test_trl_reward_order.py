"""A TRL environment is scored as TRL 1.16's `GRPOTrainer` scores it: TRL's own `_calculate_rewards` runs (a real
trainer on a tiny random model, given environment instances) beside textenv's Gym adapter on the same environment
class and reward function, and both call the reward function first, then `get_reward`, with the same argument
names, and sum to the same reward (TRL's reward weights are 1). TRL calls a reward function once per batch, textenv
once per episode (a batch of one), as each episode ends."""

from __future__ import annotations

import pytest
import trl
from packaging.version import Version

from textenv.gym import GymScheduler, ScriptedPolicy
from textenv.testing import tiny_causal_lm

if Version(trl.__version__) < Version("1.16"):
    pytest.skip(f"compares with TRL 1.16's GRPOTrainer (environment_factory); trl {trl.__version__} is installed", allow_module_level=True)

PROMPT = [{"role": "user", "content": "Raise the counter."}]


class OrderEnv:
    """Records when its reward is read and what a reward function left on it."""

    calls: list = []

    def reset(self, **kwargs) -> None:
        self.judged = None
        return None

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: The value to add.
        """
        return step

    def get_reward(self) -> float:
        OrderEnv.calls.append(("get_reward", self.judged))
        return 1.0 if self.judged == "judge" else -1.0


def judge(prompts, completions, environments, **kwargs):
    OrderEnv.calls.append(("judge", tuple(sorted(["prompts", "completions", "environments", *kwargs]))))
    for environment in environments:
        environment.judged = "judge"
    return [0.5] * len(completions)


@pytest.fixture(autouse=True)
def fresh_calls():
    OrderEnv.calls = []


def trl_calls(tmp_path) -> tuple[list, list[float]]:
    """What TRL's `_calculate_rewards` calls, in order, for two completions, and the summed rewards."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from textenv.chat.templates import CHATML_TOOLS_TEMPLATE
    from textenv.models import load_tokenizer

    tokenizer = load_tokenizer()
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE  # TRL refuses a template that renders no tool calls
    tokenizer.response_template = qwen3_template  # and needs a parser for the replies (Hermes, what it writes)
    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8)
    dataset = Dataset.from_dict({"prompt": [PROMPT] * 2, "level": ["easy"] * 2})
    trainer = GRPOTrainer(model=tiny_causal_lm(seed=0), reward_funcs=[judge], args=args, train_dataset=dataset, processing_class=tokenizer,
                          environment_factory=OrderEnv)
    OrderEnv.calls = []  # TRL probes one instance at construction
    trainer.environments = [OrderEnv(), OrderEnv()]
    for environment in trainer.environments:
        environment.reset()
    inputs = [{"prompt": PROMPT, "level": "easy"}] * 2
    rewards = trainer._calculate_rewards(inputs, [PROMPT] * 2, [[{"role": "assistant", "content": "Done."}]] * 2, [[1, 2], [3]])
    return list(OrderEnv.calls), rewards.sum(dim=1).tolist()


def textenv_calls(tokenizer) -> tuple[list, list[float]]:
    policy = ScriptedPolicy(tokenizer, lambda context: "Done.")
    scheduler = GymScheduler(None, tokenizer, policy=policy, environment_factory=OrderEnv, reward_funcs=[judge], max_turns=2)
    OrderEnv.calls = []
    episodes = scheduler.run([{"prompt": PROMPT, "level": "easy"}] * 2)
    return list(OrderEnv.calls), [episode.total_reward for episode in episodes]


def test_reward_functions_then_get_reward_with_trls_arguments(tmp_path, tokenizer):
    trl_order, trl_rewards = trl_calls(tmp_path)
    order, rewards = textenv_calls(tokenizer)
    assert trl_order[0][0] == "judge" and [call for call in trl_order[1:]] == [("get_reward", "judge")] * 2  # TRL's own order
    assert order[0] == trl_order[0]  # the reward function first, with the argument names TRL passes
    assert sorted(call for call in order if call[0] == "get_reward") == [("get_reward", "judge")] * 2
    assert order.index(("get_reward", "judge")) > 0
    assert rewards == trl_rewards == [1.5, 1.5]
