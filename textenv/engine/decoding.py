"""The engine's own decoding loop.

Rows are decoded together in one growing/shrinking batch of at most `max_rows` rows (continuous
batching): a row leaves as soon as it finishes, and waiting rows are admitted into the free slots. Each
admitted row starts from the longest cached prefix of its context (its own previous turn, or a prompt
prefix shared with the other new rows, computed once), so only its new tokens are run through the model.
Logits are computed for the last position only, and stops are checked on the newest tokens only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from textenv.engine.kv_cache import GrowingLayer, growing_cache, merged_cache
from textenv.engine.prefix_cache import CacheEntry, PrefixCache, common_prefix_length
from textenv.engine.sampling import SamplingSettings
from textenv.engine.stopping import FINISH_LENGTH, StopChecker

MIN_SHARED_PREFIX = 16  # tokens; shorter common prefixes are not worth a separate forward pass


@dataclass
class RowResult:
    """What one row generated: its new token ids and why it stopped."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


def supports_fast_decoding(model: torch.nn.Module) -> bool:
    """Decoder-only models whose cache is a plain per-layer KV cache (no sliding window, no recurrent
    state) and whose forward takes `position_ids` and `logits_to_keep`."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    parameters = inspect.signature(model.forward).parameters
    if not {"position_ids", "past_key_values", "logits_to_keep"} <= set(parameters):
        return False
    try:
        cache = DynamicCache(config=config)
    except Exception:  # noqa: BLE001 - an unusual config: let transformers' generate handle it
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


@dataclass
class _Batch:
    """The rows being decoded: their context index, KV cache, attention mask over the cache (0 on
    padding), the position of the next token each row feeds, and the logits for its next choice."""

    rows: list[int]
    cache: DynamicCache
    attention_mask: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.attention_mask.device)
        self.rows = [self.rows[i] for i in keep]
        self.cache.batch_select_indices(index)
        self.attention_mask, self.positions, self.logits = self.attention_mask[index], self.positions[index], self.logits[index]


class BatchDecoder:
    """Decodes one turn for many rows.

    Args:
        model: the causal LM (already unwrapped).
        settings: token budget and sampling.
        stop_checker: per-row stop strings and EOS ids.
        prefix_cache: where cached prefixes are looked up and finished sequences are stored.
        pad_token_id: the id used in padded positions (never attended to).
        max_rows (`int`): rows decoded at the same time.
    """

    def __init__(self, model, settings: SamplingSettings, stop_checker: StopChecker, prefix_cache: PrefixCache, pad_token_id: int, max_rows: int):
        self.model = model
        self.settings = settings
        self.stop_checker = stop_checker
        self.prefix_cache = prefix_cache
        self.pad_token_id = pad_token_id
        self.max_rows = max_rows
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def decode(self, contexts: Sequence[torch.Tensor], on_finish: Callable[[int, RowResult], None] | None = None) -> list[RowResult]:
        """Generate one turn for every context; results in row order (the contexts' order, then added rows).

        Args:
            contexts: the rows' token ids.
            on_finish: called (outside inference mode) as ``on_finish(row, result)`` when a row finishes; it
                may call `add_row` to queue a follow-up row, decoded in this same call.
        """
        self.contexts, self.results, self.waiting = [], [], []
        self.on_finish = on_finish
        for context in contexts:
            self.add_row(context)
        batch: _Batch | None = None
        while self.waiting or batch is not None:
            free = self.max_rows - (len(batch.rows) if batch else 0)
            if self.waiting and (batch is None or free >= max(1, self.max_rows // 4)):
                admitted, self.waiting = self.waiting[:free], self.waiting[free:]
                batch = self._merge(batch, self._prefill(admitted))
            batch = self._step(batch)
        return self.results

    def add_row(self, context: torch.Tensor) -> int:
        """Queue a row to decode; returns its row index."""
        self.contexts.append(context.detach().to("cpu", torch.long))
        self.results.append(RowResult())
        self.waiting.append(len(self.contexts) - 1)
        return len(self.contexts) - 1

    # ---------------------------------------------------------------------------------- decoding
    def _step(self, batch: _Batch) -> _Batch | None:
        """Choose every row's next token, retire finished rows, feed the others; `None` when none is left."""
        counts = [len(self.results[row].token_ids) for row in batch.rows]
        tokens = self.settings.next_tokens(batch.logits, counts).tolist()
        for row, token in zip(batch.rows, tokens):
            self.results[row].token_ids.append(token)
        reasons = self.stop_checker.finished([self.results[row].token_ids for row in batch.rows])
        keep = []
        for position, (row, reason) in enumerate(zip(batch.rows, reasons)):
            if reason is None and len(self.results[row].token_ids) >= self.settings.max_new_tokens:
                reason = FINISH_LENGTH
            if reason is None:
                keep.append(position)
            else:
                self.results[row].finish_reason = reason
                self._finish(row, batch, position)
        if not keep:
            return None
        if len(keep) < len(batch.rows):
            batch.select(keep)
            tokens = [tokens[i] for i in keep]
        input_ids = torch.tensor(tokens, device=self.device).unsqueeze(1)
        batch.attention_mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones((len(keep), 1))], dim=1)
        batch.logits = self._forward(input_ids, batch.attention_mask, batch.positions.unsqueeze(1), batch.cache)
        batch.positions = batch.positions + 1
        return batch

    def _prefill(self, rows: list[int]) -> _Batch:
        """Run the admitted rows' uncached tokens on top of their cached prefixes."""
        contexts = [self.contexts[row] for row in rows]
        entries = self._cached_prefixes(contexts)
        cache, past_mask = self._cache_from_entries(entries)
        input_ids, new_mask, position_ids = self._new_token_inputs(contexts, entries)
        attention_mask = torch.cat([past_mask, new_mask], dim=1)
        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        positions = torch.tensor([len(c) for c in contexts], device=self.device)
        return _Batch(rows=rows, cache=cache, attention_mask=attention_mask, positions=positions, logits=logits)

    def _merge(self, batch: _Batch | None, new: _Batch) -> _Batch:
        """One batch from the running rows and newly admitted ones (caches left-padded to one length)."""
        if batch is None:
            return new
        length = max(batch.attention_mask.shape[1], new.attention_mask.shape[1])
        cache = merged_cache(self.model.config, [batch.cache, new.cache], length, spare=self.settings.max_new_tokens)
        attention_mask = torch.cat([_left_pad(batch.attention_mask, length), _left_pad(new.attention_mask, length)])
        return _Batch(
            rows=batch.rows + new.rows,
            cache=cache,
            attention_mask=attention_mask,
            positions=torch.cat([batch.positions, new.positions]),
            logits=torch.cat([batch.logits, new.logits]),
        )

    # ---------------------------------------------------------------------------------- prefixes
    def _cached_prefixes(self, contexts: list[torch.Tensor]) -> list[CacheEntry | None]:
        """Each row's longest cached prefix; rows without one share a freshly computed common prefix."""
        entries = [self.prefix_cache.longest_prefix(c) for c in contexts]
        uncached = [i for i, entry in enumerate(entries) if entry is None]
        if len(uncached) >= 2:
            shared = self._shared_prefix([contexts[i] for i in uncached])
            if shared is not None:
                for i in uncached:
                    entries[i] = shared
        for entry in entries:
            if entry is not None:
                self.prefix_cache.consume(entry)
        return entries

    def _shared_prefix(self, contexts: list[torch.Tensor]) -> CacheEntry | None:
        length = min(common_prefix_length(contexts), min(len(c) for c in contexts) - 1)
        if length < MIN_SHARED_PREFIX:
            return None
        ids = contexts[0][:length]
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=ids.to(self.device).unsqueeze(0), past_key_values=cache, use_cache=True, logits_to_keep=1)
        entry = CacheEntry(token_ids=ids, layers=[(layer.keys[0], layer.values[0]) for layer in cache.layers], shared=True)
        self.prefix_cache.add(entry)
        return entry

    def _cache_from_entries(self, entries: list[CacheEntry | None]) -> tuple[DynamicCache, torch.Tensor]:
        """A batched cache holding every row's cached prefix, left-padded to the longest, and its mask."""
        lengths = [len(entry) if entry is not None else 0 for entry in entries]
        past = max(lengths)
        attention_mask = torch.zeros((len(entries), past), dtype=torch.long, device=self.device)
        cache = self._decoding_cache()
        if past == 0:
            return cache, attention_mask
        template = next(entry for entry in entries if entry is not None)
        for layer_index, (keys, values) in enumerate(template.layers):
            no_prefix = (keys.new_zeros((1, keys.shape[0], 0, keys.shape[2])), values.new_zeros((1, values.shape[0], 0, values.shape[2])))
            rows = [
                no_prefix if entry is None else (entry.layers[layer_index][0][None], entry.layers[layer_index][1][None])
                for entry in entries
            ]
            cache.layers[layer_index] = GrowingLayer.from_rows(rows, past, spare=self.settings.max_new_tokens)
        for row, length in enumerate(lengths):
            attention_mask[row, past - length :] = 1
        return cache, attention_mask

    def _new_token_inputs(self, contexts, entries) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tokens after each row's cached prefix, left-padded, with their true positions."""
        starts = [len(entry) if entry is not None else 0 for entry in entries]
        new_tokens = [c[start:] for c, start in zip(contexts, starts)]
        width = max(len(t) for t in new_tokens)
        input_ids = torch.full((len(contexts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        position_ids = torch.zeros((len(contexts), width), dtype=torch.long)
        for row, (tokens, start) in enumerate(zip(new_tokens, starts)):
            input_ids[row, width - len(tokens) :] = tokens
            mask[row, width - len(tokens) :] = 1
            position_ids[row, width - len(tokens) :] = torch.arange(start, start + len(tokens))
        return input_ids.to(self.device), mask.to(self.device), position_ids.to(self.device)

    # ---------------------------------------------------------------------------------- model
    def _decoding_cache(self) -> DynamicCache:
        """A cache that the rows' new tokens are appended to in place (room for a whole turn)."""
        return growing_cache(self.model.config, spare=self.settings.max_new_tokens)

    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :]

    def _finish(self, row: int, batch: _Batch, position: int) -> None:
        """Keep a finished row's KV for whoever extends it: a later call (no `on_finish`), or the follow-up
        row `on_finish` queued. A row without a follow-up in a streamed decode is not kept."""
        if self.on_finish is None:
            self._store(row, batch, position)
            return
        queued = len(self.waiting)
        with torch.inference_mode(False):  # the caller's tensors must stay usable for training
            self.on_finish(row, self.results[row])
        if len(self.waiting) > queued:
            self._store(row, batch, position)

    def _store(self, row: int, batch: _Batch, position: int) -> None:
        """Keep a finished row's KV: its context and every generated token but the last (never fed)."""
        valid = batch.attention_mask[position].bool()
        layers = [(layer.keys[position][:, valid], layer.values[position][:, valid]) for layer in batch.cache.layers]
        token_ids = torch.cat([self.contexts[row], torch.tensor(self.results[row].token_ids[:-1], dtype=torch.long)])
        if len(token_ids) == int(valid.sum()):  # always true; never store an entry that mismatches its ids
            self.prefix_cache.add(CacheEntry(token_ids=token_ids, layers=layers))


def _left_pad(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad a `[rows, len]` attention mask on the left to `length` columns."""
    return F.pad(mask, (length - mask.shape[1], 0))
