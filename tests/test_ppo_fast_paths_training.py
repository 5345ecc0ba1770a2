"""The PPO step's fast paths, part 2: fused Adam and the optimizer step fused into backward, the sparse
tied-embedding gradient, the memory-mapped reference model, and the first training mini-batch's forward pass
run with the experience passes, each against the plain computation (tolerances: tests/ppo_fast_paths_helpers.py)."""

import copy
import functools
import gc
import os
import warnings

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo.offloaded_reference import AUTO_OFFLOAD_MIN_BYTES, OffloadedReference, should_offload
from textenv.testing import tiny_causal_lm

from numerics import assert_reordered_close, backward_terms, float64_model, sgd
from ppo_fast_paths_helpers import (
    MASKS,
    QUERIES,
    RESPONSES,
    SCORES,
    assert_identical_step,
    assert_same_float64_step,
    flat_weights,
    make_model,
    make_trainer,
    step_results,
)


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
    assert_identical_step(plain, fused)  # the same gradients and the same element-wise Adam update, only earlier
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
    model = float64_model(make_model()).eval()
    reference = copy.deepcopy(model)
    ids = torch.cat([QUERIES[0], RESPONSES[0]])[None]
    logits, _, values = model(input_ids=ids, logits_to_keep=slice(5, None))
    (logits.logsumexp(-1).sum() + values.sum()).backward()
    output = reference.pretrained_model(input_ids=ids, output_hidden_states=True)
    ref_values = reference.v_head(output.hidden_states[-1]).squeeze(-1)
    (output.logits[:, 5:].logsumexp(-1).sum() + ref_values.sum()).backward()
    embedding = model.pretrained_model.model.embed_tokens.weight
    assert embedding is model.pretrained_model.lm_head.weight and not embedding.grad.is_sparse
    positions = ids.shape[1] - 5
    assert_reordered_close(embedding.grad, reference.pretrained_model.model.embed_tokens.weight.grad,
                           backward_terms(model.config, ids.shape[1], positions), "embedding gradient")
    assert embedding.grad.abs().max() > 1e-3  # a gradient, not zeros


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
    assert_identical_step(in_memory, offloaded)


def test_offloaded_reference_holds_no_weights_between_uses_and_is_frozen():
    model = make_model()
    policy_before = flat_weights(model)
    trainer = make_trainer(model=model, offload_reference=True, learning_rate=1e-2)
    reference = trainer.ref_model
    assert all(p.numel() == 0 for p in reference.skeleton.parameters())
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert all(p.numel() == 0 for p in reference.skeleton.parameters())
    with reference.loaded() as loaded:
        assert torch.equal(flat_weights(loaded), policy_before)
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


# ------------------------------------------------------------------------------------------------
# the first training mini-batch's forward pass runs with the experience passes
# ------------------------------------------------------------------------------------------------
def count_policy_passes(trainer):
    calls = []
    body = trainer.accelerator.unwrap_model(trainer.model).pretrained_model.model
    body.register_forward_pre_hook(lambda module, args: calls.append(torch.is_grad_enabled()))
    return calls


@pytest.mark.parametrize("mini_batch_size", [3, 1])
def test_first_minibatch_pass_is_reused_and_changes_nothing(monkeypatch, mini_batch_size):
    """Float64 and SGD: the early pass runs on the mini-batch's rows in the shuffled order (a packed layout
    other than the experience passes'), with gradients on, so the old log-probabilities agree only in exact
    arithmetic."""
    def float64_trainer():
        model = float64_model(make_model())
        return make_trainer(model=model, optimizer=sgd(model, 1e-3), mini_batch_size=mini_batch_size)

    early = float64_trainer()
    early_calls = count_policy_passes(early)
    early_result = (early, early.step(QUERIES, RESPONSES, SCORES, MASKS), flat_weights(early.model))
    monkeypatch.setattr(PPOTrainer, "_first_minibatch_rows", lambda self: None)
    plain = float64_trainer()
    plain_calls = count_policy_passes(plain)
    plain_result = (plain, plain.step(QUERIES, RESPONSES, SCORES, MASKS), flat_weights(plain.model))
    assert_same_float64_step(plain_result, early_result, optimizer_steps=2 * (3 // mini_batch_size))
    # 2 epochs of 3 / mini_batch_size mini-batches, plus the no-grad experience passes of every row
    training_passes = 2 * (3 // mini_batch_size)
    assert plain_calls.count(True) == training_passes and early_calls.count(True) == training_passes
    assert plain_calls.count(False) == 3 // mini_batch_size
    assert early_calls.count(False) == 3 // mini_batch_size - 1  # one mini-batch's pass did both jobs


class DrawsInRewards(PPOTrainer):
    def compute_rewards(self, *args):
        np.random.rand()  # consumes the global RNG between the experience passes and the first epoch
        return super().compute_rewards(*args)


def test_first_minibatch_pass_is_dropped_when_the_rng_moved_on(monkeypatch):
    np.random.seed(3)
    peeked = np.random.permutation(3)  # the first mini-batch the experience passes expect
    np.random.seed(3)
    np.random.rand()
    assert np.random.permutation(3)[0] != peeked[0]  # the one `_optimise` draws after compute_rewards drew
    results, passes = [], []
    for reuse in (True, False):
        if not reuse:
            monkeypatch.setattr(PPOTrainer, "_first_minibatch_rows", lambda self: None)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No dataset is provided")
            model = float64_model(make_model())  # float64 and SGD: the dropped pass's rows ran in another pass
            trainer = DrawsInRewards(PPOConfig(batch_size=3, mini_batch_size=1, ppo_epochs=1), model, optimizer=sgd(model, 1e-3))
        calls = count_policy_passes(trainer)
        np.random.seed(3)
        results.append((trainer, trainer.step(QUERIES, RESPONSES, SCORES, MASKS), flat_weights(trainer.model)))
        passes.append(calls)
    assert passes[0].count(True) == 1 + 3 and passes[0].count(False) == 2  # early pass ran, then was not used
    assert passes[1].count(True) == 3 and passes[1].count(False) == 3
    assert_same_float64_step(results[1], results[0], optimizer_steps=3)


def test_experience_passes_run_without_dropout_after_a_training_step():
    """The step leaves the policy in train mode; the next step's reference pass (the PEFT policy with its
    adapters disabled) and policy passes must still run in eval mode, as legacy's `batched_forward_pass` did."""
    from peft import LoraConfig

    from textenv.ppo.batch import pack_batch

    base = tiny_causal_lm()
    for layer in base.model.layers:
        layer.self_attn.attention_dropout = 0.5  # dropout that only train mode applies
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(model=AutoModelForCausalLMWithValueHead.from_pretrained(base, peft_config=lora))
    trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert trainer.model.training
    inputs = trainer.prepare_model_inputs(QUERIES, RESPONSES)
    packed = pack_batch(QUERIES, RESPONSES, MASKS, inputs["input_ids"], inputs["attention_mask"])
    with torch.no_grad():
        first = trainer._windowed_experience_forward(packed)[:3]
        trainer.model.train()
        second = trainer._windowed_experience_forward(packed)[:3]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
