"""The fallback path: one `transformers` `generate` call per chunk, with per-row stop detection on the
newest tokens (used for generation settings the engine's own loop does not implement, such as beam
search, repetition penalties or custom logits processors, and for models without a plain KV cache)."""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from textenv.engine.stopping import FINISH_LENGTH, StopChecker


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
            window = self.checker.window
            start = max(self.prompt_length, input_ids.shape[1] - window)
            newest = input_ids[running, start:].tolist()
            for row, reason in zip(running, self.checker.finished(newest)):
                if reason is not None:
                    self.stop_lengths[row] = input_ids.shape[1] - self.prompt_length
                    self.finish_reasons[row] = reason
        done = [length is not None for length in self.stop_lengths]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def generate_with_hf(model, input_ids, attention_mask, checker: StopChecker, kwargs: dict) -> list[tuple[torch.Tensor, str]]:
    """Run `model.generate` on a left-padded chunk; return each row's new ids (cut at its stop) and reason."""
    prompt_length = input_ids.shape[1]
    stopper = _RowStopper(checker, prompt_length, input_ids.shape[0])
    call_kwargs = dict(kwargs)
    call_kwargs["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or []), stopper])
    with torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **call_kwargs)
    if not isinstance(output, torch.Tensor):  # return_dict_in_generate=True
        output = output.sequences
    generated = output[:, prompt_length:]
    results = []
    for row in range(input_ids.shape[0]):
        length = stopper.stop_lengths[row]
        token_ids = generated[row, : length if length is not None else generated.shape[1]]
        results.append((token_ids.clone(), stopper.finish_reasons[row] or FINISH_LENGTH))
    return results


def stopping_criteria_given(kwargs: dict) -> bool:
    criteria: Sequence | None = kwargs.get("stopping_criteria")
    return bool(criteria)
