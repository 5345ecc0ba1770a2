"""The `Settings` of one training run, and the policy, the trainer and the seeds they give."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from textenv.training.policy import load_policy


@dataclass
class Settings:
    """Everything one training run depends on. The defaults are the demo's (the calculator agent on a CPU).

    Tuning note (bundled model, LoRA r=16 on the top 8 layers, 16 episodes per step): a learning rate of
    1e-3 with 4 mini-batches per step wrecked the policy in one step (KL 2.5, training reward 0.50 -> 0.06).

    Attributes:
        model: `"bundled"` (SmolLM2-135M-Instruct), `"tiny"` (a random tiny model, for smoke tests) or a
            local folder / hub id of a causal LM.
        device: torch device of the policy (`"cpu"`, `"cuda"`, ...).
        threads: torch CPU threads (`torch.set_num_threads`); 0 leaves torch's default.
        seed: seed of torch, of the training tasks and of the PPO trainer.
        steps: PPO steps.
        batch_size: episodes per PPO step.
        mini_batch_size: episodes per PPO mini-batch (forward + backward).
        ppo_epochs: optimisation passes over each batch.
        learning_rate: Adam learning rate.
        init_kl_coef: initial weight of the KL penalty to the reference policy.
        adap_kl_ctrl: adapt the KL weight towards `kl_target`.
        kl_target: target KL of the adaptive controller.
        lora: train LoRA adapters (peft) instead of all weights.
        lora_rank: LoRA rank `r` (`lora_alpha = 2 * r`).
        lora_layers: put adapters on the top `lora_layers` decoder layers only (0 = all layers). Gradients
            then stop at the lowest adapted layer, which makes the backward pass much cheaper on a CPU.
        value_head_init_std: the value head starts with weights ~ N(0, this) and bias 0, so its first
            values are about 0. With PyTorch's default init the bundled model's values differ by ~1.3
            from one position to the next, more than the 0/1 reward, and the first PPO steps follow that
            noise. 0 keeps the default init.
        max_new_tokens: tokens per model turn.
        max_turns: model turns per episode.
        generation_batch_size: episodes generated together.
        eval_tasks: size of the held-out task set.
        eval_seed: seed of the held-out task set.
        mixed_precision: `"bf16"` (or `"fp16"`): the PPO step under accelerate's mixed precision and the rollout
            under `torch.autocast` in that dtype (weights stay float32); `None`: float32 throughout.
        tool_format: `"tags"` (the legacy `<request><Calculator>...<call>` syntax) or `"json"` (the chat
            template's JSON tool calls) for the calculator job.
    """

    model: str = "bundled"
    device: str = "cpu"
    threads: int = 2
    seed: int = 0
    steps: int = 20
    batch_size: int = 16
    mini_batch_size: int = 4
    ppo_epochs: int = 1
    learning_rate: float = 2e-4
    init_kl_coef: float = 0.02
    adap_kl_ctrl: bool = True
    kl_target: float = 6.0
    lora: bool = True
    lora_rank: int = 16
    lora_layers: int = 8
    value_head_init_std: float = 1e-3
    max_new_tokens: int = 24
    max_turns: int = 3
    generation_batch_size: int = 50
    eval_tasks: int = 100
    eval_seed: int = 1234
    mixed_precision: str | None = None
    tool_format: str = "tags"


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed `random` and torch; with `threads > 0`, also fix the number of torch CPU threads."""
    random.seed(seed)
    torch.manual_seed(seed)
    if threads > 0:
        torch.set_num_threads(threads)


def build_policy(settings: Settings) -> tuple[Any, Any]:
    """`load_policy` with the model, device, LoRA and value-head settings of `settings`.

    Returns:
        `(model, tokenizer)`: an `AutoModelForCausalLMWithValueHead` in eval mode and its tokenizer.
    """
    return load_policy(
        settings.model,
        device=settings.device,
        lora_rank=settings.lora_rank if settings.lora else 0,
        lora_layers=settings.lora_layers,
        value_head_init_std=settings.value_head_init_std,
        seed=settings.seed,
    )


def build_trainer(model, tokenizer, settings: Settings, log_dir: str | None = None, name: str = "calculator"):
    """A `PPOTrainer` for `model` with the PPO settings of `settings` (the reference is the model with its
    adapters disabled when it uses LoRA, else a frozen copy).

    Args:
        model: the policy, from `build_policy` or `load_policy`.
        tokenizer: its tokenizer.
        settings (`Settings`): seed, steps, batch sizes, epochs, learning rate and KL control.
        log_dir (`str`, *optional*): log the statistics to tensorboard there, under the run `name`.
        name (`str`, defaults to `"calculator"`): the run's name (`exp_name`, tracker project).

    Returns:
        A `PPOTrainer`.
    """
    from textenv.ppo import PPOConfig

    config = PPOConfig(
        exp_name=name,
        seed=settings.seed,
        steps=settings.steps * settings.batch_size,
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
    )
    return trainer_without_dataset(config, model, tokenizer)


def trainer_without_dataset(config, model, tokenizer):
    """A `PPOTrainer` of `model` (its reference: the model with adapters disabled, or a frozen copy) whose
    episodes come from an episode source, not from a dataset (so no warning says none was given)."""
    from textenv.ppo import PPOTrainer

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No dataset is provided", category=UserWarning)
        return PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)
