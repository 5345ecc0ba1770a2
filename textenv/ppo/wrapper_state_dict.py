"""The state-dict key layout of the value-head wrappers, as legacy TRL (0.11.4) wrote it.

Legacy TRL's ``AutoModel...WithValueHead.state_dict()`` returned the wrapped model's own keys (no
``pretrained_model.`` prefix) plus ``v_head.summary.weight`` / ``v_head.summary.bias``, so that the dict can be
handed to the wrapped model's ``save_pretrained`` and read back by ``AutoModelForCausalLM.from_pretrained``.
Parameter names (``named_parameters``, ``get_parameter``) keep the ``pretrained_model.`` prefix.

Here that layout is produced by torch state-dict hooks instead of an overridden ``state_dict`` method, so it
composes with wrappers around the model (DDP, accelerate) that call ``state_dict(prefix="module.")``, and
``load_state_dict`` accepts both the legacy layout and the prefixed one (legacy TRL could not load its own
``state_dict()`` with ``strict=True``). Missing and unexpected keys are reported in the legacy layout, the
names ``state_dict()`` uses, which keeps ``safetensors.torch.load_model`` (used by accelerate's
``load_state``) consistent about tied weights.
"""

from __future__ import annotations

from torch import nn

WRAPPED_MODEL = "pretrained_model"
_LOAD_PREFIX_ATTR = "_value_head_load_prefix"


def register_legacy_layout(wrapper: nn.Module) -> None:
    """Give ``wrapper`` (which holds the wrapped model as ``wrapper.pretrained_model``) the legacy layout.

    The hooks are module-level functions, so ``copy.deepcopy`` and pickling of the wrapper keep them.

    Args:
        wrapper: a value-head wrapper module.
    """
    wrapper.register_state_dict_post_hook(_drop_wrapped_prefix)
    wrapper.register_load_state_dict_pre_hook(_accept_both_layouts)
    wrapper.register_load_state_dict_post_hook(_report_in_legacy_layout)


def _unprefixed(key: str, prefix: str) -> str:
    """``<prefix>pretrained_model.<rest>`` -> ``<prefix><rest>``; other keys unchanged."""
    inner = f"{prefix}{WRAPPED_MODEL}."
    return prefix + key[len(inner):] if key.startswith(inner) else key


def _drop_wrapped_prefix(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    # This module's keys were added last and are contiguous at the end of `state_dict`: pop and re-insert
    # them renamed, in the same order (wrapped model first, then `v_head.*`).
    ours = [key for key in state_dict if key.startswith(prefix)]
    for key in ours:
        state_dict[_unprefixed(key, prefix)] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        inner = f"{prefix}{WRAPPED_MODEL}"
        for key in [key for key in metadata if key == inner or key.startswith(inner + ".")]:
            renamed = prefix[:-1] if key == inner else _unprefixed(key, prefix)
            metadata[renamed] = metadata.pop(key)


def _accept_both_layouts(
    module: nn.Module,
    state_dict: dict,
    prefix: str,
    local_metadata: dict,
    strict: bool,
    missing_keys: list,
    unexpected_keys: list,
    error_msgs: list,
) -> None:
    # `state_dict` is load_state_dict's own copy; the children are loaded from it after this hook.
    object.__setattr__(module, _LOAD_PREFIX_ATTR, prefix)
    own = tuple(f"{prefix}{name}." for name in module._modules)  # pretrained_model., v_head., (score.)
    for key in [key for key in state_dict if key.startswith(prefix) and not key.startswith(own)]:
        state_dict[f"{prefix}{WRAPPED_MODEL}.{key[len(prefix):]}"] = state_dict.pop(key)


def _report_in_legacy_layout(module: nn.Module, incompatible_keys) -> None:
    prefix = module.__dict__.pop(_LOAD_PREFIX_ATTR, "")
    for keys in (incompatible_keys.missing_keys, incompatible_keys.unexpected_keys):
        keys[:] = [_unprefixed(key, prefix) for key in keys]
