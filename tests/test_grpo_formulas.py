"""textenv's GRPO (`textenv.grpo`) computes what TRL 1.16's `GRPOTrainer` computes, on the same inputs.

TRL's own code is executed, not re-typed:

1. the loss: `GRPOTrainer._compute_loss` runs unbound on a stand-in ``self`` (`trl_loss_self`) carrying the
   attributes that method reads, whose `_get_per_token_logps_and_entropies` hands it given log-probabilities;
   textenv's `core` functions get the same log-probabilities, advantages and masks. Compared: the loss, its
   gradient w.r.t. the log-probabilities (the weight of each token), the per-token loss itself (one trained token
   at a time) and the logged clip ratios and KL;
2. the advantages: a real TRL `GRPOTrainer` on a tiny random model, its generation replaced by fixed completions,
   runs `_generate_and_score_completions` (reward functions, ``scale_rewards``, everything after generation);
3. end to end: one `textenv.grpo.GRPOTrainer.step` on a tiny model against a real TRL trainer's
   `_generate_and_score_completions`, `_compute_loss` and backward on a copy of the same weights: the gradients
   of every optimizer step, the advantages and the logged statistics.

Two details these tests found, and textenv now follows: TRL's default ``use_bias_correction_kl=True`` weights the
KL term by the probability ratio (test_kl_term_with_trl_default_bias_correction), and dapo's token count is
clamped to 1 before it is scaled to the accumulation window (test_dapo_divisor_when_the_batch_trains_one_token).

Tolerances (tests/numerics.py has the analysis): the two sides compute the same formulas in other orders, so they
agree only in exact arithmetic, except where noted.
- part 1 runs in float64 (TRL's `_compute_loss` keeps the dtype of the log-probabilities it is given): the losses,
  token weights, per-token losses and the KL metric within `reduction_tolerance` of ``PER_TOKEN_ROUNDINGS`` plus
  the tokens summed, at `case_magnitude` (a bound of every per-token term and its derivative: |A| times the
  ratio, plus beta times the KL and its derivative). The clip ratios are exact: both sides divide the same
  integer count by the same integer token count in float32, one correctly rounded division;
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

import contextlib
import dataclasses
import math
from collections import defaultdict
from types import SimpleNamespace

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

from numerics import backward_terms, forward_terms, reduction_tolerance, rounding_tolerance  # noqa: E402

FLOAT64 = torch.float64
# Roundings on a token's chain in part 1: the ratio (a difference, exp as 2), its clip, two products with the
# advantage, the min and the sign; the KL (a difference, exp as 2, two subtractions, the product with the ratio
# and with beta, the sum); the mask; the normaliser (one or two divisions)
PER_TOKEN_ROUNDINGS = 20

# --------------------------------------------------------------------------------------------------
# helpers: comparisons, a one-process accelerator, TRL's `_compute_loss` on a stand-in self
# --------------------------------------------------------------------------------------------------


def assert_close(actual, expected, tolerance, what=""):
    """Every entry of ``actual`` within ``tolerance`` (a number, or a tensor of one per entry) of ``expected``;
    both are compared in float64 (a float32 value converts exactly)."""
    actual, expected = torch.as_tensor(actual, dtype=FLOAT64), torch.as_tensor(expected, dtype=FLOAT64)
    assert actual.shape == expected.shape, f"{what}: shapes {tuple(actual.shape)} != {tuple(expected.shape)}"
    difference = (actual - expected).abs()
    assert bool((difference <= torch.as_tensor(tolerance, dtype=FLOAT64)).all()), (
        f"{what}: max |difference| {difference.max().item():.3g} (tolerance {torch.as_tensor(tolerance).max().item():.3g})"
        f"\ntextenv: {actual}\nTRL:     {expected}"
    )


def case_magnitude(case, beta) -> float:
    """A bound of every per-token term of the loss and of its derivative: |A| times the ratio (at least the clip
    bound 1.28), plus beta times the KL ``exp(d) - d - 1`` and its derivative, times the ratio."""
    old = case.logps if case.old is None else case.old
    ratio = max(float((case.logps - old).exp().max()), 1.28)
    magnitude = float(case.advantages.abs().max()) * ratio
    if beta > 0:
        d = float((case.ref - case.logps).abs().max())
        magnitude += beta * 2 * (math.exp(d) + d + 1) * ratio
    return magnitude


def loss_tolerance(case, beta) -> float:
    """Part 1: two orders of a token's chain and of the sum over the case's tokens, in float64."""
    return reduction_tolerance(PER_TOKEN_ROUNDINGS + case.logps.numel(), case_magnitude(case, beta), FLOAT64)


def advantage_tolerance(rewards, num_generations, scale_rewards) -> torch.Tensor:
    """Part 2, one per episode: float32 group advantages ``(r - mean) / (std + 1e-4)`` in two orders: the sums of
    the mean and the variance over the group (the batch for ``"batch"``) and ~6 more roundings (the deviation,
    the square root, the division), of rewards of size max |r| scaled by 1 / (std + 1e-4)."""
    rewards = torch.as_tensor(rewards, dtype=FLOAT64)
    grouped = rewards.view(-1, num_generations)
    if scale_rewards == "batch":
        terms, size, divisor = len(rewards) + 6, rewards.abs().max().expand(len(rewards)), rewards.std() + 1e-4
    else:
        terms = num_generations + 6
        size = grouped.abs().amax(1).repeat_interleave(num_generations)
        divisor = (grouped.std(1) + 1e-4).repeat_interleave(num_generations) if scale_rewards == "group" else 1.0
    return reduction_tolerance(terms, 1.0, torch.float32) * size / divisor


class OneProcessAccelerator:
    """What `_compute_loss` and `_get_per_token_logps_and_entropies` call on `self.accelerator`, for one process
    (accelerate's own `reduce` and `gather` return the tensor unchanged on one process)."""

    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    def autocast(self):
        return contextlib.nullcontext()


def trl_loss_self(*, loss_type, beta, epsilon_low, epsilon_high, logps, entropies, accumulation_steps=1,
                  steps_per_generation=1, max_completion_length=8, use_bias_correction_kl=False):
    """A stand-in ``self`` for `TRLGRPOTrainer._compute_loss` with exactly the attributes it reads for the
    token-level GRPO losses (a `SimpleNamespace` raises on any other), in training mode; its
    `_get_per_token_logps_and_entropies` returns the given `logps` (a leaf requiring grad) and `entropies`.
    The other settings are a TRL trainer's defaults (test_stand_in_settings_are_trl_defaults) but
    `use_bias_correction_kl` (off here, so the plain KL term is checked too; on, with TRL's default, in
    test_kl_term_with_trl_default_bias_correction)."""

    def get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == logps.shape[1] and input_ids.shape[0] == logps.shape[0]
        return logps, entropies, None

    return SimpleNamespace(
        loss_type=loss_type,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        args=SimpleNamespace(delta=None, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=steps_per_generation),
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        current_gradient_accumulation_steps=accumulation_steps,
        max_completion_length=max_completion_length,
        model=SimpleNamespace(training=True),
        accelerator=OneProcessAccelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=get_per_token_logps_and_entropies,
    )


# --------------------------------------------------------------------------------------------------
# part 1 data: 4 completions of up to 6 tokens, right-padded, with tool tokens (tool_mask 0)
# --------------------------------------------------------------------------------------------------
PROMPT_LENGTH, T = 3, 6
COMPLETION_LENGTHS = (6, 4, 5, 2)
TOOL_MASKS = {
    "tools_and_padding": [[1, 1, 0, 0, 1, 1], [1, 0, 1, 1, 1, 1], [1, 1, 1, 0, 0, 1], [0, 1, 1, 1, 1, 1]],
    # row 1 trains nothing (as a truncated episode with mask_truncated_completions)
    "untrained_row": [[1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 1], [0, 1, 1, 1, 1, 1]],
}
ADVANTAGES = (1.5, -0.7, 0.3, -1.2)
# old = logp + shift, so ratio = exp(-shift): +-0.5 puts it outside [1 - 0.2, 1 + 0.28] on either side, +-0.05 inside;
# rolled by one per row, so that the trained tokens of rows of either advantage sign fall on both sides.
OLD_SHIFT = (-0.5, 0.5, 0.05, -0.05, 0.5, -0.5)
EPSILON = 0.2


@dataclasses.dataclass
class LossCase:
    logps: torch.Tensor  # [B, T] the policy's log-probabilities (no grad; each side makes its own leaf)
    old: torch.Tensor | None  # None: on-policy (TRL gets no old_per_token_logps, textenv logps.detach())
    ref: torch.Tensor | None
    entropies: torch.Tensor
    advantages: torch.Tensor
    completion_mask: torch.Tensor  # long, right padding
    tool_mask: torch.Tensor  # long, 0 on tool tokens

    @property
    def mask(self) -> torch.Tensor:
        """textenv's loss_mask: 1 on the trained tokens (model tokens of the response), float."""
        return (self.completion_mask * self.tool_mask).float()

    def trl_inputs(self, num_items_in_batch=None) -> dict:
        """The mini-batch dict `_compute_loss` reads (TRL's layout: prompts left-padded, completions right-padded)."""
        rows = len(self.advantages)
        inputs = {
            "prompt_ids": torch.arange(rows * PROMPT_LENGTH).view(rows, PROMPT_LENGTH) + 10,
            "prompt_mask": torch.ones(rows, PROMPT_LENGTH, dtype=torch.long),
            "completion_ids": torch.full((rows, self.logps.shape[1]), 7) * self.completion_mask,
            "completion_mask": self.completion_mask,
            "tool_mask": self.tool_mask,
            "advantages": self.advantages,
            "num_items_in_batch": self.mask.sum() if num_items_in_batch is None else num_items_in_batch,
        }
        if self.old is not None:
            inputs["old_per_token_logps"] = self.old
        if self.ref is not None:
            inputs["ref_per_token_logps"] = self.ref
        return inputs

    def rows(self, rows: slice) -> "LossCase":
        return LossCase(*(None if value is None else value[rows] for value in dataclasses.astuple(self)))


def make_case(masks: str, old: str, beta: float, seed: int = 0) -> LossCase:
    """A float64 case (TRL's `_compute_loss` and textenv's `core` keep float64; see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)
    logps = -0.1 - 3.0 * torch.rand(len(ADVANTAGES), T, generator=generator, dtype=FLOAT64)
    completion_mask = torch.tensor([[1] * n + [0] * (T - n) for n in COMPLETION_LENGTHS])
    shift = torch.stack([torch.tensor(OLD_SHIFT, dtype=FLOAT64).roll(row) for row in range(len(ADVANTAGES))])
    return LossCase(
        logps=logps,
        old=None if old == "on_policy" else logps + shift,
        ref=logps + 0.3 * torch.randn(logps.shape, generator=generator, dtype=FLOAT64) if beta > 0 else None,
        entropies=3.0 * torch.rand(logps.shape, generator=generator, dtype=FLOAT64),
        advantages=torch.tensor(ADVANTAGES, dtype=FLOAT64),
        completion_mask=completion_mask,
        tool_mask=torch.tensor(TOOL_MASKS[masks]),
    )


def run_trl_loss(case: LossCase, loss_type, beta, epsilon_high, num_items_in_batch=None, **settings):
    """TRL's `_compute_loss` on the case: `(loss, d loss / d logps, logged metrics)`."""
    logps = case.logps.clone().requires_grad_(True)
    fake_self = trl_loss_self(loss_type=loss_type, beta=beta, epsilon_low=EPSILON, epsilon_high=epsilon_high,
                              logps=logps, entropies=case.entropies, **settings)
    loss = TRLGRPOTrainer._compute_loss(fake_self, None, case.trl_inputs(num_items_in_batch))
    (grad,) = torch.autograd.grad(loss, logps)
    return loss.detach(), grad, fake_self._metrics["train"]


def run_textenv_loss(case: LossCase, loss_type, beta, epsilon_high, *, accumulation_steps=1, max_completion_length=8,
                     tokens_per_optimizer_step=None, use_bias_correction_kl=False):
    """textenv's `core` on the case, as `GRPOTrainer._mini_batch_loss` chains it: `(loss, grad, per_token_loss, ratio)`."""
    logps = case.logps.clone().requires_grad_(True)
    old = logps.detach() if case.old is None else case.old
    per_token_loss, ratio = core.clipped_token_loss(logps, old, case.advantages, EPSILON, epsilon_high)
    if beta > 0:
        per_token_loss = per_token_loss + beta * core.reference_kl(logps, case.ref, ratio if use_bias_correction_kl else None)
    tokens = case.mask.sum().item() if tokens_per_optimizer_step is None else tokens_per_optimizer_step
    loss = core.aggregate_loss(per_token_loss, case.mask, loss_type, accumulation_steps=accumulation_steps,
                               max_completion_length=max_completion_length, tokens_per_optimizer_step=tokens)
    (grad,) = torch.autograd.grad(loss, logps)
    return loss.detach(), grad, per_token_loss.detach(), ratio.detach()


def textenv_tokens_per_optimizer_step(generation_batch_tokens, accumulation_steps, mini_batches, num_processes=1):
    """dapo's divisor as `textenv.grpo.trainer.GRPOTrainer._optimise` computes it (`core.dapo_divisor`); part 3
    checks it through the trainer."""
    return core.dapo_divisor(generation_batch_tokens, num_processes, accumulation_steps, mini_batches)


LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
BETAS = (0.0, 0.04)
EPSILON_HIGHS = (None, 0.28)  # None: TRL and textenv use epsilon (test_shared_defaults_and_epsilon_high_default_equal_trl)
OLDS = ("on_policy", "shifted")


def upper_epsilon(epsilon_high):
    return GRPOConfig(batch_size=4, mini_batch_size=4, num_generations=2, epsilon=EPSILON, epsilon_high=epsilon_high).upper_epsilon


# --------------------------------------------------------------------------------------------------
# part 1: the loss
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("masks", sorted(TOOL_MASKS))
@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("epsilon_high", EPSILON_HIGHS)
@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_token_weights_equal_trl(loss_type, beta, epsilon_high, old, masks):
    """The aggregated loss and its gradient w.r.t. every token's log-probability (each token's weight in the
    update: 0 on tool tokens and padding, the clipped tokens' 0 included)."""
    case = make_case(masks, old, beta)
    trl_loss, trl_grad, _ = run_trl_loss(case, loss_type, beta, upper_epsilon(epsilon_high))
    loss, grad, _, _ = run_textenv_loss(case, loss_type, beta, upper_epsilon(epsilon_high))
    assert loss.dtype == trl_loss.dtype == grad.dtype == trl_grad.dtype == FLOAT64  # neither side rounded to float32
    assert_close(loss, trl_loss, loss_tolerance(case, beta), what="loss")
    assert_close(grad, trl_grad, loss_tolerance(case, beta), what="d loss / d logps")
    assert (trl_grad[case.mask == 0] == 0).all()  # the tool tokens and the padding are not trained
    if old == "shifted" and beta == 0:  # the clipped tokens get no gradient (ratio * A was not the min)
        assert (trl_grad[case.mask == 1] == 0).any()


@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("epsilon_high", EPSILON_HIGHS)
@pytest.mark.parametrize("beta", BETAS)
def test_per_token_loss_equals_trl(beta, epsilon_high, old):
    """Every token's loss (clipped surrogate + beta * k3 KL): TRL's dapo loss with only that token trained and
    one trained token in the batch is that token's loss."""
    case = make_case("tools_and_padding", old, beta)
    _, _, per_token_loss, _ = run_textenv_loss(case, "dapo", beta, upper_epsilon(epsilon_high))
    trl_per_token_loss = torch.zeros_like(per_token_loss)
    positions = case.completion_mask.nonzero().tolist()  # tool-token positions too: each is trained alone here
    for row, column in positions:
        single = dataclasses.replace(case, tool_mask=torch.zeros_like(case.tool_mask))
        single.tool_mask[row, column] = 1
        trl_loss, _, _ = run_trl_loss(single, "dapo", beta, upper_epsilon(epsilon_high))
        trl_per_token_loss[row, column] = trl_loss
    trained = case.completion_mask.bool()
    assert_close(per_token_loss[trained], trl_per_token_loss[trained], loss_tolerance(case, beta), what="per-token loss")
    assert per_token_loss[trained].abs().min() > 0  # every token carries a loss: the comparison is not of zeros


@pytest.mark.parametrize("zero_advantage", (False, True), ids=("signed_advantages", "a_zero_advantage"))
@pytest.mark.parametrize("masks", sorted(TOOL_MASKS))
@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("epsilon_high", EPSILON_HIGHS)
@pytest.mark.parametrize("beta", BETAS)
def test_clip_ratios_and_kl_equal_trl_metrics(beta, epsilon_high, old, masks, zero_advantage):
    """TRL's logged clip_ratio/{low,high,region}_mean and kl against textenv's `clip_fractions` and `k3_kl`, each a
    sum over the trained tokens divided by their number (as `GRPOTrainer._step_stats` divides them). A row with
    advantage 0 (a tied group) has ratios on both sides of the range and is clipped on neither."""
    case = make_case(masks, old, beta)
    if zero_advantage:
        case.advantages[2] = 0.0
    _, _, metrics = run_trl_loss(case, "dapo", beta, upper_epsilon(epsilon_high))
    _, _, _, ratio = run_textenv_loss(case, "dapo", beta, upper_epsilon(epsilon_high))
    tokens = case.mask.sum()
    fractions = core.clip_fractions(ratio, case.advantages, case.mask, EPSILON, upper_epsilon(epsilon_high))
    for name in ("low", "high", "region"):  # an integer count over an integer count, one float32 division each
        assert float(fractions[name] / tokens) == metrics[f"clip_ratio/{name}_mean"][-1], f"clip_ratio/{name}_mean"
    if old == "shifted":  # the data clip on both sides
        assert metrics["clip_ratio/low_mean"][-1] > 0 and metrics["clip_ratio/high_mean"][-1] > 0
    else:
        assert metrics["clip_ratio/region_mean"][-1] == 0
    if beta > 0:
        kl = (core.k3_kl(case.logps, case.ref) * case.mask).sum() / tokens
        assert_close(kl, metrics["kl"][-1], loss_tolerance(case, beta), what="kl")
        assert metrics["kl"][-1] > 0
    else:
        assert "kl" not in metrics


def two_batch_case(beta) -> LossCase:
    """8 rows: the 4-row case twice, the copy with other log-probabilities."""
    first, second = make_case("tools_and_padding", "shifted", beta, seed=0), make_case("untrained_row", "shifted", beta, seed=1)
    return LossCase(*(None if a is None else torch.cat([a, b]) for a, b in zip(dataclasses.astuple(first), dataclasses.astuple(second))))


@pytest.mark.parametrize("mini_batches, accumulation_steps", [(2, 1), (2, 2), (4, 2), (4, 1)])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_accumulated_mini_batches_equal_trl(loss_type, mini_batches, accumulation_steps):
    """A generation batch of 8 rows in `mini_batches` mini-batches (TRL's steps_per_generation), an optimizer step
    every `accumulation_steps`: each mini-batch's loss and token weights. dapo divides by the generation batch's
    trained tokens (TRL: inputs["num_items_in_batch"]) * accumulation / mini-batches."""
    beta, epsilon_high = 0.04, 0.28
    case = two_batch_case(beta)
    rows = len(case.advantages) // mini_batches
    tokens = textenv_tokens_per_optimizer_step(case.mask.sum().item(), accumulation_steps, mini_batches)
    for index in range(mini_batches):
        mini_batch = case.rows(slice(index * rows, (index + 1) * rows))
        trl_loss, trl_grad, _ = run_trl_loss(mini_batch, loss_type, beta, epsilon_high, num_items_in_batch=case.mask.sum(),
                                             accumulation_steps=accumulation_steps, steps_per_generation=mini_batches)
        loss, grad, _, _ = run_textenv_loss(mini_batch, loss_type, beta, epsilon_high, accumulation_steps=accumulation_steps,
                                            tokens_per_optimizer_step=tokens)
        assert_close(loss, trl_loss, loss_tolerance(mini_batch, beta), what=f"mini-batch {index} loss")
        assert_close(grad, trl_grad, loss_tolerance(mini_batch, beta), what=f"mini-batch {index} d loss / d logps")


def test_dapo_divisor_when_the_batch_trains_one_token():
    """dapo with one trained token in a generation batch split in 2 mini-batches, one optimizer step each: TRL
    clamps the token count to 1 before scaling it to the accumulation window (1 * 1 / 2 = 0.5, grpo_trainer.py
    `_compute_loss`: ``normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / num_processes`` then
    ``* current_gradient_accumulation_steps / steps_per_generation``), and so does `core.dapo_divisor`."""
    case = make_case("tools_and_padding", "shifted", 0.0)
    case.tool_mask.zero_()
    case.tool_mask[0, 0] = 1
    mini_batch = case.rows(slice(0, 2))
    tokens = textenv_tokens_per_optimizer_step(case.mask.sum().item(), accumulation_steps=1, mini_batches=2)
    trl_loss, trl_grad, _ = run_trl_loss(mini_batch, "dapo", 0.0, EPSILON, num_items_in_batch=case.mask.sum(),
                                         accumulation_steps=1, steps_per_generation=2)
    loss, grad, _, _ = run_textenv_loss(mini_batch, "dapo", 0.0, EPSILON, tokens_per_optimizer_step=tokens)
    assert trl_loss != 0
    assert_close(loss, trl_loss, loss_tolerance(mini_batch, 0.0), what="loss")
    assert_close(grad, trl_grad, loss_tolerance(mini_batch, 0.0), what="d loss / d logps")


@pytest.mark.parametrize("old", OLDS)
def test_kl_term_with_trl_default_bias_correction(old):
    """TRL 1.16's default ``use_bias_correction_kl=True`` multiplies the per-token KL by the (differentiable) ratio
    (grpo_trainer.py `_compute_loss`: ``if self.args.use_bias_correction_kl: per_token_kl = per_token_kl * coef_1``);
    textenv's default too (`GRPOConfig.use_bias_correction_kl`, `core.reference_kl`). Without it the loss values
    would agree on-policy (ratio 1) but not the gradients (``d ratio = ratio * d logp`` adds ``beta * kl`` to
    each token's weight)."""
    assert GRPOConfig(batch_size=2, mini_batch_size=2, num_generations=2).use_bias_correction_kl is True
    assert {field.name: field.default for field in dataclasses.fields(TRLGRPOConfig)}["use_bias_correction_kl"] is True
    beta = 0.04
    case = make_case("tools_and_padding", old, beta)
    trl_loss, trl_grad, _ = run_trl_loss(case, "dapo", beta, 0.28, use_bias_correction_kl=True)
    loss, grad, _, _ = run_textenv_loss(case, "dapo", beta, 0.28, use_bias_correction_kl=True)
    assert_close(loss, trl_loss, loss_tolerance(case, beta), what="loss")
    assert_close(grad, trl_grad, loss_tolerance(case, beta), what="d loss / d logps")


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
