"""The fallback path: `transformers`' `generate` on a batch of waiting requests, with per-row stop
detection on the newest tokens (used for generation settings the engine's own loop does not implement,
such as beam search, repetition penalties or custom logits processors, and for models without a plain KV
cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from textenv.engine.stopping import FINISH_LENGTH, StopChecker
from textenv.padding import left_pad


@dataclass(eq=False)
class HFGenerateRequest:
    """One turn for `generate`: the context (1-D, CPU), the merged generation kwargs, the stop checker, and
    ``done(token_ids, finish_reason)`` / ``done(None, error)``."""

    context: torch.Tensor
    kwargs: dict
    stop_checker: StopChecker
    done: Callable

    def same_batch_as(self, other: "HFGenerateRequest") -> bool:
        """Whether both can go into one `generate` call (same kwargs and stops)."""
        return self.stop_checker is other.stop_checker and _same_kwargs(self.kwargs, other.kwargs)


class _RowStopper(StoppingCriteria):
    """Marks rows done as `StopChecker` finds their stop; records how many tokens each had then."""

    def __init__(self, checker: StopChecker, prompt_length: int, rows: int):
        self.checker = checker
        self.prompt_length = prompt_length
        self.stop_lengths: list[int | None] = [None] * rows
        self.finish_reasons: list[str | None] = [None] * rows

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        running = [row for row, length in enumerate(self.stop_lengths) if length is None]
        if running:
            start = max(self.prompt_length, input_ids.shape[1] - self.checker.window)
            newest = input_ids[running, start:].tolist()
            for row, reason in zip(running, self.checker.finished(newest)):
                if reason is not None:
                    self.stop_lengths[row] = input_ids.shape[1] - self.prompt_length
                    self.finish_reasons[row] = reason
        done = [length is not None for length in self.stop_lengths]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def serve_with_hf(model, pad_token_id: int, requests: list[HFGenerateRequest], default_max_new_tokens: int) -> None:
    """Run one `model.generate` call for `requests` (same kwargs and stops) and report each row's new ids
    (cut at its stop) and finish reason, or the error to every row."""
    try:
        results = _generate(model, pad_token_id, requests, default_max_new_tokens)
    except Exception as error:  # noqa: BLE001 - reported to the rows of this call
        for request in requests:
            request.done(None, error)
        return
    for request, (token_ids, reason) in zip(requests, results):
        request.done(token_ids, reason)


def _generate(model, pad_token_id, requests, default_max_new_tokens) -> list[tuple[list[int], str]]:
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad([request.context.to(device) for request in requests], pad_token_id)
    kwargs = dict(requests[0].kwargs)
    kwargs.setdefault("pad_token_id", pad_token_id)
    if "max_new_tokens" not in kwargs and "max_length" not in kwargs:
        kwargs["max_new_tokens"] = default_max_new_tokens
    prompt_length = input_ids.shape[1]
    stopper = _RowStopper(requests[0].stop_checker, prompt_length, input_ids.shape[0])
    kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stopper])
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
    if not isinstance(output, torch.Tensor):  # return_dict_in_generate=True
        output = output.sequences
    generated = output[:, prompt_length:]
    results = []
    for row in range(input_ids.shape[0]):
        length = stopper.stop_lengths[row]
        token_ids = generated[row, : length if length is not None else generated.shape[1]]
        results.append((token_ids.tolist(), stopper.finish_reasons[row] or FINISH_LENGTH))
    return results


def _same_kwargs(left: dict, right: dict) -> bool:
    if left.keys() != right.keys():
        return False
    try:
        return all(left[key] is right[key] or left[key] == right[key] for key in left)
    except Exception:  # noqa: BLE001 - values that cannot be compared (tensors): only identical ones match
        return all(left[key] is right[key] for key in left)
