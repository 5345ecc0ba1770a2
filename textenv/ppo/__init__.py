"""Step-based PPO (the legacy TRL ``PPOTrainer.step`` workflow) on current torch / transformers / accelerate.

- `trainer`: `PPOTrainer`, ``step(queries, responses, scores, masks)``; its methods come from the mixins of
  `step_methods`, `windowed_forward`, `step_stats`, `generation`, `rollout_correction` and `checkpoint`;
- `config`: `PPOConfig`, every field and default of legacy TRL 0.11.4's;
- `core`: the PPO math as pure functions (log-probabilities, KL penalties, GAE, clipped losses);
- `step_methods`: the overridable pieces of a step, with legacy's names; `step_stats`: its statistics and logging;
- `inputs`: checks of `step`'s arguments; `batch`: the padded batch layout; `packing`: rows packed into one
  sequence with shared prefixes once; `windowed_forward`: the fast forward passes; `step_in_backward`: optimizer
  steps fused into backward;
- `trainer_setup`: what `PPOTrainer.__init__` checks and builds; `generation`: `PPOTrainer.generate`;
- `kl_control`: `AdaptiveKLController`, `FixedKLController`, `RunningMoments`;
- `rollout_correction`: off-policy correction of a step (through `textenv.off_policy`);
- `value_head`: `ValueHead`, `AutoModelForCausalLMWithValueHead`; `seq2seq_value_head`:
  `AutoModelForSeq2SeqLMWithValueHead`; `pretrained_wrapper`: `PreTrainedModelWrapper`, what both share;
- `value_head_files`, `wrapper_state_dict`: legacy file and state-dict layouts; `reward_adapter`: a reward LoRA
  adapter beside the policy's;
- `reference_model`: `create_reference_model`; `offloaded_reference`: `OffloadedReference`, memory-mapped;
- `checkpoint`: checkpoint and resume (also `GRPOTrainer`'s); `utils`: legacy `trl.core` helpers,
  `LengthSampler`, `set_seed`.

May import: textenv.engine (value heads: fast_path's cache_keyword, returned_cache), textenv.extras, textenv.hardware, textenv.off_policy, textenv.padding, textenv.transformers_compat
"""

import textenv.transformers_compat  # noqa: F401  (before anything reads transformers' modules)
from textenv.ppo.config import PPOConfig
from textenv.ppo.kl_control import AdaptiveKLController, FixedKLController, RunningMoments
from textenv.ppo.offloaded_reference import OffloadedReference
from textenv.ppo.pretrained_wrapper import PreTrainedModelWrapper
from textenv.ppo.seq2seq_value_head import AutoModelForSeq2SeqLMWithValueHead
from textenv.ppo.trainer import PPOTrainer
from textenv.ppo.utils import LengthSampler, set_seed
from textenv.ppo.reference_model import create_reference_model
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead, ValueHead

__all__ = [
    "AdaptiveKLController",
    "AutoModelForCausalLMWithValueHead",
    "AutoModelForSeq2SeqLMWithValueHead",
    "FixedKLController",
    "LengthSampler",
    "OffloadedReference",
    "PPOConfig",
    "PPOTrainer",
    "PreTrainedModelWrapper",
    "RunningMoments",
    "ValueHead",
    "create_reference_model",
    "set_seed",
]
