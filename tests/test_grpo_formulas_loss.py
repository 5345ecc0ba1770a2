"""textenv's GRPO loss (`textenv.grpo.core`) computes what TRL 1.16's `GRPOTrainer._compute_loss` computes, on the
same inputs: part 1 of the comparison with TRL (parts 2 and 3, the advantages and one whole step against a real TRL
trainer: tests/test_grpo_formulas_trl_trainer.py).

TRL's own code is executed, not re-typed: `GRPOTrainer._compute_loss` runs unbound on a stand-in ``self``
(`trl_loss_self`) carrying the attributes that method reads, whose `_get_per_token_logps_and_entropies` hands it
given log-probabilities; textenv's `core` functions get the same log-probabilities, advantages and masks.
Compared: the loss, its gradient w.r.t. the log-probabilities (the weight of each token), the per-token loss itself
(one trained token at a time) and the logged clip ratios and KL.

Two details these tests found, and textenv now follows: TRL's default ``use_bias_correction_kl=True`` weights the
KL term by the probability ratio (test_kl_term_with_trl_default_bias_correction), and dapo's token count is
clamped to 1 before it is scaled to the accumulation window (test_dapo_divisor_when_the_batch_trains_one_token).

Tolerances (tests/numerics.py has the analysis): the two sides compute the same formulas in other orders, so they
agree only in exact arithmetic. Part 1 runs in float64 (TRL's `_compute_loss` keeps the dtype of the
log-probabilities it is given): the losses, token weights, per-token losses and the KL metric within
`reduction_tolerance` of ``PER_TOKEN_ROUNDINGS`` plus the tokens summed, at `case_magnitude` (a bound of every
per-token term and its derivative: |A| times the ratio, plus beta times the KL and its derivative). The clip ratios
are exact: both sides divide the same integer count by the same integer token count in float32, one correctly
rounded division.
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

from trl import GRPOConfig as TRLGRPOConfig  # noqa: E402
from trl import GRPOTrainer as TRLGRPOTrainer  # noqa: E402

from textenv.grpo import core  # noqa: E402
from textenv.grpo.config import GRPOConfig  # noqa: E402

from grpo_formulas_helpers import EPSILON, EPSILON_HIGHS, FLOAT64, LOSS_TYPES, assert_close, trl_loss_self  # noqa: E402
from numerics import reduction_tolerance  # noqa: E402

# Roundings on a token's chain in part 1: the ratio (a difference, exp as 2), its clip, two products with the
# advantage, the min and the sign; the KL (a difference, exp as 2, two subtractions, the product with the ratio
# and with beta, the sum); the mask; the normaliser (one or two divisions)
PER_TOKEN_ROUNDINGS = 20
BETAS = (0.0, 0.04)
OLDS = ("on_policy", "shifted")


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
