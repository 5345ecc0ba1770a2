"""Layout of a PPO batch: query+response rows padded into one tensor, and where each response sits.

Logprob position ``t`` predicts token ``t + 1``, so a row whose query has ``q`` tokens (after ``offset``
left-padding tokens) has its response predicted by positions ``[offset + q - 1, offset + q - 1 + r)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    """Padded model inputs plus the span of each row.

    Attributes:
        input_ids: `[B, L]` token ids.
        attention_mask: `[B, L]` 1 on real tokens.
        starts: `[B]` first logprob position of each response.
        ends: `[B]` one past the last logprob position of each response.
        first_token: `[B]` index of each row's first real token (left padding).
        last_token: `[B]` one past each row's last real token.
        masks: `[B, L - 1]` float, 1 on trainable logprob positions (response tokens with mask 1).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor
    first_token: torch.Tensor
    last_token: torch.Tensor
    masks: torch.Tensor

    @property
    def num_positions(self) -> int:
        return self.input_ids.shape[1] - 1

    def select(self, rows) -> "PackedBatch":
        """The sub-batch of the given row indices."""
        return PackedBatch(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))


def pack_batch(
    queries: list[torch.Tensor],
    responses: list[torch.Tensor],
    response_masks: list[torch.Tensor] | None,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
) -> PackedBatch:
    """Compute response spans and trainable-position masks for already padded ``input_ids``.

    ``input_ids``/``attention_mask`` may be left- or right-padded (e.g. by a user's collator) and may be
    wider than needed (padding across processes).
    """
    device = input_ids.device
    batch, length = input_ids.shape
    query_lens = torch.tensor([len(q) for q in queries], device=device)
    response_lens = torch.tensor([len(r) for r in responses], device=device)
    first_token = attention_mask.int().argmax(dim=1)  # [B]
    starts = first_token + query_lens - 1
    ends = starts + response_lens
    last_token = first_token + query_lens + response_lens
    positions = torch.arange(length - 1, device=device)  # [L - 1]
    masks = ((positions >= starts[:, None]) & (positions < ends[:, None])).float()  # [B, L - 1]
    if response_masks is not None:
        for row, mask in enumerate(response_masks):
            start = int(starts[row])
            masks[row, start : start + len(mask)] *= mask.to(device=device, dtype=masks.dtype)
    return PackedBatch(input_ids, attention_mask, starts, ends, first_token, last_token, masks)
