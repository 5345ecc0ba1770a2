"""The one policy loader of the demo, the CLI and the examples: a model by name, on a device, with an
optional value head, LoRA adapters and value-head initialisation."""

from __future__ import annotations

import copy
from typing import Any

TINY_MODEL = "tiny"
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(rank: int, layers: int, num_hidden_layers: int):
    """A peft `LoraConfig` on the attention and MLP projections of the top `layers` decoder layers.

    Args:
        rank (`int`): LoRA rank `r`; `lora_alpha` is `2 * rank`.
        layers (`int`): adapt only the top `layers` decoder layers; 0 (or at least `num_hidden_layers`)
            adapts all of them.
        num_hidden_layers (`int`): the model's decoder layers.

    Returns:
        A `peft.LoraConfig` for a causal LM.
    """
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGET_MODULES),
        layers_to_transform=top_layers(layers, num_hidden_layers),
        task_type="CAUSAL_LM",
    )


def top_layers(layers: int, num_hidden_layers: int) -> list[int] | None:
    """The indices of the top `layers` decoder layers, or `None` (all layers) for 0 or at least all of them.

    Raises:
        ValueError: a negative `layers`.
    """
    if layers < 0:
        raise ValueError(f"lora_layers must be >= 0 (0: every layer), got {layers}.")
    return list(range(num_hidden_layers - layers, num_hidden_layers)) if 0 < layers < num_hidden_layers else None


def load_policy(
    model: str = "bundled",
    *,
    device: str = "cpu",
    value_head: bool = True,
    lora_rank: int = 0,
    lora_layers: int = 0,
    value_head_init_std: float = 0.0,
    seed: int = 0,
    peft_config: Any = None,
    dtype: Any = None,
) -> tuple[Any, Any]:
    """Load the policy to train or to run, in eval mode, and its tokenizer.

    A folder holding a value head (saved by `PPOTrainer.save_pretrained`) gets its value head back.

    Args:
        model (`str`, defaults to `"bundled"`): `"bundled"` (SmolLM2-135M-Instruct), `"tiny"` (a random tiny
            model with the bundled tokenizer, for smoke runs) or a local folder / hub id of a causal LM.
        device (`str`, defaults to `"cpu"`): torch device of the policy; the weights, adapters and value
            head are created on the CPU first, so a seed gives the same start on every device.
        value_head (`bool`, defaults to `True`): wrap the model in `AutoModelForCausalLMWithValueHead` for PPO;
            `False` returns the plain causal LM (for GRPO, or for running episodes only).
        lora_rank (`int`, defaults to 0): train LoRA adapters of this rank instead of all weights; 0 = no LoRA.
        lora_layers (`int`, defaults to 0): put the adapters on the top `lora_layers` decoder layers only
            (0 = all layers); see `lora_config`.
        value_head_init_std (`float`, defaults to 0): start a new value head with weights ~ N(0, this) and
            bias 0; 0 keeps PyTorch's default initialisation.
        seed (`int`, defaults to 0): the weights of the tiny model.
        peft_config (`peft.PeftConfig`, *optional*): adapters to train, given whole (e.g. from TRL's
            `get_peft_config`); replaces `lora_rank`. A `lora_layers` given with it puts its adapters on the top
            `lora_layers` layers (its ``layers_to_transform``), as `textenv train --use_peft --lora_layers N` does.
        dtype (`str` or `torch.dtype`, *optional*): the weights' dtype (`"bfloat16"`, `"float32"`, `"auto"`);
            `None`: the checkpoint's default (float32 for the bundled model). textenv never picks bfloat16 itself
            (`textenv train`'s `--dtype` defaults to float32); bfloat16 weights on a CPU that emulates bf16 are
            warned about once, with the cost.

    Returns:
        `(model, tokenizer)`: a value-head model or, with ``value_head=False``, the causal LM (a `peft.PeftModel`
        with adapters).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from textenv.models import load_tokenizer, resolve_model_path, tiny_causal_lm

    load_options: dict[str, Any] = {} if dtype in (None, "None") else {"dtype": dtype}
    if model == TINY_MODEL:
        source, tokenizer = tiny_causal_lm(seed=seed), load_tokenizer()
    else:
        source = resolve_model_path(model)
        tokenizer = load_tokenizer(source)
    if (peft_config is None and lora_rank) or (peft_config is not None and lora_layers):
        config = AutoConfig.from_pretrained(source) if isinstance(source, str) else source.config
        if peft_config is None:
            peft_config = lora_config(lora_rank, lora_layers, config.num_hidden_layers)
        else:
            target = getattr(peft_config, "target_modules", None)
            if isinstance(target, str) and target != "all-linear":
                raise ValueError(f"lora_layers ({lora_layers}) cannot narrow the regex target_modules {target!r} (peft applies a regex "
                                 "as it is): name the layers in the regex, or give module names (e.g. q_proj v_proj).")
            peft_config = copy.copy(peft_config)
            peft_config.layers_to_transform = top_layers(lora_layers, config.num_hidden_layers)
    if not value_head:
        policy = AutoModelForCausalLM.from_pretrained(source, **load_options) if isinstance(source, str) else source
        if peft_config is not None:
            from peft import get_peft_model

            policy = get_peft_model(policy, peft_config)
        return _checked_for_emulated_bf16(policy.to(device).eval()), tokenizer

    from textenv.ppo import AutoModelForCausalLMWithValueHead

    options: dict[str, Any] = dict(load_options) if isinstance(source, str) else {}
    if peft_config is not None:
        options["peft_config"] = peft_config
    if value_head_init_std > 0:
        options.update(v_head_init_strategy="normal", v_head_initializer_range=value_head_init_std)
    policy = AutoModelForCausalLMWithValueHead.from_pretrained(source, **options)
    return _checked_for_emulated_bf16(policy.to(device).eval()), tokenizer


def _checked_for_emulated_bf16(policy):
    """`policy`, after a warning (once) if it holds bfloat16 weights on a CPU that emulates bf16."""
    import torch

    from textenv.hardware import warn_if_bf16_emulated

    if any(parameter.dtype == torch.bfloat16 and parameter.device.type == "cpu" for parameter in policy.parameters()):
        warn_if_bf16_emulated("a policy with bfloat16 weights")
    return policy
