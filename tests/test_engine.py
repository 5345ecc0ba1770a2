"""The generation engine's own decoding loop against transformers' `generate`: same greedy tokens, batched
== one by one, cached prefixes (previous turn, shared prompt) == no cache, per-row stops, EOS, budgets,
and the fallback to `generate` for settings the loop does not implement.

Comparisons (tests/numerics.py has the analysis):
- greedy tokens of two paths that differ in reduction order (the loop against `generate`, a batch against
  single rows, a cached prefix against a full pass, rows leaving a batch at a stop or EOS, episodes at their own
  pace against lockstep batches) are equal only in exact arithmetic: argmax flips where the top two logits are
  within rounding. They go through `assert_greedy_agree` / `assert_greedy_continuations_agree`: equal up to the
  first place where the two paths part, and there both picks must be within `reduction_tolerance` (of
  `logit_terms`) of the largest logit of a float64 forward pass: a tie. A stale cache or a wrong position picks a
  token far below it. What depends on the later tokens (texts, finish reasons, which episode finished first) is
  compared only where the tokens were identical;
- exact: the same path run twice (seeded sampling), token ids, cache bookkeeping; a token forbidden by
  ``min_new_tokens`` (its logit is -inf).
"""

import pytest
import torch

import textenv.engine.engine as engine_module
from textenv.engine import GenerationEngine as RolloutEngine
from textenv.engine.fast_path import DecodingPath, decoding_path
from textenv.engine.prefix_cache import PrefixCache, common_prefix_length
from textenv.engine.sampling import SamplingSettings

from numerics import assert_greedy_agree, assert_greedy_continuations_agree

PROMPT = "You are a calculator. Answer with <request><Calc>expression<call> and end with <submit>.\n\n"
QUERIES = ["What is 1+1?", "What is 12*7, please?", "Compute 3-5.", "And 100/4?"]


def contexts_for(tokenizer, queries=QUERIES, prompt=PROMPT):
    return [tokenizer(prompt + query, return_tensors="pt").input_ids[0] for query in queries]


def hf_greedy(model, tokenizer, context, max_new_tokens):
    """transformers' greedy continuation of one unpadded context (no stop strings, no EOS)."""
    with torch.no_grad():
        output = model.generate(
            context.unsqueeze(0), attention_mask=torch.ones(1, len(context), dtype=torch.long),
            do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=-1, pad_token_id=tokenizer.pad_token_id,
        )
    return output[0, len(context):].tolist()


def greedy_kwargs(max_new_tokens):
    return {"do_sample": False, "max_new_tokens": max_new_tokens, "eos_token_id": -1}


def ids(completions):
    return [completion.token_ids.tolist() for completion in completions]


def force_generate(monkeypatch):
    monkeypatch.setattr(engine_module, "decoding_path", lambda model: DecodingPath(fast=False, reason="forced by the test"))


@pytest.fixture()
def no_fast_path(monkeypatch):
    force_generate(monkeypatch)


def test_fast_path_is_used_for_llama(tiny_model):
    assert decoding_path(tiny_model).fast
    assert SamplingSettings.from_kwargs(tiny_model.generation_config, greedy_kwargs(8), 32) is not None


def test_greedy_matches_hf_generate_tiny(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(12))
    got = ids(engine.generate_batch(contexts, stop_at_eos=False))
    assert_greedy_continuations_agree(tiny_model, contexts, got, [hf_greedy(tiny_model, tokenizer, c, 12) for c in contexts])


def test_greedy_matches_hf_generate_bundled(bundled):
    model, tokenizer = bundled
    contexts = contexts_for(tokenizer)[:3]
    engine = RolloutEngine(model, tokenizer, greedy_kwargs(10))
    got = ids(engine.generate_batch(contexts, stop_at_eos=False))
    assert_greedy_continuations_agree(model, contexts, got, [hf_greedy(model, tokenizer, c, 10) for c in contexts])


def test_fast_path_equals_generate_fallback_with_stops(tiny_model, tokenizer, monkeypatch):
    contexts = contexts_for(tokenizer)
    kwargs = greedy_kwargs(16)
    fast = RolloutEngine(tiny_model, tokenizer, kwargs).generate_batch(contexts, stop_strings=["a", "e"], stop_at_eos=False)
    force_generate(monkeypatch)
    slow = RolloutEngine(tiny_model, tokenizer, kwargs).generate_batch(contexts, stop_strings=["a", "e"], stop_at_eos=False)
    for context, one, other in zip(contexts, fast, slow):
        if assert_greedy_continuations_agree(tiny_model, [context], [one.token_ids], [other.token_ids]):
            assert (one.finish_reason, one.text) == (other.finish_reason, other.text)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 16])
def test_batched_equals_one_by_one(tiny_model, tokenizer, batch_size):
    contexts = contexts_for(tokenizer)
    one_by_one = [ids(RolloutEngine(tiny_model, tokenizer, greedy_kwargs(10)).generate_batch([c], stop_at_eos=False))[0] for c in contexts]
    batched = ids(RolloutEngine(tiny_model, tokenizer, greedy_kwargs(10)).generate_batch(contexts, batch_size=batch_size, stop_at_eos=False))
    assert_greedy_continuations_agree(tiny_model, contexts, batched, one_by_one)


def test_next_turn_reuses_the_cache_and_matches_no_cache(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    cached = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(8))
    uncached = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(8), reuse_cache=False)
    first = cached.generate_batch(contexts, stop_at_eos=False)
    assert_greedy_continuations_agree(tiny_model, contexts, ids(first), ids(uncached.generate_batch(contexts, stop_at_eos=False)))
    tool = tokenizer("42<response>", add_special_tokens=False, return_tensors="pt").input_ids[0]
    second_contexts = [torch.cat([c, done.token_ids, tool]) for c, done in zip(contexts, first)]
    for context in second_contexts:  # every episode's previous turn is cached
        assert len(cached.prefix_cache.longest_prefix(context)) == len(context) - len(tool) - 1
    second = ids(cached.generate_batch(second_contexts, stop_at_eos=False))
    assert_greedy_continuations_agree(tiny_model, second_contexts, second, ids(uncached.generate_batch(second_contexts, stop_at_eos=False)))
    assert not uncached.prefix_cache.entries


def test_shared_prompt_prefix_is_computed_once(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4))
    engine.generate_batch(contexts, stop_at_eos=False)
    shared = [entry for entry in engine.prefix_cache.entries if entry.shared]
    assert len(shared) == 1
    assert len(shared[0]) == common_prefix_length(contexts)


def test_cache_is_dropped_when_weights_change(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(6))
    engine.generate_batch(contexts, stop_at_eos=False)
    assert engine.prefix_cache.entries
    with torch.no_grad():
        tiny_model.model.layers[0].mlp.down_proj.weight.mul_(3.0)  # an in-place update, like an optimizer step
    fresh = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(6), reuse_cache=False)
    extended = [torch.cat([c, torch.tensor([13, 14])]) for c in contexts]
    got = ids(engine.generate_batch(extended, stop_at_eos=False))
    assert_greedy_continuations_agree(tiny_model, extended, got, ids(fresh.generate_batch(extended, stop_at_eos=False)))


def test_cache_is_dropped_after_a_fused_optimizer_step(tokenizer):
    # A fused optimizer (the PPO trainer's Adam) updates the weights without bumping their version counters;
    # a rollout after it must still not reuse KV computed with the old weights.
    from textenv.testing import tiny_causal_lm

    model = tiny_causal_lm(seed=3).eval()
    contexts = contexts_for(tokenizer)
    engine = RolloutEngine(model, tokenizer, greedy_kwargs(6))
    engine.generate_batch(contexts, stop_at_eos=False)
    assert engine.prefix_cache.entries
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5, fused=True)
    model(contexts[0][None]).logits.sum().backward()
    optimizer.step()
    fresh = RolloutEngine(model, tokenizer, greedy_kwargs(6), reuse_cache=False)
    extended = [torch.cat([c, torch.tensor([13, 14])]) for c in contexts]
    got = ids(engine.generate_batch(extended, stop_at_eos=False))
    assert_greedy_continuations_agree(model, extended, got, ids(fresh.generate_batch(extended, stop_at_eos=False)))


def test_stop_strings_per_row(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    free = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(24)).generate_batch(contexts, stop_at_eos=False)
    stop = free[0].text[3:6]  # a string that row 0 produces; other rows stop on it or run on
    completions = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(24)).generate_batch(contexts, stop_strings=[stop], stop_at_eos=False)
    same = []  # rows leave the batch at their stop: the others decode in smaller batches (another reduction order)
    for context, full, completion in zip(contexts, free, completions):
        if completion.finish_reason == "stop":
            assert stop in completion.text
            shorter = tokenizer.decode(completion.token_ids[:-1], skip_special_tokens=False)
            assert stop not in shorter  # cut right at the token that completed the stop string
        else:
            assert completion.finish_reason == "length" and stop not in completion.text
        prefix = full.token_ids[: len(completion.token_ids)]
        same.append(assert_greedy_continuations_agree(tiny_model, [context], [prefix], [completion.token_ids]))
    if same[0]:  # row 0 wrote the stop string in the free run
        assert completions[0].finish_reason == "stop"


def test_eos_ends_a_row(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    free = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(6)).generate_batch(contexts, stop_at_eos=False)
    # Declare one of row 0's greedy tokens the EOS id: the row ends at its first occurrence.
    eos = free[0].token_ids[2].item()
    end = free[0].token_ids.tolist().index(eos) + 1
    completions = RolloutEngine(tiny_model, tokenizer, {**greedy_kwargs(6), "eos_token_id": eos}).generate_batch(contexts, stop_at_eos=False)
    if assert_greedy_continuations_agree(tiny_model, contexts[:1], [completions[0].token_ids], [free[0].token_ids[:end]]):
        assert completions[0].finish_reason == "eos"
    for context, full, completion in zip(contexts[1:], free[1:], completions[1:]):  # rows leave the batch at EOS
        expected = full.token_ids.tolist()
        if eos in expected:
            expected = expected[: expected.index(eos) + 1]
        assert_greedy_continuations_agree(tiny_model, [context], [completion.token_ids], [expected])


def test_max_new_tokens_and_min_new_tokens(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    completions = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(5)).generate_batch(contexts, stop_at_eos=False)
    assert all(len(c.token_ids) == 5 and c.finish_reason == "length" for c in completions)
    first = completions[0].token_ids[0].item()
    blocked = RolloutEngine(tiny_model, tokenizer, {**greedy_kwargs(5), "eos_token_id": first, "min_new_tokens": 2})
    row = blocked.generate_batch(contexts[:1], stop_at_eos=False)[0]
    assert row.token_ids[0].item() != first  # EOS is forbidden before min_new_tokens


def test_sampling_is_seeded_and_valid(tiny_model, tokenizer):
    contexts = contexts_for(tokenizer)
    kwargs = {"do_sample": True, "top_k": 5, "top_p": 0.9, "temperature": 0.7, "max_new_tokens": 6}
    torch.manual_seed(0)
    first = ids(RolloutEngine(tiny_model, tokenizer, kwargs).generate_batch(contexts, stop_at_eos=False))
    torch.manual_seed(0)
    second = ids(RolloutEngine(tiny_model, tokenizer, kwargs).generate_batch(contexts, stop_at_eos=False))
    assert first == second and all(len(row) == 6 for row in first)


def test_unsupported_kwargs_fall_back_to_generate(tiny_model, tokenizer):
    assert SamplingSettings.from_kwargs(tiny_model.generation_config, {"num_beams": 2}, 8) is None
    assert SamplingSettings.from_kwargs(tiny_model.generation_config, {"repetition_penalty": 1.3}, 8) is None
    assert SamplingSettings.from_kwargs(tiny_model.generation_config, {"min_length": -1, "top_k": 0.0}, 8) is not None
    contexts = contexts_for(tokenizer)[:2]
    completions = RolloutEngine(tiny_model, tokenizer, {"max_new_tokens": 4, "repetition_penalty": 1.3}).generate_batch(contexts)
    assert all(1 <= len(c.token_ids) <= 4 for c in completions)


def test_prefix_cache_ages_out_unused_entries():
    cache = PrefixCache(max_idle_calls=1)
    from textenv.engine.prefix_cache import CacheEntry

    entry = CacheEntry(token_ids=torch.tensor([1, 2, 3]), layers=[])
    cache.add(entry)
    cache.end_call()
    assert cache.longest_prefix(torch.tensor([1, 2, 3, 4])) is entry
    cache.end_call()
    assert cache.entries  # survives one call in which nobody used it
    cache.end_call()
    assert not cache.entries
    assert cache.longest_prefix(torch.tensor([1, 2])) is None


def test_a_fast_episode_goes_on_while_others_generate(bundled):
    """Episode 0 stops after a few tokens (a stop string taken from its own greedy output); its second
    turn starts while episode 1 is still on its first. The turns equal `generate_batch` called turn by turn."""
    import asyncio

    from textenv.tasks import calculator as task

    model, tokenizer = bundled  # real text, so a stop string can single out one row
    contexts = contexts_for(tokenizer, [task.format_query("What is 7+21?"), task.format_query("What is 30+12?")], task.PROMPT)
    first_turn = RolloutEngine(model, tokenizer, greedy_kwargs(12)).generate_batch(contexts)
    prefixes = (tokenizer.decode(first_turn[0].token_ids[:k]) for k in range(1, 12))
    stop = next(text for text in prefixes if text not in first_turn[1].text)  # where row 0 departs from row 1

    engine = RolloutEngine(model, tokenizer, greedy_kwargs(12))
    events = []

    async def episode(index):
        context = contexts[index]
        for _ in range(2):
            completion = await engine.generate(context, [stop], episode=index)
            events.append((index, completion.token_ids.tolist()))
            context = torch.cat([context, completion.token_ids, torch.tensor([13, 14])])
        engine.end_episode(index)

    async def both():
        await asyncio.gather(episode(0), episode(1))

    asyncio.run(both())

    lockstep = RolloutEngine(model, tokenizer, greedy_kwargs(12))
    expected_first = lockstep.generate_batch(contexts, stop_strings=[stop])
    followers = [torch.cat([c, done.token_ids, torch.tensor([13, 14])]) for c, done in zip(contexts, expected_first)]
    expected_second = lockstep.generate_batch(followers, stop_strings=[stop])
    by_episode = {0: [], 1: []}
    for index, token_ids in events:
        by_episode[index].append(token_ids)
    same = True
    for index in (0, 1):  # the whole episode: first turn, the appended [13, 14], second turn
        own = torch.cat([contexts[index], torch.tensor(by_episode[index][0]), torch.tensor([13, 14]), torch.tensor(by_episode[index][1])])
        batched = torch.cat([followers[index], expected_second[index].token_ids])
        chosen = [torch.cat([torch.zeros(len(contexts[index])), torch.ones(len(turn)), torch.zeros(2), torch.ones(len(second))])
                  for turn, second in ((by_episode[index][0], by_episode[index][1]), (expected_first[index].token_ids, expected_second[index].token_ids))]
        same &= assert_greedy_agree(model, own, batched, start=len(contexts[index]), what=f"episode {index}", masks=chosen)
    if same:  # the stop string singled out row 0 in the batch: so it does at its own pace
        assert [index for index, _ in events] == [0, 0, 1, 1]  # episode 0 finished both turns first


def test_requests_without_fast_path_are_served_by_hf_generate(tiny_model, tokenizer, no_fast_path):
    """Settings the engine's loop cannot decode go to `generate`, batched, with the same greedy tokens."""
    import asyncio

    contexts = contexts_for(tokenizer, QUERIES[:3])
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4))

    async def all_turns():
        return await asyncio.gather(*(engine.generate(context, episode=index) for index, context in enumerate(contexts)))

    completions = asyncio.run(all_turns())
    assert_greedy_continuations_agree(tiny_model, contexts, ids(completions), [hf_greedy(tiny_model, tokenizer, c, 4) for c in contexts])
    assert not engine.prefix_cache.entries  # generate keeps no KV


def test_an_episode_kv_is_kept_for_its_next_turn_and_dropped_when_it_ends(tiny_model, tokenizer):
    """A turn of an episode leaves its KV cached (the next turn runs only the new tokens); the entry goes
    when the episode ends, and a later turn from scratch gives the same tokens."""
    import asyncio

    contexts = contexts_for(tokenizer)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4))
    fresh = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4), reuse_cache=False)

    async def two_turns(index):
        first = await engine.generate(contexts[index], episode=index)
        stored = [e for e in engine.prefix_cache.entries if e.owner == index]
        extended = torch.cat([contexts[index], first.token_ids, torch.tensor([13])])
        second = await engine.generate(extended, episode=index)
        engine.end_episode(index)
        return stored, extended, second

    async def everything():
        return await asyncio.gather(*(two_turns(index) for index in range(len(contexts))))

    outcomes = asyncio.run(everything())
    for index, (stored, extended, second) in enumerate(outcomes):
        assert len(stored) == 1 and len(stored[0]) == len(contexts[index]) + 3  # context + 3 of 4 new tokens
        assert_greedy_continuations_agree(tiny_model, [extended], ids([second]), ids(fresh.generate_batch([extended], stop_at_eos=False)))
    engine.generate_batch(contexts[:1])  # the next call releases the ended episodes' entries
    assert not any(entry.owner in range(len(contexts)) for entry in engine.prefix_cache.entries)


def test_a_model_error_fails_the_rows_it_hit_and_the_engine_goes_on(tiny_model, tokenizer, monkeypatch):
    """An exception in a decoding step is raised in every episode whose row was in the batch; the engine
    drops its cache and serves the next requests normally."""
    import asyncio

    from textenv.engine import decoding
    from textenv.engine.engine import Completion

    original, forwards = decoding.ContinuousDecoder._forward, []

    def failing_second_forward(self, *args, **kwargs):
        forwards.append(1)
        if len(forwards) == 2:
            raise RuntimeError("out of memory (pretend)")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(decoding.ContinuousDecoder, "_forward", failing_second_forward)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(3))
    contexts = contexts_for(tokenizer)

    async def all_turns():
        return await asyncio.gather(*(engine.generate(c, episode=i) for i, c in enumerate(contexts)), return_exceptions=True)

    failed = asyncio.run(all_turns())
    assert [type(outcome) for outcome in failed] == [RuntimeError] * len(contexts)
    assert not engine.prefix_cache.entries
    served = asyncio.run(all_turns())
    assert all(isinstance(outcome, Completion) for outcome in served)
    assert_greedy_continuations_agree(tiny_model, contexts, ids(served), ids(RolloutEngine(tiny_model, tokenizer, greedy_kwargs(3)).generate_batch(contexts)))


def test_run_hosted_decodes_in_the_calling_thread(tiny_model, tokenizer, monkeypatch):
    """`run_hosted` plays the episodes' event loop in a helper thread and decodes in the caller's thread
    (the thread whose OpenMP team torch set up), with the same tokens as a batch call."""
    import asyncio
    import threading

    from textenv.engine import decoding

    decoding_threads = set()
    original = decoding.ContinuousDecoder.step

    def recording_step(self):
        decoding_threads.add(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(decoding.ContinuousDecoder, "step", recording_step)
    engine = RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4))
    contexts = contexts_for(tokenizer)

    async def episodes():
        loop_thread = threading.current_thread().name
        completions = await asyncio.gather(*(engine.generate(c, episode=i) for i, c in enumerate(contexts)))
        return loop_thread, completions

    loop_thread, completions = engine.run_hosted(episodes())
    assert decoding_threads == {threading.current_thread().name} != {loop_thread}
    assert engine._worker is None
    assert_greedy_continuations_agree(tiny_model, contexts, ids(completions), ids(RolloutEngine(tiny_model, tokenizer, greedy_kwargs(4)).generate_batch(contexts)))
