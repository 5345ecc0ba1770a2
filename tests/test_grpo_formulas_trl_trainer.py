"""textenv's GRPO computes what TRL 1.16's `GRPOTrainer` computes, on the same inputs: parts 2 and 3 of the comparison
with TRL, against a real TRL trainer (part 1, the loss on given log-probabilities: tests/test_grpo_formulas_loss.py).

2. the advantages: a real TRL `GRPOTrainer` on a tiny random model, its generation replaced by fixed completions,
   runs `_generate_and_score_completions` (reward functions, ``scale_rewards``, everything after generation);
3. end to end: one `textenv.grpo.GRPOTrainer.step` on a tiny model against a real TRL trainer's
   `_generate_and_score_completions`, `_compute_loss` and backward on a copy of the same weights: the gradients
   of every optimizer step, the advantages and the logged statistics.

Tolerances (tests/numerics.py has the analysis): the two sides compute the same formulas in other orders, so they
agree only in exact arithmetic, except where noted.
- part 2 stays float32 (TRL makes its reward tensor float32): each advantage within `reduction_tolerance` of its
  group's (or the batch's) sums at ``max |reward| / (std + 1e-4)``. The division by the std amplifies the
  rounding of ``reward - mean``, up to 10^4 times in a tied group (std 0), where both sides give 0 only in exact
  arithmetic. The fraction of zero-std groups is a count over a count: exact;
- part 3 stays float32: TRL computes the LM head's log-softmax in float32 (its chunked log-prob kernel
  accumulates in float32 whatever the model's dtype), so a float64 model would not make the comparison float64.
  Gradients within `reduction_tolerance` of `backward_terms` at the tensor's largest entry, a weight after an SGD
  step within `rounding_tolerance` of the update's 3 roundings, the advantages as in part 2, the entropy and the KL
  within `forward_terms` plus the tokens summed at log V (the size of the log-probabilities they combine), the
  clip ratios within a few float32 roundings (TRL rounds each mini-batch's fraction to float32).
"""

import dataclasses
import math

import pytest
import torch
import trl
from packaging.version import Version

if Version(trl.__version__) < Version("1.16"):
    pytest.skip(
        f"compares textenv's GRPO with TRL 1.16's GRPOTrainer; trl {trl.__version__} is installed",
        allow_module_level=True,
    )

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig as TRLGRPOConfig  # noqa: E402
from trl import GRPOTrainer as TRLGRPOTrainer  # noqa: E402

from textenv.grpo import core  # noqa: E402
from textenv.grpo.config import GRPOArguments, GRPOConfig  # noqa: E402
from textenv.grpo.trainer import GRPOTrainer  # noqa: E402
from textenv.models import load_tokenizer  # noqa: E402
from textenv.testing import tiny_causal_lm  # noqa: E402

from grpo_formulas_helpers import (  # noqa: E402
    EPSILON,
    EPSILON_HIGHS,
    LOSS_TYPES,
    advantage_tolerance,
    assert_close,
    trl_loss_self,
)
from numerics import backward_terms, forward_terms, reduction_tolerance, rounding_tolerance  # noqa: E402


# --------------------------------------------------------------------------------------------------
# a real TRL GRPOTrainer whose generation returns fixed completions
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def fixed_reward(completions, reward, **kwargs):
    """The reward function of the TRL trainers: the dataset row's ``reward`` column."""
    return list(reward)


def make_trl_trainer(tmp_path, tokenizer, model, **config):
    """A TRL `GRPOTrainer` on `model` (an instance, or a folder TRL also loads the reference from), float32 on the
    CPU (TRL's bf16 default would autocast), not reporting anywhere."""
    args = TRLGRPOConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False, **config)
    dataset = Dataset.from_dict({"prompt": ["unused"] * args.generation_batch_size, "reward": [0.0] * args.generation_batch_size})
    return TRLGRPOTrainer(model=model, reward_funcs=[fixed_reward], args=args, train_dataset=dataset, processing_class=tokenizer)


def trl_generation_batch(trainer, prompt_ids, completion_ids, rewards, tool_masks=None):
    """Run TRL's `_generate_and_score_completions` in training mode with its `_generate` returning the given token
    ids (TRL 1.16's tuple: prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, images,
    tool_images) and the reward function returning `rewards`: TRL's padding, masks, old and reference
    log-probabilities, token count and advantages."""

    def generate(prompts):
        assert len(prompts) == len(prompt_ids)
        completions = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return prompt_ids, completion_ids, tool_masks, completions, None, {}, None, []

    trainer._generate = generate
    trainer.model.train()  # the mode the training loop calls it in ("train": num_generations, the train batch size)
    return trainer._generate_and_score_completions([{"prompt": "unused", "reward": float(r)} for r in rewards])


# --------------------------------------------------------------------------------------------------
# part 2: advantages
# --------------------------------------------------------------------------------------------------
REWARDS = {
    # group size 2: four groups, the second tied (zero std)
    2: [0.3, 1.7, 2.0, 2.0, -1.0, 4.0, 0.5, 0.25],
    # group size 4: a spread group and a tied group
    4: [1.0, 2.0, 3.0, 5.0, 1.5, 1.5, 1.5, 1.5],
}


@pytest.fixture(scope="module")
def advantage_model():
    return tiny_causal_lm(seed=0, hidden_size=16, num_layers=1)


@pytest.mark.parametrize("scale_rewards", ("group", "batch", "none"))
@pytest.mark.parametrize("num_generations", sorted(REWARDS))
@pytest.mark.parametrize("all_tied", (False, True), ids=("rewards", "all_tied"))
def test_advantages_equal_trl(tmp_path, tokenizer, advantage_model, num_generations, scale_rewards, all_tied):
    """`group_advantages` against the advantages of TRL's `_generate_and_score_completions` (one process, one
    reward function: "sum_then_normalize"), and the fraction of groups with zero reward std it logs."""
    # 0.75: the tied rewards' means and stds are exact in any order (std exactly 0, advantages exactly 0). With
    # 0.7, float32's mean of four 0.7s is not 0.7, the std is rounding noise, and whether `isclose(std, 0)`
    # (absolute 1e-8) counts the group as tied would depend on the summation order.
    rewards = [0.75] * 8 if all_tied else REWARDS[num_generations]
    trainer = make_trl_trainer(tmp_path, tokenizer, advantage_model, num_generations=num_generations,
                               per_device_train_batch_size=len(rewards), scale_rewards=scale_rewards, max_completion_length=4)
    completion_ids = [[100 + row, tokenizer.eos_token_id] for row in range(len(rewards))]
    batch = trl_generation_batch(trainer, [[10, 11, 12]] * len(rewards), completion_ids, rewards)
    advantages, std_rewards = core.group_advantages(torch.tensor(rewards), num_generations, scale_rewards)
    assert_close(advantages, batch["advantages"], advantage_tolerance(rewards, num_generations, scale_rewards), what="advantages")
    zero_std = torch.isclose(std_rewards, torch.zeros_like(std_rewards)).float().mean()  # as GRPOTrainer._step_stats
    assert zero_std.item() == trainer._metrics["train"]["frac_reward_zero_std"][-1]  # a count over a count
    if not all_tied and scale_rewards != "none":  # the data are not a trivial case
        assert batch["advantages"].abs().max() > 0.5


def test_shared_defaults_and_epsilon_high_default_equal_trl(tmp_path, tokenizer, advantage_model):
    """The GRPO fields textenv shares with TRL's GRPOConfig have TRL's defaults (but max_completion_length, whose
    None means the batch's longest response, and gradient_accumulation_steps, None: one optimizer step per batch),
    and an unset epsilon_high is epsilon in both (TRL resolves it in GRPOTrainer.__init__)."""
    trl_defaults = {field.name: field.default for field in dataclasses.fields(TRLGRPOConfig)}
    for field in dataclasses.fields(GRPOArguments):
        if field.name not in ("max_completion_length", "gradient_accumulation_steps"):
            assert field.default == trl_defaults[field.name], field.name
    for epsilon_high in EPSILON_HIGHS:
        trainer = make_trl_trainer(tmp_path, tokenizer, advantage_model, num_generations=2, per_device_train_batch_size=2,
                                   epsilon=0.15, epsilon_high=epsilon_high)
        config = GRPOConfig(batch_size=2, mini_batch_size=2, num_generations=2, epsilon=0.15, epsilon_high=epsilon_high)
        assert (config.epsilon_low, config.upper_epsilon) == (trainer.epsilon_low, trainer.epsilon_high)


def test_stand_in_settings_are_trl_defaults(tmp_path, tokenizer, advantage_model):
    """The settings `trl_loss_self` fixes are those of a TRL trainer built with TRL's defaults (so part 1 checks
    the default code path of `_compute_loss`), but use_bias_correction_kl (test_kl_term_with_trl_default_bias_correction)."""
    trainer = make_trl_trainer(tmp_path, tokenizer, advantage_model, num_generations=2, per_device_train_batch_size=2)
    stand_in = trl_loss_self(loss_type="dapo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2, logps=None, entropies=None)
    for name in ("importance_sampling_level", "top_entropy_quantile", "off_policy_mask_threshold", "use_vllm",
                 "_entropy_bonus_enabled", "aux_loss_enabled", "loss_type", "beta", "epsilon_low", "epsilon_high"):
        assert getattr(trainer, name) == getattr(stand_in, name), name
    assert trainer.args.delta is stand_in.args.delta is None
    assert trainer.args.use_bias_correction_kl is True and stand_in.args.use_bias_correction_kl is False


# --------------------------------------------------------------------------------------------------
# part 3: one step of textenv's GRPOTrainer against TRL's trainer on the same tiny model
# --------------------------------------------------------------------------------------------------
# Prompts of equal length: textenv passes position_ids counting real tokens only (a left-padded row starts at 0,
# as when it was generated), TRL's forward passes none, so the model numbers a left-padded row's tokens from the
# padding on. Without left padding both number them 0, 1, 2, ...; the comparison is then of the GRPO math and its
# plumbing, not of that (deliberate) difference.
E2E_PROMPTS = [[101, 202, 303], [101, 202, 303], [404, 505, 606], [404, 505, 606]]
E2E_COMPLETIONS = [[11, 12, 13, 14, 2], [21, 22, 2], [31, 32, 33, 34, 35, 2], [41, 42, 43, 44]]  # the last: truncated
E2E_TOOL_MASKS = [[1, 0, 0, 1, 1], [1, 1, 1], [1, 1, 0, 0, 1, 1], [1, 0, 1, 1]]  # 0: tool-output tokens
E2E_REWARDS = [1.0, 0.0, 0.5, 2.0]
# SGD steps that take some of the second optimizer step's ratios out of the clip range without blowing them up
# (dr_grpo's loss is the smallest: a sum over B * max_completion_length)
E2E_LEARNING_RATES = {"grpo": 0.5, "dr_grpo": 1.0, "dapo": 0.5}


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that keeps a copy of the weights and the gradients of each step (those textenv's trainer
    accumulated) before applying it."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.weights, self.grads = [], []

    @torch.no_grad()
    def step(self, closure=None):
        params = [p for group in self.param_groups for p in group["params"]]
        self.weights.append([p.clone() for p in params])
        self.grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
        return super().step(closure)


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """A mini-batch of TRL's generation batch (as `split_tensor_dict`: per-row tensors indexed, scalars kept)."""
    return {key: value[rows] if isinstance(value, torch.Tensor) and value.dim() > 0 else value for key, value in batch.items()}


def weighted_mean(values, weights):
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


@pytest.mark.parametrize("accumulation_steps", (2, 1), ids=("on_policy", "two_optimizer_steps"))
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_one_step_on_a_tiny_model_equals_trl(tmp_path, tokenizer, monkeypatch, loss_type, accumulation_steps):
    """`GRPOTrainer.step` on 4 episodes (2 groups of 2, tool tokens, one truncated episode masked out) in 2
    mini-batches, an optimizer step every `accumulation_steps`, with a KL term, against a TRL trainer on the same
    weights: TRL's generation batch (padding, masks, token count, old and reference log-probabilities from the
    initial weights, advantages), then `_compute_loss` and backward on the same mini-batches in the same order.

    Each optimizer step's gradients are compared at the weights textenv's step had (the first: the initial ones,
    checked; the second: those after the first step, checked to be the first step's SGD update), so that the
    float32 rounding of one side's first update does not carry into the second comparison. Then the advantages
    and the logged statistics (token-weighted over the mini-batches)."""
    beta, temperature, mini_batch_size, max_completion_length = 0.04, 0.7, 2, 8
    model = tiny_causal_lm(seed=3)
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)  # TRL loads the policy and its reference (beta > 0) from here

    trl_trainer = make_trl_trainer(
        tmp_path, tokenizer, str(model_dir), num_generations=2, per_device_train_batch_size=mini_batch_size,
        steps_per_generation=len(E2E_REWARDS) // mini_batch_size, gradient_accumulation_steps=accumulation_steps,
        loss_type=loss_type, beta=beta, epsilon=EPSILON, epsilon_high=0.28, temperature=temperature,
        max_completion_length=max_completion_length, mask_truncated_completions=True)  # use_bias_correction_kl: both default True
    trl_batch = trl_generation_batch(trl_trainer, E2E_PROMPTS, E2E_COMPLETIONS, E2E_REWARDS, E2E_TOOL_MASKS)
    assert ("old_per_token_logps" in trl_batch) == (accumulation_steps == 1)  # TRL is off-policy with 2 steps

    config = GRPOConfig(batch_size=len(E2E_REWARDS), mini_batch_size=mini_batch_size, num_generations=2,
                        gradient_accumulation_steps=accumulation_steps, loss_type=loss_type, beta=beta, epsilon=EPSILON,
                        epsilon_high=0.28, temperature=temperature, max_completion_length=max_completion_length,
                        mask_truncated_completions=True, max_grad_norm=None)
    initial_weights = [p.detach().clone() for p in model.parameters()]
    learning_rate = E2E_LEARNING_RATES[loss_type]
    optimizer = RecordingSGD(model.parameters(), lr=learning_rate)
    trainer = GRPOTrainer(config, model=model, tokenizer=tokenizer, optimizer=optimizer)
    orders = []  # the mini-batch order textenv draws (its one shuffle per batch), for TRL's side

    def recording_randperm(*args, _randperm=torch.randperm, **kwargs):
        orders.append(_randperm(*args, **kwargs))
        return orders[-1]

    monkeypatch.setattr(torch, "randperm", recording_randperm)
    stats = trainer.step(
        [torch.tensor(ids) for ids in E2E_PROMPTS], [torch.tensor(ids) for ids in E2E_COMPLETIONS],
        [torch.tensor(r) for r in E2E_REWARDS], [torch.tensor(m) for m in E2E_TOOL_MASKS],
        truncated=[ids[-1] != tokenizer.eos_token_id for ids in E2E_COMPLETIONS])
    monkeypatch.undo()
    assert len(orders) == 1
    windows = config.mini_batches // accumulation_steps
    assert len(optimizer.grads) == windows

    # TRL's side: the training loop's work for these mini-batches (transformers' Trainer sets
    # current_gradient_accumulation_steps to the window's mini-batches; the backward is accelerator.backward's)
    trl_model = trl_trainer.model
    trl_trainer.current_gradient_accumulation_steps = accumulation_steps
    names, params = zip(*trl_model.named_parameters())
    for name, weight, initial in zip(names, optimizer.weights[0], initial_weights, strict=True):
        assert torch.equal(weight, initial), name  # the first step starts from the weights TRL loaded
    tokens_per_mini_batch = []
    length = len(E2E_PROMPTS[0]) + max(map(len, E2E_COMPLETIONS))
    trained_tokens = sum(sum(mask) for mask in E2E_TOOL_MASKS)
    gradient_terms = backward_terms(model.config, length, trained_tokens)
    for window in range(windows):
        if window > 0:  # textenv's weights at this step are the previous step's SGD update
            for name, weight, previous, grad in zip(names, optimizer.weights[window], optimizer.weights[window - 1],
                                                    optimizer.grads[window - 1], strict=True):
                update = rounding_tolerance(3, float(previous.abs().max() + learning_rate * grad.abs().max()))  # product, sum, and SGD's own
                assert_close(weight, previous - learning_rate * grad, update, what=f"{name} before step {window}")
        with torch.no_grad():
            for param, weight in zip(params, optimizer.weights[window], strict=True):
                param.copy_(weight)
                param.grad = None
        for index in range(window * accumulation_steps, (window + 1) * accumulation_steps):
            mini_batch = select_rows(trl_batch, orders[0][index * mini_batch_size : (index + 1) * mini_batch_size])
            trl_trainer._compute_loss(trl_model, mini_batch).backward()
            tokens_per_mini_batch.append((mini_batch["completion_mask"] * mini_batch["tool_mask"]).sum().item())
        for name, grad, param in zip(names, optimizer.grads[window], params, strict=True):
            # float32 reductions in other orders (TRL's chunked log-softmax over the vocabulary, its padding)
            magnitude = max(float(grad.abs().max()), float(param.grad.abs().max()))
            assert_close(grad, param.grad, reduction_tolerance(gradient_terms, magnitude),
                         what=f"optimizer step {window}: gradient of {name}")
        assert max(param.grad.abs().max().item() for param in params) > 1e-3  # the step moves the weights
    if accumulation_steps == 1:  # the second step is off-policy: the policy is no longer the one that sampled
        mini_batch = select_rows(trl_batch, orders[0][mini_batch_size:])
        with torch.no_grad():
            logps, _, _ = trl_trainer._get_per_token_logps_and_entropies(
                trl_model, torch.cat([mini_batch["prompt_ids"], mini_batch["completion_ids"]], dim=1),
                torch.cat([mini_batch["prompt_mask"], mini_batch["completion_mask"]], dim=1), mini_batch["completion_ids"].shape[1])
        trained = (mini_batch["completion_mask"] * mini_batch["tool_mask"]).bool()
        ratio = torch.exp(logps - mini_batch["old_per_token_logps"])[trained]
        assert ((ratio < 1 - EPSILON) | (ratio > 1.28)).any()  # some tokens are outside the clip range

    assert_close(stats["grpo/advantages"], trl_batch["advantages"], advantage_tolerance(E2E_REWARDS, 2, "group"), what="advantages")
    metrics = trl_trainer._metrics["train"]
    log_vocabulary = math.log(model.config.vocab_size)  # the size of the log-probabilities an entropy or a KL combines
    statistic_tolerance = reduction_tolerance(forward_terms(model.config, length) + trained_tokens, log_vocabulary)
    for stat, metric in (("objective/entropy", "entropy"), ("objective/kl", "kl")):
        assert_close(stats[stat], weighted_mean(metrics[metric], tokens_per_mini_batch), statistic_tolerance, what=stat)
    for stat, metric in (("grpo/clip_ratio/low_mean", "clip_ratio/low_mean"), ("grpo/clip_ratio/high_mean", "clip_ratio/high_mean"),
                         ("grpo/clip_ratio/region_mean", "clip_ratio/region_mean")):
        # counts over counts; TRL rounds each mini-batch's fraction to float32 before they are weighted here
        assert_close(stats[stat], weighted_mean(metrics[metric], tokens_per_mini_batch), rounding_tolerance(2 + windows * accumulation_steps, 1.0),
                     what=stat)
    assert stats["tokens/trained"] == sum(tokens_per_mini_batch) == trl_batch["num_items_in_batch"].item()
