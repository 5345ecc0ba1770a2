"""Padding, in one place: stacking token rows into padded batches, and the pad token itself."""

from __future__ import annotations

import warnings
from typing import Sequence

import torch


def left_pad(sequences: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D id tensors into `[batch, max_len]` ids and attention mask, padded on the left."""
    max_length = max(len(s) for s in sequences)
    device = sequences[0].device
    input_ids = torch.full((len(sequences), max_length), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros((len(sequences), max_length), dtype=torch.long, device=device)
    for row, sequence in enumerate(sequences):
        if len(sequence):
            input_ids[row, -len(sequence) :] = sequence
            attention_mask[row, -len(sequence) :] = 1
    return input_ids, attention_mask


def right_pad(sequences: Sequence[torch.Tensor], pad_value: int) -> torch.Tensor:
    """Stack 1-D tensors into `[batch, max_len]`, padding on the right with `pad_value`."""
    return torch.nn.utils.rnn.pad_sequence(list(sequences), batch_first=True, padding_value=pad_value)


def ensure_pad_token(tokenizer, warn: bool = True) -> None:
    """Give a tokenizer without a pad token its EOS token as pad token (with a warning unless `warn=False`)."""
    if tokenizer.pad_token is None and warn:
        warnings.warn(
            "The tokenizer has no pad token; using its EOS token as pad token "
            "(set tokenizer.pad_token yourself to choose another).",
            stacklevel=3,
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def pad_token_id(tokenizer, model) -> int:
    """The id to pad with: the tokenizer's pad token, else its EOS, else the model config's pad token, else 0."""
    for candidate in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "config", None), "pad_token_id", None),
    ):
        if isinstance(candidate, int):
            return candidate
    return 0
