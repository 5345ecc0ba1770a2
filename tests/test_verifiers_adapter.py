"""verifiers environments (classic API, verifiers 0.3) run unchanged by `GymScheduler(verifiers_env=...)`:
verifiers' own rollout code and rubric, textenv's engine, tokens and masks.

The equality tests run the same environment twice with the same scripted replies: once through verifiers'
own `Environment.generate` against an OpenAI-compatible stub (verifiers' `OpenAIChatCompletionsClient`
over `httpx.MockTransport`), once through textenv; messages, rewards and metrics must be equal."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap

import pytest

vf = pytest.importorskip("verifiers", reason="the verifiers tests need textenv[verifiers]")

from datasets import Dataset  # noqa: E402

from textenv.gym import GymScheduler, ScriptedPolicy, read_completions  # noqa: E402
from textenv.gym.verifiers_envs import load_verifiers_environment  # noqa: E402
from textenv.gym.verifiers_messages import chat_dicts  # noqa: E402
from tests.verifiers_stub import Chooser, comparable, openai_stub_client, scripted_policy  # noqa: E402

QUESTIONS = [{"question": "What is 2+3?", "answer": "5"}, {"question": "What is 4+4?", "answer": "8"}]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def answer_parser():
    return vf.XMLParser(["answer"], answer_field="answer")


def exact_answer(parser):
    def correct_answer(completion, answer, **kwargs) -> float:
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    return correct_answer


def single_turn_env(**kwargs):
    parser = answer_parser()
    rubric = vf.Rubric(funcs=[exact_answer(parser), parser.get_format_reward_func()], weights=[1.0, 0.2], parser=parser)
    few_shot = [{"role": "user", "content": "What is one plus one?"}, {"role": "assistant", "content": "<answer>2</answer>"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(QUESTIONS), system_prompt="Answer in <answer></answer> tags.", few_shot=few_shot,
                            parser=parser, rubric=rubric, **kwargs)


def tool_env(**kwargs):
    parser = answer_parser()
    return vf.ToolEnv(dataset=Dataset.from_list(QUESTIONS), tools=[add], max_turns=3, parser=parser,
                      rubric=vf.Rubric(funcs=[exact_answer(parser)], parser=parser), **kwargs)


class GuessEnv(vf.MultiTurnEnv):
    """A number-guessing game: the environment answers each guess with higher / lower, and stops on a hit."""

    async def setup_state(self, state):
        state["target"] = int(state["answer"])
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        guess = int(re.findall(r"-?\d+", messages[-1].content or "0")[-1])
        if guess == state["target"]:
            state["solved"] = True
            return [{"role": "user", "content": "Correct!"}]
        return [{"role": "user", "content": "higher" if guess < state["target"] else "lower"}]

    @vf.stop
    async def solved(self, state) -> bool:
        return state.get("solved", False)


def guess_env(group_bonus: bool = True):
    async def solved_reward(state) -> float:
        return 1.0 if state.get("solved") else 0.0

    async def fewest_guesses(states) -> list:  # a group function: the quickest solver of the group gets 1
        best = min(state["guesses"] for state in states)
        return [1.0 if state["guesses"] == best else 0.0 for state in states]

    funcs = [solved_reward, fewest_guesses] if group_bonus else [solved_reward]
    rows = [{"question": "Guess my number (1-10).", "answer": "7"}, {"question": "Guess my number (1-10).", "answer": "3"}]
    return GuessEnv(dataset=Dataset.from_list(rows), max_turns=4, rubric=vf.Rubric(funcs=funcs, weights=[1.0, 0.5][: len(funcs)]))


# ---------------------------------------------------------------- the scripts both sides play
def is_question(text: str) -> bool:
    return text.startswith(("What is 2", "What is 4", "Guess"))


def tool_script(question: str, choice: int, turn: int):
    """A call of `add` first (choice 1 adds one too many), then the answer the tool gave."""
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    if turn == 0:
        return "Let me add.", ("add", {"a": a, "b": b + choice})
    return f"<answer>{a + b + choice}</answer>", None


def answer_script(question: str, choice: int, turn: int):
    a, b = (int(x) for x in re.findall(r"\d+", question)[:2])
    return (f"<answer>{a + b}</answer>" if choice == 0 else f"I think {a + b + 1}"), None


def guess_script(question: str, choice: int, turn: int):
    guesses = [[5, 7, 3, 1], [3, 6, 7, 3]][choice]
    return f"My guess is {guesses[turn]}", None


async def verifiers_own(env, script, generations: int):
    """verifiers' own rollouts and scores of every row, `generations` per row, against the stub endpoint."""
    rows = [row for row in env.get_dataset() for _ in range(generations)]
    client = openai_stub_client(Chooser(script, generations), is_question)
    results = await env.generate(rows, client=client, model="stub", sampling_args={"max_tokens": 64})
    outputs = results["outputs"]
    return sorted(comparable([*output["prompt"], *output["completion"]], [output["reward"], output["metrics"]]) for output in outputs)


def textenv_own(env, tokenizer, script, generations: int):
    policy = scripted_policy(tokenizer, Chooser(script, generations), is_question)
    episodes = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, loss_scale="all").run(env.get_dataset(), num_generations=generations)
    assert not [episode.errors for episode in episodes if episode.errors]
    return sorted(comparable(e.messages, [e.final_reward, e.trajectory_infos[-1]["metrics"]]) for e in episodes)


@pytest.mark.parametrize("make_env, script", [
    (single_turn_env, answer_script),
    (tool_env, tool_script),
    (guess_env, guess_script),
], ids=["single_turn", "tool_env", "multi_turn_group_reward"])
def test_equal_to_verifiers_own_rollout(tokenizer, make_env, script):
    expected = asyncio.run(verifiers_own(make_env(), script, generations=2))
    got = textenv_own(make_env(), tokenizer, script, generations=2)
    assert got == expected
    assert len({reward for _, reward in got}) > 1  # the scripts' choices score differently: the comparison can fail


def test_single_turn_environment_uses_prompt_rubric_and_metrics(tokenizer, tmp_path):
    env = single_turn_env()
    policy = ScriptedPolicy(tokenizer, lambda context: "<answer>5</answer>" if "2+3" in context else "<answer>9</answer>")
    scheduler = GymScheduler(None, tokenizer, policy=policy, verifiers_env=env, loss_scale="all")
    episodes = scheduler.run(env.get_dataset(), completions_path=tmp_path / "completions.jsonl")
    assert [episode.messages[:3] for episode in episodes] == [[
        {"role": "system", "content": "Answer in <answer></answer> tags."},
        {"role": "user", "content": "What is one plus one?"},
        {"role": "assistant", "content": "<answer>2</answer>"},
    ]] * 2
    assert [episode.total_reward for episode in episodes] == pytest.approx([1.2, 0.2])
    metrics = [episode.trajectory_infos[-1]["metrics"] for episode in episodes]
    assert metrics[0]["correct_answer"] == 1.0 and metrics[1]["correct_answer"] == 0.0
    assert all(episode.finish_reason == "done" and not episode.errors for episode in episodes)
    records = read_completions(tmp_path / "completions.jsonl")
    assert [record["final_reward"] for record in records] == pytest.approx([1.2, 0.2])
    assert records[0]["trajectory_infos"][-1]["stop_condition"] == "max_turns_reached"
