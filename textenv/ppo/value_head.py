"""[`ValueHead`] and [`AutoModelForCausalLMWithValueHead`]: a causal LM with a scalar value head, as in legacy
TRL 0.11.4 (loading, saving and state-dict layout are in `textenv.ppo.pretrained_wrapper`)."""

from __future__ import annotations

import warnings

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from textenv.engine.fast_path import cache_keyword, returned_cache
from textenv.ppo.core import upcast_half
from textenv.ppo.pretrained_wrapper import PreTrainedModelWrapper

VALUE_HEAD_KWARGS = ("summary_dropout_prob", "v_head_initializer_range", "v_head_init_strategy")
# Config attributes that change the logits after the LM head; such models take the generic forward path.
# Keyword arguments the decoder body passes down to its attention layers (PPO's packed rows, see `textenv.ppo.packing`).
_BODY_KWARGS = {"packed_rows"}
_LOGIT_POSTPROCESSING_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def value_head_hidden_size(config) -> int:
    """The width of the hidden states the value head reads, by legacy TRL's rules: ``hidden_size``, overridden
    by ``word_embed_proj_dim`` (OPT-350m projects before the LM head), or for an encoder-decoder config with a
    ``decoder`` sub-config by the decoder's ``hidden_size``; configs without ``hidden_size`` fall back to their
    text config, ``n_embd`` or ``d_model``."""
    hidden_size = getattr(config, "hidden_size", None)
    if getattr(config, "word_embed_proj_dim", None) is not None:
        hidden_size = config.word_embed_proj_dim
    elif getattr(config, "is_encoder_decoder", False):
        decoder = getattr(config, "decoder", None)
        if getattr(decoder, "hidden_size", None):
            hidden_size = decoder.hidden_size
    if hidden_size is None and hasattr(config, "get_text_config"):
        hidden_size = getattr(config.get_text_config(), "hidden_size", None)
    for name in ("n_embd", "d_model"):
        if hidden_size is None:
            hidden_size = getattr(config, name, None)
    if hidden_size is None:
        raise ValueError("Cannot find the hidden size in the model config (hidden_size / n_embd / d_model)")
    return hidden_size


class ValueHead(nn.Module):
    """Dropout then ``Linear(hidden_size, 1)``: one scalar value per position.

    Args:
        config: the wrapped model's config. Its ``summary_dropout_prob``, if it has one, wins over the argument
            (legacy TRL's precedence); see [`value_head_hidden_size`] for the input width.
        summary_dropout_prob: dropout before the linear layer (default 0.1); ``None`` or 0 disables it.
    """

    def __init__(self, config, summary_dropout_prob: float | None = 0.1, **kwargs):
        super().__init__()
        if hasattr(config, "summary_dropout_prob"):
            summary_dropout_prob = config.summary_dropout_prob
        self.dropout = nn.Dropout(summary_dropout_prob) if summary_dropout_prob else nn.Identity()
        self.summary = nn.Linear(value_head_hidden_size(config), 1)
        self.flatten = nn.Flatten()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`[B, T, H]` -> `[B, T, 1]` in the head's dtype (float32 unless cast): dropout, upcast, linear."""
        output = self.dropout(hidden_states)
        if output.dtype != self.summary.weight.dtype:
            output = output.to(self.summary.weight.dtype)
        return self.summary(output)


def attach_value_head(
    wrapper: PreTrainedModelWrapper,
    summary_dropout_prob: float | None,
    v_head_initializer_range: float,
    v_head_init_strategy: str | None,
    unknown_kwargs: dict,
) -> None:
    """Give ``wrapper`` its initialised ``v_head`` on the LM head's device (``ValueError`` without an LM head)."""
    if unknown_kwargs:
        warnings.warn(f"Ignoring unknown arguments {sorted(unknown_kwargs)}", UserWarning, stacklevel=3)
    if not wrapper._has_lm_head():
        raise ValueError("The model does not have a language model head, please use a model that has one.")
    wrapper.v_head = ValueHead(wrapper.config, summary_dropout_prob=summary_dropout_prob)
    wrapper._init_weights(v_head_initializer_range=v_head_initializer_range, v_head_init_strategy=v_head_init_strategy)
    wrapper.v_head.to(wrapper._head_device())


class AutoModelForCausalLMWithValueHead(PreTrainedModelWrapper):
    """Any ``AutoModelForCausalLM`` (optionally a PEFT model) plus a [`ValueHead`].

    ``forward`` returns ``(lm_logits, loss, value)`` like the legacy TRL wrapper: float32 logits `[B, T, V]`,
    the LM loss when ``labels`` are given, and one value per position `[B, T]`. Passing ``logits_to_keep``
    (a ``slice`` of positions, an int = the last N positions, or an index tensor) computes the LM head only
    on those positions — PPO uses this to skip the prompt. ``generate`` delegates to the wrapped model.

    Args:
        pretrained_model: the causal LM (``transformers.PreTrainedModel`` or ``peft.PeftModel``).
        summary_dropout_prob: dropout of the value head (default 0.1; the config's value wins if it has one).
        v_head_initializer_range: standard deviation for ``v_head_init_strategy="normal"`` (default 0.2).
        v_head_init_strategy: ``None`` (PyTorch default init) or ``"normal"`` (weight ~ N(0, range), bias 0).
        score_module / supports_rm_adapter / rm_adapter_name: a reward adapter (see ``from_pretrained``).
    """

    transformers_parent_class = AutoModelForCausalLM
    lm_head_namings = ["lm_head", "embed_out"]
    supported_args = VALUE_HEAD_KWARGS

    def __init__(
        self,
        pretrained_model: nn.Module,
        summary_dropout_prob: float | None = 0.1,
        v_head_initializer_range: float = 0.2,
        v_head_init_strategy: str | None = None,
        score_module: nn.Module | None = None,
        supports_rm_adapter: bool = False,
        rm_adapter_name: str | None = None,
        **kwargs,
    ):
        super().__init__(pretrained_model, score_module, supports_rm_adapter, rm_adapter_name)
        attach_value_head(self, summary_dropout_prob, v_head_initializer_range, v_head_init_strategy, kwargs)

    # ---------------------------------------------------------------------------------------------------------
    @property
    def causal_lm(self) -> nn.Module:
        """The transformers causal LM (inside the PEFT wrapper if there is one)."""
        return self.transformers_model

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

        ``attention_mask`` may be a prepared 4-D mask (with ``position_ids``); ``packed_rows`` (with
        ``position_ids``) runs rows packed into one sequence, as PPO does (see `textenv.ppo.packing`).
        """
        if logits_to_keep is not None and self._simple_lm_head and set(kwargs) <= _BODY_KWARGS and past_key_values is None:
            return self._forward_kept_logits(input_ids, attention_mask, position_ids, logits_to_keep, **kwargs)
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = as_index(logits_to_keep, input_ids.shape[1], input_ids.device)
        kwargs["output_hidden_states"] = True
        if past_key_values is not None:
            kwargs[cache_keyword(self.pretrained_model)] = past_key_values
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        if self.is_peft_model and getattr(self.pretrained_model.active_peft_config, "peft_type", None) == "PREFIX_TUNING":
            kwargs.pop(cache_keyword(self.pretrained_model), None)
        output = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        last_hidden_state = output.hidden_states[-1]
        if last_hidden_state.device != self.v_head.summary.weight.device:
            last_hidden_state = last_hidden_state.to(self.v_head.summary.weight.device)
        value = self.v_head(last_hidden_state).squeeze(-1)  # [B, T]
        logits = upcast_half(output.logits)
        if return_past_key_values:
            return logits, output.loss, value, returned_cache(output)
        return logits, output.loss, value

    def _forward_kept_logits(self, input_ids, attention_mask, position_ids, logits_to_keep, **body_kwargs) -> tuple:
        # One pass through the decoder body; the value head sees every position, the LM head only the kept ones.
        causal_lm = self.causal_lm
        body = getattr(causal_lm, causal_lm.base_model_prefix)
        inputs = {"input_ids": input_ids}
        embedding = causal_lm.get_input_embeddings()
        if _tied_trainable_embedding(embedding, causal_lm.get_output_embeddings()) and torch.is_grad_enabled():
            # A sparse gradient for the lookup: autograd adds its few rows to the LM head's dense gradient of the
            # same tied matrix, instead of zero-filling a second dense [V, H] gradient first.
            inputs = {"inputs_embeds": nn.functional.embedding(input_ids, embedding.weight, embedding.padding_idx, sparse=True)}
        hidden = body(attention_mask=attention_mask, position_ids=position_ids, **inputs, **body_kwargs).last_hidden_state  # [B, T, H]
        value = self.v_head(hidden.to(self.v_head.summary.weight.device)).squeeze(-1)  # [B, T]
        kept = hidden[:, logits_to_keep] if isinstance(logits_to_keep, slice) else hidden[
            :, as_index(logits_to_keep, hidden.shape[1], hidden.device)
        ]
        logits = upcast_half(causal_lm.get_output_embeddings()(kept))  # [B, K, V]
        return logits, None, value


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


def as_index(keep: slice | int | torch.Tensor, length: int, device: torch.device | str) -> torch.Tensor:
    """``logits_to_keep`` as a tensor of positions in ``[0, length)``: a slice, the last N positions for an int
    (all of them for 0), or an index tensor (returned as is)."""
    if isinstance(keep, slice):
        return torch.arange(length, device=device)[keep]
    if isinstance(keep, int):
        return torch.arange(length, device=device)[-keep:] if keep > 0 else torch.arange(length, device=device)
    return keep
