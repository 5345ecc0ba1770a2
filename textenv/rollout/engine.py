"""The rollout engine: batched generation of one model turn for many episodes at once.

Both front ends (TextEnvironment and the Gym scheduler) generate through `RolloutEngine.generate`. It
takes each episode's exact context token ids, left-pads them into batches, and stops every row at its own
stop strings or EOS. Stop strings are looked for in the newest tokens only (a short window decoded per
step), never by decoding whole rows, and each row keeps exactly the tokens up to and including the one
that completed its stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

DEFAULT_MAX_NEW_TOKENS = 32
FINISH_STOP = "stop"
FINISH_EOS = "eos"
FINISH_LENGTH = "length"


@dataclass
class Completion:
    """One generated turn.

    Attributes:
        token_ids (`torch.LongTensor`): the generated ids, 1-D, up to and including the stop token.
        text (`str`): their decoded text (special tokens kept).
        finish_reason (`str`): `"stop"` (a stop string), `"eos"` or `"length"` (token budget reached).
    """

    token_ids: torch.Tensor
    text: str
    finish_reason: str


def unwrap_model(model: Any) -> Any:
    """The model that owns `.generate`: strips accelerate/DDP wrappers and the value-head wrapper."""
    from accelerate.utils import extract_model_from_parallel

    model = extract_model_from_parallel(model)
    return getattr(model, "pretrained_model", model)


def model_device(model: Any) -> torch.device:
    model = unwrap_model(model)
    device = getattr(model, "device", None)
    if device is None:
        device = next(model.parameters()).device
    return torch.device(device)


class _RowStopper(StoppingCriteria):
    """Per-row stop detection on the newest tokens only.

    After each generated token, every row that is still running decodes its last few tokens (enough to
    hold the longest stop string) and is marked done when a stop string or an EOS id appears. The number
    of tokens the row had generated at that moment is recorded in `stop_lengths`.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str], eos_token_ids: set[int], prompt_length: int, rows: int):
        self.tokenizer = tokenizer
        self.stop_strings = [s for s in stop_strings if s]
        self.eos_token_ids = eos_token_ids
        self.prompt_length = prompt_length
        # A stop string of n characters spans at most n tokens (+2 for byte-fragment tokens).
        self.window = max((len(s) for s in self.stop_strings), default=0) + 2
        self.stop_lengths: list[int | None] = [None] * rows
        self.finish_reasons: list[str | None] = [None] * rows

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_length
        running = [row for row, length in enumerate(self.stop_lengths) if length is None]
        if running and self.eos_token_ids:
            newest = input_ids[running, -1].tolist()
            for row, token_id in zip(running, newest):
                if token_id in self.eos_token_ids:
                    self._finish(row, generated, FINISH_EOS)
            running = [row for row in running if self.stop_lengths[row] is None]
        if running and self.stop_strings:
            start = max(self.prompt_length, input_ids.shape[1] - self.window)
            windows = self.tokenizer.batch_decode(input_ids[running, start:], skip_special_tokens=False)
            for row, window_text in zip(running, windows):
                if any(stop in window_text for stop in self.stop_strings):
                    self._finish(row, generated, FINISH_STOP)
        done = [length is not None for length in self.stop_lengths]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def _finish(self, row: int, generated: int, reason: str) -> None:
        self.stop_lengths[row] = generated
        self.finish_reasons[row] = reason


class RolloutEngine:
    """Generates one turn for a batch of episodes.

    Args:
        model: a causal LM, or a value-head wrapper around one (`.pretrained_model`), possibly wrapped by
            accelerate/DDP or PEFT.
        tokenizer: its tokenizer. A missing pad token is set to EOS (with a warning).
        generation_kwargs (`dict`, *optional*): passed to `model.generate` on every call (`do_sample`,
            `top_k`, `max_new_tokens`, ...). The dict is read, never modified. Without `max_new_tokens`
            or `max_length`, `max_new_tokens=32` is used.
        batch_size (`int`, defaults to 16): rows per `generate` call.
    """

    def __init__(self, model, tokenizer, generation_kwargs: dict | None = None, batch_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        ensure_pad_token(tokenizer)

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def generate(
        self,
        contexts: Sequence[torch.Tensor],
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        batch_size: int | None = None,
        stop_at_eos: bool = True,
    ) -> list[Completion]:
        """Generate one turn for every context.

        Args:
            contexts: each episode's token ids so far (1-D tensors; lengths may differ).
            stop_strings: a row stops once its new text contains any of these.
            generation_kwargs: overrides for this call, merged over the engine's.
            batch_size: rows per `generate` call (default: the engine's).
            stop_at_eos: stop a row at the tokenizer's EOS token even if `generation_kwargs` says
                `eos_token_id=-1` (the legacy examples' setting).

        Returns:
            One `Completion` per context, in order.
        """
        if len(contexts) == 0:
            return []
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        batch_size = batch_size or self.batch_size
        stop_strings = list(stop_strings)
        completions: list[Completion] = []
        for start in range(0, len(contexts), batch_size):
            chunk = contexts[start : start + batch_size]
            completions.extend(self._generate_chunk(chunk, stop_strings, kwargs, stop_at_eos))
        return completions

    def _generate_chunk(self, contexts, stop_strings, kwargs, stop_at_eos) -> list[Completion]:
        model = unwrap_model(self.model)
        device = model_device(model)
        input_ids, attention_mask = left_pad([c.to(device) for c in contexts], self.tokenizer.pad_token_id)
        prompt_length = input_ids.shape[1]
        eos_ids = self.eos_token_ids if stop_at_eos else set()
        stopper = _RowStopper(self.tokenizer, stop_strings, eos_ids, prompt_length, len(contexts))
        call_kwargs = dict(kwargs)
        call_kwargs["stopping_criteria"] = StoppingCriteriaList([*kwargs.get("stopping_criteria", []), stopper])
        call_kwargs.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        if "max_new_tokens" not in call_kwargs and "max_length" not in call_kwargs:
            call_kwargs["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
        with torch.no_grad():
            output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **call_kwargs)
        if not isinstance(output, torch.Tensor):  # return_dict_in_generate=True
            output = output.sequences
        generated = output[:, prompt_length:]
        completions = []
        for row in range(len(contexts)):
            length = stopper.stop_lengths[row]
            reason = stopper.finish_reasons[row] or FINISH_LENGTH
            token_ids = generated[row, : length if length is not None else generated.shape[1]]
            text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
            completions.append(Completion(token_ids=token_ids.clone(), text=text, finish_reason=reason))
        return completions


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


def ensure_pad_token(tokenizer) -> None:
    """Give a tokenizer without a pad token its EOS token as pad token, with a warning."""
    if tokenizer.pad_token is None:
        import warnings

        warnings.warn(
            "The tokenizer has no pad token; using its EOS token as pad token "
            "(set tokenizer.pad_token yourself to choose another).",
            stacklevel=3,
        )
        tokenizer.pad_token = tokenizer.eos_token
