"""`TextEnvironment(tool_format="json")` honours an overridden `generate` as the tag format does: episodes
run in lockstep through it (every live episode's turn in one call, then every tool call), with the same
warning and `turn_order` rules; with the built-in `generate`, lockstep gives the continuous run's episodes.

Comparisons (tests/numerics.py has the analysis): the continuous and the lockstep runs of the bundled model
decode greedily in different batches (another reduction order), so `assert_greedy_histories_agree`: tokens
and masks equal up to the first rounding tie of the top two logits (checked in float64), and the tool calls,
which follow from the tokens, compared where the episodes are identical. Scripted and recorded token ids are
compared exactly (copies).
"""

from __future__ import annotations

import asyncio
import json
import warnings
from unittest.mock import patch

import pytest
import torch

from textenv.environment import TextEnvironment
from textenv.episodes.lockstep import LockstepGenerator
from textenv.tools import Calculator

from numerics import assert_greedy_histories_agree

SCRIPT = {
    "What is 2+3?": ['<tool_call>\n{"name": "Calculator", "arguments": {"query": "2+3"}}\n</tool_call>', "Result=5"],
    "Say hi": ["hi"],
    "What is 6*7?": ['<tool_call>\n{"name": "Calculator", "arguments": {"query": "6*7"}}\n</tool_call>', "Result=42"],
}


def reward(texts):
    return [float("Result=" in text) for text in texts]


class ScriptedPolicy:
    """A legacy-style `generate(histories) -> histories`: appends each episode's next scripted turn, ended
    by the EOS token, as a model segment; records how many histories each call got."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls: list[int] = []
        self.turns = {query: 0 for query in SCRIPT}
        self.appended: dict[str, list[list[int]]] = {query: [] for query in SCRIPT}

    def __call__(self, histories):
        self.calls.append(len(histories))
        for history in histories:
            query = next(query for query in SCRIPT if query in history.text)
            text = SCRIPT[query][self.turns[query]] + self.tokenizer.eos_token
            self.turns[query] += 1
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
            self.appended[query].append(ids)
            history.append_segment(text, torch.tensor(ids), system=False)
        return histories


class ScriptedEnvironment(TextEnvironment):
    def generate(self, histories):
        return self.policy(histories)


def json_env(cls, model, tokenizer, **kwargs):
    return cls(model, tokenizer, {"Calculator": Calculator()}, reward, "Be brief.", tool_format="json", **kwargs)


def model_segments(history):
    return [history.tokens[start:end].tolist() for (start, end), system in zip(history.token_spans, history.system_spans) if not system]


@pytest.mark.parametrize("override", ["subclass", "instance attribute", "patched class"])
def test_an_overridden_generate_plays_json_episodes_in_lockstep_and_warns(override, tiny_model, tokenizer):
    policy = ScriptedPolicy(tokenizer)
    queries = list(SCRIPT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if override == "subclass":
            env = json_env(ScriptedEnvironment, tiny_model, tokenizer)
            env.policy = policy
            result = env.run(queries)
        elif override == "instance attribute":
            env = json_env(TextEnvironment, tiny_model, tokenizer)
            env.generate = policy
            result = env.run(queries)
        else:
            env = json_env(TextEnvironment, tiny_model, tokenizer)
            with patch.object(TextEnvironment, "generate", lambda self, histories: policy(histories)):
                result = env.run(queries)
    assert any("generate is overridden: turns run in lockstep" in str(w.message) for w in caught)
    _, responses, masks, rewards, histories = result
    assert policy.calls == [3, 2]  # every live episode per call; "Say hi" ended after its first turn
    for query, history in zip(queries, histories):
        assert model_segments(history) == policy.appended[query]  # the scripted ids, EOS included, bit for bit
        assert masks[queries.index(query)].sum().item() == sum(len(ids) for ids in policy.appended[query])
    calls = histories[0].info["tool_calls"]
    assert [(call["name"], call["result"]) for call in calls] == [("Calculator", "5")]
    assert [call["result"] for call in histories[2].info["tool_calls"]] == ["42"]
    assert histories[1].info["tool_calls"] == [] and rewards == [1.0, 0.0, 1.0]
    messages = histories[0].info["messages"]
    assert messages[-1] == {"role": "assistant", "content": "Result=5"}  # the EOS ended the turn, not kept as text
    assert [message["role"] for message in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert "<tool_response>\n5\n</tool_response>" in histories[0].text


def test_the_turn_order_rules_are_the_tag_formats(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="overridden generate"):
        env = json_env(ScriptedEnvironment, tiny_model, tokenizer, turn_order="continuous")
        env.policy = ScriptedPolicy(tokenizer)
        env.run(["Say hi"])
    env = json_env(ScriptedEnvironment, tiny_model, tokenizer, turn_order="lockstep")
    env.policy = ScriptedPolicy(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said explicitly: no warning
        histories = env.run(["Say hi", "What is 2+3?"])[4]
    assert env.policy.calls == [2, 1] and histories[1].info["tool_calls"][0]["result"] == "5"


def test_an_error_in_the_overridden_generate_is_raised(tiny_model, tokenizer):
    class Failing(TextEnvironment):
        def generate(self, histories):
            raise RuntimeError("the scripted policy broke")

    env = json_env(Failing, tiny_model, tokenizer, turn_order="lockstep")
    with pytest.raises(RuntimeError, match="the scripted policy broke"):
        env.run(["Say hi", "What is 2+3?"])


def test_lockstep_waits_for_every_live_episode_and_not_for_ended_ones():
    served: list[list[int]] = []

    def turns(contexts):
        served.append([int(context[0]) for context in contexts])
        return [None] * len(contexts)

    async def episode(generator, key, rounds):
        for _ in range(rounds):
            await generator.generate(torch.tensor([key]), episode=key)
        generator.end_episode(key)

    async def main():
        generator = LockstepGenerator(turns, episodes=3)
        await asyncio.gather(episode(generator, 2, 1), episode(generator, 0, 3), episode(generator, 1, 2))
        return generator

    generator = asyncio.run(main())
    assert served == [[2, 0, 1], [0, 1], [0]] and generator.batch_sizes == [3, 2, 1]


def test_the_builtin_generate_in_lockstep_gives_the_continuous_episodes(bundled):
    from textenv.tasks import calculator as task

    model, tokenizer = bundled
    queries, answers = task.generate_tasks(4, seed=5, plain=True)
    runs = {}
    for order in ("continuous", "lockstep"):
        env = TextEnvironment(model, tokenizer, {"Calculator": Calculator()}, task.json_exact_match_reward, task.JSON_PROMPT, max_turns=3,
                              generation_kwargs={"do_sample": False, "max_new_tokens": 40}, tool_format="json", turn_order=order)
        runs[order] = env.run(queries, answers=answers)[4]
    for continuous, lockstep in zip(runs["continuous"], runs["lockstep"]):
        if assert_greedy_histories_agree(model, [continuous], [lockstep]):
            assert json.dumps(continuous.info["tool_calls"]) == json.dumps(lockstep.info["tool_calls"])


def test_the_builtin_generate_in_lockstep_keeps_the_sampled_ids_and_answers_the_calls(bundled):
    from textenv.tasks import calculator as task

    model, tokenizer = bundled
    env = TextEnvironment(model, tokenizer, {"Calculator": Calculator()}, task.json_exact_match_reward, task.JSON_PROMPT, max_turns=3,
                          generation_kwargs={"do_sample": True, "top_k": 0, "max_new_tokens": 40}, tool_format="json", turn_order="lockstep")
    returned, real = [], env._engine.generate_batch
    env._engine.generate_batch = lambda *args, **kwargs: returned.extend(real(*args, **kwargs)) or returned[-len(args[0]):]
    torch.manual_seed(1)  # 4 tool calls among the 12 episodes (0 to 5 for seeds 0 to 3)
    queries, answers = task.generate_tasks(12, seed=11, plain=True)
    *_, masks, rewards, histories = env.run(queries, answers=answers)
    segments = [tuple(ids) for history in histories for ids in model_segments(history)]
    assert sorted(segments) == sorted(tuple(completion.token_ids.tolist()) for completion in returned)
    assert sum(mask.sum().item() for mask in masks) == sum(len(completion.token_ids) for completion in returned)
    calls = [call for history in histories for call in history.info["tool_calls"]]
    assert calls and all(call["result"] in history.text for history in histories for call in history.info["tool_calls"])
