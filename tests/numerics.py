"""Tolerances for comparing two computations, derived from floating-point error analysis.

Which comparison a test makes depends on why the two results should agree:

* **Exact** (``torch.equal``, ``==``): the same code path on the same inputs with the same kernels (a run
  repeated, a checkpoint reloaded, a copy), integer data (token ids, masks, counts), or results that do not
  depend on rounding (a parameter that received no gradient).
* **Reordered reductions** (`assert_reordered_close`): the same math with its additions in another order:
  another padding, packing, mini-batch split, a KV cache instead of a full pass, another kernel level
  (``ATEN_CPU_CAPABILITY``) or thread count. The worst-case bound of a sum of ``n`` terms, ``n u sum|x_i|``
  (``u`` the unit roundoff; Higham, *Accuracy and Stability of Numerical Algorithms*, eq. 4.4), is reached only
  if every rounding errs the same way; modelling roundings as independent, mean-zero errors, Higham and Mary
  (*A New Approach to Probabilistic Rounding Error Analysis*, SIAM J. Sci. Comput. 41(5), 2019)
  prove ``|error| <= lambda sqrt(n) u sum|x_i|`` with probability at least ``1 - 2n exp(-lambda^2 / 2)``.
  With ``lambda = 10`` that is below 1e-16 for every chain here. To first order the errors of a chain of
  reductions add (their variances add), so two orders of one computation differ by at most
  ``2 lambda sqrt(terms) u magnitude``: ``terms`` the additions on the longest chain that makes one value
  (`forward_terms` for a model), ``magnitude`` the size of the values summed (the largest ``|value|``
  compared, unless the compared values cancel, as a KL of two log-probabilities does: then the log-probabilities'
  size). This treats the layers between reductions (softmax, normalisation, activations) as well-conditioned,
  which holds for the models and short sequences of the tests; a real bug (a wrong mask or position) moves
  values by their own magnitude.
* **Greedy tokens** (`assert_greedy_agree` and its variants): argmax is discontinuous, so two reduction orders
  can pick different tokens where the top two logits are within rounding, and the paths then decode different
  contexts. Two paths' tokens must be equal up to the first place where they part, and there both picks must be
  within `reduction_tolerance` (of `logit_terms`) of the largest logit of a float64 forward pass: a tie. A claim
  about one greedy path (the text or reward it reaches) holds on every machine where every token leads its
  runner-up by more than that (`assert_greedy_determined`).
* **Trained weights** (`float64_sgd_tolerance`): Adam divides a gradient by ``sqrt(v) + eps``; on a weight whose
  gradient is near zero it turns a rounding-level difference of the gradient into a step difference of up to
  ``2 lr`` (``d/dg [g / (|g| + eps)] <= 1 / eps``), so no tolerance below the update itself holds for
  Adam-trained weights, in any precision. Tests that compare training results which agree only in exact
  arithmetic therefore train in **float64** (`float64_model`) with **SGD** (`sgd`): the weights then differ by
  ``lr * steps`` times the gradients' float64 rounding difference, many orders of magnitude under what a real
  difference (a token trained that should not be) gives. Equal gradients give equal Adam steps, so this proves
  the default optimizer's result equal too. Statistics the trainer reports are rounded to float32 last: one more
  float32 ulp (`reported_float32`).
"""

from __future__ import annotations

import copy
import math
import types

import torch

LAMBDA = 10.0  # Higham and Mary's confidence parameter: their bound fails with probability <= 2n exp(-50)
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# An upper bound of sum |term| of one gradient entry in the tests' small models: trained positions (< 100) x
# |d loss / d logit| (<= 2: losses of whitened advantages and clipped ratios) x activations (< 5).
GRADIENT_MAGNITUDE = 1e3


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the distance from 1.0 to the next representable number of ``dtype``."""
    return UNIT_ROUNDOFF[dtype]


def reduction_tolerance(terms: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference between two summation orders of ``terms`` additions of values of size ``magnitude``:
    each order is within ``LAMBDA sqrt(terms) u magnitude`` of the exact result (Higham and Mary's bound)."""
    return 2 * LAMBDA * math.sqrt(terms) * unit_roundoff(dtype) * magnitude


def forward_terms(config, length: int) -> int:
    """Additions on the longest chain from the input to one log-probability of a decoder-only transformer:
    per layer the attention scores (``head_dim``), the weighted sum over ``length`` positions, the output,
    up/gate and down projections (``hidden``, ``hidden``, ``intermediate``); then the LM head (``hidden``)
    and the log-softmax's normaliser over the vocabulary."""
    hidden = config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    per_layer = head_dim + length + 2 * hidden + intermediate
    return config.num_hidden_layers * per_layer + hidden + config.vocab_size


def backward_terms(config, length: int, positions: int) -> int:
    """Additions on the longest chain of a weight's gradient: the backward pass mirrors the forward one, and
    a weight's gradient sums over every trained position."""
    return 2 * forward_terms(config, length) + positions


def float64_sgd_tolerance(config, length: int, positions: int, learning_rate: float, steps: int) -> float:
    """Largest difference of a float64 weight after ``steps`` SGD steps whose gradients were computed in two
    reduction orders: ``lr * steps`` times `reduction_tolerance` of the gradient's chain at `GRADIENT_MAGNITUDE`."""
    gradient_error = reduction_tolerance(backward_terms(config, length, positions), GRADIENT_MAGNITUDE, torch.float64)
    return learning_rate * steps * gradient_error


def sgd(model: torch.nn.Module, learning_rate: float) -> torch.optim.SGD:
    """Plain SGD over ``model``'s trainable parameters: a weight moves by exactly ``lr`` times its gradient."""
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=learning_rate)


def reported_float32(tolerance: float, magnitude: float) -> float:
    """``tolerance`` plus one float32 ulp of ``magnitude``: a float64 statistic rounded to float32 at the end
    can land on either side of a rounding boundary."""
    return tolerance + 2 * unit_roundoff(torch.float32) * magnitude


def assert_reordered_close(actual: torch.Tensor, expected: torch.Tensor, terms: int, what: str = "values") -> None:
    """``actual`` equals ``expected`` up to two summation orders of ``terms`` additions (`reduction_tolerance`
    at the largest magnitude compared, in ``expected``'s dtype)."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    magnitude = float(torch.maximum(actual.abs().max(), expected.abs().max())) if expected.numel() else 0.0
    tolerance = reduction_tolerance(terms, magnitude, expected.dtype)
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=tolerance, msg=lambda m: f"{what} ({terms} terms, atol {tolerance:.3g}): {m}")


def float64_model(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of ``model`` (the original is left as it is), float64 throughout.

    transformers' RMSNorm (Llama and its relatives) computes in ``float32`` whatever its input ("upcast to fp32"
    for half precision, a downcast for float64): the norm would round every float64 hidden state and gradient to
    float32, where two float64 values that differ by a rounding error land on either side of a float32 rounding
    boundary now and then (a float32 ulp, 1e-7, against float64 tolerances of 1e-12). The copy's RMSNorms compute
    in their input's dtype instead (at least float32, as transformers intends)."""
    copied = copy.deepcopy(model).to(torch.float64)
    for module in copied.modules():
        if type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon") and hasattr(module, "weight"):
            module.forward = types.MethodType(_rms_norm_in_input_dtype, module)
    return copied


def _rms_norm_in_input_dtype(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' ``LlamaRMSNorm.forward`` with its float32 replaced by ``promote_types(input, float32)``."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.promote_types(input_dtype, torch.float32))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def assert_stats_close(actual: dict, expected: dict, keys, terms: int, dtype: torch.dtype = torch.float64, magnitude: float = 0.0) -> None:
    """Each statistic of ``keys`` agrees up to two reduction orders of ``terms`` additions in ``dtype`` (the
    model's), plus one float32 ulp: the trainers report their statistics in float32. ``magnitude``: the size of
    the values summed where a statistic cancels them (a KL, a loss of terms of both signs)."""
    for key in keys:
        size = max(abs(float(actual[key])), abs(float(expected[key])), magnitude)
        tolerance = reported_float32(reduction_tolerance(terms, size, dtype), size)
        assert abs(float(actual[key]) - float(expected[key])) <= tolerance, f"{key}: {actual[key]} != {expected[key]} (atol {tolerance:.3g})"


# ------------------------------------------------------------------------------------------------------------
# Short chains and half precision
# ------------------------------------------------------------------------------------------------------------
def rounding_tolerance(roundings: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """Worst-case difference between a computation with ``roundings`` roundings in all (both sides of the
    comparison counted) and another with none, each rounding off by at most ``u`` times a value of size
    ``magnitude``: Higham's gamma_n = n u / (1 - n u), to first order ``n u magnitude`` (eq. 3.8). For the
    short chains it is meant for (n of a few tens) it is below `reduction_tolerance`'s probabilistic bound."""
    return roundings * unit_roundoff(dtype) * magnitude


def autocast_roundings(config) -> int:
    """Half-precision roundings on the longest chain from the input to a logit or a value of a decoder-only
    transformer under bf16/fp16 autocast (or with half-precision weights): per layer the input, weight and
    output of a query/key/value projection (3), the rotary embedding (2), the attention output (1), the output
    projection (3), the gate/up projection (3), the activation and gating product (2) and the down projection
    (3); then the LM or value head (3). Matrix products accumulate in float32 (oneDNN on the CPU, cuBLAS on
    CUDA), so a dot product's error is its terms' roundings, not its length; the log-softmax and the
    statistics are taken in float32 (`textenv.ppo.core.upcast_half`)."""
    return 17 * config.num_hidden_layers + 3


# ------------------------------------------------------------------------------------------------------------
# Greedy tokens of two reduction orders
# ------------------------------------------------------------------------------------------------------------
def logit_terms(config, length: int) -> int:
    """Additions on the longest chain to one logit: `forward_terms` without the log-softmax's normaliser over the
    vocabulary (it shifts a row's log-probabilities together, so it never changes which token is largest)."""
    return forward_terms(config, length) - config.vocab_size


def _floating_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def _next_token_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """The logits of the token after ``ids`` by one full, unpadded forward pass of ``model``."""
    device = next(model.parameters()).device
    with torch.no_grad():
        output = model(input_ids=torch.tensor([ids], device=device))
    logits = output.logits if hasattr(output, "logits") else output[0]
    return logits[0, -1].detach().cpu()


def assert_greedy_agree(model, left, right, start: int = 0, what: str = "greedy tokens", masks=None) -> bool:
    """Two paths decoded the same context greedily in different reduction orders (batched or single, padded or
    not, a KV cache or a full pass, another engine): their token sequences ``left`` and ``right`` (context
    included) agree up to where the top two logits are a rounding tie.

    Each path computes every logit within ``e = LAMBDA sqrt(n) u M`` of its exact value (``n`` = `logit_terms`,
    ``M`` the row's largest ``|logit|``; `reduction_tolerance` is ``2e``). A path picks token ``c`` only if its
    logit of ``c`` is the largest of its row, so the exact logit of ``c`` is within ``2e`` of the exact maximum.
    Where the paths first pick different tokens, both picks must therefore be within ``reduction_tolerance`` of
    the maximum of a float64 forward pass of the common prefix (exact to ~1e-13): a tie that rounding may break
    either way. A real bug (a wrong position, mask or a stale cache) picks a token far below the maximum. After
    a tie the paths see different contexts, so nothing after it is compared.

    Args:
        model: the model both paths decoded with (a transformers causal LM, or a PEFT model of one).
        left, right: the two token sequences, context first.
        start: the length of the context (given, not chosen): it must be equal.
        masks: optional ``(left_mask, right_mask)``, 1 where a token was chosen by the model and 0 where it was
            appended by the environment (an episode's history): they must agree up to the first difference,
            and the first difference must be at a token both paths chose.

    Returns:
        True when the sequences (and masks) are identical, False when they part at a rounding tie (then what
        depends on the later tokens, such as texts, rewards or finish reasons, cannot be compared).
    """
    left, right = [int(t) for t in left], [int(t) for t in right]
    assert left[:start] == right[:start], f"{what}: the contexts differ"
    common = min(len(left), len(right))
    part = next((k for k in range(start, common) if left[k] != right[k]), None)
    if masks is not None:
        left_mask, right_mask = ([int(m) for m in mask] for mask in masks)
        end = common if part is None else part
        assert left_mask[:end] == right_mask[:end], f"{what}: the masks differ where the tokens agree"
    if part is None:
        assert len(left) == len(right), f"{what}: the paths agree on {common} tokens, then one stops and the other goes on"
        return True
    if masks is not None:
        assert left_mask[part] == right_mask[part] == 1, (
            f"{what}: the paths part at token {part}, where one of them did not let the model choose (masks "
            f"{left_mask[part]} and {right_mask[part]}): they stopped differently after the same tokens"
        )
    reference = float64_model(model).eval()
    logits = _next_token_logits(reference, left[:part])
    config = getattr(model, "config", None) or model.get_base_model().config
    tolerance = reduction_tolerance(logit_terms(config, part), float(logits.abs().max()), _floating_dtype(model))
    top = float(logits.max())
    for token in (left[part], right[part]):
        gap = top - float(logits[token])
        assert gap <= tolerance, (
            f"{what}: the paths part after {part} tokens ({left[part]} and {right[part]}); token {token} is {gap:.3g} "
            f"below the largest logit, more than two rounding orders can explain ({tolerance:.3g}): not a tie"
        )
    return False


def assert_greedy_continuations_agree(model, contexts, left, right, what: str = "greedy tokens") -> bool:
    """`assert_greedy_agree` for each context and its two continuations (the generated tokens only); True when
    every row is identical."""
    assert len(left) == len(right) == len(contexts), f"{what}: {len(left)} and {len(right)} rows for {len(contexts)} contexts"
    identical = True
    for row, (context, one, other) in enumerate(zip(contexts, left, right)):
        context = [int(t) for t in context]
        one, other = context + [int(t) for t in one], context + [int(t) for t in other]
        identical &= assert_greedy_agree(model, one, other, start=len(context), what=f"{what}, row {row}")
    return identical


def assert_greedy_histories_agree(model, left, right, what: str = "episodes") -> bool:
    """`assert_greedy_agree` for two lists of episode histories (``TextHistory``: ``tokens``, ``token_masks``)
    whose model turns were decoded greedily in different reduction orders; the masks mark the model's tokens.
    True when every pair is identical."""
    assert len(left) == len(right), f"{what}: {len(left)} and {len(right)} episodes"
    identical = True
    for index, (one, other) in enumerate(zip(left, right)):
        identical &= assert_greedy_agree(
            model, one.tokens, other.tokens, what=f"{what}, episode {index}", masks=(one.token_masks, other.token_masks)
        )
    return identical


def assert_greedy_determined(model, histories, what: str = "episode") -> None:
    """Every token the model chose in ``histories`` (``TextHistory``: ``tokens``, ``token_masks`` 1 where the model
    chose) is the largest logit of a float64 forward pass of the tokens before it, ahead of the runner-up by more
    than `reduction_tolerance` (of `logit_terms`): then every reduction order (any kernel level or thread count)
    picks the same greedy tokens (each path's logits are within half of that of the exact ones), so what follows
    from the tokens (texts, rewards, tool calls) is the same on every machine."""
    reference = float64_model(model).eval()
    config = getattr(model, "config", None) or model.get_base_model().config
    dtype = _floating_dtype(model)
    device = next(reference.parameters()).device
    for index, history in enumerate(histories):
        tokens = [int(t) for t in history.tokens]
        with torch.no_grad():
            output = reference(input_ids=torch.tensor([tokens], device=device))
        logits = (output.logits if hasattr(output, "logits") else output[0])[0].detach().cpu()
        for position, chosen in enumerate(history.token_masks.tolist()):
            if not chosen or position == 0:
                continue
            row = logits[position - 1]
            top, runner_up = row.topk(2).values.tolist()
            tolerance = reduction_tolerance(logit_terms(config, position), float(row.abs().max()), dtype)
            assert int(row.argmax()) == tokens[position] and top - runner_up > tolerance, (
                f"{what} {index}: token {position} ({tokens[position]}) is not the largest logit ({int(row.argmax())}) by "
                f"more than {tolerance:.3g} (margin {top - runner_up:.3g}): another reduction order may pick another token"
            )
