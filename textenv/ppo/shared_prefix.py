"""Run rows that share a prompt prefix as one packed sequence: the prefix once, then the rest of every row.

The episodes of one TextEnvironment batch usually start with the same few-shot prompt. Laid out as
``[prefix, rest_0, rest_1, ...]`` (one row, no padding) with an attention mask in which every rest sees
the prefix and, causally, itself, each token gets exactly the inputs it has in the padded batch, so the
hidden states are the same to float rounding, while the prefix runs through the model once, forward and
backward. Only right-padded batches are packed (their position ids are ``0..len - 1`` in both layouts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_SHARED_PREFIX = 16  # tokens; a shorter common prefix saves too little to pay for the custom mask
MIN_SAVING = 0.25  # pack only when it removes at least this fraction of the padded token positions
MAX_PACKED_TOKENS = 4096  # the mask is [N, N]: beyond this, attention cost outgrows the saving
MASK_FORMATS = {"sdpa": "bool", "eager": "additive"}  # attention implementations that take a custom 4-D mask


@dataclass
class PrefixPacking:
    """One packed row for a right-padded batch of ``B`` rows of width ``L``.

    Attributes:
        input_ids: `[1, N]` the shared prefix, then the rest of each row (real tokens only).
        position_ids: `[1, N]` each token's position in its own row.
        segment_ids: `[N]` 0 for the prefix, ``r + 1`` for the rest of row ``r``.
        token_index: `[B, L]` packed index of every padded-batch position (padding points at the row's last
            real token; its outputs are masked downstream).
        real_tokens: `[B, L]` True on real tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    token_index: torch.Tensor
    real_tokens: torch.Tensor

    def attention_mask(self, mask_format: str, dtype: torch.dtype) -> torch.Tensor:
        """`[1, 1, N, N]`: token ``i`` sees ``j <= i`` of the prefix or of its own segment.

        Args:
            mask_format: ``"bool"`` (True = attend, for SDPA) or ``"additive"`` (0 / dtype minimum, for eager).
            dtype: the model's compute dtype (for the additive format).
        """
        order = torch.arange(self.segment_ids.numel(), device=self.segment_ids.device)
        segment_query, segment_key = self.segment_ids[:, None], self.segment_ids[None, :]
        allowed = (order[None, :] <= order[:, None]) & ((segment_key == 0) | (segment_key == segment_query))
        if mask_format == "bool":
            return allowed[None, None]
        additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return additive.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def mask_format(config) -> str | None:
    """How a model with this config takes a custom 4-D attention mask (``"bool"`` or ``"additive"``), or
    ``None`` when it cannot: other attention kernels (flash attention ignores 4-D masks), sliding-window
    layers (the packed mask would override their window) or encoder-decoders."""
    if getattr(config, "is_encoder_decoder", False):
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        sliding = any(layer_type != "full_attention" for layer_type in layer_types)
    else:
        sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    if sliding:
        return None
    return MASK_FORMATS.get(getattr(config, "_attn_implementation", None))


def plan_prefix_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PrefixPacking | None:
    """The packed layout of a right-padded batch, or ``None`` when packing would not pay.

    Args:
        input_ids: `[B, L]` right-padded token ids.
        attention_mask: `[B, L]` 1 on real tokens.
    """
    batch, width = input_ids.shape
    lengths = attention_mask.sum(dim=1)  # [B]
    real_tokens = torch.arange(width, device=input_ids.device)[None, :] < lengths[:, None]  # [B, L]
    if batch < 2 or not torch.equal(real_tokens, attention_mask.bool()):
        return None  # a single row, or left padding / holes in the mask
    prefix_len = _common_prefix_len(input_ids, int(lengths.min()))
    rest_lengths = lengths - prefix_len
    packed_len = prefix_len + int(rest_lengths.sum())
    padded_len = batch * int(lengths.max())
    if prefix_len < MIN_SHARED_PREFIX or packed_len > (1 - MIN_SAVING) * padded_len or packed_len > MAX_PACKED_TOKENS:
        return None
    rest_starts = prefix_len + torch.cumsum(rest_lengths, dim=0) - rest_lengths  # [B] packed index of each rest
    positions = torch.arange(width, device=input_ids.device)[None, :].expand(batch, width)  # [B, L]
    last_real = (lengths - 1)[:, None].expand(batch, width)
    clamped = torch.minimum(positions, last_real)
    token_index = torch.where(clamped < prefix_len, clamped, rest_starts[:, None] + clamped - prefix_len)  # [B, L]
    rests = real_tokens & (positions >= prefix_len)
    packed_ids = torch.cat([input_ids[0, :prefix_len], input_ids[rests]])
    packed_positions = torch.cat([positions[0, :prefix_len], positions[rests]])
    segment_ids = torch.cat([
        torch.zeros(prefix_len, dtype=torch.long, device=input_ids.device),
        torch.repeat_interleave(torch.arange(1, batch + 1, device=input_ids.device), rest_lengths),
    ])
    return PrefixPacking(packed_ids[None], packed_positions[None], segment_ids, token_index, real_tokens)


def _common_prefix_len(input_ids: torch.Tensor, limit: int) -> int:
    head = input_ids[:, :limit]  # [B, limit]
    same = (head == head[:1]).all(dim=0)  # [limit]
    return limit if bool(same.all()) else int((~same).int().argmax())
