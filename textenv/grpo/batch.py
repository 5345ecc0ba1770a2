"""The tensors of a GRPO step, laid out as TRL lays them out: prompts left-padded, responses right-padded, so
the response positions of every row line up in the last `T` columns; and the model's log-probabilities there,
from the padded rows or, where the model allows, from the rows packed with their shared prompt run once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from textenv.ppo import packing


@dataclass
class GroupBatch:
    """Query and response tokens of a step, padded.

    Attributes:
        prompt_ids: `[B, Q]` query ids, left-padded.
        prompt_mask: `[B, Q]` 1 on real query tokens.
        completion_ids: `[B, T]` response ids, right-padded.
        completion_mask: `[B, T]` 1 on real response tokens.
        loss_mask: `[B, T]` float, 1 on the response tokens trained on (the model's; tool and observation
            tokens and padding are 0).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    loss_mask: torch.Tensor

    def select(self, rows: torch.Tensor) -> "GroupBatch":
        """The sub-batch of the given row indices."""
        return GroupBatch(*(getattr(self, name)[rows] for name in self.__dataclass_fields__))

    def to(self, device: torch.device | str) -> "GroupBatch":
        return GroupBatch(*(getattr(self, name).to(device) for name in self.__dataclass_fields__))


def pad_group_batch(
    queries: Sequence[torch.Tensor],
    responses: Sequence[torch.Tensor],
    response_masks: Sequence[torch.Tensor] | None,
    pad_token_id: int,
    device: torch.device | str,
) -> GroupBatch:
    """Pad a step's rows (``response_masks`` `None`: every response token is trained)."""
    batch = len(queries)
    prompt_length = max(len(query) for query in queries)
    completion_length = max(len(response) for response in responses)
    prompt_ids = torch.full((batch, prompt_length), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, prompt_length), dtype=torch.long)
    completion_ids = torch.full((batch, completion_length), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((batch, completion_length), dtype=torch.long)
    loss_mask = torch.zeros((batch, completion_length))
    for row, (query, response) in enumerate(zip(queries, responses)):
        prompt_ids[row, prompt_length - len(query) :] = query
        prompt_mask[row, prompt_length - len(query) :] = 1
        completion_ids[row, : len(response)] = response
        completion_mask[row, : len(response)] = 1
        loss_mask[row, : len(response)] = 1.0 if response_masks is None else response_masks[row].float()
    return GroupBatch(prompt_ids, prompt_mask, completion_ids, completion_mask, loss_mask).to(device)


def pad_rollout_logprobs(rollout_logprobs: Sequence[torch.Tensor], batch: GroupBatch) -> torch.Tensor:
    """`[B, T]`: the inference engine's log-probability of each response token where `batch` has that token
    (response `i`'s token `j` at ``[i, j]``, packed or not: `response_logprobs` places its results there too),
    NaN on the padding."""
    padded = torch.full(batch.completion_ids.shape, float("nan"), device=batch.completion_ids.device)
    for row, logprobs in enumerate(rollout_logprobs):
        padded[row, : len(logprobs)] = logprobs.to(padded.device)
    return padded


def response_logprobs(
    model, batch: GroupBatch, temperature: float = 1.0, with_entropy: bool = False, packed_config=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The model's log-probabilities of the response tokens (`[B, T]`) and, with `with_entropy`, the entropy of
    its distribution at each response position (`[B, T]`, no gradient).

    Positions count real tokens only (a left-padded row starts at position 0, as when it was generated).
    Logits are divided by `temperature`, the sampling temperature, as TRL does.

    Args:
        packed_config: the model's transformers config when it can run packed (`packing.supports_packing`): the
            rows then run as one sequence of real tokens, each prefix several rows share once (forward and
            backward), and the LM head only on the response positions; the results equal the padded rows' to
            float rounding, and are 0 on padding. `None`: the padded rows, as TRL runs them.
    """
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # [B, Q + T]
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    layout = packing.plan_packing(input_ids, attention_mask) if packed_config is not None else None
    if layout is None:
        return _padded_logprobs(model, batch, input_ids, attention_mask, temperature, with_entropy)
    rows, offsets = batch.completion_mask.nonzero(as_tuple=True)  # [K] each: the real response tokens
    predicting = layout.token_index[rows, batch.prompt_ids.shape[1] + offsets - 1]  # packed index of the position before
    computed, copies = predicting.unique(return_inverse=True)  # rows of a group may share a reply's first tokens
    with packing.packed_attention(packed_config):
        output = model(input_ids=layout.input_ids, position_ids=layout.position_ids, logits_to_keep=computed, packed_rows=layout)
    logits = output.logits[0][copies] / temperature  # [K, V]
    kept = selective_log_softmax(logits[None], batch.completion_ids[rows, offsets][None])[0]  # one row: one logsumexp
    logprobs = _place(kept, rows, offsets, batch)
    entropies = None
    if with_entropy:
        with torch.no_grad():
            entropies = _place(entropy_from_logits(logits), rows, offsets, batch)
    return logprobs, entropies


def _padded_logprobs(model, batch: GroupBatch, input_ids, attention_mask, temperature: float, with_entropy: bool):
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    completion_length = batch.completion_ids.shape[1]
    output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=completion_length + 1)
    logits = output.logits[:, :-1, :] / temperature  # position t predicts token t + 1: [B, T, V]
    logprobs = selective_log_softmax(logits, batch.completion_ids)
    entropies = None
    if with_entropy:
        with torch.no_grad():
            entropies = entropy_from_logits(logits)
    return logprobs, entropies


def _place(kept: torch.Tensor, rows: torch.Tensor, offsets: torch.Tensor, batch: GroupBatch) -> torch.Tensor:
    """`[K]` values of the real response tokens -> `[B, T]`, zero on padding (differentiable in `kept`)."""
    placed = torch.zeros(batch.completion_ids.shape, dtype=kept.dtype, device=kept.device)
    return placed.index_put((rows, offsets), kept)
