"""Group Relative Policy Optimisation beside PPO: the same episodes, a plain causal LM, TRL 1.16's formulas.

- `trainer`: `GRPOTrainer`, ``step(queries, responses, scores, masks, truncated=...)`` as `PPOTrainer.step`;
- `config`: `GRPOConfig`; `AlgorithmArguments` / `GRPOArguments`, ``--algorithm ppo|grpo`` and GRPO's options;
  `ALGORITHMS`;
- `core`: the math as pure functions (group-relative advantages, clipped token loss, KL, loss aggregation);
- `batch`: a step's tensors laid out as TRL lays them out, padded or packed.

May import: textenv.off_policy, textenv.padding, textenv.ppo (packing, checkpointing, step statistics, trainer set-up)
"""

from textenv.grpo.config import ALGORITHMS, AlgorithmArguments, GRPOArguments, GRPOConfig
from textenv.grpo.trainer import GRPOTrainer

__all__ = ["ALGORITHMS", "AlgorithmArguments", "GRPOArguments", "GRPOConfig", "GRPOTrainer"]
