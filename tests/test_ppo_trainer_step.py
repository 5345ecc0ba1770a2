"""PPOTrainer on a tiny random Llama with hand-made tensors (legacy tests/test_ppo_trainer.py, adapted), part 1:
construction, the step's statistics, gradients and reference model, input checks, masked tool tokens, and forward
passes that do not depend on padding or mini-batch size (tolerances: tests/ppo_trainer_helpers.py)."""

import copy
import warnings

import numpy as np
import pytest
import torch

from textenv.ppo import PPOConfig, PPOTrainer
from textenv.ppo.batch import pack_batch

from numerics import assert_reordered_close, assert_stats_close, float64_model, float64_sgd_tolerance, forward_terms, sgd
from ppo_trainer_helpers import QUERY, RESPONSE, batch, flat_weights, float64_trainer, make_model, make_trainer, tiny_lm

EXPECTED_STATS = [
    "objective/kl", "objective/kl_dist", "objective/logprobs", "objective/ref_logprobs", "objective/kl_coef",
    "objective/entropy", "ppo/mean_non_score_reward", "ppo/mean_scores", "ppo/std_scores",
    "tokens/queries_len_mean", "tokens/queries_len_std", "tokens/queries_dist", "tokens/responses_len_mean",
    "tokens/responses_len_std", "tokens/responses_dist", "ppo/loss/policy", "ppo/loss/value", "ppo/loss/total",
    "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/policy/policykl", "ppo/policy/clipfrac",
    "ppo/policy/advantages", "ppo/policy/advantages_mean", "ppo/policy/ratio", "ppo/returns/mean",
    "ppo/returns/var", "ppo/val/vpred", "ppo/val/error", "ppo/val/clipfrac", "ppo/val/mean", "ppo/val/var",
    "ppo/val/var_explained", "ppo/learning_rate", "time/ppo/forward_pass", "time/ppo/compute_rewards",
    "time/ppo/compute_advantages", "time/ppo/optimize_step", "time/ppo/calc_stats", "time/ppo/total",
]


def packed_batch(trainer, queries, responses, masks=None):
    """The trainer's padded inputs with each response's span and mask (what the windowed forward passes take)."""
    inputs = trainer.prepare_model_inputs(queries, responses)
    return pack_batch(queries, responses, masks, inputs["input_ids"], inputs["attention_mask"])


def record_gradients(model):
    """Names of the parameters that received a non-zero gradient at least once."""
    seen = set()
    for name, param in model.named_parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(
                lambda p, name=name: seen.add(name) if p.grad is not None and p.grad.abs().sum() > 0 else None
            )
    return seen


# --------------------------------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------------------------------
def test_constructor_checks():
    with pytest.raises(ValueError, match="PPOConfig"):
        PPOTrainer(config={"batch_size": 2}, model=make_model())
    with pytest.raises(ValueError, match="AutoModelForCausalLMWithValueHead"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), tiny_lm())
    with pytest.raises(ValueError, match="tokenizer"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), make_model(), tokenizer="gpt2")
    with pytest.raises(ValueError, match="dataset"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), make_model(), dataset=[1, 2, 3])
    with pytest.raises(ValueError, match="lr_scheduler"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), make_model(), lr_scheduler=object())


def test_no_dataset_warns():
    with pytest.warns(UserWarning, match="No dataset is provided"):
        trainer = PPOTrainer(PPOConfig(batch_size=1, mini_batch_size=1), make_model())
    assert trainer.dataloader is None
    stats = trainer.step([QUERY], [RESPONSE], [torch.tensor(1.0)])
    assert stats["ppo/mean_scores"] == 1.0


def test_drop_last_dataloader():
    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"query": "x"}

    trainer = make_trainer(dataset=Rows(), batch_size=3, mini_batch_size=3)
    assert len(list(trainer.dataloader)) == 0
    trainer = make_trainer(dataset=Rows(), batch_size=2, mini_batch_size=1)
    assert len(list(trainer.dataloader)) == 1


def test_ref_model_and_shared_layers_warns():
    model = make_model()
    with pytest.warns(UserWarning, match="num_shared_layers is ignored"):
        PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1), model, ref_model=copy.deepcopy(model), num_shared_layers=1)


# --------------------------------------------------------------------------------------------------
# step: stats, gradients, reference model
# --------------------------------------------------------------------------------------------------
def test_step_returns_every_stat_and_every_parameter_gets_a_gradient():
    model = make_model()
    got_gradient = record_gradients(model)  # before the trainer's hooks, which step and drop each gradient
    trainer = make_trainer(model=model, ppo_epochs=4)
    stats = trainer.step(*batch())
    assert set(EXPECTED_STATS) <= set(stats)
    assert trainer.config.ppo_epochs == 4
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert got_gradient == trainable
    assert isinstance(stats["objective/kl"], float) and isinstance(stats["ppo/loss/total"], float)
    assert stats["objective/logprobs"].shape == (2, 13)
    # 2 mini-batches x 4 epochs, each contributing 13 positions of advantages
    assert stats["ppo/policy/advantages"].shape == (2 * 4 * 13,)


def test_step_with_masks_all_ones_equals_no_masks():
    first = make_trainer().step(*batch())
    second = make_trainer().step(*batch(), [torch.ones(len(RESPONSE), dtype=torch.long)] * 2)
    for key in ("ppo/loss/total", "ppo/loss/value", "objective/kl", "ppo/val/vpred"):
        assert first[key] == second[key], key


def test_reference_model_is_untouched():
    trainer = make_trainer(learning_rate=1e-2)
    before_ref = flat_weights(trainer.ref_model)
    before_policy = flat_weights(trainer.model)
    trainer.step(*batch())
    assert torch.equal(flat_weights(trainer.ref_model), before_ref)
    assert not torch.equal(flat_weights(trainer.model), before_policy)
    assert all(p.grad is None for p in trainer.ref_model.parameters())


def test_explicit_reference_model_is_untouched():
    model = make_model()
    reference = make_model(seed=1)
    before = flat_weights(reference)
    trainer = make_trainer(model=model, ref_model=reference, learning_rate=1e-2)
    stats = trainer.step(*batch())
    assert torch.equal(flat_weights(reference), before)
    assert stats["objective/kl"] != 0.0  # a different reference gives a non-zero KL


def test_shared_layers_are_frozen_and_shared():
    model = make_model()
    got_gradient = record_gradients(model)
    trainer = make_trainer(model=model, num_shared_layers=1, learning_rate=1e-2)
    layer0 = model.pretrained_model.model.layers[0].self_attn.q_proj.weight
    assert layer0 is trainer.ref_model.pretrained_model.model.layers[0].self_attn.q_proj.weight
    before = layer0.detach().clone()
    trainer.step(*batch())
    assert torch.equal(layer0, before)
    assert not any(".layers.0." in n or "embed_tokens" in n for n in got_gradient)
    assert any(".layers.1." in n for n in got_gradient)
    assert any(n.startswith("v_head") for n in got_gradient)
    assert any(n.endswith("model.norm.weight") for n in got_gradient)


def test_sgd_and_lr_scheduler_stepped_once_per_step():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    trainer = make_trainer(model=model, optimizer=optimizer, lr_scheduler=scheduler)
    first = trainer.step(*batch())
    second = trainer.step(*batch())
    assert first["ppo/learning_rate"] == pytest.approx(0.01)
    assert second["ppo/learning_rate"] == pytest.approx(0.005)


# --------------------------------------------------------------------------------------------------
# input checks
# --------------------------------------------------------------------------------------------------
def test_rewards_shape():
    trainer = make_trainer()
    queries, responses, _ = batch()
    with pytest.raises(ValueError, match=r"scores\[0\]"):
        trainer.step(queries, responses, [torch.tensor([[1.0]]), torch.tensor([[2.0]])])
    stats = trainer.step(queries, responses, [torch.tensor([1.0]), torch.tensor([2.0])])
    assert stats["ppo/mean_scores"] == pytest.approx(1.5)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda q, r, s, m: (tuple(q) and "not a list", r, s, m), r"`queries` must be a list"),
        (lambda q, r, s, m: (q[:1], r, s, m), r"`queries` has 1 elements but config.batch_size is 2"),
        (lambda q, r, s, m: (q, r[:1], s, m), r"`responses` has 1 elements"),
        (lambda q, r, s, m: (q, [r[0], r[1].tolist()], s, m), r"`responses\[1\]` must be a 1-D torch.LongTensor"),
        (lambda q, r, s, m: ([q[0], q[1].unsqueeze(0)], r, s, m), r"`queries\[1\]` must be 1-D"),
        (lambda q, r, s, m: (q, [r[0], r[1].float()], s, m), r"`responses\[1\]` must hold integer token ids"),
        (lambda q, r, s, m: (q, [r[0], r[1][:0]], s, m), r"`responses\[1\]` is empty"),
        (lambda q, r, s, m: ([q[0], q[1] + 10**6], r, s, m), r"`queries\[1\]` holds token id .* outside the model's vocabulary"),
        (lambda q, r, s, m: (q, r, [s[0], torch.tensor(float("nan"))], m), r"`scores\[1\]` is nan"),
        (lambda q, r, s, m: (q, r, [torch.tensor(float("inf")), s[1]], m), r"`scores\[0\]` is inf"),
        (lambda q, r, s, m: (q, r, [s[0], "good"], m), r"`scores\[1\]` must be a scalar tensor or a number"),
        (lambda q, r, s, m: (q, r, [s[0], torch.tensor([1.0, 2.0])], m), r"`scores\[1\]` must be a scalar"),
        (lambda q, r, s, m: (q, r, s, [m[0], m[1][:-1]]), r"`response_masks\[1\]` has length 6 but `responses\[1\]` has length 7"),
        (lambda q, r, s, m: (q, r, s, [m[0]]), r"`response_masks` has 1 elements"),
        (lambda q, r, s, m: (q, r, s, [m[0] * 2, m[1]]), r"`response_masks\[0\]` must contain only 0 and 1"),
        (lambda q, r, s, m: (q, r, s, [m[0], m[1] * 0]), r"`response_masks\[1\]` is all zeros"),
    ],
)
def test_step_input_errors_name_argument_and_index(mutate, match):
    trainer = make_trainer()
    queries, responses, scores = batch()
    masks = [torch.ones(len(RESPONSE), dtype=torch.long) for _ in range(2)]
    with pytest.raises(ValueError, match=match):
        trainer.step(*mutate(queries, responses, scores, masks))


def test_plain_number_scores_are_accepted():
    stats = make_trainer().step(*batch()[:2], [1.0, 3])
    assert stats["ppo/mean_scores"] == pytest.approx(2.0)


# --------------------------------------------------------------------------------------------------
# masks: tool tokens have no effect
# --------------------------------------------------------------------------------------------------
def test_masked_tool_tokens_at_the_end_equal_removing_them():
    """Tool tokens after the last model token, masked out, give the same losses, stats and weights as the
    same episodes without them (float64 and SGD: the two batches are padded differently)."""
    tool_tokens = torch.tensor([27, 4012, 31, 1234, 88])
    queries, responses, scores = batch()
    scores = [torch.tensor(1.0), torch.tensor(-0.5)]
    with_tool = [torch.cat([responses[0], tool_tokens]), responses[1]]
    masks = [torch.cat([torch.ones(len(RESPONSE)), torch.zeros(len(tool_tokens))]), torch.ones(len(RESPONSE))]

    trainer_a = float64_trainer()
    stats_a = trainer_a.step(queries, with_tool, scores, masks)
    trainer_b = float64_trainer()
    stats_b = trainer_b.step(queries, responses, scores)
    config, length, trained = trainer_a.model.config, len(QUERY) + len(with_tool[0]), 2 * len(RESPONSE)
    assert_stats_close(stats_a, stats_b, ("ppo/loss/policy", "ppo/loss/value", "ppo/loss/total", "objective/kl", "objective/entropy",
                                          "ppo/policy/entropy", "ppo/returns/mean", "ppo/val/vpred", "ppo/mean_non_score_reward"),
                       forward_terms(config, length) + trained, magnitude=float(np.log(config.vocab_size)))
    tolerance = float64_sgd_tolerance(config, length, trained, learning_rate=1e-3, steps=2)
    torch.testing.assert_close(flat_weights(trainer_a.model), flat_weights(trainer_b.model), rtol=0, atol=tolerance)
    assert not torch.equal(flat_weights(trainer_a.model), flat_weights(float64_model(make_model())))  # it trained


def test_tool_token_logprobs_get_no_gradient():
    """Changing what the model predicts at tool-token positions (their logits) does not change the loss:
    the gradient of the loss with respect to those logits is exactly zero."""
    trainer = make_trainer(batch_size=1, mini_batch_size=1)
    queries, responses, scores = batch(1)
    mask = torch.tensor([1, 1, 0, 0, 0, 1, 1], dtype=torch.float)
    packed = packed_batch(trainer, queries, responses, [mask])
    with torch.no_grad():
        old_logprobs, ref_logprobs, old_values, _ = trainer._windowed_experience_forward(packed)
    from textenv.ppo import core

    kls = old_logprobs - ref_logprobs
    rewards, _ = core.compute_rewards(torch.tensor([1.0]), kls, packed.masks, 0.2)
    values, advantages, returns = core.compute_advantages(old_values, rewards, packed.masks)
    from textenv.ppo.windowed_forward import response_positions

    rows, positions = response_positions(packed)
    with trainer._packed_scope(trainer.model, packed) as layout:
        logits, vpreds = trainer._forward_kept(trainer.model, packed, rows, positions, layout)
        logits.retain_grad()
        logprobs = trainer._place(core.selective_logprobs(logits, trainer._labels(packed, rows, positions)), rows, positions, packed)
        loss, _, _ = core.ppo_loss(old_logprobs, values, logprobs, vpreds, torch.zeros_like(logprobs), packed.masks,
                                   advantages, returns, 0.2, 0.2, 0.1)
        loss.backward()
    grad_per_position = logits.grad.abs().sum(-1)  # [K]: the response positions in order
    assert torch.equal(positions, torch.arange(int(packed.starts[0]), int(packed.ends[0])))
    trainable = packed.masks[0, positions]
    assert (grad_per_position[trainable == 0] == 0).all()
    assert (grad_per_position[trainable == 1] > 0).all()


# --------------------------------------------------------------------------------------------------
# forward pass independence of padding and mini-batch size
# --------------------------------------------------------------------------------------------------
def test_batched_forward_pass_independent_of_padding_and_minibatch_size(tokenizer):
    queries = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7, 8, 9, 10, 11]), torch.tensor([12, 13])]
    responses = [torch.tensor([20, 21, 22, 23, 24]), torch.tensor([30, 31]), torch.tensor([40, 41, 42, 43, 44, 45, 46, 47])]
    masks = [torch.tensor([1, 1, 0, 0, 1]), torch.ones(2), torch.tensor([1, 0, 1, 1, 1, 1, 0, 1])]
    results = []
    for mini_batch_size in (1, 3):
        trainer = make_trainer(model=float64_model(make_model()), tokenizer=tokenizer, batch_size=3, mini_batch_size=mini_batch_size)
        packed = packed_batch(trainer, queries, responses, masks)
        with torch.no_grad():
            outputs = trainer._windowed_experience_forward(packed)[:3]
        results.append((packed.masks, outputs))
    # a different padding: every row on its own (no padding at all)
    trainer = make_trainer(model=float64_model(make_model()), tokenizer=tokenizer, batch_size=1, mini_batch_size=1)
    single = []
    for q, r, m in zip(queries, responses, masks):
        packed = packed_batch(trainer, [q], [r], [m])
        with torch.no_grad():
            logprobs, _, values, _ = trainer._windowed_experience_forward(packed)
        single.append((logprobs[0][packed.masks[0].bool()], values[0][packed.masks[0].bool()]))

    (mask_a, out_a), (mask_b, out_b) = results
    assert torch.equal(mask_a, mask_b)
    assert mask_a.sum() == sum(m.sum() for m in masks)
    terms = forward_terms(trainer.model.config, max(len(q) + len(r) for q, r in zip(queries, responses)))
    for a, b in zip(out_a, out_b):
        assert_reordered_close(a[mask_a.bool()], b[mask_b.bool()], terms)
    for row, (logprobs, values) in enumerate(single):
        assert_reordered_close(out_a[0][row][mask_a[row].bool()], logprobs, terms, "log-probabilities")
        assert_reordered_close(out_a[2][row][mask_a[row].bool()], values, terms, "values")


def test_left_padding_collator_gives_the_same_stats(tokenizer):
    from transformers import DataCollatorWithPadding

    left = copy.deepcopy(tokenizer)
    left.padding_side = "left"
    queries = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7, 8, 9, 10, 11])]
    responses = [torch.tensor([20, 21, 22, 23, 24]), torch.tensor([30, 31, 32])]
    scores = [torch.tensor(1.0), torch.tensor(0.0)]
    right_stats = float64_trainer(tokenizer=tokenizer).step(queries, responses, scores)
    model = float64_model(make_model())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        trainer = PPOTrainer(PPOConfig(batch_size=2, mini_batch_size=1, seed=42, ppo_epochs=1), model, tokenizer=left,
                             optimizer=sgd(model, 1e-3), training_data_collator=DataCollatorWithPadding(left))
    assert trainer.prepare_model_inputs(queries, responses)["attention_mask"][0, 0] == 0  # really left-padded
    left_stats = trainer.step(queries, responses, scores)
    assert_stats_close(left_stats, right_stats, ("ppo/loss/total", "objective/entropy", "ppo/val/vpred"),
                       forward_terms(model.config, 11) + 8, magnitude=float(np.log(model.config.vocab_size)))
