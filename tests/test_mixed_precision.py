"""bf16 mixed precision on CPU, opt-in: the PPO step through accelerate's ``mixed_precision`` and the rollout
through ``mixed_precision=`` of the generation engine, `TextEnvironment` and `GymScheduler`.

Tolerances (tests/numerics.py has the analysis): the bf16 step's statistics against the float32 step's, within
`rounding_tolerance` of `autocast_roundings` bf16 roundings (u = 2^-8) at the statistic's magnitude: under
autocast every matrix product rounds its inputs and output to bf16 but accumulates in float32, so a value's
relative error is bounded by the number of bf16 roundings on its chain (37 for the tiny model: 14% relative),
not by the length of its sums. Only statistics that are sums of terms of one sign or of the size of their
terms are compared (a value loss, an entropy, mean values and returns). A bug of the kind mixed precision brings
(a reduction over the vocabulary or the sequence accumulated in bf16) moves them by far more. Exact: the
matmul dtypes, the master weights' dtype, the sampled tokens.
"""

import warnings

import pytest
import torch
from accelerate.state import AcceleratorState

from textenv import TextEnvironment
from textenv.engine import GenerationEngine
from textenv.gym import GymScheduler
from textenv.ppo import AutoModelForCausalLMWithValueHead, PPOConfig, PPOTrainer
from textenv.testing import tiny_causal_lm

from numerics import autocast_roundings, rounding_tolerance

QUERIES = [torch.arange(100, 130), torch.arange(200, 220), torch.arange(300, 341)]
RESPONSES = [torch.arange(400, 410), torch.arange(500, 506), torch.arange(600, 612)]
SCORES = [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(0.5)]
MASKS = [torch.tensor([1] * 4 + [0] * 3 + [1] * 3), torch.ones(6), torch.ones(12)]


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    AcceleratorState._reset_state(True)  # mixed precision is process-wide state in accelerate
    yield
    AcceleratorState._reset_state(True)


def matmul_dtypes(model):
    """Record the output dtype of one MLP projection of ``model``."""
    seen = []
    layer = model.pretrained_model.model.layers[0] if hasattr(model, "pretrained_model") else model.model.layers[0]
    layer.mlp.down_proj.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    return seen


@pytest.mark.parametrize("kl_penalty", ["kl", "full"])  # the fast path and the legacy forward passes
def test_ppo_step_in_bf16_runs_matmuls_in_bf16_and_stays_close_to_fp32(kl_penalty):
    results = {}
    for mixed_precision in ("no", "bf16"):
        AcceleratorState._reset_state(True)
        model = AutoModelForCausalLMWithValueHead(tiny_causal_lm(seed=0))
        seen = matmul_dtypes(model)
        config = PPOConfig(batch_size=3, mini_batch_size=3, ppo_epochs=2, learning_rate=1e-3, kl_penalty=kl_penalty,
                           accelerator_kwargs={"mixed_precision": mixed_precision})
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="No dataset is provided")
            trainer = PPOTrainer(config, model)
        results[mixed_precision] = trainer.step(QUERIES, RESPONSES, SCORES, MASKS)
        expected = torch.bfloat16 if mixed_precision == "bf16" else torch.float32
        assert seen and set(seen) == {expected}, mixed_precision  # every pass, reference included
        assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay fp32
    roundings = autocast_roundings(model.config)
    for key in ("ppo/loss/value", "ppo/val/vpred", "objective/entropy", "ppo/returns/mean"):
        bf16, float32 = float(results["bf16"][key]), float(results["no"][key])
        assert abs(bf16 - float32) <= rounding_tolerance(roundings, max(abs(bf16), abs(float32)), torch.bfloat16), key
    assert results["bf16"]["ppo/loss/value"] != results["no"]["ppo/loss/value"]  # really a different precision


def test_engine_decodes_in_bf16_when_asked(tokenizer):
    model = tiny_causal_lm(seed=1)
    seen = matmul_dtypes(model)
    contexts = [torch.arange(100, 110), torch.arange(200, 207)]
    for mixed_precision, expected in ((None, torch.float32), ("bf16", torch.bfloat16)):
        seen.clear()
        engine = GenerationEngine(model, tokenizer, {"do_sample": False, "max_new_tokens": 4}, mixed_precision=mixed_precision)
        completions = engine.generate_batch(contexts)
        assert [len(completion.token_ids) for completion in completions] == [4, 4]
        assert set(seen) == {expected}
    assert next(model.parameters()).dtype == torch.float32


def test_text_environment_rollout_in_bf16_keeps_exact_tokens(tokenizer):
    model = tiny_causal_lm(seed=2)
    seen = matmul_dtypes(model)
    env = TextEnvironment(model, tokenizer, {}, lambda responses, **kw: [0.0] * len(responses), prompt="Hi",
                          max_turns=2, generation_kwargs={"do_sample": False, "max_new_tokens": 6}, mixed_precision="bf16")
    queries, responses, masks, _, histories = env.run(["a b", "c d e"])
    assert set(seen) == {torch.bfloat16}
    for query, response, history in zip(queries, responses, histories):
        assert torch.equal(torch.cat([query, response]), history.tokens)  # the tokens as sampled, no re-encoding


@pytest.mark.parametrize("make", [
    lambda model, tokenizer: GenerationEngine(model, tokenizer, mixed_precision="bfloat16"),
    lambda model, tokenizer: TextEnvironment(model, tokenizer, {}, None, mixed_precision="fp8"),
    lambda model, tokenizer: GymScheduler(model, tokenizer, mixed_precision="half"),
])
def test_unknown_mixed_precision_is_refused_naming_the_choices(make, tokenizer):
    with pytest.raises(ValueError, match="mixed_precision must be None, 'no', 'bf16' or 'fp16'"):
        make(tiny_causal_lm(), tokenizer)


def test_bundled_model_calculator_rollout_in_bf16(bundled):
    """The real model in bf16 autocast plays calculator episodes with tool calls, exact tokens and masks."""
    from textenv.tasks import calculator as task
    from textenv.tools import Calculator

    model, tokenizer = bundled
    env = TextEnvironment(model, tokenizer, {task.TOOL_NAME: Calculator()}, task.exact_match_reward, task.PROMPT,
                          max_turns=2, generation_kwargs={"do_sample": False, "max_new_tokens": 24}, mixed_precision="bf16")
    queries, answers = task.generate_tasks(4, seed=0)
    _, responses, masks, rewards, histories = env.run(queries, answers=answers)
    assert any("<call>" in history.text for history in histories)  # the model called the tool
    for response, mask, history in zip(responses, masks, histories):
        assert len(mask) == len(response)
        system = [system for span, system in zip(history.token_spans[1:], history.system_spans[1:]) for _ in range(*span)]
        assert mask.tolist() == [0 if flag else 1 for flag in system]  # tool tokens masked, model tokens trained
    assert next(model.parameters()).dtype == torch.float32
