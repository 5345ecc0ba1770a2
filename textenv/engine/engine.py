"""The generation engine: batched generation of one model turn for many episodes at once.

Both front ends (TextEnvironment and the Gym scheduler) generate through `RolloutEngine.generate`. It
takes each episode's exact context token ids and stops every row at its own stop strings or EOS, keeping
exactly the tokens up to and including the one that completed its stop.

For greedy and plain sampled decoding (temperature, top-k, top-p, min_new_tokens) on models with a plain
KV cache, the engine runs its own loop (`decoding.py`): a context that extends a sequence it processed
before (the same episode one turn later) starts from that sequence's cached keys and values, a prompt
prefix shared by new episodes is computed once, finished rows leave the batch, stop strings are looked for
in the newest tokens only, and logits are computed for the last position only. Greedy results are the
tokens `transformers`' `generate` gives (up to float rounding). Anything else falls back to `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from textenv.engine.decoding import BatchDecoder, supports_fast_decoding
from textenv.engine.hf_generate import generate_with_hf
from textenv.engine.prefix_cache import PrefixCache
from textenv.engine.sampling import SamplingSettings
from textenv.engine.stopping import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, StopChecker

DEFAULT_MAX_NEW_TOKENS = 32

__all__ = ["Completion", "RolloutEngine", "left_pad", "unwrap_model", "FINISH_EOS", "FINISH_LENGTH", "FINISH_STOP"]


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


class RolloutEngine:
    """Generates one turn for a batch of episodes.

    Args:
        model: a causal LM, or a value-head wrapper around one (`.pretrained_model`), possibly wrapped by
            accelerate/DDP or PEFT.
        tokenizer: its tokenizer. A missing pad token is set to EOS (with a warning).
        generation_kwargs (`dict`, *optional*): generation settings for every call (`do_sample`, `top_k`,
            `max_new_tokens`, ...), as for `model.generate`. The dict is read, never modified. Without
            `max_new_tokens` or `max_length`, `max_new_tokens=32` is used.
        batch_size (`int`, defaults to 16): the most rows decoded at the same time (finished rows make
            room for waiting ones).
        reuse_cache (`bool`, defaults to `True`): reuse cached prefixes across calls (an episode's
            previous turns) and within a call (a shared prompt). The cache is dropped automatically when
            the model's weights change. `False` recomputes every context from scratch.
    """

    def __init__(self, model, tokenizer, generation_kwargs: dict | None = None, batch_size: int = 16, reuse_cache: bool = True):
        self.model = model
        self.tokenizer = tokenizer
        self.generation_kwargs = generation_kwargs if generation_kwargs is not None else {}
        self.batch_size = batch_size
        self.reuse_cache = reuse_cache
        self.prefix_cache = PrefixCache()
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
            batch_size: rows decoded together (default: the engine's).
            stop_at_eos: stop a row at the tokenizer's EOS token even if `generation_kwargs` says
                `eos_token_id=-1` (the legacy examples' setting).

        Returns:
            One `Completion` per context, in order.
        """
        if len(contexts) == 0:
            return []
        batch_size = batch_size or self.batch_size
        model, kwargs, settings = self._decoding_plan(generation_kwargs)
        checker = self._stop_checker(stop_strings, settings, stop_at_eos)
        if settings is not None:
            self._prepare_cache(model)
            results = self._decode(model, contexts, settings, checker, batch_size)
        else:
            results = []
            for start in range(0, len(contexts), batch_size):
                results.extend(self._generate_chunk(model, contexts[start : start + batch_size], checker, kwargs))
        return [self._completion(ids, reason) for ids, reason in results]

    def run_turns(
        self,
        contexts: Sequence[torch.Tensor],
        next_context: Callable[[int, Completion], torch.Tensor | None],
        stop_strings: Iterable[str] = (),
        generation_kwargs: dict | None = None,
        batch_size: int | None = None,
    ) -> None:
        """Generate turn after turn, each episode at its own pace.

        When episode ``i``'s turn ends, ``next_context(i, completion)`` returns its next context (the
        episode continues in the same decoding batch, while slower episodes are still on their turn) or
        ``None`` (it is done). Without the fast decoding path, turns run in lockstep through `generate`.

        Args:
            contexts: each episode's first context.
            next_context: the episode's reaction to a finished turn (tools, end checks).
            stop_strings, generation_kwargs, batch_size: as for `generate`.
        """
        model, _, settings = self._decoding_plan(generation_kwargs)
        if settings is None or len(contexts) == 0:
            self._run_turns_in_lockstep(contexts, next_context, stop_strings, generation_kwargs, batch_size)
            return
        checker = self._stop_checker(stop_strings, settings)
        self._prepare_cache(model)
        decoder = self._decoder(model, settings, checker, batch_size or self.batch_size)
        episode_of_row = list(range(len(contexts)))
        devices = [context.device for context in contexts]

        def on_finish(row: int, result) -> None:
            episode = episode_of_row[row]
            token_ids = torch.tensor(result.token_ids, dtype=torch.long, device=devices[episode])
            following = next_context(episode, self._completion(token_ids, result.finish_reason))
            if following is not None:
                episode_of_row.append(episode)
                decoder.add_row(following)

        decoder.decode(contexts, on_finish=on_finish)
        self._end_call()

    def _decoding_plan(self, generation_kwargs: dict | None) -> tuple[Any, dict, SamplingSettings | None]:
        """The unwrapped model, this call's generation kwargs (merged over the engine's), and the sampling
        settings when the engine's own loop can decode them (``None``: transformers' `generate` must)."""
        kwargs = {**self.generation_kwargs, **(generation_kwargs or {})}
        model = unwrap_model(self.model)
        settings = SamplingSettings.from_kwargs(getattr(model, "generation_config", None), kwargs, DEFAULT_MAX_NEW_TOKENS)
        return model, kwargs, settings if settings is not None and supports_fast_decoding(model) else None

    def _stop_checker(self, stop_strings: Iterable[str], settings: SamplingSettings | None, stop_at_eos: bool = True) -> StopChecker:
        stop_ids = self.eos_token_ids if stop_at_eos else set()
        if settings is not None:
            stop_ids = stop_ids | settings.eos_token_ids
        return StopChecker(self.tokenizer, list(stop_strings), stop_ids)

    def _run_turns_in_lockstep(self, contexts, next_context, stop_strings, generation_kwargs, batch_size) -> None:
        pending = dict(enumerate(contexts))
        while pending:
            episodes = list(pending)
            completions = self.generate([pending[i] for i in episodes], stop_strings, generation_kwargs, batch_size)
            pending = {}
            for episode, completion in zip(episodes, completions):
                following = next_context(episode, completion)
                if following is not None:
                    pending[episode] = following

    def _prepare_cache(self, model) -> None:
        if self.reuse_cache:
            self.prefix_cache.validate(model)
        else:
            self.prefix_cache.clear()

    def _decoder(self, model, settings, checker, batch_size: int) -> BatchDecoder:
        return BatchDecoder(model, settings, checker, self.prefix_cache, self.tokenizer.pad_token_id, max_rows=batch_size)

    def _end_call(self) -> None:
        self.prefix_cache.end_call()
        if not self.reuse_cache:
            self.prefix_cache.clear()

    def _decode(self, model, contexts, settings, checker, batch_size) -> list[tuple[torch.Tensor, str]]:
        results = self._decoder(model, settings, checker, batch_size).decode(contexts)
        self._end_call()
        return [
            (torch.tensor(r.token_ids, dtype=torch.long, device=context.device), r.finish_reason)
            for r, context in zip(results, contexts)
        ]

    def _generate_chunk(self, model, chunk, checker, kwargs) -> list[tuple[torch.Tensor, str]]:
        device = model_device(model)
        input_ids, attention_mask = left_pad([c.to(device) for c in chunk], self.tokenizer.pad_token_id)
        call_kwargs = dict(kwargs)
        call_kwargs.setdefault("pad_token_id", self.tokenizer.pad_token_id)
        if "max_new_tokens" not in call_kwargs and "max_length" not in call_kwargs:
            call_kwargs["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
        return generate_with_hf(model, input_ids, attention_mask, checker, call_kwargs)

    def _completion(self, token_ids: torch.Tensor, reason: str) -> Completion:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        return Completion(token_ids=token_ids, text=text, finish_reason=reason)


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
