"""What `PPOTrainer.__init__` checks and builds: argument checks, the default optimizer, the reference model."""

from __future__ import annotations

import gc
import os
import warnings

import torch
from torch import nn

from textenv.hardware import warn_if_bf16_emulated
from textenv.ppo.offloaded_reference import OffloadedReference, should_offload
from textenv.ppo.reference_model import create_reference_model
from textenv.ppo.seq2seq_value_head import AutoModelForSeq2SeqLMWithValueHead
from textenv.ppo.step_in_backward import StepInBackward
from textenv.ppo.value_head import AutoModelForCausalLMWithValueHead

FUSED_ADAM_DEVICES = ("cpu", "cuda")


def empty_device_cache() -> None:
    """``gc.collect()`` and release cached accelerator memory."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    elif torch.backends.mps.is_available():
        torch.mps.empty_cache()


def default_optimizer(params: list[nn.Parameter], learning_rate: float) -> torch.optim.Adam:
    """Adam, as legacy TRL, with the fused kernel where it exists: one pass over each parameter and its two
    moments instead of about ten (6x faster on CPU for the bundled model; same update to float rounding)."""
    fused = all(param.device.type in FUSED_ADAM_DEVICES and param.is_floating_point() for param in params)
    return torch.optim.Adam(params, lr=learning_rate, fused=fused or None)


def is_value_head_model(model) -> bool:
    """A causal or seq2seq LM wrapped with a value head (``AutoModelFor...WithValueHead``)."""
    return isinstance(model, nn.Module) and hasattr(model, "v_head") and hasattr(model, "pretrained_model")


def check_constructor_args(config, model, tokenizer, dataset, lr_scheduler) -> None:
    """Raise ``ValueError`` naming the argument when one of `PPOTrainer`'s arguments has the wrong type."""
    from transformers import PreTrainedTokenizerBase

    from textenv.ppo.config import PPOConfig

    if not isinstance(config, PPOConfig):
        raise ValueError(f"config must be a PPOConfig, got {type(config).__name__}")
    if not is_value_head_model(model):
        raise ValueError(
            f"model must be an AutoModelForCausalLMWithValueHead or AutoModelForSeq2SeqLMWithValueHead, got "
            f"{type(model).__name__}; wrap the model with AutoModelForCausalLMWithValueHead(model) or load it with "
            ".from_pretrained(...)"
        )
    if tokenizer is not None and not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ValueError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
    if dataset is not None and not isinstance(dataset, torch.utils.data.Dataset):
        try:
            import datasets

            ok = isinstance(dataset, datasets.Dataset)
        except ImportError:
            ok = False
        if not ok:
            raise ValueError(f"dataset must be a torch.utils.data.Dataset or datasets.Dataset, got {type(dataset).__name__}")
    if lr_scheduler is not None and not isinstance(lr_scheduler, torch.optim.lr_scheduler.LRScheduler):
        raise ValueError("lr_scheduler must be a torch.optim.lr_scheduler.LRScheduler")


def launched_on_cpu_only() -> bool:
    """Several processes were launched (torchrun, accelerate) on a machine without accelerators."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1 or int(os.environ.get("LOCAL_RANK", "-1")) != -1
    has_accelerator = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    return launched and not has_accelerator


def make_accelerator(config, gradient_accumulation_steps: int):
    """The `Accelerator` of a step-based trainer: ``config.accelerator_kwargs``, the tracker and project settings,
    the CPU on a CPU-only multi-process launch, and gradient accumulation over `gradient_accumulation_steps`."""
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin, ProjectConfiguration

    accelerator_kwargs = dict(config.accelerator_kwargs)
    if launched_on_cpu_only():
        # accelerate treats a torchrun/mpirun launch on a machine without accelerators as a single process
        # unless told to use the CPU; say it, so the processes really train together (gloo).
        accelerator_kwargs.setdefault("cpu", True)
    accelerator_kwargs.setdefault(
        "gradient_accumulation_plugin", GradientAccumulationPlugin(num_steps=gradient_accumulation_steps, sync_with_dataloader=False)
    )
    accelerator = Accelerator(log_with=config.log_with, project_config=ProjectConfiguration(**config.project_kwargs), **accelerator_kwargs)
    if accelerator.mixed_precision == "bf16" and accelerator.device.type == "cpu":
        warn_if_bf16_emulated("a training step under bf16 autocast (mixed_precision='bf16')")
    return accelerator


def build_reference(trainer, model, ref_model, num_shared_layers):
    """The frozen reference: ``ref_model`` as given, ``None`` for PEFT (adapters disabled), an [`OffloadedReference`]
    or a copy sharing the lower ``num_shared_layers`` layers."""
    if trainer.config.offload_reference and (ref_model is not None or num_shared_layers is not None or trainer.is_peft_model):
        raise ValueError(
            "offload_reference=True only applies when the trainer copies the model for the reference; it "
            "cannot be combined with ref_model, num_shared_layers or a PEFT model (leave it None)"
        )
    if ref_model is not None:
        if num_shared_layers is not None:
            warnings.warn(
                "num_shared_layers is ignored when ref_model is given; pass only one of them.",
                UserWarning,
                stacklevel=3,
            )
        if not is_value_head_model(ref_model):
            wrapper = AutoModelForSeq2SeqLMWithValueHead if trainer.is_encoder_decoder else AutoModelForCausalLMWithValueHead
            ref_model = wrapper(ref_model)
        for param in ref_model.parameters():
            param.requires_grad_(False)
        return ref_model.eval()
    if trainer.is_peft_model:
        return None  # the reference is the same model with its adapters disabled
    if num_shared_layers is None and should_offload(trainer.config.offload_reference, model, trainer.accelerator.device):
        return OffloadedReference(model, trainer.accelerator.device)
    return create_reference_model(model, num_shared_layers=num_shared_layers)


def prepare_reference(accelerator, ref_model):
    """Move the reference to the accelerator's device (a separate DeepSpeed engine under ZeRO-3)."""
    if isinstance(ref_model, OffloadedReference):
        return ref_model  # loaded onto its device at each use
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        import deepspeed

        ds_config = dict(plugin.deepspeed_config)
        ds_config.pop("optimizer", None)
        ds_config.pop("scheduler", None)
        engine, *_ = deepspeed.initialize(model=ref_model, config=ds_config)
        engine.eval()
        return engine
    return ref_model.to(accelerator.device)


def configure_deepspeed(accelerator, config) -> None:
    """Fill DeepSpeed's ``"auto"`` micro batch size and accumulation steps from ``config``: PPO has no dataloader
    for accelerate to infer them from."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds_config = plugin.deepspeed_config
    if ds_config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        ds_config["train_micro_batch_size_per_gpu"] = config.mini_batch_size
    if ds_config.get("gradient_accumulation_steps", "auto") == "auto":
        ds_config["gradient_accumulation_steps"] = config.gradient_accumulation_steps


def make_step_in_backward(trainer, owns_optimizer: bool) -> StepInBackward | None:
    """Fuse the optimizer step into backward (see `textenv.ppo.step_in_backward`) when asked for and nothing needs
    all gradients at once: our own optimizer, one process, no accumulation, clipping, loss scaling or DeepSpeed."""
    config, accelerator = trainer.config, trainer.accelerator
    fusable = (
        config.step_in_backward
        and owns_optimizer
        and accelerator.num_processes == 1
        and config.gradient_accumulation_steps == 1
        and config.max_grad_norm is None
        and accelerator.scaler is None
        and getattr(accelerator.state, "deepspeed_plugin", None) is None
    )
    return StepInBackward(trainer.optimizer.optimizer, trainer.trainable_params) if fusable else None


def make_dataloader(config, dataset, data_collator=None) -> torch.utils.data.DataLoader:
    """`PPOTrainer.prepare_dataloader`: shuffled batches of ``config.batch_size``, the last partial one dropped;
    🤗 datasets lose the columns the model does not take (unless ``config.remove_unused_columns`` is False)."""
    try:
        import datasets

        if isinstance(dataset, datasets.Dataset) and config.remove_unused_columns:
            keep = {"input_ids", "attention_mask", "label", "query", "response"}
            unused = [c for c in dataset.column_names if c not in keep]
            dataset = dataset.remove_columns(unused) if unused else dataset
    except ImportError:
        pass
    return torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, collate_fn=data_collator, shuffle=True, drop_last=True)


def init_trackers(accelerator, config) -> None:
    """Start accelerate's trackers (``config.log_with``) with the configuration as hyper-parameters."""
    if config.log_with == "tensorboard":
        tracker_config = {k: v for k, v in config.to_dict().items() if isinstance(v, (int, float, str, bool)) and v is not None}
    else:
        tracker_config = {"trl_ppo_trainer_config": config.to_dict()}
    accelerator.init_trackers(config.tracker_project_name, config=tracker_config, init_kwargs=config.tracker_kwargs)
