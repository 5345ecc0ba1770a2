"""The one episode driver (`textenv.episodes.driver`) and both front ends on it: stop rules, per-episode
failures, `close` always, lazy concurrency; Gym episodes on the generation engine keep their KV across
turns; TextEnvironment's explicit turn orders; the shared tag reaction.

Comparisons (tests/numerics.py has the analysis): episodes decoded greedily by two paths that batch their turns
differently (the continuous engine against lockstep batches) are equal only in exact arithmetic, so
`assert_greedy_histories_agree`: tokens and masks equal up to the first rounding tie of the top two logits,
checked in float64. Everything else here is exact (counts, token ids, stage names).
"""

import asyncio
import time

import pytest
import torch

from textenv.engine.engine import Completion, GenerationEngine
from textenv.episodes.driver import MAX_TURNS, Episode, StopRule, play, play_all
from textenv.gym import GymScheduler
from textenv.tools.tag_calls import TagToolCalls

from numerics import assert_greedy_histories_agree


class CountingGenerator:
    """Replies `token` to every request; records requests and ended episodes."""

    def __init__(self, fail_on_call=None):
        self.requests, self.ended, self.fail_on_call = [], [], fail_on_call

    async def generate(self, context_ids, stop_strings=(), generation_kwargs=None, *, episode=None):
        self.requests.append((episode, len(context_ids)))
        if self.fail_on_call == len(self.requests):
            raise RuntimeError("out of memory (pretend)")
        return Completion(token_ids=torch.tensor([7]), text="x", finish_reason="eos")

    def end_episode(self, episode):
        self.ended.append(episode)


class CounterEpisode(Episode):
    """Grows its context by one token per turn; ends with "enough" after `stop_after` turns."""

    stop_rules = (StopRule("enough", lambda episode: episode.turns >= episode.stop_after), MAX_TURNS)

    def __init__(self, stop_after=3, max_turns=None, max_length=None, fail_in=None):
        super().__init__()
        self.stop_after, self.max_turns, self.max_length, self.fail_in = stop_after, max_turns, max_length, fail_in
        self.tokens = torch.tensor([1, 2, 3])
        self.closed = 0

    async def reset(self):
        if self.fail_in == "reset":
            raise KeyError("no such row field")

    def context(self):
        if self.fail_in == "context" and self.turns == 1:
            raise ValueError("bad context")
        return self.tokens

    async def react(self, completion):
        if self.fail_in == "react":
            raise RuntimeError("env step failed")
        self.tokens = torch.cat([self.tokens, completion.token_ids])

    async def close(self):
        self.closed += 1
        if self.fail_in == "close":
            raise OSError("close failed")


@pytest.mark.parametrize(
    "episode, reason, turns",
    [
        (CounterEpisode(stop_after=3), "enough", 3),
        (CounterEpisode(stop_after=5, max_turns=2), "max_turns", 2),
        (CounterEpisode(stop_after=9, max_length=5), "max_length", 2),  # 3 + 2 tokens: no room for a third turn
        (CounterEpisode(stop_after=0), "enough", 0),
    ],
)
def test_stop_rules_end_the_episode_with_their_name(episode, reason, turns):
    generator = CountingGenerator()
    asyncio.run(play(episode, generator))
    assert (episode.finish_reason, episode.turns, episode.failures) == (reason, turns, [])
    assert episode.closed == 1 and generator.ended == [episode.key]


@pytest.mark.parametrize(
    "fail_in, stage, turn",
    [("reset", "reset", None), ("context", "context_manager", 2), ("react", "step", 1), ("close", "close", None)],
)
def test_a_failure_is_recorded_with_its_stage_and_close_still_runs(fail_in, stage, turn):
    episode = CounterEpisode(stop_after=3, fail_in=fail_in)
    asyncio.run(play(episode, CountingGenerator()))
    assert [(failure.stage, failure.turn) for failure in episode.failures] == [(stage, turn)]
    assert episode.finish_reason == "error" and episode.closed == 1


def test_a_generation_failure_ends_only_its_episode():
    generator = CountingGenerator(fail_on_call=2)
    episodes = [CounterEpisode(stop_after=2) for _ in range(3)]
    done = []
    asyncio.run(play_all([lambda e=e: e for e in episodes], generator, max_concurrency=3, on_done=lambda i, e: done.append(i)))
    failed = [episode for episode in episodes if episode.failures]
    assert len(failed) == 1 and failed[0].failures[0].stage == "generate"
    assert failed[0].failures[0].turn == failed[0].turns + 1  # the turn it was generating
    assert sorted(done) == [0, 1, 2] and all(episode.closed == 1 for episode in episodes)
    assert [episode.finish_reason for episode in episodes if not episode.failures] == ["enough", "enough"]


def test_play_all_creates_episodes_lazily_within_max_concurrency():
    alive, most_alive = set(), [0]

    class Tracked(CounterEpisode):
        async def reset(self):
            alive.add(self.key)
            most_alive[0] = max(most_alive[0], len(alive))
            await asyncio.sleep(0.01)

        async def close(self):
            alive.discard(self.key)

    created = []

    def factories():
        for index in range(7):
            yield lambda index=index: created.append(index) or Tracked(stop_after=1)

    asyncio.run(play_all(factories(), CountingGenerator(), max_concurrency=2))
    assert created == list(range(7)) and most_alive[0] == 2


# ---------------------------------------------------------------- the Gym on the engine
def test_gym_episodes_keep_their_kv_across_turns(tokenizer, tiny_model, monkeypatch):
    """On the engine, an episode's second turn runs only the tokens appended since its first turn (its
    reply's last token, the observation and the next generation prompt), not the whole conversation."""
    from textenv.engine import decoding

    uncached = []
    original = decoding.ContinuousDecoder._new_token_inputs

    def recording(self, contexts, entries):
        for context, entry in zip(contexts, entries):
            uncached.append((len(context), len(context) - (len(entry) if entry is not None else 0)))
        return original(self, contexts, entries)

    monkeypatch.setattr(decoding.ContinuousDecoder, "_new_token_inputs", recording)
    sched = GymScheduler(tiny_model, tokenizer, gym_env="math_env", max_turns=2, loss_scale="default",
                         generation_kwargs={"max_new_tokens": 4, "do_sample": False})
    episodes = sched.run([{"problem": "What is 2+2?", "solution": "5"}, {"problem": "What is 3+4?", "solution": "9"}])
    assert [e.num_turns for e in episodes] == [2, 2] and all(e.error is None for e in episodes)
    assert isinstance(sched._engine, GenerationEngine) and sched.stats.batch_sizes is None
    second_turns = sorted(uncached)[-2:]
    retry = len(tokenizer(sched.renderer.message_text(episodes[0].messages[:3], episodes[0].messages[3]), add_special_tokens=False).input_ids)
    for context_length, new_tokens in second_turns:
        assert new_tokens < retry + 10 < context_length  # the delta, not the conversation
    deadline = time.monotonic() + 10
    while sched._engine._worker is not None and time.monotonic() < deadline:  # ended episodes are released
        time.sleep(0.01)  # by the decoding thread before it stops
    assert not [entry for entry in sched._engine.prefix_cache.entries if entry.owner is not None and entry.owner != "<shared prefix>"]


def test_gym_greedy_tokens_equal_on_engine_and_through_generate(tokenizer, tiny_model):
    """The continuous engine path and batches through an overridden `generate` give the same tokens."""

    class Batched(GymScheduler):
        def generate(self, contexts, stop_strings=()):
            return super().generate(contexts, stop_strings)

    rows = [{"problem": f"What is {a}+{a}?", "solution": "0"} for a in range(4)]
    kwargs = dict(gym_env="math_env", max_turns=3, loss_scale="default", generation_kwargs={"max_new_tokens": 5, "do_sample": False})
    continuous = GymScheduler(tiny_model, tokenizer, **kwargs).run(rows)
    batched_scheduler = Batched(tiny_model, tokenizer, **kwargs)
    batched = batched_scheduler.run(rows)
    assert batched_scheduler.stats.batch_sizes  # it did go through generate
    assert_greedy_histories_agree(tiny_model, [e.history for e in continuous], [e.history for e in batched])


# ---------------------------------------------------------------- TextEnvironment turn orders
def _environment(tiny_model, tokenizer, **kwargs):
    from textenv import TextEnvironment

    return TextEnvironment(tiny_model, tokenizer, {"Calc": lambda q: "4"}, None, "Use <request><Calc>2+2<call>.\n",
                           max_turns=2, generation_kwargs={"max_new_tokens": 6, "do_sample": False}, **kwargs)


def test_turn_orders_give_the_same_episodes(tiny_model, tokenizer):
    continuous = _environment(tiny_model, tokenizer, turn_order="continuous").run(["a", "bb", "ccc"])[4]
    lockstep = _environment(tiny_model, tokenizer, turn_order="lockstep").run(["a", "bb", "ccc"])[4]
    assert_greedy_histories_agree(tiny_model, continuous, lockstep)


def test_an_overridden_generate_runs_in_lockstep_and_says_so(tiny_model, tokenizer):
    from textenv import TextEnvironment

    calls = []

    class Mine(TextEnvironment):
        def generate(self, histories):
            calls.append(len(histories))
            return super().generate(histories)

    env = Mine(tiny_model, tokenizer, {}, None, "", max_turns=1, generation_kwargs={"max_new_tokens": 2})
    with pytest.warns(UserWarning, match="turn_order='lockstep'"):
        env.run(["a", "b"])
    assert calls == [2]
    env = Mine(tiny_model, tokenizer, {}, None, "", max_turns=1, generation_kwargs={"max_new_tokens": 2}, turn_order="continuous")
    with pytest.raises(ValueError, match="turn_order='lockstep'"):
        env.run(["a"])
    with pytest.raises(ValueError, match="turn_order must be"):
        TextEnvironment(tiny_model, tokenizer, {}, turn_order="parallel")


# ---------------------------------------------------------------- the shared tag reaction
def test_text_environment_and_tool_env_answer_calls_with_the_same_rules():
    from textenv.gym.builtin import ToolEnv

    env = ToolEnv({"tools": ["Calculator"]})
    env.answer = "4"
    reaction = TagToolCalls({"Calculator": env.tools["Calculator"]})
    for reply in ("<request><Nope>1<call>", "<request>no tag<call>", "<request><Calculator>2*21<call>"):
        observation, reward, done, _ = asyncio.run(env.step([{"role": "assistant", "content": reply}]))
        assert (observation, reward, done) == (reaction.respond(reply), 0.0, False)
    assert reaction.respond("<request><Nope>1<call>") == "Unknown tool Nope."
    assert reaction.respond("<request>no tag<call>").startswith("Unknown tool call:")
    for reply in ("Result=4<submit>", "I think it is 4", "<request><Calculator>1<call> then <submit>"):
        assert TagToolCalls.ends_episode(reply)
        assert asyncio.run(env.step([{"role": "assistant", "content": reply}]))[2] is True
