"""PPOConfig: every field and default of the legacy step-based PPO configuration (TRL v0.11.4)."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Literal

from textenv import off_policy
from textenv.extras import require
from textenv.ppo.utils import flatten_dict

KL_PENALTIES = ("kl", "abs", "mse", "full")
DEFAULT_CLIP_MAX = 2.0  # the importance weight's upper bound, vllm_importance_sampling_cap's default before it had an alias


def _script_name() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "textenv"
    return name[: -len(".py")] if name.endswith(".py") else name


@dataclass
class PPOConfig:
    """Configuration of [`PPOTrainer`], with the fields and defaults of the legacy TRL ``PPOConfig``.

    This API is supported in textenv: no deprecation warning is emitted. The legacy aliases are honoured:
    ``forward_batch_size`` is copied to ``mini_batch_size`` and ``optimize_cuda_cache`` to
    ``optimize_device_cache`` (legacy TRL silently ignored the latter).

    ``share_prompt_prefix`` (textenv only, default True): the rows of a mini-batch run packed into one sequence
    of real tokens, without padding, and every prefix several rows share (the few-shot prompt of all, the
    longer opening of some) runs through the model once, forward and backward (same losses to float rounding;
    see `textenv.ppo.packing`). Set it to False to run the padded rows, as legacy TRL did. ``step_in_backward`` (textenv only, opt-in, default False): with the trainer's
    own optimizer on one process and no ``max_grad_norm`` or gradient accumulation, each parameter is updated
    as soon as backward completes its gradient, so the gradients of the whole model never exist at once (same
    update, less peak memory; see `textenv.ppo.step_in_backward`). A user can tell: after ``step`` the
    parameters have no ``.grad``, which legacy code and tests inspect, hence opt-in. ``offload_reference`` (textenv only): keep the reference
    copy the trainer makes in a snapshot file, memory-mapped only during its forward pass (same outputs; see
    `textenv.ppo.offloaded_reference`); ``None`` (default) does so on CPU for models of 256 MiB or more.
    Mixed precision (opt-in): ``accelerator_kwargs={"mixed_precision": "bf16"}`` runs every forward and backward
    pass of the step (reference included) under bf16 autocast, on CPU too; weights, gradients and optimizer
    state stay float32.

    Off-policy correction (textenv only, opt-in, off by default; TRL GRPO's names): when the episodes were
    sampled by another engine (vLLM), or by older weights while rollouts overlap training, the engine's
    log-probabilities differ from the trainer's own, so the samples are off-policy.
    ``vllm_importance_sampling_correction=True`` then weights each model token's policy-gradient term by an
    importance weight of ``exp(old_logprob - rollout_logprob)``, where ``old_logprob`` is the trainer's
    log-probability from the step's forward pass before optimisation and ``rollout_logprob`` the engine's, given
    to ``PPOTrainer.step(..., rollout_logprobs=...)`` (required then). ``vllm_importance_sampling_mode`` says how
    the ratio becomes a weight (TRL 1.16's ``"token_truncate"``, ``"token_mask"``, ``"sequence_truncate"``,
    ``"sequence_mask"``; default ``"token_truncate"``: ``min(ratio, clip_max)``, truncated importance sampling as
    verl's TIS) within ``[vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max]``.
    ``vllm_importance_sampling_cap`` is the older name of ``vllm_importance_sampling_clip_max``: give either
    (both: the same value); neither gives 2.0, and after ``__post_init__`` both hold the bound in use (PPO's
    ``None`` means that default: ``math.inf`` is no upper bound). ``off_policy_objective="decoupled"``: AReaL's
    decoupled PPO objective instead, the weight masked to 0 above ``behave_imp_weight_cap`` (default 5.0, AReaL's).
    The value loss is unchanged. Off (the default), ``rollout_logprobs`` are ignored and ``step`` is legacy's. See
    `textenv.off_policy` for the formulas and the statistics it adds.

    Derived fields set in ``__post_init__``: ``backward_batch_size = mini_batch_size *
    gradient_accumulation_steps`` and ``total_ppo_epochs = ceil(steps / batch_size)``; the trainer fills in
    ``world_size``, ``global_backward_batch_size`` and ``global_batch_size``.

    Raises:
        ValueError: ``batch_size`` is not a multiple of ``backward_batch_size``, or ``kl_penalty`` is not
            one of ``"kl"``, ``"abs"``, ``"mse"``, ``"full"``, ``vllm_importance_sampling_cap`` is not positive or
            differs from ``vllm_importance_sampling_clip_max``, or an off-policy setting is out of range
            (`textenv.off_policy.check_settings`).
    """

    # --- tracking -----------------------------------------------------------------------------------
    exp_name: str = field(default_factory=_script_name)
    seed: int = 0
    log_with: Literal["wandb", "tensorboard"] | None = None
    task_name: str | None = None
    model_name: str = "gpt2"
    query_dataset: str = "stanfordnlp/imdb"
    reward_model: str = "sentiment-analysis:lvwerra/distilbert-imdb"
    remove_unused_columns: bool = True
    tracker_kwargs: dict = field(default_factory=dict)
    accelerator_kwargs: dict = field(default_factory=dict)
    project_kwargs: dict = field(default_factory=dict)
    tracker_project_name: str = "trl"
    push_to_hub_if_best_kwargs: dict = field(default_factory=dict)
    # --- optimisation -------------------------------------------------------------------------------
    steps: int = 20000
    learning_rate: float = 1.41e-5
    adap_kl_ctrl: bool = True
    init_kl_coef: float = 0.2
    kl_penalty: Literal["kl", "abs", "mse", "full"] = "kl"
    target: float = 6.0
    horizon: float = 10000.0
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    batch_size: int = 128
    forward_batch_size: int | None = None
    mini_batch_size: int = 128
    gradient_accumulation_steps: int = 1
    world_size: int | None = None
    ppo_epochs: int = 4
    max_grad_norm: float | None = None
    optimize_cuda_cache: bool | None = None
    optimize_device_cache: bool = False
    early_stopping: bool = False
    target_kl: float = 1.0
    compare_steps: int = 1
    ratio_threshold: float = 10.0
    use_score_scaling: bool = False
    use_score_norm: bool = False
    score_clip: float | None = None
    whiten_rewards: bool = False
    gradient_checkpointing: bool = False
    # --- textenv addition ---------------------------------------------------------------------------
    share_prompt_prefix: bool = True
    step_in_backward: bool = False
    offload_reference: bool | None = None
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = "token_truncate"
    vllm_importance_sampling_clip_max: float | None = None  # None: vllm_importance_sampling_cap, else DEFAULT_CLIP_MAX
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_cap: float | None = None
    off_policy_objective: Literal["importance_sampling", "decoupled"] = "importance_sampling"
    behave_imp_weight_cap: float = 5.0
    # --- filled in by __post_init__ / the trainer ---------------------------------------------------
    is_encoder_decoder: bool | None = None
    is_peft_model: bool | None = None
    backward_batch_size: int | None = None
    global_backward_batch_size: int | None = None
    global_batch_size: int | None = None
    dataset_num_proc: int | None = None
    total_ppo_epochs: int | None = None

    def __post_init__(self) -> None:
        if self.forward_batch_size is not None:
            self.mini_batch_size = self.forward_batch_size
        if self.optimize_cuda_cache is not None:
            self.optimize_device_cache = bool(self.optimize_cuda_cache)
        for name in ("batch_size", "mini_batch_size", "gradient_accumulation_steps", "ppo_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be a positive integer, got {value!r}")
        self.backward_batch_size = self.mini_batch_size * self.gradient_accumulation_steps
        if self.batch_size % self.backward_batch_size != 0:
            raise ValueError(
                f"`batch_size` ({self.batch_size}) must be a multiple of `mini_batch_size * "
                f"gradient_accumulation_steps` ({self.mini_batch_size} * {self.gradient_accumulation_steps} "
                f"= {self.backward_batch_size})"
            )
        if self.kl_penalty not in KL_PENALTIES:
            raise ValueError(f"`kl_penalty` must be one of {KL_PENALTIES}, got {self.kl_penalty!r}")
        self._resolve_clip_max()
        off_policy.check_settings(self)
        if self.log_with in ("wandb", "tensorboard", "trackio"):
            require(self.log_with, f"log_with={self.log_with!r}")
        self.total_ppo_epochs = int(math.ceil(self.steps / self.batch_size))

    def _resolve_clip_max(self) -> None:
        """``vllm_importance_sampling_clip_max`` and its older name ``vllm_importance_sampling_cap`` both set to
        the one upper bound given (`DEFAULT_CLIP_MAX` if neither is)."""
        cap, clip_max = self.vllm_importance_sampling_cap, self.vllm_importance_sampling_clip_max
        if cap is not None and not cap > 0:
            raise ValueError(f"`vllm_importance_sampling_cap` must be positive, got {cap!r}")
        if cap is not None and clip_max is not None and cap != clip_max:
            raise ValueError(
                f"vllm_importance_sampling_cap ({cap}) and vllm_importance_sampling_clip_max ({clip_max}) differ: the "
                "cap is the older name of the clip max; give one of them (after dataclasses.replace, set both)."
            )
        bound = next((value for value in (clip_max, cap) if value is not None), DEFAULT_CLIP_MAX)
        self.vllm_importance_sampling_cap = self.vllm_importance_sampling_clip_max = bound

    def to_dict(self) -> dict:
        """All fields as one flat dictionary (nested dictionaries joined with ``"/"``; empty ones left out, as
        legacy TRL did)."""
        return flatten_dict(asdict(self))

    def to_json_string(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)
