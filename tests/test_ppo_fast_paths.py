"""The PPO step's fast paths give the results of the plain computation: rows packed around a shared prompt
prefix, the optimizer step fused into backward, the sparse tied-embedding gradient, fused Adam and the
memory-mapped reference model.

Tolerances (tests/numerics.py has the analysis):
- exact (`assert_identical_step`: every compared statistic ``==``, the weights ``torch.equal``, after the
  default fused-Adam float32 step): paths that run the same kernels on the same tensors (same shapes, same
  packed layout, same process and thread count), so no rounding can differ: the optimizer step fused into
  backward (each parameter gets the same gradient and the same element-wise Adam update, only earlier),
  gradient checkpointing (the recomputed forward is the same forward), the memory-mapped reference (the same
  float32 weights). Also exact: an offloaded reference's weights, passes that must not depend on the model's
  mode, weights that must not move;
- float64 with SGD (`assert_same_float64_step`: `assert_stats_close` on the statistics, `float64_sgd_tolerance`
  on the weights, with a check that the weights moved by more than 1000 times it): steps that agree only in
  exact arithmetic because the rows are laid out differently (packed around a shared prefix or padded; the
  first mini-batch's pass run with gradients in the shuffled row order, or without, separately). Adam would
  turn a rounding-level gradient difference on a near-zero gradient into a step difference of up to 2 lr, so
  float32 Adam-trained weights cannot be compared below the update itself; float64 SGD leaves differences of
  lr x steps x the gradients' float64 rounding (about 1e-12 here);
- `assert_reordered_close` in float64: forward passes (logits, values) and the tied embedding's gradient
  computed with another layout or kernel (packed rows; the sparse gradient), `forward_terms` /
  `backward_terms` additions of the tiny model. With ``attn_implementation="eager"`` the padded passes run
  transformers' eager attention, whose softmax is taken in float32 even for a float64 model; the
  `float64_eager_softmax` fixture takes it in float64 so that the comparison is float64 throughout (the packed
  passes use SDPA, float64 already);
- the full KL against a *different* reference, in float64: positive by far more than its rounding bound
  (against the policy's own copy it is exactly 0 and would not show a sign error).
"""

import copy
import functools
import gc
import os
import warnings

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.ppo import packing
from textenv.ppo.offloaded_reference import AUTO_OFFLOAD_MIN_BYTES, OffloadedReference, should_offload
from textenv.testing import tiny_causal_lm

from numerics import (
    assert_reordered_close,
    assert_stats_close,
    backward_terms,
    float64_model,
    float64_sgd_tolerance,
    forward_terms,
    reduction_tolerance,
    sgd,
)

PROMPT = torch.arange(100, 130)  # 30 tokens every row starts with
QUERIES = [torch.cat([PROMPT, torch.tensor([7, 8])]), torch.cat([PROMPT, torch.tensor([9, 10, 11])]), torch.cat([PROMPT, torch.tensor([12])])]
RESPONSES = [torch.arange(200, 206), torch.arange(300, 303), torch.arange(400, 410)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1, 1, 0, 0, 1, 1]), torch.ones(3), torch.tensor([1] * 4 + [0] * 3 + [1] * 3)]
COMPARED_STATS = ("ppo/loss/total", "ppo/loss/value", "ppo/loss/policy", "objective/kl", "objective/entropy",
                  "ppo/val/vpred", "ppo/policy/entropy", "ppo/policy/approxkl", "ppo/returns/mean")
# The longest sequence a forward pass sums over (the packed row: the prompt once, then every row's rest) and the
# trained (mask 1) positions of the batch: the sizes of the float64 tolerances.
PACKED_LENGTH = len(PROMPT) + sum(len(q) + len(r) - len(PROMPT) for q, r in zip(QUERIES, RESPONSES))
TRAINED_POSITIONS = int(sum(m.sum() for m in MASKS))


@pytest.fixture()
def float64_eager_softmax(monkeypatch):
    """transformers' eager attention takes its softmax with ``dtype=torch.float32`` ("upcast to fp32"), which
    for a float64 model is a downcast to float32 (its packed counterpart, SDPA, stays float64): for the duration
    of the test a softmax asked for float32 of a float64 input is taken in float64."""
    softmax = torch.nn.functional.softmax

    def at_least_input_precision(input, dim=None, _stacklevel=3, dtype=None):
        if dtype is not None and input.is_floating_point():
            dtype = torch.promote_types(dtype, input.dtype)
        return softmax(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", at_least_input_precision)


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


def float64_step_results(model=None, learning_rate=1e-3, steps=1, **config_kwargs):
    """`step_results` of a float64 copy of ``model`` (default `make_model()`) trained with SGD, ``steps`` steps."""
    model = float64_model(model if model is not None else make_model())
    trainer = make_trainer(model=model, optimizer=sgd(model, learning_rate), **config_kwargs)
    for _ in range(steps):
        stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    return trainer, stats, flat_weights(trainer.model)


def assert_identical_step(first, second):
    """The same statistics and weights, bit for bit (the same kernels on the same tensors)."""
    (_, stats_a, weights_a), (_, stats_b, weights_b) = first, second
    for key in COMPARED_STATS:
        assert stats_b[key] == stats_a[key], key
    assert torch.equal(weights_b, weights_a)
    assert not torch.equal(weights_a, flat_weights(make_model()))  # it trained


def assert_same_float64_step(first, second, learning_rate=1e-3, optimizer_steps=2, initial=None):
    """Float64 SGD steps that differ by the order of their reductions: statistics within `assert_stats_close`
    (log-probabilities of size log V summed), weights within `float64_sgd_tolerance` of ``optimizer_steps``
    optimizer steps; and the weights moved from ``initial`` (default: `make_model()`'s) far beyond it."""
    (trainer, stats_a, weights_a), (_, stats_b, weights_b) = first, second
    config = trainer.model.config
    assert_stats_close(stats_b, stats_a, COMPARED_STATS, forward_terms(config, PACKED_LENGTH) + TRAINED_POSITIONS,
                       magnitude=float(np.log(config.vocab_size)))
    tolerance = float64_sgd_tolerance(config, PACKED_LENGTH, TRAINED_POSITIONS, learning_rate, optimizer_steps)
    torch.testing.assert_close(weights_b, weights_a, rtol=0, atol=tolerance)
    initial = flat_weights(float64_model(make_model())) if initial is None else initial
    assert (weights_a - initial).abs().max() > 1e3 * tolerance  # it trained, far beyond the tolerance


# ------------------------------------------------------------------------------------------------
# packed rows (no padding, shared prompt prefix once)
# ------------------------------------------------------------------------------------------------
def padded(rows, pad=0, left=False):
    if left:
        input_ids, attention_mask = padded([row.flip(0) for row in rows], pad)
        return input_ids.flip(1), attention_mask.flip(1)
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)
    attention_mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], batch_first=True)
    return input_ids, attention_mask


@pytest.mark.parametrize("left", [False, True])
def test_packing_layout_points_every_position_at_its_token(left):
    rows = [torch.cat([q, r]) for q, r in zip(QUERIES, RESPONSES)]
    input_ids, attention_mask = padded(rows, left=left)
    layout = packing.plan_packing(input_ids, attention_mask)
    lengths = [len(r) for r in rows]
    assert layout.prefix_len == 30
    assert layout.input_ids.shape == (1, 30 + sum(length - 30 for length in lengths))
    for row, length in enumerate(lengths):
        columns = torch.nonzero(attention_mask[row])[:, 0]
        index = layout.token_index[row, columns]
        assert torch.equal(layout.input_ids[0, index], rows[row])
        assert torch.equal(layout.position_ids[0, index], torch.arange(length))
        start, end = layout.rest_bounds[row]
        assert end - start == length - 30


def test_packing_without_shared_prefix_keeps_every_row_whole():
    rows = [torch.arange(10, 20), torch.arange(50, 53), torch.arange(7, 14)]
    input_ids, attention_mask = padded(rows)
    for share_prefix in (True, False):  # no common start: no prefix segment either way
        layout = packing.plan_packing(input_ids, attention_mask, share_prefix=share_prefix)
        assert layout.prefix_len == 0
        assert layout.rest_bounds == [(0, 10), (10, 13), (13, 20)]
        assert torch.equal(layout.input_ids[0], torch.cat(rows))
    with_prompt = [torch.cat([PROMPT, row]) for row in rows]
    layout = packing.plan_packing(*padded(with_prompt), share_prefix=False)
    assert layout.prefix_len == 0 and layout.input_ids.shape[1] == sum(map(len, with_prompt))


def test_packing_short_common_start_and_identical_rows():
    short = [torch.arange(10, 20), torch.arange(10, 22)]  # 10 common tokens: under MIN_SHARED_PREFIX
    assert packing.plan_packing(*padded(short)).prefix_len == 0
    same = [PROMPT.clone(), PROMPT.clone()]  # every row keeps at least one token of its own
    layout = packing.plan_packing(*padded(same))
    assert layout.prefix_len == 29 and layout.rest_bounds == [(29, 30), (30, 31)]


@pytest.mark.parametrize("left", [False, True])
def test_packing_lays_out_a_prefix_tree(left):
    opening, branch_a, branch_b = torch.arange(100, 120), torch.arange(200, 220), torch.arange(300, 320)
    rows = [torch.cat([opening, branch_a, torch.tensor([1, 2])]), torch.cat([opening, branch_b, torch.tensor([3])]),
            torch.cat([opening, branch_a, torch.tensor([4, 5, 6])]), torch.cat([opening, torch.arange(400, 405)]),
            torch.cat([opening, branch_b, torch.tensor([7, 8])])]
    input_ids, attention_mask = padded(rows, left=left)
    layout = packing.plan_packing(input_ids, attention_mask)
    assert layout.prefix_len == 60  # the opening, then branch a and branch b once each
    assert layout.input_ids.shape[1] == 60 + 2 + 1 + 3 + 5 + 2
    shared, rests = layout.segments[:3], layout.segments[3:]
    assert [(segment.start, segment.end, segment.context) for segment in shared] == [(0, 20, ()), (20, 40, ((0, 20),)), (40, 60, ((0, 20),))]
    assert [segment.context for segment in rests] == [((0, 40),), ((0, 20), (40, 60)), ((0, 40),), ((0, 20),), ((0, 20), (40, 60))]
    for row, tokens in enumerate(rows):
        index = layout.token_index[row, torch.nonzero(attention_mask[row])[:, 0]]
        assert torch.equal(layout.input_ids[0, index], tokens)
        assert torch.equal(layout.position_ids[0, index], torch.arange(len(tokens)))


def test_packing_declined_for_a_mask_with_holes():
    input_ids, attention_mask = padded([torch.arange(10, 20), torch.arange(30, 40)])
    attention_mask[0, 4] = 0
    assert packing.plan_packing(input_ids, attention_mask) is None


def test_supports_packing_per_attention_implementation():
    model = tiny_causal_lm()
    for implementation, expected in (("sdpa", True), ("eager", True), ("flash_attention_2", False)):
        model.config._attn_implementation = implementation
        assert packing.supports_packing(model) == expected
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window = 8
    assert not packing.supports_packing(model)



def test_packing_unsupported_reason_names_what_rules_packing_out():
    model = tiny_causal_lm()
    assert packing.packing_unsupported_reason(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "'flash_attention_2'" in packing.packing_unsupported_reason(model)
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window = 8
    assert "sliding-window" in packing.packing_unsupported_reason(model)


def test_a_ppo_step_that_cannot_pack_says_so_once_with_the_reason(caplog):
    """share_prompt_prefix asks for packing; a model that cannot run packed runs the padded rows (the same
    results) and says why, once, not silently. share_prompt_prefix=False asks for the padded rows: no warning."""
    from textenv.ppo import windowed_forward

    windowed_forward._warned_padded.clear()
    model = make_model()
    model.pretrained_model.config.sliding_window = 8  # Llama ignores it; packing.packing_unsupported_reason does not
    trainer = make_trainer(model=model)
    with caplog.at_level("WARNING", logger="textenv.ppo.windowed_forward"):
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
        trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    warned = [record.getMessage() for record in caplog.records if "run the padded rows" in record.getMessage()]
    assert len(warned) == 1 and "sliding-window" in warned[0] and "share_prompt_prefix=False" in warned[0]
    caplog.clear()
    windowed_forward._warned_padded.clear()
    with caplog.at_level("WARNING", logger="textenv.ppo.windowed_forward"):
        make_trainer(model=make_model(), share_prompt_prefix=False).step(QUERIES, RESPONSES, SCORES, MASKS)
    assert not [record for record in caplog.records if "run the padded rows" in record.getMessage()]


BRANCH = torch.arange(130, 148)  # the first two queries go on sharing these after PROMPT: a prefix tree
TREE_ROWS = [torch.cat([PROMPT, BRANCH, torch.tensor([7, 8]), RESPONSES[0]]), torch.cat([PROMPT, BRANCH, RESPONSES[1]]),
             torch.cat([QUERIES[2], RESPONSES[2]])]


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("tree", [False, True], ids=["common-prefix", "prefix-tree"])
def test_packed_forward_equals_padded_forward(attn_implementation, share_prefix, tree, float64_eager_softmax):
    model = float64_model(make_model(attn_implementation=attn_implementation)).eval()  # no value-head dropout
    rows = TREE_ROWS if tree else [torch.cat([q, r]) for q, r in zip(QUERIES, RESPONSES)]
    input_ids, attention_mask = padded(rows)
    layout = packing.plan_packing(input_ids, attention_mask, share_prefix=share_prefix)
    assert layout.prefix_len == (share_prefix and (48 if tree else 30))
    with torch.no_grad():
        logits, _, values = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=slice(0, None))
        with packing.packed_attention(model.causal_lm.config):
            packed_logits, _, packed_values = model(
                input_ids=layout.input_ids, position_ids=layout.position_ids, logits_to_keep=slice(0, None), packed_rows=layout
            )
    assert model.causal_lm.config._attn_implementation == attn_implementation  # switched back
    terms = forward_terms(model.config, layout.input_ids.shape[1])
    for row, length in enumerate(len(r) for r in rows):
        index = layout.token_index[row, :length]
        assert_reordered_close(packed_logits[0, index], logits[row, :length], terms, f"row {row} logits")
        assert_reordered_close(packed_values[0, index], values[row, :length], terms, f"row {row} values")


def test_packed_attention_without_layout_is_an_error():
    model = make_model().eval()
    with packing.packed_attention(model.causal_lm.config), pytest.raises(RuntimeError, match="packed_rows"):
        model(input_ids=torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_shared_prefix_step_equals_full_rows(attn_implementation, float64_eager_softmax):
    shapes = []

    def record(module, args, kwargs):
        shapes.append(tuple((kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]).shape[:2]))

    results = []
    for share in (False, True):
        model = float64_model(make_model(attn_implementation=attn_implementation))
        handle = model.pretrained_model.model.register_forward_pre_hook(record, with_kwargs=True)
        results.append(float64_step_results(model=model, share_prompt_prefix=share))
        handle.remove()
    assert_same_float64_step(*results)
    packed_len = 30 + sum(len(q) + len(r) - 30 for q, r in zip(QUERIES, RESPONSES))
    padded_len = max(len(q) + len(r) for q, r in zip(QUERIES, RESPONSES))
    assert (3, padded_len) in shapes and (1, packed_len) in shapes  # both layouts really ran


def test_full_kl_penalty_takes_the_full_logit_passes():
    """kl_penalty="full" needs every position's distribution: `step` runs `batched_forward_pass` with logits, and
    the summed KL over the vocabulary is never negative (the sampled-token estimate "kl" can be). Against another
    model (the policy's own copy gives exactly 0), in float64: every row's KL is positive beyond the rounding of
    its sums (V terms per position, at most 10 positions a row, of log-probabilities of size log V)."""
    model = float64_model(make_model())
    trainer = make_trainer(model=model, ref_model=float64_model(make_model(seed=1)), optimizer=sgd(model, 1e-3), kl_penalty="full")
    stats = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
    assert trainer._runs_legacy_forward()
    config = model.config
    rounding = max(len(r) for r in RESPONSES) * reduction_tolerance(config.vocab_size, float(np.log(config.vocab_size)), torch.float64)
    assert stats["objective/kl"] > 0 and min(stats["objective/kl_dist"]) > rounding


def test_shared_prefix_and_step_in_backward_with_gradient_checkpointing():
    """Gradient checkpointing recomputes the same forward pass and the fused step applies the same update to the
    same gradient, on the same packed layout: bit for bit the plain step (the packed layout against the padded
    one: test_shared_prefix_step_equals_full_rows)."""
    plain = step_results(step_in_backward=False)
    checkpointed = step_results(gradient_checkpointing=True, step_in_backward=True)
    assert checkpointed[0].step_in_backward is not None and checkpointed[0].config.share_prompt_prefix
    assert_identical_step(plain, checkpointed)


def test_shared_prefix_on_peft_model_with_disabled_adapter_reference():
    from peft import LoraConfig

    results = []
    for share in (False, True):
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_causal_lm(), peft_config=lora)
        initial = flat_weights(float64_model(model))
        # two steps: the adapters trained, a non-zero KL to compare
        trainer, stats, weights = float64_step_results(model=model, share_prompt_prefix=share, learning_rate=1e-2, steps=2)
        assert trainer.ref_model is None
        results.append((trainer, stats, weights))
    assert results[1][1]["objective/kl"] != 0.0
    assert_same_float64_step(*results, learning_rate=1e-2, optimizer_steps=4, initial=initial)


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
