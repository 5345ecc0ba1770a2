"""`PPOTrainer.step` calls legacy TRL's overridable methods, so subclasses that override them change what `step`
does; the windowed fast path gives the results of the legacy forward passes; everything works with the bundled
SmolLM2 tokenizer (special ids 0-16, EOS 2) as well as GPT-2's.

Tolerances (tests/numerics.py has the analysis):
- float64 with SGD (`assert_stats_close`, `float64_sgd_tolerance`): the windowed fast path against the legacy
  full-logit passes. The two compute the same losses with other reductions (the log-softmax of the kept
  positions only, chunked, and a packed layout against full padded logits), so they agree only in exact
  arithmetic; Adam would turn a rounding-level gradient difference on a near-zero gradient into a step
  difference of up to 2 lr, hence SGD, in float64;
- exact: the log-probabilities `batched_forward_pass` returns against `logprobs_from_logits` of the logits it
  returns (the same function on the same tensor), weights a zero loss must not move, integer masks and ids,
  a mean of equal scores (1.0 exactly in float32), and the KL of a policy against an identical reference on
  its first step (the same weights through the same kernels on the same inputs: exactly 0).
"""

import copy
import functools
import warnings
from unittest import mock

import numpy as np
import pytest
import torch

from textenv import TextEnvironment
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer, core
from textenv.testing import tiny_causal_lm

from numerics import assert_stats_close, float64_model, float64_sgd_tolerance, forward_terms, sgd

PROMPT = torch.arange(100, 120)
QUERIES = [torch.cat([PROMPT, torch.tensor([7, 8])]), torch.arange(140, 163), torch.cat([PROMPT, torch.tensor([12])])]
RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]
COMPARED_STATS = ("ppo/loss/total", "ppo/loss/value", "ppo/loss/policy", "objective/kl", "objective/entropy",
                  "ppo/val/vpred", "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/policy/clipfrac",
                  "ppo/returns/mean", "ppo/returns/var", "ppo/val/error", "ppo/mean_non_score_reward")


def make_model():
    base = tiny_causal_lm(seed=0)
    torch.manual_seed(0)
    return AutoModelForCausalLMWithValueHead(base)


def make_trainer(trainer_class=PPOTrainer, tokenizer=None, float64=False, **config_kwargs):
    """A trainer of the tiny model; ``float64``: of a float64 copy, with SGD at the learning rate."""
    config_kwargs = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 2, "learning_rate": 1e-3, "seed": 0, **config_kwargs}
    model = make_model()
    optimizer = None
    if float64:
        model = float64_model(model)
        optimizer = sgd(model, config_kwargs["learning_rate"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return trainer_class(PPOConfig(**config_kwargs), model, tokenizer=tokenizer, optimizer=optimizer)


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


class LegacyLoss(PPOTrainer):
    """Overrides `loss` without changing it: `step` must then run the legacy full-logit forward passes."""

    calls = 0

    def loss(self, old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns):
        type(self).calls += 1
        assert logits.dim() == 3 and logits.shape[:2] == logprobs.shape  # legacy: [mb, T, V] logits
        return super().loss(old_logprobs, values, logits, vpreds, logprobs, mask, advantages, returns)


def test_windowed_path_equals_the_legacy_forward_passes():
    """Float64 and SGD: the two paths reduce in other orders (see the module docstring)."""
    fast = make_trainer(float64=True)
    legacy = make_trainer(LegacyLoss, float64=True)
    assert not fast._runs_legacy_forward() and legacy._runs_legacy_forward()
    stats_fast = fast.step(QUERIES, RESPONSES, SCORES, MASKS)
    LegacyLoss.calls = 0
    stats_legacy = legacy.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert LegacyLoss.calls == 2  # 2 epochs x 1 mini-batch
    config = fast.model.config
    length = max(len(q) + len(r) for q, r in zip(QUERIES, RESPONSES))  # the padded width (the packed rows are shorter)
    trained = int(sum(m.sum() for m in MASKS))
    assert_stats_close(stats_fast, stats_legacy, COMPARED_STATS, forward_terms(config, length) + trained,
                       magnitude=float(np.log(config.vocab_size)))
    tolerance = float64_sgd_tolerance(config, length, trained, learning_rate=1e-3, steps=2)
    weights = flat_weights(fast.model)
    torch.testing.assert_close(weights, flat_weights(legacy.model), rtol=0, atol=tolerance)
    assert (weights - flat_weights(float64_model(make_model()))).abs().max() > 1e3 * tolerance  # it trained


def test_overriding_compute_rewards_changes_the_step():
    """Dense rewards through `compute_rewards`: a bonus on every trainable token raises the returns."""

    class DenseRewards(PPOTrainer):
        def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
            rewards, non_score, kls = super().compute_rewards(scores, logprobs, ref_logprobs, masks)
            return rewards + 0.5 * masks, non_score, kls

    plain = make_trainer().step(QUERIES, RESPONSES, SCORES, MASKS)
    dense = make_trainer(DenseRewards).step(QUERIES, RESPONSES, SCORES, MASKS)
    assert dense["ppo/returns/mean"] > plain["ppo/returns/mean"] + 0.5


def test_overriding_loss_changes_the_update():
    """A `loss` that returns zero losses: Adam then moves no weight (zero gradient -> zero update)."""

    class NoLoss(PPOTrainer):
        def loss(self, *args):
            pg_loss, vf_loss, stats = super().loss(*args)
            return pg_loss * 0.0, vf_loss * 0.0, stats

    trainer = make_trainer(NoLoss)
    before = flat_weights(trainer.model)
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert torch.equal(flat_weights(trainer.model), before)
    moved = make_trainer()
    moved.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert not torch.equal(flat_weights(moved.model), before)


def test_overriding_kl_penalty_and_train_minibatch_are_called_per_row_and_per_minibatch():
    seen = {"kl_rows": [], "minibatches": 0}

    class Spy(PPOTrainer):
        def _kl_penalty(self, logprob, ref_logprob):
            seen["kl_rows"].append(logprob.shape)
            return super()._kl_penalty(logprob, ref_logprob)

        def train_minibatch(self, old_logprobs, values, logprobs, logits, vpreds, mask, advantages, returns):
            seen["minibatches"] += 1
            return super().train_minibatch(old_logprobs, values, logprobs, logits, vpreds, mask, advantages, returns)

    make_trainer(Spy, mini_batch_size=1).step(QUERIES, RESPONSES, SCORES, MASKS)
    assert len(seen["kl_rows"]) == 3 and all(len(shape) == 1 for shape in seen["kl_rows"])  # legacy: one row at a time
    assert seen["minibatches"] == 2 * 3


def test_patching_the_class_method_is_honoured():
    """`unittest.mock.patch.object(PPOTrainer, "compute_advantages", ...)`, as legacy-style tests do."""
    trainer = make_trainer()
    with mock.patch.object(PPOTrainer, "compute_advantages", autospec=True, side_effect=PPOTrainer.compute_advantages) as spy:
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert spy.call_count == 1


def test_batched_forward_pass_legacy_shapes_and_left_padding_masks(tokenizer):
    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"  # padded as the tokenizer pads, as legacy's collator did
    trainer = make_trainer(tokenizer=left)
    inputs = trainer.prepare_model_inputs(QUERIES, RESPONSES)
    logprobs, logits, values, masks = trainer.batched_forward_pass(
        trainer.model, QUERIES, RESPONSES, inputs, return_logits=True, response_masks=MASKS
    )
    width = max(len(q) + len(r) for q, r in zip(QUERIES, RESPONSES))
    assert inputs["attention_mask"][0, 0] == 0 and inputs["attention_mask"][2, 0] == 1  # left-padded to row 2
    assert logprobs.shape == values.shape == masks.shape == (3, width - 1)
    assert logits.shape == (3, width - 1, trainer.model.config.vocab_size)
    for row, (query, response, mask) in enumerate(zip(QUERIES, RESPONSES, MASKS)):
        start = width - len(query) - len(response) + len(query) - 1
        assert masks[row, :start].sum() == 0
        assert torch.equal(masks[row, start : start + len(response)].float(), mask.float())
    assert torch.equal(logprobs, core.logprobs_from_logits(logits, inputs["input_ids"][:, 1:]))  # the same function of the same logits


def test_step_safety_checker_returns_device_lists():
    trainer = make_trainer()
    queries, responses, scores, masks = trainer._step_safety_checker(3, QUERIES, RESPONSES, [torch.tensor([1.0])] * 3, MASKS)
    assert [q.shape for q in queries] == [q.shape for q in QUERIES]
    assert all(score.dim() == 0 for score in scores) and len(masks) == 3
    with pytest.raises(ValueError, match="scores"):
        trainer._step_safety_checker(3, QUERIES, RESPONSES, [torch.tensor([[1.0]])] * 3)


def dummy_generate(histories):
    for history in histories:
        history.append_segment("<request><Echo>hi<call>", torch.tensor([3, 4, 5]), system=False)
    return histories


def test_bundled_tokenizer_text_environment_to_ppo_step(tokenizer):
    """SmolLM2's tokenizer (EOS id 2, special ids 0-16): legacy-style class-patched `generate`, then a PPO step
    on both paths with the episode's masks."""
    model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=1))
    env = TextEnvironment(model, tokenizer, tools={"Echo": lambda text: text}, reward_fn=lambda texts: [torch.tensor(1.0)] * len(texts),
                          prompt="Use the tool.\n", max_turns=2)
    with mock.patch.object(TextEnvironment, "generate", side_effect=dummy_generate) as patched:
        queries, responses, masks, rewards, histories = env.run(["a", "bb", "ccc"])
    assert patched.call_count == 2
    expected_tool_tokens = tokenizer("hi<response>", add_special_tokens=False).input_ids
    assert responses[0].tolist() == 2 * ([3, 4, 5] + expected_tool_tokens)
    assert masks[0].tolist() == 2 * ([1, 1, 1] + [0] * len(expected_tool_tokens))
    assert all(int(token) > 16 or int(token) in (3, 4, 5) for token in responses[0])  # no special token inserted
    for trainer in (make_trainer(tokenizer=tokenizer), make_trainer(LegacyLoss, tokenizer=tokenizer)):
        trainer.optimizer.zero_grad = functools.partial(trainer.optimizer.zero_grad, set_to_none=False)
        stats = trainer.step(queries, responses, rewards, masks)
        assert stats["ppo/mean_scores"] == 1.0  # the mean of three 1.0s
        assert all(param.grad is not None for param in trainer.model.parameters() if param.requires_grad)


def test_seq2seq_model_steps_through_the_legacy_passes():
    """An encoder-decoder policy (tiny T5): queries feed the encoder, responses the decoder; a raw reference
    model is wrapped with the seq2seq value head."""
    from transformers import T5Config, T5ForConditionalGeneration

    from textenv import AutoModelForSeq2SeqLMWithValueHead

    config = T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)
    torch.manual_seed(0)
    policy = AutoModelForSeq2SeqLMWithValueHead(T5ForConditionalGeneration(config))
    reference = T5ForConditionalGeneration(config)
    reference.load_state_dict(policy.pretrained_model.state_dict())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1, ppo_epochs=1), policy, ref_model=reference)
    assert trainer.is_encoder_decoder and isinstance(trainer.ref_model, AutoModelForSeq2SeqLMWithValueHead)
    trainer.optimizer.zero_grad = functools.partial(trainer.optimizer.zero_grad, set_to_none=False)
    queries = [torch.tensor([5, 6, 7, 1]), torch.tensor([8, 9, 1])]
    responses = [torch.tensor([0, 10, 11, 12, 1]), torch.tensor([0, 13, 14, 1])]
    stats = trainer.step(queries, responses, [torch.tensor(1.0), torch.tensor(0.0)])
    assert stats["objective/kl"] == 0.0  # identical reference, first step: the same kernels on the same inputs
    assert stats["ppo/loss/total"] != 0.0
    assert all(param.grad is not None for param in trainer.model.parameters() if param.requires_grad)
