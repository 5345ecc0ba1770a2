"""The model inside the wrappers: what owns `.generate`, and what the engine's own decoding loop runs."""

from __future__ import annotations

from typing import Any

import torch


def unwrap_model(model: Any) -> Any:
    """The model that owns `.generate`: strips accelerate/DDP wrappers and the value-head wrapper."""
    if _may_be_wrapped(model):
        from accelerate.utils import extract_model_from_parallel

        model = extract_model_from_parallel(model)
    return getattr(model, "pretrained_model", model)


def _may_be_wrapped(model: Any) -> bool:
    """Whether accelerate's `extract_model_from_parallel` could return something other than `model`: a
    container (DDP, DataParallel, FSDP, DeepSpeed: all have `.module`) or a compiled module. Asked before it
    because it walks every submodule looking for compiled regions (0.5 ms on a 135M model), and the engine
    unwraps the policy for every turn it serves."""
    if not isinstance(model, torch.nn.Module):
        return True
    return hasattr(model, "module") or "_orig_mod" in model._modules or "_orig_mod" in model.__dict__


def decoding_model(model: Any) -> Any:
    """The module the engine's own decoding loop runs: `unwrap_model(model)`, and for a PEFT model whose
    adapters live inside its layers (LoRA and kin, not prompt learning) the adapted transformers model
    within, which takes the `position_ids` / `logits_to_keep` the loop feeds (the PEFT wrapper's `forward`
    hides them). Its layers are the PEFT model's, so enabled or disabled adapters act the same."""
    model = unwrap_model(model)
    peft_config = getattr(model, "peft_config", None)
    active = getattr(model, "active_adapter", None)
    if isinstance(peft_config, dict) and isinstance(active, str) and active in peft_config and hasattr(model, "get_base_model"):
        if not peft_config[active].is_prompt_learning:
            return model.get_base_model()
    return model


def model_device(model: Any) -> torch.device:
    model = unwrap_model(model)
    device = getattr(model, "device", None)
    if device is None:
        device = next(model.parameters()).device
    return torch.device(device)
