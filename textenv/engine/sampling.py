"""Next-token choice for the engine's own decoding loop: which generation kwargs it supports, and greedy
or sampled selection exactly as `transformers`' `generate` does it (temperature, top-k, top-p, in
that order, and min_new_tokens).

A sampled token is drawn with torch's global generator, or, for a row that has its own `RandomStream`
(every episode played by `textenv.episodes.play_all` has one), by inverting the row's cumulative
distribution at the stream's next uniform: then an episode's tokens depend only on its stream and its own
logits, not on which other episodes share its decoding batch or when they joined it, so a run is
reproducible however the turns were scheduled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from textenv.engine.unwrapping import unwrap_model

# transformers' defaults for what a generation config leaves unset.
DEFAULT_MAX_NEW_TOKENS = 32  # a turn's token budget when the generation settings give none
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
        merged = _merged(model_generation_config, kwargs)
        if _unsupported(merged, kwargs) is not None:
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

    @staticmethod
    def unsupported_setting(model_generation_config: Any, kwargs: dict) -> str | None:
        """The first setting of `kwargs` over the model's generation config that the loop does not
        implement, as ``"name=value"``, or `None` when `from_kwargs` gives settings."""
        return _unsupported(_merged(model_generation_config, kwargs), kwargs)

    def next_tokens(self, logits: torch.Tensor, generated_counts: list[int], uniforms: torch.Tensor | None = None) -> torch.Tensor:
        """Choose one token per row from `[rows, vocab]` logits, given how many tokens each row has; when
        sampling, `uniforms` (`[rows]`, in [0, 1)) choose the tokens, else torch's global generator does."""
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
        if uniforms is None:
            return torch.multinomial(probabilities, num_samples=1).squeeze(1)
        return inverse_cdf(probabilities, uniforms)


def inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each row of `[rows, vocab]` probabilities, the token where its cumulative distribution first
    exceeds the row's uniform (`[rows]`, in [0, 1)): a draw from the row's distribution. Never a token of
    probability 0."""
    cumulative = probabilities.double().cumsum(dim=-1)
    total = cumulative[:, -1:]
    target = torch.minimum(uniforms.to(cumulative).unsqueeze(1) * total, total * (1 - 2**-52))  # below the top
    return torch.searchsorted(cumulative, target, right=True).squeeze(1)


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(value: int) -> int:
    """A well-mixed 64-bit hash of `value` (the SplitMix64 finaliser)."""
    z = (value + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


class RandomStream:
    """An episode's own uniforms in [0, 1): the `n`-th draw is a hash of `(seed, n)`, so it depends on
    nothing else (not on threads, timing or other episodes).

    Args:
        seed (`int`): the stream's seed (any integer; taken modulo 2**64).
    """

    def __init__(self, seed: int):
        self.seed = seed & _MASK64
        self.drawn = 0

    def next_uniform(self) -> float:
        """The next uniform of the stream."""
        self.drawn += 1
        return (splitmix64((self.seed + self.drawn * _GOLDEN) & _MASK64) >> 11) * 2.0**-53

    def spawn(self, index: int) -> "RandomStream":
        """An independent stream for item `index` of this one's (e.g. the episodes of a run)."""
        return RandomStream(splitmix64(self.seed ^ splitmix64(index)))


def end_token_ids(model: Any, generation_kwargs: dict) -> set[int]:
    """The ids a turn of `model` ends at besides the tokenizer's eos: `eos_token_id` of `generation_kwargs` over the
    model's generation config (negative ids ignored; `model` may be `None`, a wrapped or a value-head model)."""
    generation_config = getattr(unwrap_model(model), "generation_config", None) if model is not None else None
    return _positive_ids(_merged(generation_config, generation_kwargs).get("eos_token_id"))


def _positive_ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    values = value if isinstance(value, (list, tuple, set)) else [value]
    return {int(v) for v in values if int(v) >= 0}


def _merged(model_generation_config: Any, kwargs: dict) -> dict:
    merged = dict(_DEFAULTS)
    if model_generation_config is not None:
        merged.update({k: v for k, v in model_generation_config.to_diff_dict().items() if v is not None})
    merged.update(kwargs)
    return merged


def _unsupported(merged: dict, kwargs: dict) -> str | None:
    for key, value in merged.items():
        if key in _SUPPORTED or key in _IGNORED:
            continue
        if key in _NEUTRAL and (value == _NEUTRAL[key] or (key == "min_length" and value is not None and value <= 0)):
            continue
        if key in ("stopping_criteria", "logits_processor") and not value:
            continue
        return f"{key}={value!r}"
    if merged.get("max_new_tokens") is None and kwargs.get("max_length") is not None:
        return f"max_length={kwargs['max_length']!r} without max_new_tokens"
    return None
