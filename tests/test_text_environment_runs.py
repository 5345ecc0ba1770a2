"""TextEnvironment: tools of every kind (async, smolagents-style, failing, slow), bad input, and runs on a tiny
random model and on the real bundled model.

Comparisons (tests/numerics.py has the analysis): greedy generations of two paths that batch differently (a
batch against one row at a time, episodes at their own pace against lockstep turns) are equal only in exact
arithmetic, so `assert_greedy_histories_agree`: equal up to the first rounding tie of the top two logits (checked
in float64); what follows from the tokens (texts, rewards, tool calls, truncation) is compared where the episodes
are identical. The bundled model's calculator episodes are claims about one greedy path (the tool calls, the
rewards): `assert_greedy_determined` checks that every greedy token leads by more than rounding, so that path is
the same on any machine. Everything else is exact: token ids, masks, spans and texts of scripted turns.
"""

import asyncio

import pytest
import torch
from transformers import AutoTokenizer

from textenv import TextEnvironment, TextHistory
from textenv.models import bundled_model_path
from textenv.tools.base import TOOL_ERROR_PREFIX

from numerics import assert_greedy_determined, assert_greedy_histories_agree
from text_environment_helpers import make_env


# ---------------------------------------------------------------- tools


class AsyncTool:
    async def __call__(self, query):
        await asyncio.sleep(0)
        return query.upper()


class SmolStyleTool:
    name = "shout"

    def forward(self, query):
        return query + "!"


@pytest.mark.parametrize(
    "tools, call, expected",
    [
        ({"t": lambda q: q[::-1]}, "<request><t>abc<call>", "cba"),
        ([AsyncTool()], "<request><AsyncTool>abc<call>", "ABC"),
        ([SmolStyleTool()], "<request><shout>hey<call>", "hey!"),
        ({"t": lambda q: 1 / 0}, "<request><t>x<call>", TOOL_ERROR_PREFIX + "division by zero"),
        ({"t": lambda q: 42}, "<request><t>x<call>", "42"),
        ({"t": lambda q: None}, "<request><t>x<call>", "None"),
    ],
)
def test_tool_kinds_and_failures(tiny_model, tokenizer, tools, call, expected):
    env = make_env(tiny_model, tokenizer, tools=tools)
    history = env.step(TextHistory(call, torch.tensor([101]), system=False))
    assert history.last_text_segment == expected + "<response>"


def test_async_tool_inside_running_event_loop(tiny_model, tokenizer):
    env = make_env(tiny_model, tokenizer, tools=[AsyncTool()])

    async def inside_loop():
        return env.step(TextHistory("<request><AsyncTool>abc<call>", torch.tensor([101]), system=False))

    assert asyncio.run(inside_loop()).last_text_segment == "ABC<response>"


def test_tool_timeout(tiny_model, tokenizer):
    import time

    env = make_env(tiny_model, tokenizer, tools={"slow": lambda q: time.sleep(5) or "late"}, tool_timeout=0.2)
    started = time.monotonic()
    history = env.step(TextHistory("<request><slow>x<call>", torch.tensor([101]), system=False))
    assert time.monotonic() - started < 2
    assert history.last_text_segment == TOOL_ERROR_PREFIX + "timed out after 0.2 s<response>"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "queries, error, message",
    [
        ("a single string", TypeError, "queries must be a list of strings"),
        ([], ValueError, "queries is empty"),
        (["ok", 3], TypeError, r"queries\[1\] must be a string"),
    ],
)
def test_run_rejects_bad_queries(tiny_model, tokenizer, queries, error, message):
    with pytest.raises(error, match=message):
        make_env(tiny_model, tokenizer).run(queries)


def test_tokenizer_without_pad_token_gets_eos_with_warning(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(str(bundled_model_path()))
    tokenizer.pad_token = None
    with pytest.warns(UserWarning, match="no pad token"):
        make_env(tiny_model, tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token


# ---------------------------------------------------------------- real models


def _assert_consistent(history):
    assert len(history.tokens) == len(history.token_masks) == history.token_spans[-1][1]
    assert history.text_spans[0][0] == 0 and history.text_spans[-1][1] == len(history.text)
    for (_, end), (start, _) in zip(history.token_spans, history.token_spans[1:]):
        assert end == start
    for (_, end), (start, _) in zip(history.text_spans, history.text_spans[1:]):
        assert end == start
    query, response, mask = history.split_query_response_tokens()
    assert torch.equal(torch.cat([query, response]), history.tokens)
    for (start, end), system in zip(history.token_spans[1:], history.system_spans[1:]):
        assert history.token_masks[start:end].tolist() == [0 if system else 1] * (end - start)


def test_run_on_tiny_model_keeps_spans_and_masks_consistent(tiny_model, tokenizer):
    env = make_env(tiny_model, tokenizer, max_turns=3, generation_kwargs={"do_sample": True, "max_new_tokens": 6})
    torch.manual_seed(0)
    _, responses, masks, _, histories = env.run(["a", "bb", "ccc", "dddd"])
    for history, response, mask in zip(histories, responses, masks):
        assert history.completed
        assert len(response) == len(mask)
        _assert_consistent(history)


def test_run_on_bundled_model_with_calculator(bundled):
    from textenv.tasks import calculator as task

    model, tokenizer = bundled
    calls = []

    def calculator(expression):
        calls.append(expression)
        a, _, b = expression.partition("+")
        return str(int(a) + int(b))

    env = TextEnvironment(
        model, tokenizer, {"Calculator": calculator}, task.exact_match_reward, task.PROMPT,
        max_turns=3, generation_kwargs={"do_sample": False, "max_new_tokens": 24},
    )
    tasks = [task.format_query("What is 7+21?"), task.format_query("What is 30+12?")]
    queries, responses, masks, rewards, histories = env.run(tasks, answers=[28, 42])
    for history in histories:
        _assert_consistent(history)
        assert history.completed and not history.truncated
    # Every greedy token leads its runner-up by far more than rounding (>= 60x on this model): the episodes,
    # and so the calls and rewards below, are the same on every kernel level and thread count.
    assert_greedy_determined(model, histories)
    assert calls == ["7+21", "30+12"]
    # Greedy decoding on the 2-shot prompt calls the tool and submits the right results.
    assert rewards == [1.0, 1.0], [h.text[len(task.PROMPT):] for h in histories]
    # Batched generation gives the same episodes as one task at a time.
    for query, answer, history in zip(tasks, [28, 42], histories):
        single = env.run([query], answers=[answer])[4][0]
        assert_greedy_histories_agree(model, [single], [history])


class LockstepEnvironment(TextEnvironment):
    """Overriding `generate` (as the legacy tests' mocks do) makes `run` take every turn in lockstep."""

    def generate(self, histories):
        self.lockstep_calls = getattr(self, "lockstep_calls", 0) + 1
        return super().generate(histories)


def test_episodes_at_own_pace_equal_lockstep_turns_on_bundled_model(bundled):
    from textenv.tasks import calculator as task
    from textenv.tools import Calculator

    model, tokenizer = bundled
    questions, answers = task.generate_tasks(6, seed=3)
    results = {}
    for name, cls in (("own pace", TextEnvironment), ("lockstep", LockstepEnvironment)):
        calls = []

        def calculator(expression, calls=calls):
            calls.append(expression)
            return Calculator()(expression)

        env = cls(model, tokenizer, {task.TOOL_NAME: calculator}, task.exact_match_reward, task.PROMPT,
                  max_turns=3, generation_kwargs={"do_sample": False, "max_new_tokens": 24})
        output = env.run([task.format_query(q) for q in questions], answers=answers)
        results[name] = (output, sorted(calls), getattr(env, "lockstep_calls", 0))
    (own, own_calls, own_generate), (lockstep, lockstep_calls, lockstep_generate) = results["own pace"], results["lockstep"]
    assert own_generate == 0 and lockstep_generate >= 2
    assert len(own_calls) >= 2  # episodes with a tool turn and without
    for own_history in own[4]:
        _assert_consistent(own_history)
    if assert_greedy_histories_agree(model, own[4], lockstep[4]):  # then what follows from the tokens agrees too
        assert own_calls == lockstep_calls and own[3] == lockstep[3]
        for own_history, lockstep_history in zip(own[4], lockstep[4]):
            assert own_history.text == lockstep_history.text and own_history.truncated == lockstep_history.truncated


def test_max_turns_counts_per_episode_at_own_pace(tiny_model, tokenizer):
    env = make_env(tiny_model, tokenizer, max_turns=2, generation_kwargs={"do_sample": False, "max_new_tokens": 4})
    env.task_end_check = lambda history, model_turn=True: (False, False)  # never ends by itself
    _, _, _, _, histories = env.run(["a", "bb", "ccc"])
    for history in histories:
        assert history.completed and history.truncated
        assert sum(not system for system in history.system_spans) == 2  # two model turns each
