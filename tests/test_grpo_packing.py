"""GRPO steps run a mini-batch's rows packed, the prompt prefix they share once (`GRPOConfig.share_prompt_prefix`,
default True): the same log-probabilities, entropies, gradients and weights as the padded rows TRL runs, fewer
tokens through the model, and the padded path where packing is off or the model cannot run packed.

Tolerances (tests/numerics.py has the analysis): packed and padded rows are equal only in exact arithmetic (the
attention of a packed row sums its prefix and its own tokens in another order, and matrix products of another
shape block their sums differently), so the comparisons run in float64: log-probabilities and entropies within
`reduction_tolerance` of `forward_terms` at their size, gradients within that of `backward_terms` at theirs, and
the weights after SGD steps within `float64_sgd_tolerance`. Exact: the zeros the packed path puts on padding, and
token counts.
"""

from __future__ import annotations

import copy

import pytest
import torch

from textenv.grpo import GRPOConfig, GRPOTrainer
from textenv.grpo.batch import pad_group_batch, response_logprobs
from textenv.grpo.trainer import packed_config
from textenv.testing import tiny_causal_lm

from numerics import assert_reordered_close, backward_terms, float64_model, float64_sgd_tolerance, forward_terms, sgd

VOCAB = 512
PREFIX = 40  # a few-shot opening every row shares (longer than packing.MIN_SHARED_PREFIX)


def shared_prompt_episodes(groups: int = 2, generations: int = 3, seed: int = 0, question: int = 0, shared_reply: int = 0):
    """``groups * generations`` episodes: one opening for all, a question per group (4-5 tokens, or ``question``),
    responses of 3-9 tokens (after ``shared_reply`` tokens the group's responses all start with) with a tool span
    masked out, rewards that differ within each group."""
    generator = torch.Generator().manual_seed(seed)
    opening = torch.randint(0, VOCAB, (PREFIX,), generator=generator)
    queries, responses, masks, scores = [], [], [], []
    for group in range(groups):
        question_ids = torch.randint(0, VOCAB, (question or 4 + group,), generator=generator)
        reply_start = torch.randint(0, VOCAB, (shared_reply,), generator=generator)
        for generation in range(generations):
            length = 3 + (3 * group + 2 * generation) % 7
            response = torch.cat([reply_start, torch.randint(0, VOCAB, (length,), generator=generator)])
            mask = torch.ones(len(response), dtype=torch.long)
            mask[1 : len(response) // 2] = 0  # a tool's answer inside the response
            queries.append(torch.cat([opening, question_ids]))
            responses.append(response)
            masks.append(mask)
            scores.append(torch.tensor(float(generation)))
    return queries, responses, masks, scores


# Rows that share only the opening, and rows whose groups also share a long question and the start of their
# replies (a prefix tree: the opening, then each group's question and reply start, then each row's own rest).
SHAPES = {"opening": {}, "group_tree": {"question": 20, "shared_reply": 18}}


def float64_tiny(seed: int = 0):
    return float64_model(tiny_causal_lm(vocab_size=VOCAB, seed=seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_packed_rows_give_the_padded_rows_logprobs_entropies_and_gradients(shape):
    model = float64_tiny()
    queries, responses, masks, _ = shared_prompt_episodes(**SHAPES[shape])
    batch = pad_group_batch(queries, responses, masks, pad_token_id=0, device="cpu")
    results = {}
    for name, config in (("padded", None), ("packed", packed_config(model, True))):
        model.zero_grad()
        logprobs, entropies = response_logprobs(model, batch, temperature=0.7, with_entropy=True, packed_config=config)
        (logprobs * batch.loss_mask).sum().backward()
        results[name] = (logprobs.detach(), entropies, [p.grad.clone() for p in model.parameters()])
    assert results["packed"][0].dtype == torch.float64
    length = batch.prompt_ids.shape[1] + batch.completion_ids.shape[1]
    real = batch.completion_mask.bool()
    for index, what in ((0, "log-probabilities"), (1, "entropies")):
        padded, packed = results["padded"][index], results["packed"][index]
        assert_reordered_close(packed[real], padded[real], forward_terms(model.config, length), what)
        assert torch.equal(packed[~real], torch.zeros_like(packed[~real]))  # nothing is computed on padding
    positions = int(batch.loss_mask.sum())
    for packed, padded in zip(results["packed"][2], results["padded"][2]):
        assert_reordered_close(packed, padded, backward_terms(model.config, length, positions), "gradients")


def tokens_through_the_model(model, run) -> int:
    counted = []
    handle = model.get_input_embeddings().register_forward_hook(lambda module, inputs, output: counted.append(inputs[0].numel()))
    try:
        run()
    finally:
        handle.remove()
    return sum(counted)


def test_the_shared_prefix_runs_once():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=0)
    queries, responses, masks, _ = shared_prompt_episodes()
    batch = pad_group_batch(queries, responses, masks, pad_token_id=0, device="cpu")
    padded = tokens_through_the_model(model, lambda: response_logprobs(model, batch))
    packed = tokens_through_the_model(model, lambda: response_logprobs(model, batch, packed_config=model.config))
    real_tokens = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
    assert padded == batch.prompt_ids.numel() + batch.completion_ids.numel()
    assert packed == real_tokens - (len(queries) - 1) * PREFIX  # the opening once; each question once per row


def test_a_groups_question_and_reply_start_run_once():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=0)
    groups, generations, question, shared_reply = 2, 3, 20, 18
    queries, responses, masks, _ = shared_prompt_episodes(groups, generations, question=question, shared_reply=shared_reply)
    batch = pad_group_batch(queries, responses, masks, pad_token_id=0, device="cpu")
    packed = tokens_through_the_model(model, lambda: response_logprobs(model, batch, packed_config=model.config))
    real_tokens = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
    repeats_left_out = (len(queries) - 1) * PREFIX + (len(queries) - groups) * (question + shared_reply)
    assert packed == real_tokens - repeats_left_out  # the opening once, each group's question and reply start once


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("options", [{}, {"num_iterations": 2, "beta": 0.1}], ids=["on-policy", "off-policy+kl"])
def test_a_packed_step_trains_the_weights_a_padded_step_trains(options, shape):
    queries, responses, masks, scores = shared_prompt_episodes(**SHAPES[shape])
    learning_rate, steps = 0.05, 2
    trained = {}
    for share in (True, False):
        model = float64_tiny()
        config = GRPOConfig(batch_size=6, mini_batch_size=3, num_generations=3, learning_rate=learning_rate, seed=0,
                            share_prompt_prefix=share, **options)
        trainer = GRPOTrainer(config, model, optimizer=sgd(model, learning_rate))
        assert (trainer.packed_config is not None) == share
        stats = [trainer.step(queries, responses, scores, masks) for _ in range(steps)]
        trained[share] = (torch.cat([p.detach().flatten() for p in model.parameters()]), stats)
    length = len(queries[-1]) + max(len(response) for response in responses)
    passes = steps * config.num_iterations
    tolerance = float64_sgd_tolerance(model.config, length, sum(int(mask.sum()) for mask in masks), learning_rate, passes)
    initial = torch.cat([p.detach().flatten() for p in float64_tiny().parameters()])
    assert (trained[True][0] - initial).abs().max() > 1e3 * tolerance  # the steps moved the weights
    assert (trained[True][0] - trained[False][0]).abs().max() <= tolerance
    for packed, padded in zip(trained[True][1], trained[False][1]):
        assert packed["tokens/trained"] == padded["tokens/trained"]


def test_packing_follows_the_model_and_the_setting():
    model = tiny_causal_lm(vocab_size=VOCAB, seed=0)
    assert packed_config(model, True) is model.config
    assert packed_config(model, False) is None
    windowed = copy.deepcopy(model)
    windowed.config.layer_types = ["sliding_attention"] * windowed.config.num_hidden_layers
    with pytest.warns(UserWarning, match=r"cannot run packed.*run padded"):
        assert packed_config(windowed, True) is None  # per-segment attention is full causal attention only


def test_a_lora_policy_runs_packed_through_its_base_model():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_causal_lm(vocab_size=VOCAB, seed=0), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainer = GRPOTrainer(GRPOConfig(batch_size=6, mini_batch_size=3, num_generations=3, learning_rate=1e-2), model)
    assert trainer.packed_config is model.get_base_model().config
    queries, responses, masks, scores = shared_prompt_episodes()
    stats = trainer.step(queries, responses, scores, masks)
    assert stats["tokens/trained"] == sum(int(mask.sum()) for mask in masks)
    assert model.get_base_model().config._attn_implementation != "textenv_packed"  # switched back after the step
