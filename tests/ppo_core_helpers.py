"""Shared by the PPO math test modules (tests/test_ppo_core_*.py): how their tolerances are sized.

Tolerances (tests/numerics.py has the analysis; `reduction_tolerance(n, m, dtype)` is ``2 lambda sqrt(n) u m``,
which for the short chains here, n <= 100, is at least the worst-case bound ``2 n u m`` of two n-rounding
computations, Higham's gamma_n; exp and log count as 2 roundings, their vectorised versions being accurate to
1 ulp):
- legacy test vectors written with all their digits (``0.1``, ``0.005``) are compared in float32 within
  `reduction_tolerance` of the roundings involved (``VECTOR_ROUNDINGS``: the two input literals, the operation(s),
  the expected literal) at the inputs' magnitude;
- legacy vectors printed to 4 decimals (``3.7361``) within ``FOUR_DECIMALS`` (half a unit of the 4th decimal,
  the literal's own rounding) plus the float32 rounding of the full-KL chain (log-softmax and KL over 3 entries);
- a formula against a re-computation of it in another order (log-softmax + gather, Categorical's entropy, the
  GAE recursion, a masked loss against the loss of the masked positions removed, variances): in float64, within
  `reduction_tolerance` of the roundings on the longest chain (10 per entry of the largest reduction: shift, exp,
  sum, log, product, ...) at the magnitude of the values on it;
- exact (``==``, `torch.equal`): the same elementwise operations on the same values (IEEE operations are
  correctly rounded, so any kernel gives the same bits: ``-kl_coef * kl``, a total that is computed as the
  test computes it), values that only pass through exact arithmetic (sums of small integers, halvings: masked
  means of integer data, 0.125 = 0.5^3, a value loss of 1s), a masked-out garbage entry (it is multiplied by an
  exact 0, so the same additions run) and zeros of a KL of a distribution with itself;
- the running moments (float32 inside, from float64 data) and the KL controller (python floats) within
  `reduction_tolerance` of their sums and updates at the data's magnitude.
"""

import torch

from numerics import reduction_tolerance

VECTOR_ROUNDINGS = 6  # two input literals, at most three operations (0.5 * d^2), the expected literal
FLOAT64 = torch.float64


def chain_tolerance(entries: int, magnitude: float, dtype=FLOAT64) -> float:
    """Two orders of a formula whose longest chain goes through at most 10 roundings per entry of its largest
    reduction (``entries`` long), of values of size ``magnitude``."""
    return reduction_tolerance(10 * entries, magnitude, dtype)
