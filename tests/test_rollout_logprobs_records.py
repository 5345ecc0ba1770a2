"""The inference engine's per-token log-probabilities through the episode records: TextHistory, the tag and JSON
TextEnvironment paths, the Gym transcript and completions.jsonl.

Exact throughout: the log-probabilities carried into histories, transcripts and completions.jsonl are copies of
float32 values, and a float32 -> Python float -> JSON -> float round trip is exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from textenv import TextHistory
from textenv.engine.engine import FINISH_EOS, Completion
from textenv.environment import TextEnvironment
from textenv.gym import Env, GymScheduler, envs, load_plugins, read_completions
from textenv.tools import Calculator

PLUGIN = Path(__file__).parent / "plugins" / "gym_guess_plugin.py"


def fake_logprobs(token_ids: torch.Tensor) -> torch.Tensor:
    """Log-probabilities that tell which token they belong to."""
    return -0.001 * token_ids.float() - 0.5


def assert_aligned(history: TextHistory) -> None:
    """Model tokens carry `fake_logprobs` of exactly themselves; every other token is NaN."""
    trained = history.token_masks.bool()
    assert trained.any()
    assert torch.equal(history.token_logprobs[trained], fake_logprobs(history.tokens[trained]))  # copies: exact
    assert history.token_logprobs[~trained].isnan().all()
    _, response, _ = history.split_query_response_tokens()
    assert len(history.response_logprobs()) == len(response)


# ------------------------------------------------------------------------------------------------
# TextHistory
# ------------------------------------------------------------------------------------------------
def test_history_stores_logprobs_parallel_to_tokens():
    history = TextHistory("Hello", torch.tensor([1, 2]))
    history.append_segment("model", torch.tensor([3, 4, 5]), system=False, logprobs=torch.tensor([-0.1, -0.2, -0.3]))
    history.append_segment("tool", torch.tensor([6]))
    history.append_segment("again", torch.tensor([7, 8]), system=False)  # no logprobs reported
    history.append_segment("list", [9], system=False, logprobs=[-0.9])
    assert history.token_logprobs.dtype == torch.float32
    assert len(history.token_logprobs) == len(history.tokens) == 9
    nan = float("nan")
    expected = torch.tensor([nan, nan, -0.1, -0.2, -0.3, nan, nan, nan, -0.9])
    torch.testing.assert_close(history.token_logprobs, expected, rtol=0, atol=0, equal_nan=True)  # copies: exact
    torch.testing.assert_close(history.response_logprobs(), expected[2:], rtol=0, atol=0, equal_nan=True)
    _, response, mask = history.split_query_response_tokens()
    assert len(history.response_logprobs()) == len(response) == len(mask)


def test_history_constructor_and_legacy_fields_unchanged():
    history = TextHistory("Hello there!", torch.tensor([1, 2, 3]), system=False)
    assert history.token_masks.tolist() == [1, 1, 1]
    assert history.token_logprobs.isnan().all() and len(history.token_logprobs) == 3
    assert len(history.response_logprobs()) == 0


@pytest.mark.parametrize("logprobs", [torch.tensor([-0.1]), torch.tensor([-0.1, -0.2, -0.3]), torch.zeros(1, 2), torch.tensor(-1.0)])
def test_history_rejects_logprobs_of_the_wrong_shape(logprobs):
    history = TextHistory("Hello", torch.tensor([1]))
    with pytest.raises(ValueError, match="logprobs must be a 1-D tensor with one log-probability per token"):
        history.append_segment("xy", torch.tensor([2, 3]), system=False, logprobs=logprobs)
    assert history.tokens.tolist() == [1] and len(history.token_logprobs) == 1  # nothing appended


# ------------------------------------------------------------------------------------------------
# TextEnvironment: the tag format (engine and lockstep `generate`) and the JSON format
# ------------------------------------------------------------------------------------------------
class LogprobEngine:
    """The real engine, with every completion given `fake_logprobs`."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    @staticmethod
    def _with_logprobs(completion: Completion) -> Completion:
        return Completion(completion.token_ids, completion.text, completion.finish_reason, fake_logprobs(completion.token_ids))

    async def generate(self, *args, **kwargs):
        return self._with_logprobs(await self.engine.generate(*args, **kwargs))

    def generate_batch(self, *args, **kwargs):
        return [self._with_logprobs(completion) for completion in self.engine.generate_batch(*args, **kwargs)]


def environment_with_logprobs(tiny_model, tokenizer, **kwargs) -> TextEnvironment:
    env = TextEnvironment(
        tiny_model, tokenizer, {"Calculator": Calculator()}, lambda texts: [0.0] * len(texts), "Compute: ",
        max_turns=2, generation_kwargs={"max_new_tokens": 5, "do_sample": False}, **kwargs,
    )
    original = env._engine_for_call
    env._engine_for_call = lambda: LogprobEngine(original())
    return env


@pytest.mark.parametrize("turn_order", ["continuous", "lockstep"])
def test_tag_environment_keeps_engine_logprobs(tiny_model, tokenizer, turn_order):
    env = environment_with_logprobs(tiny_model, tokenizer, turn_order=turn_order)
    _, _, masks, _, histories = env.run(["1+1", "2*3"])
    for history, mask in zip(histories, masks):
        assert_aligned(history)
        assert history.response_logprobs()[mask.bool()].isfinite().all()


def test_json_environment_keeps_engine_logprobs(tiny_model, tokenizer):
    env = environment_with_logprobs(tiny_model, tokenizer, tool_format="json")
    _, _, _, _, histories = env.run(["1+1", "2*3"])
    for history in histories:
        assert_aligned(history)


class AppendingEnvironment(TextEnvironment):
    """A legacy-style overridden `generate` (lockstep) that reports log-probabilities with its segments."""

    def generate(self, histories):
        for history in histories:
            if not history.completed:
                ids = torch.tensor(self.tokenizer("hi" + self.tokenizer.eos_token, add_special_tokens=False).input_ids)
                history.append_segment("hi" + self.tokenizer.eos_token, ids, system=False, logprobs=fake_logprobs(ids))
        return histories


def test_json_lockstep_generate_passes_its_logprobs_on(tiny_model, tokenizer):
    env = AppendingEnvironment(
        tiny_model, tokenizer, {"Calculator": Calculator()}, lambda texts: [0.0] * len(texts), "Be brief.",
        tool_format="json", turn_order="lockstep",
    )
    _, _, _, _, (history,) = env.run(["Say hi"])
    assert_aligned(history)
    assert "hi" in history.last_model_segment


# ------------------------------------------------------------------------------------------------
# Gym (JSON transcript) path and completions.jsonl
# ------------------------------------------------------------------------------------------------
class CountingEnv(Env):
    async def reset(self, config):
        self.steps = 0
        return "task", {}, "Be brief."

    async def step(self, action):
        self.steps += 1
        return f"obs {self.steps}", 0.5, False, {}

    async def close(self):
        pass


@pytest.fixture()
def counting_env():
    envs["counting_lp"] = CountingEnv
    yield
    envs.pop("counting_lp", None)


def scripted_policy(tokenizer, with_logprobs=True):
    def policy(contexts, stop_strings=()):
        completions = []
        for context in contexts:
            turn = tokenizer.decode(context).count("<|im_start|>assistant")
            ids = torch.tensor(tokenizer(f"reply {turn}{tokenizer.eos_token}", add_special_tokens=False).input_ids)
            logprobs = fake_logprobs(ids) if with_logprobs else None
            completions.append(Completion(ids, tokenizer.decode(ids), FINISH_EOS, logprobs=logprobs))
        return completions

    return policy


@pytest.mark.parametrize("loss_scale", ["default", "last_round"])
def test_gym_histories_align_logprobs_with_trained_turns(tokenizer, counting_env, loss_scale):
    scheduler = GymScheduler(tokenizer=tokenizer, policy=scripted_policy(tokenizer), gym_env="counting_lp", max_turns=3, loss_scale=loss_scale)
    (episode,) = scheduler.run([{"env_config": {}}])
    assert_aligned(episode.history)
    trained = episode.history.response_logprobs()[episode.history.split_query_response_tokens()[2].bool()]
    assert len(trained) == (3 if loss_scale == "default" else 1) * len(tokenizer("reply 1<|im_end|>", add_special_tokens=False).input_ids)


def test_gym_rerendered_turns_lose_their_logprobs(tokenizer, counting_env):
    load_plugins(PLUGIN)
    scheduler = GymScheduler(tokenizer=tokenizer, policy=scripted_policy(tokenizer), gym_env="counting_lp", max_turns=4, loss_scale="default")
    (episode,) = scheduler.run([{"env_config": {}, "ctx_config": {"name": "keep_last_round"}}])
    history = episode.history
    assert_aligned(history)
    # The re-rendered "reply 2" sits in the (untrained) query part with NaN; only the final reply has values.
    assert history.token_logprobs.isfinite().sum() == history.token_masks.sum() == len(
        tokenizer("reply 2<|im_end|>", add_special_tokens=False).input_ids
    )


def test_completion_with_mismatched_logprobs_is_an_episode_error(tokenizer, counting_env):
    def policy(contexts, stop_strings=()):
        ids = torch.tensor(tokenizer("x" + tokenizer.eos_token, add_special_tokens=False).input_ids)
        return [Completion(ids, tokenizer.decode(ids), FINISH_EOS, logprobs=torch.zeros(len(ids) + 1)) for _ in contexts]

    (episode,) = GymScheduler(tokenizer=tokenizer, policy=policy, gym_env="counting_lp", max_turns=1).run([{"env_config": {}}])
    assert episode.error["stage"] == "generate" and "completion.logprobs has" in episode.error["message"]


def test_completions_jsonl_records_turn_logprobs_only_when_reported(tokenizer, counting_env, tmp_path):
    log = tmp_path / "completions.jsonl"
    with_lp = GymScheduler(tokenizer=tokenizer, policy=scripted_policy(tokenizer), gym_env="counting_lp", max_turns=2)
    (episode,) = with_lp.run([{"env_config": {}}], completions_path=log)
    without = GymScheduler(tokenizer=tokenizer, policy=scripted_policy(tokenizer, False), gym_env="counting_lp", max_turns=2)
    without.run([{"env_config": {}}], completions_path=log)
    first, second = read_completions(log)
    ids = tokenizer("reply 1<|im_end|>", add_special_tokens=False).input_ids
    assert len(first["turn_logprobs"]) == 2
    assert first["turn_logprobs"][0] == fake_logprobs(torch.tensor(ids)).tolist()  # float32 -> JSON -> float: exact
    assert first["turn_logprobs"] == episode.turn_logprobs
    assert "turn_logprobs" not in second
