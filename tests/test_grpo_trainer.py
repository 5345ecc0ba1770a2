"""GRPOTrainer on real models: what it trains (exact masks, truncation, groups), what it loads (no reference at
beta 0), how it steps (on/off-policy), its checkpoints, and the one training loop with both front ends in groups.
The formulas themselves are checked against TRL 1.16 in tests/test_grpo_formulas_*.py.

Tolerances (tests/numerics.py has the analysis):
- exact: weights a step must not move (no trained token, equal rewards: zero advantages, zero gradients, zero
  Adam steps), gradients that a mask multiplies by an exact 0, the clip fraction of an on-policy step (its ratio
  is exp(0) = 1 exactly), means of small integers, and a resumed trainer's next step (the checkpoint restores the
  weights, the optimizer and the RNG, and the step runs the same kernels on the same mini-batches);
- the KL to a reference equal to the policy: the k3 estimate ``exp(d) - d - 1`` of a log-probability difference
  ``|d| << 1`` cancels to at most a few roundings of 1 (`rounding_tolerance`, 4 roundings: exp as 2, two
  subtractions); d itself is a rounding difference (the reference pass and the training passes group and pad the
  rows differently), and its square is far smaller. The LoRA test runs in float64 (its KL is then within 4
  float64 roundings of 0); the other only checks that the KL is not negative beyond float32 rounding;
- statistics of small reward vectors against their formula (``sqrt(0.5)``, ``0.5 / (sqrt(1/3) + 1e-4)``) within
  `rounding_tolerance` of the float32 operations (a square root, an addition, a division, the expected value's
  conversion) at their size;
- "the better episode becomes more likely", "the objective rises": the same function of the weights before and
  after a step (same kernels, same inputs), so only the step moves it.
"""

from __future__ import annotations

import math

import pytest
import torch

from textenv.grpo import AlgorithmArguments, GRPOConfig, GRPOTrainer
from textenv.grpo.batch import pad_group_batch, response_logprobs
from textenv.gym import GymScheduler, GymSource, read_completions
from textenv.ppo import AutoModelForCausalLMWithValueHead
from textenv.testing import tiny_causal_lm

from numerics import float64_model, rounding_tolerance
from textenv.training import (
    Settings,
    TextEnvironmentSource,
    build_calculator_environment,
    build_policy,
    build_trainer,
    calculator_task_batches,
    load_policy,
    train,
)

VOCAB = 512


def make_trainer(model=None, **config) -> GRPOTrainer:
    options = dict(batch_size=4, mini_batch_size=2, num_generations=2, learning_rate=1e-2, seed=0)
    options.update(config)
    return GRPOTrainer(GRPOConfig(**options), model if model is not None else tiny_causal_lm(vocab_size=VOCAB, seed=0))


def episodes(batch_size=4, seed=0):
    """`batch_size` random episodes: queries of 3-5 tokens, responses of 4-7, rewards 0,1,2 repeating."""
    generator = torch.Generator().manual_seed(seed)
    queries = [torch.randint(0, VOCAB, (3 + index % 3,), generator=generator) for index in range(batch_size)]
    responses = [torch.randint(0, VOCAB, (4 + index % 4,), generator=generator) for index in range(batch_size)]
    scores = [torch.tensor(float(index % 3)) for index in range(batch_size)]
    return queries, responses, scores


def weights(trainer) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])


def response_logprob(model, query, response) -> float:
    with torch.no_grad():
        ids = torch.cat([query, response]).unsqueeze(0)
        logits = model(ids).logits[0, len(query) - 1 : -1]
        return logits.log_softmax(-1).gather(1, response.unsqueeze(1)).sum().item()


# ------------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 6, "num_generations": 4}, "multiple of num_generations"),
        ({"loss_type": "bnpo"}, "loss_type must be one of"),
        ({"scale_rewards": "rank"}, "scale_rewards must be one of"),
        ({"beta": -0.1}, "beta must be >= 0"),
        ({"batch_size": 4, "mini_batch_size": 3, "num_generations": 2}, "multiple of mini_batch_size"),
        ({"batch_size": 8, "mini_batch_size": 2, "gradient_accumulation_steps": 3}, "gradient_accumulation_steps"),
        ({"temperature": 0.0}, "temperature must be > 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**{"batch_size": 4, "mini_batch_size": 2, "num_generations": 2, **options})


def test_trl_defaults_and_boolean_scale_rewards():
    config = GRPOConfig()
    assert (config.num_generations, config.scale_rewards, config.loss_type, config.epsilon, config.beta) == (8, "group", "dapo", 0.2, 0.0)
    assert config.upper_epsilon == 0.2 and GRPOConfig(epsilon_high=0.28).upper_epsilon == 0.28
    assert GRPOConfig(scale_rewards=False).scale_rewards == "none" and GRPOConfig(scale_rewards=True).scale_rewards == "group"
    with pytest.raises(ValueError, match="--algorithm must be one of"):
        AlgorithmArguments(algorithm="reinforce")


def test_a_value_head_model_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="plain causal LM, without a value head: pass model.pretrained_model"):
        make_trainer(AutoModelForCausalLMWithValueHead(tiny_causal_lm(vocab_size=VOCAB)))


def test_step_arguments_are_checked():
    trainer = make_trainer()
    queries, responses, scores = episodes()
    with pytest.raises(ValueError, match=r"config.batch_size \(4\)"):
        trainer.step(queries[:3], responses[:3], scores[:3])
    with pytest.raises(ValueError, match="scores must be finite numbers"):
        trainer.step(queries, responses, [torch.tensor(float("nan"))] + scores[1:])
    with pytest.raises(ValueError, match=r"response_masks\[1\] has shape"):
        trainer.step(queries, responses, scores, [torch.ones(len(r)) for r in responses[:1]] + [torch.ones(1)] * 3)


# ------------------------------------------------------------------------------------------------ what is loaded
def test_beta_zero_loads_no_reference_and_beta_positive_a_frozen_copy():
    assert make_trainer().ref_model is None
    trainer = make_trainer(beta=0.1)
    assert trainer.ref_model is not None and not any(p.requires_grad for p in trainer.ref_model.parameters())
    stats = trainer.step(*episodes())
    # k3 >= 0; the reference equals the policy, so only its float32 cancellation can show (see the module docstring)
    assert stats["objective/kl_coef"] == 0.1 and stats["objective/kl"] >= -rounding_tolerance(4, 1.0) and "time/grpo/reference" in stats
    assert torch.isnan(torch.tensor(make_trainer().step(*episodes())["objective/kl"]))


def test_lora_policy_trains_only_its_adapters_and_uses_them_disabled_as_reference():
    model, _ = load_policy("tiny", value_head=False, lora_rank=4, seed=0)
    model = float64_model(model)  # float64: the KL of the policy to itself is then 0 within float64 rounding
    trainer = make_trainer(model, beta=0.1)
    assert trainer.ref_model is None  # the reference is the model with its adapters disabled
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    stats = trainer.step(*episodes())
    assert abs(stats["objective/kl"]) <= rounding_tolerance(4, 1.0, torch.float64)  # lora_B starts at 0: policy == reference
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, adapters[n]) for n, p in model.named_parameters() if n in adapters)


# ------------------------------------------------------------------------------------------------ what is trained
def test_the_better_episode_of_a_group_becomes_more_likely_and_the_worse_less():
    trainer = make_trainer(batch_size=2, mini_batch_size=2, learning_rate=1e-3)
    query = torch.tensor([5, 6, 7])
    good, bad = torch.tensor([10, 11, 12, 13]), torch.tensor([20, 21, 22, 23])
    before = [response_logprob(trainer.model, query, r) for r in (good, bad)]
    for _ in range(3):
        trainer.step([query, query], [good, bad], [torch.tensor(1.0), torch.tensor(0.0)])
    after = [response_logprob(trainer.model, query, r) for r in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]


def test_masked_tokens_are_not_trained_a_fully_masked_batch_changes_nothing():
    trainer = make_trainer()
    queries, responses, scores = episodes()
    before = weights(trainer)
    stats = trainer.step(queries, responses, scores, [torch.zeros(len(r)) for r in responses])
    assert stats["tokens/trained"] == 0 and torch.equal(weights(trainer), before)
    masks = [torch.tensor([1.0, 0.0] * (len(r) // 2) + [1.0] * (len(r) % 2)) for r in responses]
    stats = trainer.step(queries, responses, scores, masks)
    assert stats["tokens/trained"] == sum(m.sum().item() for m in masks) and not torch.equal(weights(trainer), before)


def test_only_mask_one_tokens_get_a_gradient():
    """The loss's gradient w.r.t. the response logits is zero at every position whose token is masked out."""
    trainer = make_trainer(batch_size=2, mini_batch_size=2)
    query, response = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7])
    mask = torch.tensor([1.0, 0.0, 0.0, 1.0])
    captured = {}

    def keep_logits(module, args, output):
        output.logits.retain_grad()
        captured["logits"] = output.logits

    handle = trainer.model.register_forward_hook(keep_logits)
    trainer.step([query, query], [response, response.flip(0)], [torch.tensor(1.0), torch.tensor(0.0)], [mask, mask])
    handle.remove()
    per_position = captured["logits"].grad.abs().sum(-1)[:, :-1]  # [rows, T]: position t predicts response token t
    assert torch.all(per_position[:, 1:3] == 0) and torch.all(per_position[:, [0, 3]] > 0)


def test_mask_truncated_completions_drops_the_truncated_episodes_tokens():
    queries, responses, scores = episodes()
    truncated = [False, True, False, False]
    kept = make_trainer().step(queries, responses, scores, truncated=truncated)
    masked = make_trainer(mask_truncated_completions=True).step(queries, responses, scores, truncated=truncated)
    assert kept["tokens/trained"] == sum(len(r) for r in responses)
    assert masked["tokens/trained"] == kept["tokens/trained"] - len(responses[1]) and masked["grpo/truncated"] == 1


def test_groups_with_equal_rewards_have_no_advantage_and_change_nothing():
    trainer = make_trainer()
    queries, responses, _ = episodes()
    before = weights(trainer)
    stats = trainer.step(queries, responses, [torch.tensor(v) for v in (1.0, 1.0, 0.0, 0.0)])
    assert stats["grpo/frac_reward_zero_std"] == 1.0 and torch.all(stats["grpo/advantages"] == 0)
    assert torch.equal(weights(trainer), before)


def test_statistics_per_group():
    stats = make_trainer().step(*episodes())  # rewards 0, 1 | 2, 0
    assert stats["grpo/rewards/group_mean"].tolist() == [0.5, 1.0]  # exact arithmetic
    stds = [math.sqrt(0.5), math.sqrt(2.0)]  # of (0, 1) and (2, 0): a correctly rounded float32 square root of 0.5 and 2
    assert stats["grpo/rewards/group_std"].tolist() == pytest.approx(stds, rel=0, abs=rounding_tolerance(2, 1.5))
    expected = [-0.5 / (stds[0] + 1e-4), 0.5 / (stds[0] + 1e-4), 1.0 / (stds[1] + 1e-4), -1.0 / (stds[1] + 1e-4)]
    assert stats["grpo/advantages"].tolist() == pytest.approx(expected, rel=0, abs=rounding_tolerance(5, 1.5))
    assert 0.0 <= stats["grpo/clip_ratio/region_mean"] <= 1.0 and stats["objective/entropy"] > 0


def test_on_policy_skips_the_old_logprob_pass_off_policy_computes_it_and_clips():
    on_policy = make_trainer().step(*episodes())
    assert "time/grpo/old_logprobs" not in on_policy and on_policy["grpo/clip_ratio/region_mean"] == 0.0  # ratio 1
    off_policy = make_trainer(num_iterations=3, gradient_accumulation_steps=1, learning_rate=0.05).step(*episodes())
    assert "time/grpo/old_logprobs" in off_policy and off_policy["grpo/clip_ratio/region_mean"] > 0.0


# ------------------------------------------------------------------------------------------------ checkpoints
def test_checkpoint_round_trip_and_the_other_algorithms_checkpoint_is_refused(tmp_path):
    from textenv.ppo.checkpoint import load_checkpoint, save_checkpoint

    trainer = make_trainer()
    trainer.step(*episodes())
    folder = save_checkpoint(trainer, tmp_path / "checkpoint-1")
    saved = weights(trainer)
    trainer.step(*episodes(seed=1))  # the uninterrupted run's next step, from the RNG state the checkpoint holds
    resumed = make_trainer()
    load_checkpoint(resumed, folder)
    assert resumed.current_step == 1 and torch.equal(weights(resumed), saved)
    resumed.step(*episodes(seed=1))  # the optimizer's moments and the RNG came back too: the same step, bit for bit
    assert torch.equal(weights(resumed), weights(trainer)) and not torch.equal(weights(resumed), saved)
    fresh = make_trainer()
    fresh.step(*episodes(seed=1))
    assert not torch.equal(weights(fresh), weights(trainer))  # without the checkpoint: another step (the check can fail)

    from textenv.ppo import PPOConfig
    from textenv.training.settings import trainer_without_dataset

    ppo = trainer_without_dataset(PPOConfig(batch_size=4, mini_batch_size=2), AutoModelForCausalLMWithValueHead(tiny_causal_lm(vocab_size=VOCAB)), None)
    with pytest.raises(ValueError, match="was saved by a GRPOTrainer"):
        load_checkpoint(ppo, folder)


# ------------------------------------------------------------------------------------------------ the training loop
SETTINGS = Settings(
    model="tiny", ppo_steps=2, batch_size=4, mini_batch_size=2, learning_rate=1e-3, lora_layers=1, max_new_tokens=4,
    max_turns=2, generation_batch_size=4, algorithm="grpo", num_generations=2,
)


def test_settings_build_a_plain_lora_policy_and_a_grpo_trainer():
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    assert isinstance(trainer, GRPOTrainer) and not hasattr(model, "v_head") and hasattr(model, "peft_config")
    assert trainer.config.num_generations == 2 and trainer.config.learning_rate == 1e-3 and trainer.config.max_grad_norm == 1.0


def test_text_environment_episodes_come_in_groups_of_one_task(tokenizer):
    model, tokenizer = build_policy(SETTINGS)
    trainer = build_trainer(model, tokenizer, SETTINGS)
    env = build_calculator_environment(model, tokenizer, SETTINGS)
    logs = train(trainer, TextEnvironmentSource(env, calculator_task_batches(4, seed=0)), 2, progress=False)
    for log in logs:
        texts = log.batch.query_texts
        assert texts[0] == texts[1] and texts[2] == texts[3] and texts[0] != texts[2]
        assert log.batch.response_texts[0] != log.batch.response_texts[1] or log.batch.response_texts[2] != log.batch.response_texts[3]
        assert "grpo/advantages" in log.stats and log.kl != log.kl  # NaN: no reference at beta 0


def test_gym_source_trains_whole_groups_and_replaces_a_group_with_a_failed_episode(tokenizer, tmp_path):
    model, tokenizer = build_policy(SETTINGS)
    scheduler = GymScheduler(model, tokenizer, gym_env="math_env", max_turns=1, generation_kwargs={"max_new_tokens": 4, "do_sample": True})
    rows = [{"problem": "What is 2+2?", "solution": "4"}, {"no_problem": 1}, {"problem": "What is 3+4?", "solution": "7"}]
    log = tmp_path / "c.jsonl"
    batch = GymSource(scheduler, rows, 4, completions_path=log).collect(step=0, num_generations=2)
    problems = [episode.history.text for episode in batch.episodes]
    assert "2+2" in problems[0] and "2+2" in problems[1] and "3+4" in problems[2] and "3+4" in problems[3]
    records = read_completions(log)
    assert len(records) == 6 and sum(r["error"] is not None for r in records) == 2  # the broken row's group


def test_gym_source_refuses_a_batch_that_is_not_whole_groups(tokenizer, tiny_model):
    scheduler = GymScheduler(tiny_model, tokenizer, gym_env="math_env")
    with pytest.raises(ValueError, match="multiple of num_generations"):
        GymSource(scheduler, [{"problem": "1+1", "solution": "2"}], 4).collect(0, num_generations=3)


def test_a_grpo_step_on_the_bundled_model_with_calculator_episodes(bundled):
    """The same path with the real model: TextEnvironment episodes in groups -> GRPOTrainer.step, which changes
    the policy's log-probability of its own episodes in the direction of their advantages."""
    import copy

    base, tokenizer = bundled
    model = copy.deepcopy(base)
    settings = Settings(batch_size=4, mini_batch_size=2, max_turns=2, max_new_tokens=16, algorithm="grpo", num_generations=4, learning_rate=1e-5)
    trainer = GRPOTrainer(GRPOConfig(batch_size=4, mini_batch_size=2, num_generations=4, learning_rate=1e-5), model, tokenizer=tokenizer)
    env = build_calculator_environment(model, tokenizer, settings)
    torch.manual_seed(1)
    batch = TextEnvironmentSource(env, calculator_task_batches(4, seed=3)).collect(0, num_generations=4)
    scores = [torch.tensor(float(i % 2)) for i in range(4)]  # a fixed 0/1 reward: two above and two below the mean
    masks = batch.masks
    assert any(m.min() == 0 for m in masks)  # the calculator's tokens are masked out
    group_batch = pad_group_batch(batch.queries, batch.responses, masks, tokenizer.pad_token_id, "cpu")

    def objective() -> float:  # what the step ascends: sum over episodes of advantage x trained log-probability
        with torch.no_grad():
            logprobs, _ = response_logprobs(trainer.model, group_batch)
        return sum(sign * (logprobs[row] * group_batch.loss_mask[row]).sum().item() for row, sign in enumerate((-1, 1, -1, 1)))

    before = objective()
    stats = trainer.step(batch.queries, batch.responses, scores, masks)
    assert stats["tokens/trained"] == sum(m.sum().item() for m in masks)
    advantage = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # rewards 0, 1, 0, 1: mean 0.5, unbiased std sqrt(1/3)
    assert stats["grpo/advantages"].tolist() == pytest.approx([-advantage, advantage, -advantage, advantage], rel=0,
                                                              abs=rounding_tolerance(8, 1.0))
    assert objective() > before
