"""GRPOConfig: the settings of [`GRPOTrainer`], with TRL 1.16 `GRPOConfig`'s names and defaults where they mean
the same thing, and `GRPOArguments`, its algorithm fields as command-line options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from textenv import off_policy
from textenv.ppo.config import _script_name

ALGORITHMS = ("ppo", "grpo")
SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("grpo", "dr_grpo", "dapo")
OFF_POLICY_SETTINGS = ("vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
                       "vllm_importance_sampling_clip_min", "off_policy_objective", "behave_imp_weight_cap")


@dataclass
class GRPOArguments:
    """The fields of Group Relative Policy Optimisation that PPO does not have (TRL 1.16's names and defaults).

    The episodes of one prompt form a group of `num_generations`; each episode's advantage is its reward minus
    its group's mean reward, divided by the group's reward std (``scale_rewards="group"``), the whole batch's
    (``"batch"``) or not at all (``"none"``). The policy loss is PPO's clipped surrogate without a value head,
    clipped to ``[1 - epsilon, 1 + epsilon_high]``, aggregated per `loss_type`, plus ``beta`` times the k3 KL to
    a reference (``beta=0``: no reference model is loaded), weighted by the probability ratio with
    ``use_bias_correction_kl`` (TRL's default).
    """

    num_generations: int = field(default=8, metadata={"help": "GRPO: episodes per prompt (one group); the batch size must be a multiple"})
    scale_rewards: str = field(default="group", metadata={"help": "GRPO: divide advantages by the reward std of the group, the batch, or none"})
    loss_type: str = field(default="dapo", metadata={"help": "GRPO: loss aggregation: grpo (per-sequence mean), dr_grpo (sum / max_completion_length), dapo (per-token mean)"})
    epsilon: float = field(default=0.2, metadata={"help": "GRPO: lower clipping range of the probability ratio"})
    epsilon_high: Optional[float] = field(default=None, metadata={"help": "GRPO: upper clipping range (default: epsilon; DAPO uses 0.28)"})
    beta: float = field(default=0.0, metadata={"help": "GRPO: weight of the KL to the reference model (0: no reference model is loaded)"})
    num_iterations: int = field(default=1, metadata={"help": "GRPO: optimisation passes over each batch (TRL's mu)"})
    use_bias_correction_kl: bool = field(
        default=True, metadata={"help": "GRPO: weight the KL term by the probability ratio (TRL's default; only with beta > 0)"}
    )
    mask_truncated_completions: bool = field(default=False, metadata={"help": "GRPO: train nothing on episodes a limit ended (max_length, max_turns, max_new_tokens)"})
    max_completion_length: Optional[int] = field(default=None, metadata={"help": "GRPO: the dr_grpo loss's divisor (default: the batch's longest response)"})

    def check_grpo_arguments(self) -> None:
        """Raise ``ValueError`` naming the field when a GRPO setting is out of range."""
        if self.scale_rewards is True or self.scale_rewards is False:  # TRL's boolean spelling
            self.scale_rewards = "group" if self.scale_rewards else "none"
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {list(SCALE_REWARDS)}, got {self.scale_rewards!r}.")
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {list(LOSS_TYPES)}, got {self.loss_type!r}.")
        for name in ("num_generations", "num_iterations"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ValueError("epsilon and epsilon_high must be >= 0.")
        if self.beta < 0:
            raise ValueError(f"beta must be >= 0, got {self.beta}.")

    @property
    def epsilon_low(self) -> float:
        return self.epsilon

    @property
    def upper_epsilon(self) -> float:
        """`epsilon_high`, or `epsilon` when it is not set."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high


@dataclass
class AlgorithmArguments(GRPOArguments):
    """``--algorithm ppo|grpo``, GRPO's settings and ``--max_staleness`` (rollouts ahead of training), for
    `textenv train`, the demo and the examples."""

    algorithm: str = field(default="ppo", metadata={"help": "ppo (legacy step-based PPO with a value head, the default) or grpo (group-relative, no value head)"})
    max_staleness: int = field(
        default=0,
        metadata={"help": "0: play each step's episodes before it (legacy). K >= 1 (--engine vllm): play the next batches while the trainer "
                          "steps, no turn trained into weights more than K versions newer than those that sampled it"},
    )

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"--algorithm must be one of {list(ALGORITHMS)}, got {self.algorithm!r}.")
        if self.max_staleness < 0:
            raise ValueError(f"--max_staleness must be >= 0 (0: episodes played in step), got {self.max_staleness}.")
        self.check_grpo_arguments()

    def check_batch_size(self, batch_size: int) -> None:
        """Raise ``ValueError`` naming both options when GRPO's groups do not fill a batch of `batch_size`."""
        if self.algorithm == "grpo" and batch_size % self.num_generations:
            raise ValueError(f"--batch_size ({batch_size}) must be a multiple of --num_generations ({self.num_generations}) with "
                             "--algorithm grpo: a step trains on whole groups.")

    def grpo_arguments(self) -> dict[str, Any]:
        """The `GRPOArguments` fields of these options, for `GRPOConfig(**...)`."""
        return {name: getattr(self, name) for name in GRPOArguments.__dataclass_fields__}


@dataclass
class GRPOConfig(GRPOArguments):
    """Configuration of [`GRPOTrainer`].

    `batch_size` episodes make one step: ``batch_size / num_generations`` groups, run through the model in
    mini-batches of `mini_batch_size` (TRL's ``steps_per_generation`` is ``batch_size / mini_batch_size``), an
    optimizer step every `gradient_accumulation_steps` mini-batches, in ``num_iterations`` passes. With one
    optimizer step per batch and one pass (the default) the samples are on-policy, the probability ratio is 1
    and no extra forward pass computes the old log-probabilities (as in TRL).

    The optimizer is Adam (TRL: AdamW with weight decay 0, the same update) at a constant `learning_rate`
    (TRL's default schedule decays it linearly; pass an `lr_scheduler` to `GRPOTrainer` for that), and
    gradients are clipped to `max_grad_norm`. `gradient_accumulation_steps`: mini-batches per optimizer step
    (default `None`: all of a batch's). `temperature`: the episodes' sampling temperature; the log-probabilities
    are computed from the logits divided by it, as in TRL. `share_prompt_prefix` (textenv only, default True): a
    mini-batch's rows run packed into one sequence of real tokens, without padding, and every prefix several rows
    share (the few-shot opening of every group; a group's whole prompt and its replies' common first tokens) runs
    through the model once, forward and backward, with the LM head on the response positions only (same losses
    and gradients to float rounding; see `textenv.ppo.packing`); False runs the padded rows, as TRL does.

    Off-policy correction (TRL 1.16's names and defaults, but off by default: textenv's episodes need not come
    from vLLM): `vllm_importance_sampling_correction=True` multiplies each token's clipped policy loss (not the KL
    term) by an importance weight of ``exp(old - rollout)``, the trainer's old log-probability (the weights before
    the step; on-policy, its own detached ones) over the engine's, ``step(..., rollout_logprobs=...)`` (required
    then). `vllm_importance_sampling_mode` (``"token_truncate"``, ``"token_mask"``, ``"sequence_truncate"``,
    ``"sequence_mask"``) says how, within ``[vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max]``
    (``None``: unbounded on that side). `off_policy_objective="decoupled"`: AReaL's decoupled PPO objective
    instead: the old log-probabilities always from a no-grad pass before optimisation (the proximal policy), the
    weight masked to 0 above `behave_imp_weight_cap`. See `textenv.off_policy`.

    Raises:
        ValueError: a GRPO setting is out of range, `batch_size` is not a multiple of `num_generations`, or
            `batch_size` does not split into optimizer steps of `gradient_accumulation_steps` whole mini-batches,
            or an off-policy setting is out of range (`textenv.off_policy.check_settings`).
    """

    exp_name: str = field(default_factory=_script_name)
    seed: int = 0
    learning_rate: float = 1e-6
    batch_size: int = 16
    mini_batch_size: int = 8
    max_grad_norm: Optional[float] = 1.0
    steps: int = 20000
    log_with: Optional[str] = None
    tracker_project_name: str = "textenv"
    tracker_kwargs: dict = field(default_factory=dict)
    accelerator_kwargs: dict = field(default_factory=dict)
    project_kwargs: dict = field(default_factory=dict)
    gradient_checkpointing: bool = False
    gradient_accumulation_steps: Optional[int] = None
    temperature: float = 1.0
    share_prompt_prefix: bool = True
    vllm_importance_sampling_correction: bool = False
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_max: Optional[float] = 3.0
    vllm_importance_sampling_clip_min: Optional[float] = None
    off_policy_objective: str = "importance_sampling"
    behave_imp_weight_cap: float = 5.0

    def __post_init__(self) -> None:
        self.check_grpo_arguments()
        off_policy.check_settings(self)
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 (the sampling temperature of the episodes), got {self.temperature}.")
        if self.gradient_accumulation_steps is not None and self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be at least 1, got {self.gradient_accumulation_steps}.")
        if self.batch_size % self.num_generations:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of num_generations ({self.num_generations}): "
                "a step trains on whole groups."
            )
        if self.mini_batch_size < 1 or self.batch_size % self.mini_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of mini_batch_size ({self.mini_batch_size}).")
        if self.gradient_accumulation_steps is None:
            self.gradient_accumulation_steps = self.mini_batches
        if self.mini_batches % self.gradient_accumulation_steps:
            raise ValueError(
                f"the {self.mini_batches} mini-batches of a batch must split into optimizer steps of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) mini-batches."
            )

    @property
    def mini_batches(self) -> int:
        """Mini-batches per batch (TRL's ``steps_per_generation``)."""
        return self.batch_size // self.mini_batch_size

    @property
    def on_policy(self) -> bool:
        """One optimizer step per batch and one pass: the old log-probabilities are the current ones."""
        return self.num_iterations == 1 and self.gradient_accumulation_steps == self.mini_batches

    @property
    def computes_old_logprobs(self) -> bool:
        """Whether a step runs a no-grad pass for the old log-probabilities: off-policy, or the decoupled
        objective's proximal policy."""
        return not self.on_policy or off_policy.needs_proximal_pass(self)

    @property
    def total_steps(self) -> int:
        """Training steps: ``ceil(steps / batch_size)`` (as `PPOConfig.total_ppo_epochs`)."""
        return -(-self.steps // self.batch_size)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_ppo_config(cls, ppo_config, grpo_arguments: dict[str, Any], temperature: float = 1.0,
                        off_policy_given: Iterable[str] = ("vllm_importance_sampling_correction",)) -> "GRPOConfig":
        """The GRPO configuration of a run whose shared settings (seed, learning rate, batch sizes, steps, tracking,
        accelerator) are in a `PPOConfig`, as `textenv train`, the demo and the examples hold them.

        Of the off-policy correction's settings only those in `off_policy_given` (the ones the user gave; by default
        only whether to correct) are taken from `ppo_config`; the others keep GRPO's defaults (``"sequence_mask"``,
        clip max 3.0, TRL's), so GRPO corrects the same way however it is built (PPO's defaults are
        ``"token_truncate"`` at 2.0). Gradients are clipped to the PPO config's `max_grad_norm` when it sets one,
        else to GRPO's default 1.0 (legacy PPO's default is no clipping). `temperature`: the episodes' sampling
        temperature (0, greedy, counts as 1)."""
        shared = ("exp_name", "seed", "learning_rate", "batch_size", "mini_batch_size", "steps", "log_with",
                  "tracker_kwargs", "accelerator_kwargs", "project_kwargs", "gradient_checkpointing", "tracker_project_name",
                  "share_prompt_prefix")
        given = set(off_policy_given)
        if "vllm_importance_sampling_cap" in given:  # PPOConfig's older name of the upper clip
            given.add("vllm_importance_sampling_clip_max")
        values = {name: getattr(ppo_config, name) for name in (*shared, *given.intersection(OFF_POLICY_SETTINGS))}
        if ppo_config.max_grad_norm is not None:
            values["max_grad_norm"] = ppo_config.max_grad_norm
        return cls(**values, **grpo_arguments, temperature=temperature if temperature > 0 else 1.0)
