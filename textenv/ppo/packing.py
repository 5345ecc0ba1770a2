"""Run the rows of a PPO mini-batch as one packed sequence: real tokens only, a shared prompt prefix once.

A padded batch spends compute on padding, and the episodes of one TextEnvironment batch usually start with
the same few-shot prompt. Packed, the rows are laid out as ``[prefix, rest_0, rest_1, ...]`` in one sequence
of real tokens (the prefix is the prompt all rows share, or empty), every token keeps its position in its own
row, and attention runs per segment: the prefix causally on itself, each rest on the prefix and causally on
itself. Every token then gets exactly the inputs it has in the padded batch (same hidden states to float
rounding) while no padding and no repeated prompt runs through the model, forward or backward.

The per-segment attention is an attention implementation registered with transformers
(`PACKED_ATTENTION`); `packed_attention(config)` switches a model to it for the duration of a forward and
backward pass, and the layout reaches it as the ``packed_rows`` keyword argument, which transformers
passes down to every attention call (and which gradient checkpointing keeps for its recomputation).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

PACKED_ATTENTION = "textenv_packed"
MIN_SHARED_PREFIX = 16  # tokens; a shorter common prompt is not worth its own segment


@dataclass
class PackedRows:
    """The packed layout of a batch of ``B`` rows of width ``L``.

    Attributes:
        input_ids: `[1, N]` the shared prefix, then the rest of each row (real tokens only).
        position_ids: `[1, N]` each token's position in its own row.
        prefix_len: tokens of the shared prefix (0: none).
        rest_bounds: ``(start, end)`` packed span of each row's rest, ``B`` pairs.
        token_index: `[B, L]` packed index of every padded-batch position (padding points at a real token of
            its row; its outputs are masked downstream).
        real_tokens: `[B, L]` True on real tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    prefix_len: int
    rest_bounds: list[tuple[int, int]]
    token_index: torch.Tensor
    real_tokens: torch.Tensor


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefix: bool = True) -> PackedRows | None:
    """The packed layout of a left- or right-padded batch, or ``None`` when a row's mask has holes.

    Args:
        input_ids: `[B, L]` padded token ids.
        attention_mask: `[B, L]` 1 on real tokens, one contiguous run per row.
        share_prefix: put the prompt prefix all rows share (at least ``MIN_SHARED_PREFIX`` tokens) in one
            segment that every row attends to.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    lengths = attention_mask.sum(dim=1)  # [B]
    first = attention_mask.int().argmax(dim=1)  # [B] first real column (left padding)
    columns = torch.arange(width, device=device)[None, :]  # [1, L]
    real_tokens = (columns >= first[:, None]) & (columns < (first + lengths)[:, None])  # [B, L]
    if not torch.equal(real_tokens, attention_mask.bool()) or int(lengths.min()) == 0:
        return None
    positions = (columns - first[:, None]).clamp(min=0)  # [B, L] position within the row
    prefix_len = _shared_prefix_len(input_ids, first, int(lengths.min())) if share_prefix and batch > 1 else 0
    rest_lengths = lengths - prefix_len  # [B]
    rest_starts = prefix_len + torch.cumsum(rest_lengths, dim=0) - rest_lengths  # [B]
    clamped = torch.minimum(positions, (lengths - 1)[:, None])  # padding -> the row's last real token
    token_index = torch.where(clamped < prefix_len, clamped, rest_starts[:, None] + clamped - prefix_len)  # [B, L]
    rests = real_tokens & (positions >= prefix_len)
    prefix_columns = first[0] + torch.arange(prefix_len, device=device)
    packed_ids = torch.cat([input_ids[0, prefix_columns], input_ids[rests]])
    packed_positions = torch.cat([torch.arange(prefix_len, device=device), positions[rests]])
    rest_bounds = [(int(start), int(start + length)) for start, length in zip(rest_starts, rest_lengths)]
    return PackedRows(packed_ids[None], packed_positions[None], prefix_len, rest_bounds, token_index, real_tokens)


def _shared_prefix_len(input_ids: torch.Tensor, first: torch.Tensor, limit: int) -> int:
    columns = first[:, None] + torch.arange(limit, device=input_ids.device)[None, :]  # [B, limit]
    heads = input_ids.gather(1, columns)
    same = (heads == heads[:1]).all(dim=0)  # [limit]
    length = limit if bool(same.all()) else int((~same).int().argmax())
    # A row must keep at least one token of its own, and a short common start is not worth a segment.
    length = min(length, limit - 1)
    return length if length >= MIN_SHARED_PREFIX else 0


def supports_packing(model) -> bool:
    """Whether ``model`` (a transformers causal LM) can run packed: decoder-only, attention dispatched through
    transformers' attention interface (``_supports_attention_backend``) with SDPA or eager, and no
    sliding-window layers (the per-segment attention is full causal attention)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False) or not getattr(model, "_supports_attention_backend", False):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(layer_type == "full_attention" for layer_type in layer_types)
    return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)


@contextlib.contextmanager
def packed_attention(config) -> Iterator[None]:
    """Run the attention layers of the model with this config per packed segment while inside (forward and
    backward: gradient checkpointing recomputes the forward during backward)."""
    _register()
    previous = config._attn_implementation
    config._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


def segment_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_rows: PackedRows | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of one packed sequence, segment by segment (the transformers attention-interface signature).

    Args:
        query: `[1, H, N, D]`; key / value: `[1, H_kv, N, D]`.
        packed_rows: the layout (required).

    Returns:
        `([1, N, H, D], None)`.
    """
    if packed_rows is None:
        raise RuntimeError(f"attention implementation {PACKED_ATTENTION!r} needs the packed_rows keyword argument")
    prefix_len = packed_rows.prefix_len
    settings = {"dropout_p": dropout, "scale": scaling, "enable_gqa": key.shape[1] != query.shape[1]}
    outputs = []
    if prefix_len:
        prefix = slice(0, prefix_len)
        outputs.append(F.scaled_dot_product_attention(query[:, :, prefix], key[:, :, prefix], value[:, :, prefix], is_causal=True, **settings))
    for start, end in packed_rows.rest_bounds:
        rest = slice(start, end)
        if not prefix_len:
            outputs.append(F.scaled_dot_product_attention(query[:, :, rest], key[:, :, rest], value[:, :, rest], is_causal=True, **settings))
            continue
        keys = torch.cat([key[:, :, :prefix_len], key[:, :, rest]], dim=2)
        values = torch.cat([value[:, :, :prefix_len], value[:, :, rest]], dim=2)
        visible = _prefix_causal_mask(end - start, prefix_len, query.device)
        outputs.append(F.scaled_dot_product_attention(query[:, :, rest], keys, values, attn_mask=visible, **settings))
    return torch.cat(outputs, dim=2).transpose(1, 2), None


def _prefix_causal_mask(rest_len: int, prefix_len: int, device: torch.device) -> torch.Tensor:
    """`[rest_len, prefix_len + rest_len]`: rest token ``i`` sees the whole prefix and rest tokens ``<= i``."""
    keys = torch.arange(prefix_len + rest_len, device=device)[None, :]
    return keys <= (prefix_len + torch.arange(rest_len, device=device))[:, None]


def _register() -> None:
    from transformers import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, segment_attention)
