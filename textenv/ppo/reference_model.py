"""[`create_reference_model`]: the frozen copy of the policy that PPO's KL penalty compares it with."""

from __future__ import annotations

import copy
import warnings
from typing import Any

from torch import nn

# Layer-name patterns tried by `create_reference_model(num_shared_layers=k)`, formatted with k.
LAYER_PATTERNS = (
    "transformer.h.{layer}",
    "model.decoder.layers.{layer}",
    "gpt_neox.layers.{layer}",
    "model.layers.{layer}",
)


def _shared_prefix_parameters(model: nn.Module, num_shared_layers: int, pattern: str | None) -> list[nn.Parameter]:
    """The parameters listed before the first parameter of layer ``num_shared_layers``."""
    names = [name for name, _ in model.named_parameters()]
    patterns = [pattern.format(layer=num_shared_layers)] if pattern else [
        p.format(layer=num_shared_layers) for p in LAYER_PATTERNS
    ]
    for candidate in patterns:
        hits = [i for i, name in enumerate(names) if f"{candidate}." in name or name.endswith(candidate)]
        if hits:
            params = list(model.named_parameters())
            return [param for _, param in params[: hits[0]]]
    raise ValueError(
        f"Layer {num_shared_layers} not found with the patterns {patterns}; pass `pattern` with a `{{layer}}` "
        "placeholder, e.g. 'model.layers.{layer}'"
    )


def create_reference_model(
    model: nn.Module, num_shared_layers: int | None = None, pattern: str | None = None
) -> nn.Module:
    """A frozen copy of ``model`` for the KL penalty.

    With ``num_shared_layers=k`` the parameters before layer ``k`` (embeddings and the first ``k`` layers)
    are frozen in ``model`` and **shared** with the reference (the same tensors, no second copy); only the
    upper layers and the heads are copied.

    Args:
        model: the policy.
        num_shared_layers: number of lower layers to freeze and share.
        pattern: layer-name pattern with a ``{layer}`` placeholder, when the built-in ones do not match.

    Returns:
        The reference model, in eval mode, with ``requires_grad=False`` everywhere.
    """
    try:
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():
            raise ValueError("create_reference_model cannot copy a ZeRO-3 sharded model; load a reference model instead")
    except ImportError:
        pass
    memo: dict[int, Any] = {}
    if num_shared_layers is not None:
        for param in _shared_prefix_parameters(model, num_shared_layers, pattern):
            param.requires_grad_(False)
            memo[id(param)] = param  # deepcopy returns these objects themselves: shared, not copied
    elif pattern is not None:
        warnings.warn("`pattern` is ignored without `num_shared_layers`", UserWarning, stacklevel=2)
    reference = copy.deepcopy(model, memo)
    for param in reference.parameters():
        param.requires_grad_(False)
    return reference.eval()
