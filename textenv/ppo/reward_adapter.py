"""A reward-modeling LoRA adapter loaded next to the policy adapter of a PEFT model (legacy TRL's
"multi-adapter RL"): one base model serves as policy and as reward model.

The reward adapter is a ``SEQ_CLS`` adapter saved by ``peft`` from a sequence-classification model; its file
also holds the classification head (``score``), which the causal model lacks, so the head is rebuilt here as a
frozen ``nn.Linear``. [`PreTrainedModelWrapper.compute_reward_score`] switches to the adapter to use it.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from textenv.ppo.value_head_files import CheckpointLocation

ADAPTER_FILES = ("adapter_model.bin", "adapter_model.safetensors")  # legacy's order
SCORE_MODULE_NAMES = ("score",)


def load_reward_adapter(
    pretrained_model: nn.Module, adapter_model_id: str | os.PathLike, adapter_name: str, token: str | bool | None = None
) -> nn.Linear:
    """Load a reward adapter into ``pretrained_model`` (frozen) and return its frozen score head.

    Args:
        pretrained_model: the policy, a ``peft.PeftModel``.
        adapter_model_id: local folder or Hub id of the reward adapter (``adapter_config.json`` and
            ``adapter_model.bin`` or ``adapter_model.safetensors`` with a ``score`` weight).
        adapter_name: the name the adapter gets in ``pretrained_model``.
        token: Hub token.

    Returns:
        The score head, ``Linear(hidden_size, num_labels)`` in the model's dtype on the model's device.

    Raises:
        ValueError: no adapter weights, or no ``score`` weight in them.
    """
    adapter_model_id = str(adapter_model_id)
    pretrained_model.load_adapter(adapter_model_id, adapter_name, is_trainable=False)
    pretrained_model.train()  # as legacy TRL; load_adapter may leave the model in eval mode
    location = CheckpointLocation(adapter_model_id, token=token)
    path = next((found for found in map(location.find, ADAPTER_FILES) if found is not None), None)
    if path is None:
        raise ValueError(
            f"Could not find the adapter weights ({' or '.join(ADAPTER_FILES)}) of {adapter_model_id}; "
            "make sure the reward adapter id or folder is right."
        )
    score_state = _score_tensors(_load_tensors(path))
    if "weight" not in score_state:
        raise ValueError(
            f"The reward adapter {adapter_model_id} has no score head ({'/'.join(SCORE_MODULE_NAMES)}.weight); "
            "save it from a sequence-classification model (peft task_type='SEQ_CLS')."
        )
    num_labels, hidden_size = score_state["weight"].shape
    device = next(pretrained_model.parameters()).device
    score = nn.Linear(hidden_size, num_labels, bias="bias" in score_state)
    score.to(device=device, dtype=pretrained_model.dtype)
    score.load_state_dict(score_state)
    score.requires_grad_(False)
    return score


def _load_tensors(path: str) -> dict[str, torch.Tensor]:
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def _score_tensors(adapter_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{"weight": ..., "bias": ...}`` of the first score-module name present in the adapter's keys."""
    for candidate in SCORE_MODULE_NAMES:
        names = [name for name in adapter_state if candidate in name.split(".")]
        if names:
            return {name.rsplit(".", 1)[-1]: adapter_state[name] for name in names}
    return {}
