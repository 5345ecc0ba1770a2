"""Checks of the arguments of `PPOTrainer.step`, with messages that name the argument and the index."""

from __future__ import annotations

import math
from numbers import Real
from typing import Sequence

import torch


def _check_list(name: str, values, batch_size: int | None) -> None:
    if not isinstance(values, (list, tuple)):
        raise ValueError(f"`{name}` must be a list of length batch_size={batch_size}, got {type(values).__name__}")
    if batch_size is not None and len(values) != batch_size:
        raise ValueError(
            f"`{name}` has {len(values)} elements but config.batch_size is {batch_size}; the batch size must "
            "match (set PPOConfig(batch_size=...) accordingly)"
        )


def _check_token_tensor(name: str, index: int, tensor, vocab_size: int | None) -> torch.Tensor:
    where = f"`{name}[{index}]`"
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{where} must be a 1-D torch.LongTensor of token ids, got {type(tensor).__name__}")
    if tensor.dim() != 1:
        raise ValueError(f"{where} must be 1-D (one sequence of token ids), got shape {tuple(tensor.shape)}")
    if tensor.numel() == 0:
        raise ValueError(f"{where} is empty; every query and response needs at least one token")
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"{where} must hold integer token ids, got dtype {tensor.dtype}")
    if vocab_size is not None:
        low, high = int(tensor.min()), int(tensor.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{where} holds token id {bad}, outside the model's vocabulary [0, {vocab_size})")
    return tensor.long()


def _check_score(index: int, score) -> torch.Tensor:
    where = f"`scores[{index}]`"
    if isinstance(score, torch.Tensor):
        if score.dim() > 1 or (score.dim() == 1 and score.numel() != 1):
            raise ValueError(
                f"{where} must be a scalar tensor (or shape [1]), got shape {tuple(score.shape)}; give one "
                "score per episode"
            )
        if score.dtype == torch.bool or score.dtype.is_complex:
            raise ValueError(f"{where} must be a real number, got dtype {score.dtype}")
        value = score.reshape(()).detach().float()
    elif isinstance(score, Real) and not isinstance(score, bool):
        value = torch.tensor(float(score))
    else:
        raise ValueError(f"{where} must be a scalar tensor or a number, got {type(score).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{where} is {float(value)}; scores must be finite (check the reward function)")
    return value


def _check_mask(index: int, mask, response_length: int) -> torch.Tensor:
    where = f"`response_masks[{index}]`"
    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"{where} must be a 1-D tensor of 0/1, got {type(mask).__name__}")
    if mask.dim() != 1:
        raise ValueError(f"{where} must be 1-D, got shape {tuple(mask.shape)}")
    if mask.numel() != response_length:
        raise ValueError(
            f"{where} has length {mask.numel()} but `responses[{index}]` has length {response_length}; a mask "
            "needs one entry per response token"
        )
    values = mask.float()
    if not bool(((values == 0) | (values == 1)).all()):
        raise ValueError(f"{where} must contain only 0 and 1")
    if not bool(values.any()):
        raise ValueError(
            f"{where} is all zeros: the response has no model-written token to train on (and no place for the score)"
        )
    return values


def check_step_inputs(
    queries: Sequence,
    responses: Sequence,
    scores: Sequence,
    response_masks: Sequence | None,
    batch_size: int | None,
    vocab_size: int | None = None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, list[torch.Tensor] | None]:
    """Validate and normalise the inputs of `PPOTrainer.step`.

    Returns:
        `(queries, responses, scores, masks)`: lists of 1-D LongTensors, a `[B]` float tensor of scores and a
        list of 1-D float masks (or None). Nothing is moved to a device.

    Raises:
        ValueError: with the name of the bad argument and the index of the bad element.
    """
    for name, values in (("queries", queries), ("responses", responses), ("scores", scores)):
        _check_list(name, values, batch_size)
    queries = [_check_token_tensor("queries", i, q, vocab_size) for i, q in enumerate(queries)]
    responses = [_check_token_tensor("responses", i, r, vocab_size) for i, r in enumerate(responses)]
    score_tensor = torch.stack([_check_score(i, s) for i, s in enumerate(scores)])
    masks = None
    if response_masks is not None:
        _check_list("response_masks", response_masks, batch_size)
        masks = [_check_mask(i, m, len(r)) for i, (m, r) in enumerate(zip(response_masks, responses))]
    return queries, responses, score_tensor, masks
