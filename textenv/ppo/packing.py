"""Run the rows of a mini-batch as one packed sequence: real tokens only, every prompt prefix rows share once.

A padded batch spends compute on padding, and the episodes of a batch share openings: a TextEnvironment batch
starts every row with the same few-shot prompt, and the episodes of a GRPO group share their whole task (and
often the first tokens of their replies). Packed, the rows' token sequences become a prefix tree: each run of
tokens that several rows share (at least ``MIN_SHARED_PREFIX`` long) is one *shared segment*, the rest of each
row its own segment, all laid out in one sequence of real tokens ``[shared_0, shared_1, ..., rest_0, rest_1, ...]``.
Every token keeps its position in its own row, and attention runs per segment: a segment's tokens attend to all
tokens of the segments it continues (its ancestors in the tree) and causally to its own. Every token then gets
exactly the inputs it has in the padded batch (same hidden states to float rounding) while no padding and no
repeated prefix runs through the model, forward or backward.

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
MIN_SHARED_PREFIX = 16  # tokens; a shorter shared run is not worth its own segment


@dataclass
class Segment:
    """A run of packed tokens ``[start, end)`` that attends to the packed spans in ``context`` (the tokens of the
    segments it continues, root first, adjacent spans merged) and causally to itself."""

    start: int
    end: int
    context: tuple[tuple[int, int], ...] = ()


@dataclass
class PackedRows:
    """The packed layout of a batch of ``B`` rows of width ``L``.

    Attributes:
        input_ids: `[1, N]` the shared segments, then the rest of each row (real tokens only).
        position_ids: `[1, N]` each token's position in its own row.
        segments: every segment in packed order (their spans tile ``[0, N)``).
        rest_bounds: ``(start, end)`` packed span of each row's own rest, ``B`` pairs.
        token_index: `[B, L]` packed index of every padded-batch position (padding points at a real token of
            its row; its outputs are masked downstream).
        real_tokens: `[B, L]` True on real tokens.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: list[Segment]
    rest_bounds: list[tuple[int, int]]
    token_index: torch.Tensor
    real_tokens: torch.Tensor

    @property
    def prefix_len(self) -> int:
        """Packed tokens in shared segments (0: every row runs whole)."""
        return self.rest_bounds[0][0] if self.rest_bounds else 0


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, share_prefix: bool = True) -> PackedRows | None:
    """The packed layout of a left- or right-padded batch, or ``None`` when a row's mask has holes.

    Args:
        input_ids: `[B, L]` padded token ids.
        attention_mask: `[B, L]` 1 on real tokens, one contiguous run per row.
        share_prefix: run every prefix that several rows share (at least ``MIN_SHARED_PREFIX`` tokens) once,
            as a segment those rows attend to; ``False``: every row whole.
    """
    batch, width = input_ids.shape
    device = input_ids.device
    lengths = attention_mask.sum(dim=1)  # [B]
    first = attention_mask.int().argmax(dim=1)  # [B] first real column (left padding)
    columns = torch.arange(width, device=device)[None, :]  # [1, L]
    real_tokens = (columns >= first[:, None]) & (columns < (first + lengths)[:, None])  # [B, L]
    if not torch.equal(real_tokens, attention_mask.bool()) or int(lengths.min()) == 0:
        return None
    rows = [input_ids[row, real_tokens[row]].tolist() for row in range(batch)]
    tree = _PrefixTree(rows)
    if share_prefix and batch > 1:
        tree.split(list(range(batch)), start=0, depth=0, parent=-1)
    return tree.layout(first, real_tokens, device)


class _PrefixTree:
    """The shared segments of a batch's rows (a radix tree of their token sequences) and where each row's own
    rest begins; ``layout`` lays them out."""

    def __init__(self, rows: list[list[int]]):
        self.rows = rows
        self.shared: list[tuple[int, int, int, int]] = []  # (row depth start, end, parent segment, a row holding it)
        self.rests: list[tuple[int, int]] = [(0, -1)] * len(rows)  # (row depth start, parent segment) per row: whole

    def split(self, members: list[int], start: int, depth: int, parent: int) -> None:
        """Place ``members``, rows equal on ``[0, depth)``, whose tokens from ``start`` are in no segment yet."""
        if len(members) == 1:
            self.rests[members[0]] = (start, parent)
            return
        reference = self.rows[members[0]]
        limit = min(len(self.rows[row]) for row in members) - 1  # every row keeps a token of its own
        end = depth
        while end < limit and all(self.rows[row][end] == reference[end] for row in members):
            end += 1
        if end - start >= MIN_SHARED_PREFIX:
            self.shared.append((start, end, parent, members[0]))
            start, parent = end, len(self.shared) - 1
        branches: dict[int, list[int]] = {}
        for row in members:
            branches.setdefault(self.rows[row][end], []).append(row)
        if len(branches) == 1:  # equal up to the shortest row's last token
            for row in members:
                self.rests[row] = (start, parent)
            return
        for branch in branches.values():
            self.split(branch, start, end, parent)

    def layout(self, first: torch.Tensor, real_tokens: torch.Tensor, device: torch.device) -> PackedRows:
        pieces: list[tuple[list[int], int, int]] = []  # (row, depth start, depth end) of each segment, packed order
        pieces += [(self.rows[holder], begin, end) for begin, end, _, holder in self.shared]
        pieces += [(row, begin, len(row)) for row, (begin, _) in zip(self.rows, self.rests)]
        starts = [0]
        for _, begin, end in pieces:
            starts.append(starts[-1] + end - begin)
        parents = [parent for *_, parent, _ in self.shared] + [parent for _, parent in self.rests]
        segments = [Segment(starts[i], starts[i + 1], self._context(parents[i], parents, starts)) for i in range(len(pieces))]
        input_ids = torch.tensor([token for row, begin, end in pieces for token in row[begin:end]], device=device)
        position_ids = torch.cat([torch.arange(begin, end, device=device) for _, begin, end in pieces])
        shared_count = len(self.shared)
        token_index = torch.zeros(real_tokens.shape, dtype=torch.long, device=device)
        for row, tokens in enumerate(self.rows):
            packed = torch.cat([torch.arange(segments[i].start, segments[i].end, device=device) for i in self._chain(shared_count + row, parents)])
            clamped = (torch.arange(real_tokens.shape[1], device=device) - first[row]).clamp(0, len(tokens) - 1)
            token_index[row] = packed[clamped]  # padding -> the row's nearest real token
        rest_bounds = [(segment.start, segment.end) for segment in segments[shared_count:]]
        return PackedRows(input_ids[None], position_ids[None], segments, rest_bounds, token_index, real_tokens)

    def _chain(self, segment: int, parents: list[int]) -> list[int]:
        """``segment`` and its ancestors, root first."""
        chain = [segment]
        while parents[chain[-1]] >= 0:
            chain.append(parents[chain[-1]])
        return chain[::-1]

    def _context(self, parent: int, parents: list[int], starts: list[int]) -> tuple[tuple[int, int], ...]:
        """The packed spans of segment ``parent`` and its ancestors, root first, adjacent ones merged."""
        spans: list[tuple[int, int]] = []
        for ancestor in self._chain(parent, parents) if parent >= 0 else []:
            begin, end = starts[ancestor], starts[ancestor + 1]
            if spans and spans[-1][1] == begin:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((begin, end))
        return tuple(spans)


def supports_packing(model) -> bool:
    """Whether ``model`` (a transformers causal LM) can run packed (see `packing_unsupported_reason`)."""
    return packing_unsupported_reason(model) is None


def packing_unsupported_reason(model) -> str | None:
    """Why ``model`` cannot run packed, or ``None`` when it can: it must be decoder-only, dispatch its attention
    through transformers' attention interface (``_supports_attention_backend``) with SDPA or eager, and have no
    sliding-window layers (the per-segment attention is full causal attention)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "it is an encoder-decoder"
    if not getattr(model, "_supports_attention_backend", False):
        return f"{type(model).__name__} does not dispatch its attention through transformers' attention interface"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ("sdpa", "eager"):
        return f"its attention implementation is {implementation!r} (packing needs 'sdpa' or 'eager')"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return None if all(layer_type == "full_attention" for layer_type in layer_types) else "it has sliding-window layers"
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    return "it has sliding-window attention" if sliding else None


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
    settings = {"dropout_p": dropout, "scale": scaling, "enable_gqa": key.shape[1] != query.shape[1]}
    outputs = []
    for segment in packed_rows.segments:
        own = slice(segment.start, segment.end)
        if not segment.context:
            outputs.append(F.scaled_dot_product_attention(query[:, :, own], key[:, :, own], value[:, :, own], is_causal=True, **settings))
            continue
        spans = [slice(begin, end) for begin, end in segment.context] + [own]
        keys = torch.cat([key[:, :, span] for span in spans], dim=2)
        values = torch.cat([value[:, :, span] for span in spans], dim=2)
        visible = _prefix_causal_mask(segment.end - segment.start, keys.shape[2] - (segment.end - segment.start), query.device)
        outputs.append(F.scaled_dot_product_attention(query[:, :, own], keys, values, attn_mask=visible, **settings))
    return torch.cat(outputs, dim=2).transpose(1, 2), None


def _prefix_causal_mask(rest_len: int, prefix_len: int, device: torch.device) -> torch.Tensor:
    """`[rest_len, prefix_len + rest_len]`: rest token ``i`` sees the whole prefix and rest tokens ``<= i``."""
    keys = torch.arange(prefix_len + rest_len, device=device)[None, :]
    return keys <= (prefix_len + torch.arange(rest_len, device=device))[:, None]


def _register() -> None:
    from transformers import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, segment_attention)
