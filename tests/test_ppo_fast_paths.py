"""The PPO step's fast paths give the results of the plain computation: rows packed around a shared prompt
prefix, the optimizer step fused into backward, the sparse tied-embedding gradient, fused Adam and the
memory-mapped reference model."""

import copy
import functools
import gc
import os
import warnings

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo import shared_prefix
from textenv.ppo.offloaded_reference import AUTO_OFFLOAD_MIN_BYTES, OffloadedReference, should_offload
from textenv.testing import tiny_causal_lm

PROMPT = torch.arange(100, 130)  # 30 tokens every row starts with
QUERIES = [torch.cat([PROMPT, torch.tensor([7, 8])]), torch.cat([PROMPT, torch.tensor([9, 10, 11])]), torch.cat([PROMPT, torch.tensor([12])])]
RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]
COMPARED_STATS = ("ppo/loss/total", "ppo/loss/value", "ppo/loss/policy", "objective/kl", "objective/entropy",
                  "ppo/val/vpred", "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/returns/mean")


def make_model(seed=0, attn_implementation="sdpa"):
    base = tiny_causal_lm(seed=seed)
    base.config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return AutoModelForCausalLMWithValueHead(base)


def make_trainer(model=None, **config_kwargs):
    config_kwargs = {"batch_size": 3, "mini_batch_size": 3, "ppo_epochs": 2, "learning_rate": 1e-3, "seed": 0, **config_kwargs}
    trainer_kwargs = {k: config_kwargs.pop(k) for k in list(config_kwargs) if k in ("ref_model", "num_shared_layers", "optimizer")}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided")
        return PPOTrainer(PPOConfig(**config_kwargs), model if model is not None else make_model(), **trainer_kwargs)


def flat_weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def step_results(**config_kwargs):
    trainer = make_trainer(**config_kwargs)
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    return trainer, stats, flat_weights(trainer.model)


def assert_same_step(first, second, rel=1e-4):
    (_, stats_a, weights_a), (_, stats_b, weights_b) = first, second
    for key in COMPARED_STATS:
        assert stats_b[key] == pytest.approx(stats_a[key], rel=rel, abs=1e-6), key
    # Adam divides by the gradient's running magnitude, so where a gradient is ~0 float rounding moves an
    # update by up to a few percent of the learning rate (1e-3): weights agree to 1e-4, stats to rel 1e-4.
    torch.testing.assert_close(weights_b, weights_a, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# shared prompt prefix
# ------------------------------------------------------------------------------------------------
def padded(rows, pad=0):
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)
    attention_mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
    return input_ids, attention_mask


def test_packing_layout_points_every_position_at_its_token():
    rows = [torch.cat([q, r]) for q, r in zip(QUERIES, RESPONSES)]
    input_ids, attention_mask = padded(rows)
    packing = shared_prefix.plan_prefix_packing(input_ids, attention_mask)
    assert packing is not None
    lengths = [len(r) for r in rows]
    assert int((packing.segment_ids == 0).sum()) == 30
    assert packing.input_ids.shape == (1, 30 + sum(length - 30 for length in lengths))
    for row, length in enumerate(lengths):
        index = packing.token_index[row, :length]
        assert torch.equal(packing.input_ids[0, index], rows[row])
        assert torch.equal(packing.position_ids[0, index], torch.arange(length))
        assert packing.real_tokens[row].sum() == length


def test_packing_mask_sees_prefix_and_own_row_only():
    input_ids, attention_mask = padded([torch.cat([PROMPT, torch.tensor([1, 2])]), torch.cat([PROMPT, torch.tensor([3])])])
    packing = shared_prefix.plan_prefix_packing(input_ids, attention_mask)
    allowed = packing.attention_mask("bool", torch.float32)[0, 0]
    additive = packing.attention_mask("additive", torch.float32)[0, 0]
    assert torch.equal(additive == 0, allowed)
    first_rest, second_rest = 30, 32  # packed indices of the two rows' own tokens
    assert allowed[first_rest + 1, :first_rest + 2].all()  # the prefix and its own earlier token
    assert not allowed[second_rest, first_rest:second_rest].any()  # never the other row
    assert not allowed[5, 6:].any()  # causal inside the prefix


@pytest.mark.parametrize("rows, reason", [
    ([torch.cat([PROMPT, torch.tensor([1])])], "one row"),
    ([torch.arange(10, 20), torch.arange(10, 22)], "prefix under 16 tokens"),
    ([torch.cat([PROMPT, torch.arange(500, 600)]), torch.cat([PROMPT, torch.arange(600, 700)])], "saves under 25%"),
])
def test_packing_declined_when_it_does_not_pay(rows, reason):
    input_ids, attention_mask = padded(rows)
    assert shared_prefix.plan_prefix_packing(input_ids, attention_mask) is None, reason


def test_packing_declined_for_left_padding():
    input_ids, attention_mask = padded([torch.cat([PROMPT, torch.tensor([1, 2])]), torch.cat([PROMPT, torch.tensor([3])])])
    left_ids, left_mask = input_ids.flip(1), attention_mask.flip(1)
    assert shared_prefix.plan_prefix_packing(left_ids, left_mask) is None


def test_mask_format_per_attention_implementation():
    config = tiny_causal_lm().config
    for implementation, expected in (("sdpa", "bool"), ("eager", "additive"), ("flash_attention_2", None)):
        config._attn_implementation = implementation
        assert shared_prefix.mask_format(config) == expected
    config._attn_implementation = "sdpa"
    config.sliding_window = 8
    assert shared_prefix.mask_format(config) is None


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packed_forward_equals_padded_forward(attn_implementation):
    model = make_model(attn_implementation=attn_implementation).eval()  # no value-head dropout
    rows = [torch.cat([q, r]) for q, r in zip(QUERIES, RESPONSES)]
    input_ids, attention_mask = padded(rows)
    packing = shared_prefix.plan_prefix_packing(input_ids, attention_mask)
    mask_format = shared_prefix.mask_format(model.config)
    with torch.no_grad():
        logits, _, values = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=slice(0, None))
        packed_logits, _, packed_values = model(
            input_ids=packing.input_ids,
            attention_mask=packing.attention_mask(mask_format, torch.float32),
            position_ids=packing.position_ids,
            logits_to_keep=slice(0, None),
        )
    for row, length in enumerate(len(r) for r in rows):
        index = packing.token_index[row, :length]
        torch.testing.assert_close(packed_logits[0, index], logits[row, :length], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(packed_values[0, index], values[row, :length], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_shared_prefix_step_equals_full_rows(attn_implementation):
    shapes = []

    def record(module, args, kwargs):
        shapes.append(tuple((kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]).shape[:2]))

    results = []
    for share in (False, True):
        model = make_model(attn_implementation=attn_implementation)
        handle = model.pretrained_model.model.register_forward_pre_hook(record, with_kwargs=True)
        results.append(step_results(model=model, share_prompt_prefix=share))
        handle.remove()
    assert_same_step(*results)
    packed_len = 30 + sum(len(q) + len(r) - 30 for q, r in zip(QUERIES, RESPONSES))
    padded_len = max(len(q) + len(r) for q, r in zip(QUERIES, RESPONSES))
    assert (3, padded_len) in shapes and (1, packed_len) in shapes  # both layouts really ran


def test_full_kl_penalty_takes_the_full_logit_passes():
    """kl_penalty="full" needs every position's distribution: `step` runs `batched_forward_pass` with logits, and
    the summed KL over the vocabulary is never negative (the sampled-token estimate "kl" can be)."""
    trainer, stats, _ = step_results(kl_penalty="full")
    assert trainer._runs_legacy_forward()
    assert stats["objective/kl"] >= 0 and all(value >= -1e-6 for value in stats["objective/kl_dist"])


def test_shared_prefix_and_step_in_backward_with_gradient_checkpointing():
    plain = step_results(share_prompt_prefix=False, step_in_backward=False)
    checkpointed = step_results(gradient_checkpointing=True, step_in_backward=True)
    assert checkpointed[0].step_in_backward is not None
    assert_same_step(plain, checkpointed)


def test_shared_prefix_on_peft_model_with_disabled_adapter_reference():
    from peft import LoraConfig

    results = []
    for share in (False, True):
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_causal_lm(), peft_config=lora)
        trainer = make_trainer(model=model, share_prompt_prefix=share, learning_rate=1e-2)
        assert trainer.ref_model is None
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
        stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)  # adapters trained: a non-zero KL to compare
        results.append((trainer, stats, flat_weights(trainer.model)))
    assert results[1][1]["objective/kl"] != 0.0
    assert_same_step(*results)


# ------------------------------------------------------------------------------------------------
# optimizer: fused Adam, step fused into backward
# ------------------------------------------------------------------------------------------------
def test_default_optimizer_is_fused_adam_and_leaves_gradients_as_legacy():
    """step_in_backward is opt-in: by default every trainable parameter has a `.grad` after `step` (legacy code
    and tests inspect them), here with zero_grad keeping the tensors as legacy TRL's tests do."""
    trainer = make_trainer()
    assert isinstance(trainer.optimizer.optimizer, torch.optim.Adam)
    assert trainer.optimizer.optimizer.defaults["fused"] is True
    assert trainer.step_in_backward is None
    trainer.optimizer.zero_grad = functools.partial(trainer.optimizer.zero_grad, set_to_none=False)
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert all(p.grad is not None for p in trainer.trainable_params)


def test_step_in_backward_equals_step_after_backward():
    fused = step_results(step_in_backward=True)
    plain = step_results(step_in_backward=False)
    assert fused[0].step_in_backward is not None and plain[0].step_in_backward is None
    assert_same_step(plain, fused)
    trainer = fused[0]
    assert all(p.grad is None for p in trainer.model.parameters())
    states = trainer.optimizer.optimizer.state
    assert all(int(states[p]["step"]) == 2 for p in trainer.trainable_params)  # 2 epochs x 1 mini-batch


def test_early_stopping_with_step_in_backward():
    trainer = make_trainer(early_stopping=True, target_kl=-100.0, ppo_epochs=4, step_in_backward=True)
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    states = trainer.optimizer.optimizer.state
    assert all(int(states[p]["step"]) == 1 for p in trainer.trainable_params)  # stopped after the first epoch


@pytest.mark.parametrize("setting", [
    {"max_grad_norm": 1.0},
    {"gradient_accumulation_steps": 3, "mini_batch_size": 1},
    {"optimizer": "sgd"},
])
def test_step_in_backward_off_when_all_gradients_are_needed(setting):
    if setting.get("optimizer") == "sgd":
        model = make_model()
        setting = {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)}
    assert make_trainer(step_in_backward=True, **setting).step_in_backward is None


def test_step_in_backward_hooks_do_nothing_outside_step():
    trainer = make_trainer(step_in_backward=True)
    before = flat_weights(trainer.model)
    logits, _, values = trainer.model(input_ids=QUERIES[0][None])
    (logits.mean() + values.mean()).backward()
    assert torch.equal(flat_weights(trainer.model), before)
    assert trainer.model.v_head.summary.weight.grad is not None  # the user's gradients are left alone


def test_sparse_tied_embedding_gradient_equals_dense():
    model = make_model().eval()
    reference = copy.deepcopy(model)
    ids = torch.cat([QUERIES[0], RESPONSES[0]])[None]
    logits, _, values = model(input_ids=ids, logits_to_keep=slice(5, None))
    (logits.logsumexp(-1).sum() + values.sum()).backward()
    output = reference.pretrained_model(input_ids=ids, output_hidden_states=True)
    ref_values = reference.v_head(output.hidden_states[-1]).squeeze(-1)
    (output.logits[:, 5:].logsumexp(-1).sum() + ref_values.sum()).backward()
    embedding = model.pretrained_model.model.embed_tokens.weight
    assert embedding is model.pretrained_model.lm_head.weight and not embedding.grad.is_sparse
    torch.testing.assert_close(embedding.grad, reference.pretrained_model.model.embed_tokens.weight.grad, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# reference model in a memory-mapped snapshot
# ------------------------------------------------------------------------------------------------
def test_offloaded_reference_gives_the_same_step():
    in_memory = step_results(offload_reference=False)
    offloaded = step_results(offload_reference=True)
    assert isinstance(offloaded[0].ref_model, OffloadedReference)
    assert not isinstance(in_memory[0].ref_model, OffloadedReference)
    for key in ("objective/kl", "objective/ref_logprobs"):
        assert np.array_equal(offloaded[1][key], in_memory[1][key]), key  # the same float32 weights: bit-identical
    assert_same_step(in_memory, offloaded)


def test_offloaded_reference_holds_no_weights_between_uses_and_is_frozen():
    model = make_model()
    policy_before = flat_weights(model)
    trainer = make_trainer(model=model, offload_reference=True, learning_rate=1e-2)
    reference = trainer.ref_model
    assert all(p.numel() == 0 for p in reference.skeleton.parameters())
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert all(p.numel() == 0 for p in reference.skeleton.parameters())
    with reference.loaded() as loaded:
        torch.testing.assert_close(flat_weights(loaded), policy_before, rtol=0, atol=0)
        assert not any(p.requires_grad for p in loaded.parameters())
    assert not torch.equal(flat_weights(trainer.model), policy_before)


def test_offloaded_reference_file_is_removed():
    reference = OffloadedReference(make_model())
    path = reference.path
    assert os.path.isfile(path)
    reference.close()
    assert not os.path.exists(path)
    reference = OffloadedReference(make_model())
    folder = reference.folder
    del reference
    gc.collect()
    assert not os.path.exists(folder)


def test_offloaded_reference_generates(tokenizer):
    trainer = make_trainer(offload_reference=True)
    trainer.tokenizer = tokenizer
    response, ref_response = trainer.generate(QUERIES[0], generate_ref_response=True, max_new_tokens=3, do_sample=False)
    assert ref_response.shape == response.shape == (1, len(QUERIES[0]) + 3)
    assert torch.equal(ref_response, response)  # no step yet: the reference is the policy


@pytest.mark.parametrize("extra", ["ref_model", "num_shared_layers"])
def test_offload_reference_true_refuses_other_references(extra):
    kwargs = {"ref_model": make_model(seed=1)} if extra == "ref_model" else {"num_shared_layers": 1}
    with pytest.raises(ValueError, match="offload_reference=True"):
        make_trainer(offload_reference=True, **kwargs)


def test_auto_offload_only_for_large_models_on_cpu():
    small = make_model()
    assert not should_offload(None, small, torch.device("cpu"))
    assert should_offload(True, small, torch.device("cpu"))
    large = torch.nn.Linear(1, AUTO_OFFLOAD_MIN_BYTES // 4, bias=False, device="meta")
    assert should_offload(None, large, torch.device("cpu"))
    assert not should_offload(None, large, torch.device("cuda"))
    assert not should_offload(False, large, torch.device("cpu"))
