"""[`AutoModelForSeq2SeqLMWithValueHead`]: an encoder-decoder LM with a scalar value head on the decoder, as in
legacy TRL 0.11.4 (loading, saving and state-dict layout are in `textenv.ppo.pretrained_wrapper`)."""

from __future__ import annotations


import torch
from torch import nn
from transformers import AutoModelForSeq2SeqLM

from textenv.engine.fast_path import cache_keyword, returned_cache
from textenv.ppo.pretrained_wrapper import PreTrainedModelWrapper
from textenv.ppo.value_head import VALUE_HEAD_KWARGS, as_index, attach_value_head


class AutoModelForSeq2SeqLMWithValueHead(PreTrainedModelWrapper):
    """Any ``AutoModelForSeq2SeqLM`` (T5, BART, ...; optionally a PEFT model) plus a [`ValueHead`] that reads the
    decoder's last hidden states.

    ``forward(input_ids, attention_mask, decoder_input_ids=..., decoder_attention_mask=..., ...)`` returns
    ``(lm_logits, loss, value)``: float32 decoder logits `[B, T_dec, V]`, the LM loss when ``labels`` are
    given, and one value per decoder position `[B, T_dec]`. ``generate`` delegates to the wrapped model.
    ``is_encoder_decoder`` is ``True`` (PPO and TextEnvironment test for the attribute).

    Args:
        pretrained_model: the encoder-decoder LM (``transformers.PreTrainedModel`` or ``peft.PeftModel``).
        summary_dropout_prob: dropout of the value head (default 0.1; the config's value wins if it has one).
        v_head_initializer_range: standard deviation for ``v_head_init_strategy="normal"`` (default 0.2).
        v_head_init_strategy: ``None`` (PyTorch default init) or ``"normal"`` (weight ~ N(0, range), bias 0).
        score_module / supports_rm_adapter / rm_adapter_name: a reward adapter (see ``from_pretrained``).
    """

    transformers_parent_class = AutoModelForSeq2SeqLM
    lm_head_namings = ["lm_head", "embed_out", "output_projection"]
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
        self.is_encoder_decoder = True
        attach_value_head(self, summary_dropout_prob, v_head_initializer_range, v_head_init_strategy, kwargs)

    def _has_lm_head(self) -> bool:
        # legacy: a module whose name mentions one of `lm_head_namings` anywhere inside the wrapped model
        names = (name for name, _ in self.pretrained_model.named_modules())
        return any(naming in name for name in names for naming in self.lm_head_namings) or (
            self.transformers_model.get_output_embeddings() is not None
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
        return_past_key_values: bool = False,
        logits_to_keep: slice | int | torch.Tensor | None = None,
        **kwargs,
    ) -> tuple:
        """Returns ``(lm_logits, loss, value)`` (+ ``past_key_values`` if ``return_past_key_values``).

        Args:
            input_ids / attention_mask: the encoder inputs `[B, T_enc]`.
            past_key_values: the decoder's cache from an earlier call.
            return_past_key_values: also return the cache.
            logits_to_keep: return the logits of these decoder positions only (a slice, the last N for an int,
                or an index tensor); the values cover every position.
            kwargs: passed to the wrapped model (``decoder_input_ids``, ``decoder_attention_mask``, ``labels``, ...).
        """
        kwargs["output_hidden_states"] = True
        if past_key_values is None and not return_past_key_values:
            # No cache is asked for, so none is built: FSMT on transformers 5.16-5.20 returns only the last
            # position's logits when it builds one.
            kwargs.setdefault("use_cache", False)
        if past_key_values is not None:
            kwargs[cache_keyword(self.pretrained_model)] = past_key_values
        if self.is_peft_model and getattr(self.pretrained_model.active_peft_config, "peft_type", None) == "PREFIX_TUNING":
            kwargs.pop(cache_keyword(self.pretrained_model), None)
        output = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        last_hidden_state = output.decoder_hidden_states[-1]
        if last_hidden_state.device != self.v_head.summary.weight.device:
            last_hidden_state = last_hidden_state.to(self.v_head.summary.weight.device)
        value = self.v_head(last_hidden_state).squeeze(-1)  # [B, T_dec]
        logits = output.logits
        if logits_to_keep is not None:
            logits = logits[:, as_index(logits_to_keep, logits.shape[1], logits.device)]
        logits = logits.float()
        if return_past_key_values:
            return logits, output.loss, value, returned_cache(output)
        return logits, output.loss, value
