"""The PPO step's fast paths, part 1: rows packed around a shared prompt prefix (the packing layout, packed forward
passes, the packed step) give the results of the padded rows (tolerances: tests/ppo_fast_paths_helpers.py)."""

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead
from textenv.ppo import packing
from textenv.testing import tiny_causal_lm

from numerics import assert_reordered_close, float64_model, forward_terms, reduction_tolerance, sgd
from ppo_fast_paths_helpers import (
    MASKS,
    PROMPT,
    QUERIES,
    RESPONSES,
    SCORES,
    assert_identical_step,
    assert_same_float64_step,
    flat_weights,
    float64_step_results,
    make_model,
    make_trainer,
    step_results,
)


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
