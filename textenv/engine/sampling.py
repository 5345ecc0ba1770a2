"""Next-token choice for the engine's own decoding loop: which generation kwargs it supports, and greedy
or sampled selection exactly as `transformers`' `generate` does it (temperature, top-k, top-p, in
that order, and min_new_tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# transformers' defaults for what a generation config leaves unset.
_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
# Keys that do not change which tokens are generated (or that the engine handles itself).
_IGNORED = {
    "pad_token_id", "bos_token_id", "decoder_start_token_id", "use_cache", "_from_model_config",
    "transformers_version", "output_attentions", "output_hidden_states", "return_dict_in_generate",
    "output_scores", "output_logits", "return_legacy_cache", "cache_implementation",
}
# Keys whose value is harmless when it equals the neutral value given here.
_NEUTRAL = {
    "num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0, "length_penalty": 1.0,
    "no_repeat_ngram_size": 0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "encoder_repetition_penalty": 1.0, "min_length": 0, "early_stopping": False, "renormalize_logits": False,
    "remove_invalid_values": False, "stopping_criteria": None, "logits_processor": None,
    "bad_words_ids": None, "suppress_tokens": None, "begin_suppress_tokens": None, "min_p": None,
    "top_h": None, "forced_bos_token_id": None, "forced_eos_token_id": None, "max_length": None,
    "num_beam_groups": 1, "diversity_penalty": 0.0, "guidance_scale": None, "penalty_alpha": None,
    "assistant_model": None, "prompt_lookup_num_tokens": None, "streamer": None, "generation_config": None,
}
_SUPPORTED = {"do_sample", "temperature", "top_k", "top_p", "max_new_tokens", "min_new_tokens", "eos_token_id"}


@dataclass
class SamplingSettings:
    """The generation settings the engine's loop understands.

    Attributes:
        max_new_tokens (`int`): token budget per turn.
        do_sample (`bool`): sample (with the warpers below) or pick the argmax.
        temperature, top_k, top_p: transformers' warpers, applied in that order when sampling.
        min_new_tokens (`int`): EOS ids in `eos_token_ids` are forbidden before this many new tokens.
        eos_token_ids (`set[int]`): ids that end a row (from `eos_token_id`; negative ids are ignored).
    """

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    min_new_tokens: int = 0
    eos_token_ids: set[int] = field(default_factory=set)

    @classmethod
    def from_kwargs(cls, model_generation_config: Any, kwargs: dict, default_max_new_tokens: int) -> "SamplingSettings | None":
        """Settings for `kwargs` over the model's generation config, or `None` when something in them
        needs `transformers`' `generate` (beam search, repetition penalty, custom processors, ...)."""
        merged = dict(_DEFAULTS)
        if model_generation_config is not None:
            merged.update({k: v for k, v in model_generation_config.to_diff_dict().items() if v is not None})
        merged.update(kwargs)
        for key, value in merged.items():
            if key in _SUPPORTED or key in _IGNORED:
                continue
            if key in _NEUTRAL and (value == _NEUTRAL[key] or (key == "min_length" and value is not None and value <= 0)):
                continue
            if key in ("stopping_criteria", "logits_processor") and not value:
                continue
            return None
        if merged.get("max_new_tokens") is None and "max_length" in kwargs and kwargs["max_length"] is not None:
            return None
        return cls(
            max_new_tokens=int(merged.get("max_new_tokens") or default_max_new_tokens),
            do_sample=bool(merged["do_sample"]),
            temperature=float(merged["temperature"] if merged["temperature"] is not None else 1.0),
            top_k=int(merged["top_k"] or 0),
            top_p=float(merged["top_p"] if merged["top_p"] is not None else 1.0),
            min_new_tokens=int(merged.get("min_new_tokens") or 0),
            eos_token_ids=_positive_ids(merged.get("eos_token_id")),
        )

    def next_tokens(self, logits: torch.Tensor, generated_counts: list[int], generator: torch.Generator | None = None) -> torch.Tensor:
        """Choose one token per row from `[rows, vocab]` logits, given how many tokens each row has."""
        scores = logits.float()
        if self.min_new_tokens and self.eos_token_ids:
            too_short = torch.tensor([count < self.min_new_tokens for count in generated_counts], device=scores.device)
            if too_short.any():
                scores = scores.clone()
                scores[too_short.nonzero().squeeze(1).unsqueeze(1), torch.tensor(sorted(self.eos_token_ids), device=scores.device)] = -float("inf")
        if not self.do_sample:
            return scores.argmax(dim=-1)
        if self.temperature != 1.0:
            scores = TemperatureLogitsWarper(self.temperature)(None, scores)
        if self.top_k:
            scores = TopKLogitsWarper(top_k=self.top_k)(None, scores)
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(top_p=self.top_p)(None, scores)
        probabilities = torch.softmax(scores, dim=-1)
        return torch.multinomial(probabilities, num_samples=1, generator=generator).squeeze(1)


def _positive_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    values = value if isinstance(value, (list, tuple, set)) else [value]
    return {int(v) for v in values if int(v) >= 0}
