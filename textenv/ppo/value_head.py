"""A causal LM with a scalar value head, and the frozen reference model PPO compares it with."""

from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_HEAD_KWARGS = ("summary_dropout_prob", "v_head_initializer_range", "v_head_init_strategy")
# Layer-name patterns tried by `create_reference_model(num_shared_layers=k)`, formatted with k.
LAYER_PATTERNS = (
    "transformer.h.{layer}",
    "model.decoder.layers.{layer}",
    "gpt_neox.layers.{layer}",
    "model.layers.{layer}",
)
# Config attributes that change the logits after the LM head; such models take the generic forward path.
_LOGIT_POSTPROCESSING_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _is_peft_model(model: nn.Module) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _hidden_size(config) -> int:
    if getattr(config, "word_embed_proj_dim", None):
        return config.word_embed_proj_dim
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, name, None):
            return getattr(config, name)
    raise ValueError("Cannot find the hidden size in the model config (hidden_size / n_embd / d_model)")


class ValueHead(nn.Module):
    """Dropout then ``Linear(hidden_size, 1)``: one scalar value per position.

    Args:
        config: the wrapped model's config (``word_embed_proj_dim`` is used for OPT-like models).
        summary_dropout_prob: dropout before the linear layer; defaults to ``config.summary_dropout_prob``
            or 0.1; a falsy value disables dropout.
    """

    def __init__(self, config, summary_dropout_prob: float | None = None):
        super().__init__()
        if summary_dropout_prob is None:
            summary_dropout_prob = getattr(config, "summary_dropout_prob", 0.1)
        self.dropout = nn.Dropout(summary_dropout_prob) if summary_dropout_prob else nn.Identity()
        self.summary = nn.Linear(_hidden_size(config), 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[B, T, H]` -> `[B, T, 1]` in the head's dtype (float32 unless cast)."""
        hidden_states = hidden_states.to(self.summary.weight.dtype)
        return self.summary(self.dropout(hidden_states))


class AutoModelForCausalLMWithValueHead(nn.Module):
    """Any ``AutoModelForCausalLM`` (optionally a PEFT model) plus a [`ValueHead`].

    ``forward`` returns ``(lm_logits, loss, value)`` like the legacy TRL wrapper: float32 logits `[B, T, V]`,
    the LM loss when ``labels`` are given, and one value per position `[B, T]`. Passing ``logits_to_keep``
    (a ``slice`` of positions, an int = the last N positions, or an index tensor) computes the LM head only
    on those positions — PPO uses this to skip the prompt. ``generate`` delegates to the wrapped model.

    Args:
        pretrained_model: the causal LM (``transformers.PreTrainedModel`` or ``peft.PeftModel``).
        summary_dropout_prob: dropout of the value head (default: config value or 0.1).
        v_head_initializer_range: standard deviation for ``v_head_init_strategy="normal"`` (default 0.2).
        v_head_init_strategy: ``None`` (PyTorch default init) or ``"normal"`` (weight ~ N(0, range), bias 0).
    """

    def __init__(
        self,
        pretrained_model: nn.Module,
        summary_dropout_prob: float | None = None,
        v_head_initializer_range: float = 0.2,
        v_head_init_strategy: str | None = None,
    ):
        super().__init__()
        self.pretrained_model = pretrained_model
        self.is_peft_model = _is_peft_model(pretrained_model)
        causal_lm = self.causal_lm
        if causal_lm.get_output_embeddings() is None:
            raise ValueError("The model does not have a language modeling head (`lm_head` / `embed_out`)")
        self.config = causal_lm.config
        self.v_head = ValueHead(self.config, summary_dropout_prob=summary_dropout_prob)
        self.v_head.to(next(causal_lm.get_output_embeddings().parameters()).device)
        if v_head_init_strategy == "normal":
            self.v_head.summary.weight.data.normal_(mean=0.0, std=v_head_initializer_range)
            self.v_head.summary.bias.data.zero_()
        elif v_head_init_strategy is not None:
            raise ValueError(f"v_head_init_strategy must be None or 'normal', got {v_head_init_strategy!r}")

    # ---------------------------------------------------------------------------------------------
    @property
    def causal_lm(self) -> nn.Module:
        """The transformers causal LM (inside the PEFT wrapper if there is one)."""
        return self.pretrained_model.get_base_model() if self.is_peft_model else self.pretrained_model

    @property
    def device(self) -> torch.device:
        return self.causal_lm.device

    @property
    def _simple_lm_head(self) -> bool:
        return not any(getattr(self.config, name, None) for name in _LOGIT_POSTPROCESSING_ATTRS)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        return_past_key_values: bool = False,
        logits_to_keep: slice | int | torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple:
        """Returns ``(lm_logits, loss, value)`` (+ ``past_key_values`` if ``return_past_key_values``).

        ``attention_mask`` may be a prepared 4-D mask (with ``position_ids``), as PPO passes for rows packed
        around a shared prompt prefix (see `textenv.ppo.shared_prefix`).
        """
        if logits_to_keep is not None and self._simple_lm_head and not kwargs and past_key_values is None:
            return self._forward_kept_logits(input_ids, attention_mask, position_ids, logits_to_keep)
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = _as_index(logits_to_keep, input_ids.shape[1], input_ids.device)
        kwargs["output_hidden_states"] = True
        kwargs["past_key_values"] = past_key_values
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.is_peft_model and getattr(self.pretrained_model.active_peft_config, "peft_type", None) == "PREFIX_TUNING":
            kwargs.pop("past_key_values")
        output = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        value = self.v_head(output.hidden_states[-1]).squeeze(-1)  # [B, T]
        logits = output.logits.float()
        if return_past_key_values:
            return logits, output.loss, value, output.past_key_values
        return logits, output.loss, value

    def _forward_kept_logits(self, input_ids, attention_mask, position_ids, logits_to_keep) -> tuple:
        # One pass through the decoder body; the value head sees every position, the LM head only the kept ones.
        causal_lm = self.causal_lm
        body = getattr(causal_lm, causal_lm.base_model_prefix)
        inputs = {"input_ids": input_ids}
        embedding = causal_lm.get_input_embeddings()
        if _tied_trainable_embedding(embedding, causal_lm.get_output_embeddings()) and torch.is_grad_enabled():
            # A sparse gradient for the lookup: autograd adds its few rows to the LM head's dense gradient of the
            # same tied matrix, instead of zero-filling a second dense [V, H] gradient first.
            inputs = {"inputs_embeds": nn.functional.embedding(input_ids, embedding.weight, embedding.padding_idx, sparse=True)}
        hidden = body(attention_mask=attention_mask, position_ids=position_ids, **inputs).last_hidden_state  # [B, T, H]
        value = self.v_head(hidden).squeeze(-1)  # [B, T]
        kept = hidden[:, logits_to_keep] if isinstance(logits_to_keep, slice) else hidden[
            :, _as_index(logits_to_keep, hidden.shape[1], hidden.device)
        ]
        logits = causal_lm.get_output_embeddings()(kept).float()  # [B, K, V]
        return logits, None, value

    def generate(self, *args, **kwargs):
        """Delegates to the wrapped model's ``generate``."""
        return self.pretrained_model.generate(*args, **kwargs)

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.causal_lm.gradient_checkpointing_enable(**kwargs)

    # ---------------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> None:
        """Save the wrapped model with its own ``save_pretrained`` (a normal HF checkpoint, or the adapter for
        a PEFT model) and the value head as ``value_head.safetensors`` next to it."""
        from safetensors.torch import save_file

        kwargs.pop("state_dict", None)
        self.pretrained_model.save_pretrained(save_directory, **kwargs)
        head = {f"v_head.{k}": v.detach().cpu().contiguous() for k, v in self.v_head.state_dict().items()}
        save_file(head, str(Path(save_directory) / VALUE_HEAD_FILE), metadata={"format": "pt"})

    def push_to_hub(self, repo_id: str, commit_message: str = "Upload model with value head", private: bool | None = None, token=None, **kwargs) -> str:
        """Upload the model and its value head to the Hugging Face Hub (through ``huggingface_hub``)."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder, **kwargs)
            info = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message)
        return str(info)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs) -> "AutoModelForCausalLMWithValueHead":
        """Load (or wrap) a causal LM and restore its value head if the checkpoint has one.

        Args:
            pretrained_model_name_or_path: a folder, a hub id, or an already loaded model.
            peft_config: optional ``peft`` config; the model is wrapped with ``get_peft_model``.
            kwargs: value-head options (see the class) and ``from_pretrained`` arguments of the base model.
        """
        from transformers import AutoModelForCausalLM

        head_kwargs = {k: kwargs.pop(k) for k in VALUE_HEAD_KWARGS if k in kwargs}
        peft_config = kwargs.pop("peft_config", None)
        source = pretrained_model_name_or_path
        if isinstance(source, nn.Module):
            model, folder = source, None
        else:
            folder = str(source)
            adapter_config = _find_file(folder, "adapter_config.json", kwargs)
            if adapter_config is not None:
                from peft import PeftModel

                base_name = json.loads(Path(adapter_config).read_text())["base_model_name_or_path"]
                base = AutoModelForCausalLM.from_pretrained(base_name, *model_args, **kwargs)
                model = PeftModel.from_pretrained(base, folder, is_trainable=True)
            else:
                model = AutoModelForCausalLM.from_pretrained(folder, *model_args, **kwargs)
        if peft_config is not None:
            if _is_peft_model(model):
                raise ValueError("The model is already a PEFT model; do not pass peft_config")
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        wrapper = cls(model, **head_kwargs)
        if folder is not None:
            state = _load_value_head_state(folder, kwargs)
            if state:
                wrapper.v_head.load_state_dict(state, strict=False)
        return wrapper


def _tied_trainable_embedding(embedding: nn.Module, output_embedding: nn.Module) -> bool:
    """A plain trainable lookup table that is also the LM head's weight (a sparse lookup gradient is then
    summed into a dense one before it reaches the parameter)."""
    return (
        type(embedding) is nn.Embedding
        and embedding.max_norm is None
        and not embedding.scale_grad_by_freq
        and embedding.weight.requires_grad
        and getattr(output_embedding, "weight", None) is embedding.weight
    )


def _as_index(keep: slice | int | torch.Tensor, length: int, device) -> torch.Tensor:
    if isinstance(keep, slice):
        return torch.arange(length, device=device)[keep]
    if isinstance(keep, int):
        return torch.arange(length, device=device)[-keep:] if keep > 0 else torch.arange(length, device=device)
    return keep


def _find_file(folder: str, filename: str, kwargs: dict) -> str | None:
    """Local path of ``filename`` in a folder, or in a hub repo when ``folder`` is not a local folder."""
    local = Path(folder) / filename
    if Path(folder).is_dir():
        return str(local) if local.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return hf_hub_download(folder, filename, revision=kwargs.get("revision"), token=kwargs.get("token"))
    except Exception:
        return None


def _load_value_head_state(folder: str, kwargs: dict) -> dict[str, torch.Tensor]:
    """``v_head.*`` weights (prefix stripped) from ``value_head.safetensors``, else from a legacy checkpoint
    that stored them inside ``model.safetensors`` / ``pytorch_model.bin``."""
    from safetensors import safe_open

    def _strip(state):
        return {k[len("v_head."):]: v for k, v in state.items() if k.startswith("v_head.")}

    path = _find_file(folder, VALUE_HEAD_FILE, kwargs)
    if path is None:
        path = _find_file(folder, "model.safetensors", kwargs)
    if path is not None:
        with safe_open(path, framework="pt") as handle:
            return _strip({k: handle.get_tensor(k) for k in handle.keys() if k.startswith("v_head.")})
    path = _find_file(folder, "pytorch_model.bin", kwargs)
    if path is not None:
        return _strip(torch.load(path, map_location="cpu", weights_only=True))
    return {}


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
    model: AutoModelForCausalLMWithValueHead, num_shared_layers: int | None = None, pattern: str | None = None
) -> AutoModelForCausalLMWithValueHead:
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
