"""The `Settings` of one training run, and the policy, the trainer and the seeds they give."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from textenv.grpo.config import AlgorithmArguments, GRPOConfig
from textenv.options import (DEFAULT_BATCH_SIZE, DEFAULT_PPO_EPOCHS, DEFAULT_TRAINING_STEPS, DEFAULT_VALUE_HEAD_INIT_STD, EpisodeArguments,
                             default_mini_batch_size)
from textenv.training.policy import load_policy


@dataclass
class Settings(EpisodeArguments, AlgorithmArguments):
    """Everything one training run of a `TextEnvironment` task depends on: how episodes are played (the fields
    of `textenv.options.EpisodeArguments`), the algorithm (`textenv.grpo.AlgorithmArguments`: ``ppo``, the
    default, or ``grpo`` and its settings) and the model, PPO, LoRA and evaluation settings below. The
    defaults are the demo's (the calculator agent on a CPU). The demo and the examples read them from the
    command line with `textenv.options.parse_options`; each field's ``help`` says what it holds.

    Tuning note (bundled model, LoRA r=16 on the top 8 layers, 16 episodes per step): a learning rate of
    1e-3 with 4 mini-batches per step wrecked the policy in one step (KL 2.5, training reward 0.50 -> 0.06).

    `value_head_init_std`: the value head starts with weights ~ N(0, this) and bias 0, so its first values
    are about 0. With PyTorch's default init the bundled model's values differ by ~1.3 from one position to
    the next, more than the 0/1 reward, and the first PPO steps follow that noise.
    """

    model: str = field(default="bundled", metadata={"help": "'bundled' (SmolLM2-135M-Instruct), 'tiny' (random, for smoke tests) or a folder / hub id"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads (0: torch's default)"})
    seed: int = field(default=0, metadata={"help": "seed of torch, of the training tasks and of the PPO trainer"})
    ppo_steps: int = field(default=DEFAULT_TRAINING_STEPS, metadata={"help": "training steps (each on batch_size episodes), PPO or GRPO"})
    batch_size: int = field(default=DEFAULT_BATCH_SIZE, metadata={"help": "episodes per training step (GRPO: a multiple of num_generations)"})
    mini_batch_size: Optional[int] = field(
        default=None, metadata={"help": "episodes per mini-batch (forward + backward); default: the largest of 4, 3, 2, 1 that divides batch_size"}
    )
    ppo_epochs: int = field(default=DEFAULT_PPO_EPOCHS, metadata={"help": "PPO: optimisation passes over each batch (GRPO: num_iterations)"})
    learning_rate: float = field(default=2e-4, metadata={"help": "Adam learning rate"})
    init_kl_coef: float = field(default=0.02, metadata={"help": "initial weight of the KL penalty to the reference policy"})
    adap_kl_ctrl: bool = field(default=True, metadata={"help": "adapt the KL weight towards kl_target"})
    kl_target: float = field(default=6.0, metadata={"help": "target KL of the adaptive controller"})
    lora: bool = field(default=True, metadata={"help": "train LoRA adapters (peft) instead of all weights"})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank r (lora_alpha = 2 r)"})
    lora_layers: int = field(
        default=8, metadata={"help": "adapters on the top N decoder layers only, 0 = all (the backward pass then stops at the lowest one)"}
    )
    value_head_init_std: float = field(default=DEFAULT_VALUE_HEAD_INIT_STD, metadata={"help": "std of the value head's initial weights (0: PyTorch's default init)"})
    eval_tasks: int = field(default=100, metadata={"help": "size of the held-out task set (0: none)"})
    eval_seed: int = field(default=1234, metadata={"help": "seed of the held-out task set"})
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={"help": "weight each trained token by the trainer's over the sampler's probability (vLLM's log-probabilities; "
                          "PPO: token_truncate at 2, GRPO: sequence_mask at 3, as GRPOConfig and TRL; see textenv.off_policy); for --engine vllm, "
                          "with --max_staleness"},
    )

    def __post_init__(self) -> None:
        EpisodeArguments.__post_init__(self)
        AlgorithmArguments.__post_init__(self)
        if self.mini_batch_size is None:
            self.mini_batch_size = default_mini_batch_size(self.batch_size)
        self.check_batch_size(self.batch_size)


def algorithm_summary(settings: Settings) -> str:
    """The algorithm's settings in a few words, for the summaries the demo and the examples print."""
    if settings.algorithm == "grpo":
        return (f"GRPO: {settings.num_generations} episodes per group, loss {settings.loss_type}, scale_rewards "
                f"{settings.scale_rewards}, beta {settings.beta}, num_iterations {settings.num_iterations}")
    return f"PPO: ppo_epochs {settings.ppo_epochs}, init_kl_coef {settings.init_kl_coef}"


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed `random` and torch; with `threads > 0`, also fix the number of torch CPU threads."""
    random.seed(seed)
    torch.manual_seed(seed)
    if threads > 0:
        torch.set_num_threads(threads)


def build_policy(settings: Settings) -> tuple[Any, Any]:
    """`load_policy` with the model, device, LoRA and value-head settings of `settings`.

    Returns:
        `(model, tokenizer)`: for PPO an `AutoModelForCausalLMWithValueHead`, for GRPO the causal LM (with its
        LoRA adapters), in eval mode, and its tokenizer.
    """
    return load_policy(
        settings.model,
        device=settings.device,
        value_head=settings.algorithm == "ppo",
        lora_rank=settings.lora_rank if settings.lora else 0,
        lora_layers=settings.lora_layers,
        value_head_init_std=settings.value_head_init_std,
        seed=settings.seed,
    )


def build_trainer(model, tokenizer, settings: Settings, log_dir: str | None = None, name: str = "calculator"):
    """The trainer of `settings.algorithm` for `model`: a `PPOTrainer` with the PPO settings of `settings` (the
    reference is the model with its adapters disabled when it uses LoRA, else a frozen copy), or a
    `GRPOTrainer` with the same seed, steps, batch sizes, learning rate and tracking and the GRPO settings.

    Args:
        model: the policy, from `build_policy` or `load_policy`.
        tokenizer: its tokenizer.
        settings (`Settings`): seed, steps, batch sizes, epochs, learning rate and KL control.
        log_dir (`str`, *optional*): log the statistics to tensorboard there, under the run `name`.
        name (`str`, defaults to `"calculator"`): the run's name (`exp_name`, tracker project).

    Returns:
        A `PPOTrainer` or a `GRPOTrainer`.
    """
    from textenv.ppo import PPOConfig

    config = PPOConfig(
        exp_name=name,
        seed=settings.seed,
        steps=settings.ppo_steps * settings.batch_size,
        learning_rate=settings.learning_rate,
        batch_size=settings.batch_size,
        mini_batch_size=settings.mini_batch_size,
        ppo_epochs=settings.ppo_epochs,
        init_kl_coef=settings.init_kl_coef,
        adap_kl_ctrl=settings.adap_kl_ctrl,
        target=settings.kl_target,
        log_with="tensorboard" if log_dir else None,
        project_kwargs={"logging_dir": log_dir} if log_dir else {},
        tracker_project_name=name,
        accelerator_kwargs={"mixed_precision": settings.mixed_precision} if settings.mixed_precision else {},
        vllm_importance_sampling_correction=settings.vllm_importance_sampling_correction,
    )
    if settings.algorithm == "grpo":
        from textenv.grpo import GRPOTrainer

        return GRPOTrainer(GRPOConfig.from_ppo_config(config, settings.grpo_arguments(), settings.temperature), model, tokenizer=tokenizer)
    return trainer_without_dataset(config, model, tokenizer)


def trainer_without_dataset(config, model, tokenizer):
    """A `PPOTrainer` of `model` (its reference: the model with adapters disabled, or a frozen copy) whose
    episodes come from an episode source, not from a dataset (so no warning says none was given)."""
    from textenv.ppo import PPOTrainer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided", category=UserWarning)
        return PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)
