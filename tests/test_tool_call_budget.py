"""A model turn has room for a tool call: Gym episodes whose env offers JSON tools get what their longest call
needs (the call as the chat template writes it, plus some text) unless the user chose `max_new_tokens`, and a
turn cut by the budget inside a call is counted and reported once, with the option that fixes it."""

from __future__ import annotations

import json
import logging

import torch

from textenv.chat.budget import JSON_TURN_BUDGET
from textenv.chat.tool_chat import ChatTools
from textenv.engine.engine import Completion
from textenv.gym import GymScheduler
from textenv.gym.play import completion_record
from textenv.gym.trl_environments import tool_schemas
from textenv.options import EpisodeArguments, GymArguments
from textenv.view.episodes import episode_record
from textenv.view.record import step_summary

ROW = {"prompt": [{"role": "user", "content": "Raise the counter."}]}
CUT_CALL = '<tool_call>\n{"name": "increment", "argu'


class CounterEnv:
    def reset(self, **kwargs) -> str:
        self.counter = 0
        return " It is at 0."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: The value to add.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter)


class SearchEnv:
    def reset(self, **kwargs) -> None:
        return None

    def search_the_document_collection(self, query: str, language: str, collection_name: str) -> str:
        """Search documents.

        Args:
            query: What to look for.
            language: The documents' language.
            collection_name: Which collection.
        """
        return "nothing"

    def get_reward(self) -> float:
        return 0.0


def test_the_budget_holds_the_longest_call_as_the_template_writes_it(tokenizer):
    chat = ChatTools(tokenizer)
    counter, search = (tool_schemas([getattr(env(), name)], env.__name__) for env, name in ((CounterEnv, "increment"), (SearchEnv, "search_the_document_collection")))
    call = '<tool_call>\n{"name": "increment", "arguments": {"step": 123456}}\n</tool_call><|im_end|>'
    assert JSON_TURN_BUDGET <= chat.turn_budget(counter)
    assert len(tokenizer(call, add_special_tokens=False).input_ids) < chat.turn_budget(counter)
    assert chat.turn_budget(search) > chat.turn_budget(counter) + 10  # three long arguments need more room


def generated_tokens(episode) -> int:
    return int(episode.history.token_masks.sum())  # loss_scale="all": every generated token, nothing else


def test_episodes_with_json_tools_get_their_budget_unless_the_user_chose_one(tokenizer, tiny_model):
    budget = ChatTools(tokenizer).turn_budget(tool_schemas([CounterEnv().increment], "CounterEnv"))
    turns = {}
    for fit in (True, False):
        scheduler = GymScheduler(tiny_model, tokenizer, environment_factory=CounterEnv, max_turns=1, loss_scale="all", fit_tool_calls=fit,
                                 generation_kwargs={"max_new_tokens": 4, "do_sample": False})
        (episode,) = scheduler.run([ROW])
        assert episode.turn_finish_reasons == ["length"]  # a random tiny model does not stop by itself
        turns[fit] = generated_tokens(episode)
    assert turns == {True: budget, False: 4}
    unset = GymScheduler(tiny_model, tokenizer, environment_factory=CounterEnv, max_turns=1, loss_scale="all", generation_kwargs={"do_sample": False})
    (episode,) = unset.run([ROW])
    assert generated_tokens(episode) == budget  # no max_new_tokens at all: the tools' budget


def cut_policy(texts):
    def policy(contexts, stop_strings):
        return [Completion(torch.tensor([1, 2, 3]), texts[index % len(texts)], "length") for index, _ in enumerate(contexts)]

    return policy


def test_a_turn_cut_inside_a_tool_call_is_counted_and_reported_once(tokenizer, caplog, tmp_path):
    scheduler = GymScheduler(None, tokenizer, policy=cut_policy([CUT_CALL]), environment_factory=CounterEnv, max_turns=1,
                             generation_kwargs={"max_new_tokens": 24})
    with caplog.at_level(logging.WARNING, logger="textenv.gym.play"):
        episodes = scheduler.run([ROW, ROW, ROW])
    assert [episode.tool_calls_cut for episode in episodes] == [1, 1, 1]
    assert scheduler.stats.tool_calls_cut == 3
    warnings = [record.message for record in caplog.records if "inside a tool call" in record.message]
    assert len(warnings) == 1 and "max_new_tokens=24" in warnings[0] and "Raise --max_new_tokens" in warnings[0]
    assert all(completion_record(episode)["tool_calls_cut"] == 1 for episode in episodes)
    fitted = GymScheduler(None, tokenizer, policy=cut_policy([CUT_CALL]), environment_factory=CounterEnv, max_turns=1, fit_tool_calls=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="textenv.gym.play"):
        fitted.run([ROW])
    (warning,) = [record.message for record in caplog.records if "inside a tool call" in record.message]
    assert "fitted to the longest call of the episode's tools" in warning and "Raise --max_new_tokens" not in warning
    records = [episode_record(episode, step=0, phase="train") for episode in episodes]
    assert step_summary(records)["tool_calls_cut"] == 3
    line = json.loads(json.dumps(completion_record(episodes[0])))
    assert step_summary([episode_record(line, step=0, phase="rollout")])["tool_calls_cut"] == 1


def test_a_whole_call_or_plain_text_at_the_budget_is_not_a_cut_call(tokenizer):
    whole = '<tool_call>\n{"name": "increment", "arguments": {"step": 1}}\n</tool_call>'
    scheduler = GymScheduler(None, tokenizer, policy=cut_policy([whole, "The counter is high"]), environment_factory=CounterEnv, max_turns=1)
    episodes = scheduler.run([ROW, ROW])
    assert [episode.tool_calls_cut for episode in episodes] == [0, 0] and scheduler.stats.tool_calls_cut == 0
    assert "tool_calls_cut" not in completion_record(episodes[0])


def test_the_commands_fit_the_budget_unless_max_new_tokens_is_given(tokenizer, tiny_model):
    gym = GymArguments(environment_factory=f"{__file__}:CounterEnv")
    assert gym.scheduler(tiny_model, tokenizer, EpisodeArguments()).fit_tool_calls
    assert not gym.scheduler(tiny_model, tokenizer, EpisodeArguments(max_new_tokens=30)).fit_tool_calls
