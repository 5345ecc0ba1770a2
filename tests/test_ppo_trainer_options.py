"""PPOTrainer on a tiny random Llama with hand-made tensors (legacy tests/test_ppo_trainer.py, adapted), part 2:
optimisation options (gradient accumulation, clipping, early stopping, KL controllers and penalties, score scaling,
PEFT), generation, logging and saving (tolerances: tests/ppo_trainer_helpers.py)."""

import numpy as np
import pytest
import torch

from textenv.ppo import AutoModelForCausalLMWithValueHead

from numerics import float64_model, float64_sgd_tolerance
from ppo_trainer_helpers import QUERY, RESPONSE, batch, flat_weights, float64_trainer, make_model, make_trainer, tiny_lm


# --------------------------------------------------------------------------------------------------
# optimisation options
# --------------------------------------------------------------------------------------------------
def test_gradient_accumulation_equivalence():
    weights = []
    for mini_batch_size, accumulation in ((2, 1), (1, 2)):
        trainer = float64_trainer(mini_batch_size=mini_batch_size, gradient_accumulation_steps=accumulation)
        trainer.step(*batch())
        weights.append(flat_weights(trainer.accelerator.unwrap_model(trainer.model)))
    config = trainer.model.config
    tolerance = float64_sgd_tolerance(config, len(QUERY) + len(RESPONSE), 2 * len(RESPONSE), learning_rate=1e-3, steps=1)
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=tolerance)
    # and it did train
    assert not torch.equal(weights[0], flat_weights(float64_model(make_model())))


def _recorded_grad_norms(trainer):
    norms = []
    original_step = trainer.optimizer.step

    def step(*args, **kwargs):
        grads = [p.grad for p in trainer.trainable_params if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
        return original_step(*args, **kwargs)

    trainer.optimizer.step = step
    return norms


def test_max_grad_norm_applies_on_every_call():
    clipped = make_trainer(max_grad_norm=1e-3, ppo_epochs=2)
    norms = _recorded_grad_norms(clipped)
    clipped.step(*batch())
    clipped.step(*batch())
    assert len(norms) == 2 * 2 * 2
    assert max(norms) <= 1e-3 * 1.001

    unclipped = make_trainer(step_in_backward=False)  # optimizer.step() sees all gradients at once
    free_norms = _recorded_grad_norms(unclipped)
    unclipped.step(*batch())
    assert min(free_norms) > 1e-2


def test_early_stopping_stops_after_first_epoch():
    steps = {}
    for early in (False, True):
        trainer = make_trainer(early_stopping=early, target_kl=-100.0, ppo_epochs=4, step_in_backward=False)
        calls = _recorded_grad_norms(trainer)
        trainer.step(*batch())
        steps[early] = len(calls)
    assert steps[False] == 8 and steps[True] == 2


def test_ratio_threshold_skips_batch():
    trainer = make_trainer(ratio_threshold=0.0)
    before = flat_weights(trainer.model)
    with pytest.warns(UserWarning, match="Skipping batch"):
        stats = trainer.step(*batch())
    assert stats["ppo/loss/total"] == 0.0
    assert torch.equal(flat_weights(trainer.model), before)


def test_adaptive_and_fixed_kl_controllers():
    reference = make_model(seed=1)
    adaptive = make_trainer(ref_model=reference, init_kl_coef=0.2, target=6.0, horizon=10.0)
    stats = adaptive.step(*batch())
    error = float(np.clip(stats["objective/kl"] / 6.0 - 1, -0.2, 0.2))
    assert adaptive.kl_ctl.value == pytest.approx(0.2 * (1 + error * 2 / 10.0))
    value_after_first = adaptive.kl_ctl.value
    assert adaptive.step(*batch())["objective/kl_coef"] == pytest.approx(value_after_first)
    assert adaptive.kl_ctl.value != value_after_first
    fixed = make_trainer(ref_model=make_model(seed=1), adap_kl_ctrl=False, init_kl_coef=0.2)
    fixed.step(*batch())
    assert fixed.kl_ctl.value == 0.2


@pytest.mark.parametrize("penalty", ["kl", "abs", "mse", "full"])
def test_kl_penalties_in_step(penalty):
    same = make_trainer(kl_penalty=penalty).step(*batch())
    assert same["objective/kl"] == 0.0  # the reference is a copy: the same kernels on the same inputs
    different = make_trainer(kl_penalty=penalty, ref_model=make_model(seed=1)).step(*batch())
    assert different["objective/kl"] != pytest.approx(0.0, abs=1e-3)
    if penalty != "kl":
        assert different["objective/kl"] > 0
        assert different["ppo/mean_non_score_reward"] < 0


def test_score_scaling_norm_and_clip():
    queries, responses, _ = batch()
    scores = [torch.tensor(4.0), torch.tensor(-8.0)]
    clipped = make_trainer(score_clip=0.5).step(queries, responses, scores)
    assert clipped["ppo/mean_scores"] == pytest.approx(0.0)
    assert clipped["ppo/std_scores"] == pytest.approx(np.std([0.5, -0.5], ddof=1))
    trainer = make_trainer(use_score_scaling=True)
    scaled = trainer.step(queries, responses, scores)
    std = trainer.running.std
    assert scaled["ppo/mean_scores"] == pytest.approx(-2.0 / std, rel=1e-5)
    trainer = make_trainer(use_score_scaling=True, use_score_norm=True)
    normed = trainer.step(queries, responses, scores)
    assert normed["ppo/mean_scores"] == pytest.approx((-2.0 - trainer.running.mean) / trainer.running.std, rel=1e-5)


def test_peft_model_uses_disabled_adapters_as_reference():
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = AutoModelForCausalLMWithValueHead.from_pretrained(tiny_lm(), peft_config=lora)
    trainer = make_trainer(model=model, learning_rate=1e-2)
    assert trainer.ref_model is None
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n and "v_head" not in n}
    first = trainer.step(*batch())
    assert first["objective/kl"] == 0.0  # LoRA B starts at zero: the adapters add exact zeros
    second = trainer.step(*batch())
    assert second["objective/kl"] != 0.0  # adapters trained: policy differs from the reference
    for name, param in model.named_parameters():
        if name in base_before:
            assert torch.equal(param, base_before[name]), name


# --------------------------------------------------------------------------------------------------
# generation, logging, saving
# --------------------------------------------------------------------------------------------------
def test_generate_single_batched_and_reference(tokenizer):
    trainer = make_trainer(tokenizer=tokenizer)
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=-1)
    queries = [torch.tensor([504, 3616, 339]), torch.tensor([504, 3616, 339, 2691, 288])]
    single = [trainer.generate(q, return_prompt=False, **kwargs) for q in queries]
    assert single[0].shape == (1, 4)
    assert trainer.generate(queries[0], **kwargs).shape == (1, 7)
    batched = trainer.generate(queries, batch_size=2, return_prompt=False, **kwargs)
    for one, many in zip(single, batched):
        assert torch.equal(one[0], many)
    with pytest.raises(ValueError, match="1-D"):
        trainer.generate(torch.stack([queries[0], queries[0]]))

    ref = trainer.ref_model.pretrained_model.lm_head
    ref.weight = torch.nn.Parameter(-ref.weight.detach().clone(), requires_grad=False)
    response, ref_response = trainer.generate(queries, return_prompt=False, generate_ref_response=True, **kwargs)
    assert any(not torch.equal(a, b) for a, b in zip(response, ref_response))


def test_generate_cuts_after_generated_eos_only(tokenizer):
    trainer = make_trainer(tokenizer=tokenizer)
    eos = tokenizer.eos_token_id
    query = torch.tensor([504, eos, 339])  # the prompt itself contains EOS (chat templates do)
    out = trainer.generate([query], return_prompt=True, max_new_tokens=3, do_sample=False, pad_token_id=eos)[0]
    assert torch.equal(out[:3], query) and len(out) > 3


def test_log_stats_with_tensorboard(tmp_path, tokenizer):
    trainer = make_trainer(tokenizer=tokenizer, log_with="tensorboard", project_kwargs={"logging_dir": str(tmp_path)})
    stats = trainer.step(*batch())
    trainer.log_stats(stats, {"query": ["a", "b"], "response": ["c", "d"]}, [torch.tensor(1.0), torch.tensor(0.0)])
    trainer.accelerator.end_training()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list(tmp_path.rglob("events.out.tfevents*"))
    assert files
    tags = set()
    for file in files:
        accumulator = EventAccumulator(str(file))
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert {"env/reward_mean", "objective/kl", "ppo/loss/total"} <= tags


def test_save_pretrained_round_trip(tmp_path, tokenizer):
    trainer = make_trainer(tokenizer=tokenizer, learning_rate=1e-2)
    trainer.step(*batch())
    trainer.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer_config.json").is_file()
    loaded = AutoModelForCausalLMWithValueHead.from_pretrained(str(tmp_path))
    trained = trainer.accelerator.unwrap_model(trainer.model)
    assert torch.equal(loaded.v_head.summary.weight, trained.v_head.summary.weight)
    assert torch.equal(flat_weights(loaded), flat_weights(trained))
