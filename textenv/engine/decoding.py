"""The engine's own decoding loop: continuous batching over requests that come and go.

Rows are decoded together in one growing/shrinking batch of at most `max_rows` rows: a row leaves as soon
as it finishes, and waiting requests are admitted into the free slots at the next step. Each admitted row
starts from the longest cached prefix of its context (its own previous turn, or a prompt prefix shared
with the other new rows, computed once), so only its new tokens are run through the model. Every row has
its own sampling settings, stop strings and token budget. Logits are computed for the last position only,
and stops are checked on the newest tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from textenv.engine.kv_cache import GrowingLayer, growing_cache, merged_cache
from textenv.engine.prefix_cache import CacheEntry, PrefixCache, common_prefix_length
from textenv.engine.sampling import RandomStream, SamplingSettings
from textenv.engine.stopping import FINISH_LENGTH, StopChecker

MIN_SHARED_PREFIX = 16  # tokens; shorter common prefixes are not worth a separate forward pass
SHARED = "<shared prefix>"  # the owner of a shared prefix made for episodes (kept while they use it)


@dataclass(eq=False)
class DecodeRequest:
    """One turn to generate, and what the decoder reports back.

    Attributes:
        context (`torch.LongTensor`): the episode's token ids so far, 1-D, on CPU.
        settings (`SamplingSettings`): token budget and sampling of this turn.
        stop_checker (`StopChecker`): this turn's stop strings and EOS ids.
        done (`Callable`): called in the decoding thread as ``done(token_ids, finish_reason)`` when the turn
            ends, or ``done(None, error)`` when decoding failed.
        owner (`Hashable`, *optional*): the episode; its KV cache is kept for its next turn until the
            engine is told the episode ended. `None`: kept for a call or two (batch calls).
        stream (`RandomStream`, *optional*): the episode's own randomness for sampled tokens (`None`:
            torch's global generator).
        token_ids (`list[int]`): the ids generated so far.
    """

    context: torch.Tensor
    settings: SamplingSettings
    stop_checker: StopChecker
    done: Callable
    owner: Hashable | None = None
    stream: RandomStream | None = None
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Batch:
    """The rows being decoded: their requests (`None` for a finished row whose slot is not yet reclaimed),
    KV cache, attention mask over the cache (0 on padding), the position of the next token each row feeds,
    and the logits for its next choice."""

    requests: list[DecodeRequest | None]
    cache: DynamicCache
    attention_mask: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor

    @property
    def live(self) -> list[int]:
        return [index for index, request in enumerate(self.requests) if request is not None]

    def select(self, keep: list[int]) -> None:
        index = torch.tensor(keep, device=self.attention_mask.device)
        self.requests = [self.requests[i] for i in keep]
        self.cache.batch_select_indices(index)
        self.attention_mask, self.positions, self.logits = self.attention_mask[index], self.positions[index], self.logits[index]


class ContinuousDecoder:
    """Decodes the rows it is given, admitting new ones between steps (call in inference mode).

    Args:
        model: the causal LM (already unwrapped).
        prefix_cache: where cached prefixes are looked up and finished sequences are stored.
        pad_token_id: the id used in padded positions (never attended to).
        max_rows (`int`): rows decoded at the same time.
        cache_argument (`str`): the forward argument that takes the KV cache (`DecodingPath.cache_argument`).
        reuse_cache (`bool`): look up and store cached prefixes.
    """

    def __init__(self, model, prefix_cache: PrefixCache, pad_token_id: int, max_rows: int, cache_argument: str, reuse_cache: bool = True):
        self.model = model
        self.cache_argument = cache_argument
        self.prefix_cache = prefix_cache
        self.pad_token_id = pad_token_id
        self.max_rows = max_rows
        self.reuse_cache = reuse_cache
        self.device = next(model.parameters()).device
        self.batch: _Batch | None = None

    @property
    def free_rows(self) -> int:
        return self.max_rows - (len(self.batch.live) if self.batch else 0)

    def wants_rows(self) -> bool:
        """Whether to admit waiting rows now: always into an empty batch, else once a quarter of the rows
        are free (admitting merges the caches, a copy of the whole batch's KV)."""
        return self.batch is None or self.free_rows >= max(1, self.max_rows // 4)

    def admit(self, requests: list[DecodeRequest]) -> None:
        """Prefill `requests` on top of their cached prefixes and add them to the batch."""
        if requests:
            self.batch = self._merge(self.batch, self._prefill(requests))

    def step(self) -> None:
        """Choose every row's next token, retire finished rows, feed the others one token.

        A finished row's slot is reclaimed lazily: copying the batch's KV to drop one row costs about as
        much as a decoding step, so finished rows are dropped together, when a quarter of the slots are
        finished or when new rows are admitted (`_merge` copies the live rows only)."""
        batch = self.batch
        live = batch.live
        tokens = self._next_tokens(batch, live)
        for position, token in zip(live, tokens):
            batch.requests[position].token_ids.append(token)
        for position, reason in zip(live, self._finish_reasons([batch.requests[p] for p in live])):
            request = batch.requests[position]
            if reason is None and len(request.token_ids) >= request.settings.max_new_tokens:
                reason = FINISH_LENGTH
            if reason is not None:
                self._store(request, batch, position)
                batch.requests[position] = None
                request.done(request.token_ids, reason)
        live = batch.live
        if not live:
            self.batch = None
            return
        if len(batch.requests) - len(live) > max(1, len(batch.requests) // 4):
            batch.select(live)
        fed = [request.token_ids[-1] if request is not None else self.pad_token_id for request in batch.requests]
        input_ids = torch.tensor(fed, device=self.device).unsqueeze(1)
        batch.attention_mask = torch.cat([batch.attention_mask, batch.attention_mask.new_ones((len(batch.requests), 1))], dim=1)
        batch.logits = self._forward(input_ids, batch.attention_mask, batch.positions.unsqueeze(1), batch.cache)
        batch.positions = batch.positions + 1

    def fail(self, error: BaseException) -> None:
        """Report `error` to every row of the batch and drop the batch and every cached prefix."""
        requests = [request for request in self.batch.requests if request is not None] if self.batch else []
        self.batch = None
        self.prefix_cache.clear()
        for request in requests:
            request.done(None, error)

    # ---------------------------------------------------------------------------------- choosing
    @staticmethod
    def _next_tokens(batch: _Batch, live: list[int]) -> list[int]:
        """One token per live row (in `live`'s order); rows with equal settings are chosen together."""
        requests = [batch.requests[position] for position in live]
        tokens: list[int] = [0] * len(live)
        for settings, members in _group_by(requests, lambda request: request.settings):
            index = torch.tensor([live[member] for member in members], device=batch.logits.device)
            counts = [len(requests[member].token_ids) for member in members]
            streams = [requests[member].stream for member in members]
            uniforms = None
            if settings.do_sample and all(stream is not None for stream in streams):
                uniforms = torch.tensor([stream.next_uniform() for stream in streams], dtype=torch.float64)
            for member, token in zip(members, settings.next_tokens(batch.logits[index], counts, uniforms).tolist()):
                tokens[member] = token
        return tokens

    @staticmethod
    def _finish_reasons(requests: list[DecodeRequest]) -> list[str | None]:
        reasons: list[str | None] = [None] * len(requests)
        for checker, positions in _group_by(requests, lambda request: request.stop_checker):
            for position, reason in zip(positions, checker.finished([requests[p].token_ids for p in positions])):
                reasons[position] = reason
        return reasons

    # ---------------------------------------------------------------------------------- admitting
    def _prefill(self, requests: list[DecodeRequest]) -> _Batch:
        """Run the admitted rows' uncached tokens on top of their cached prefixes."""
        contexts = [request.context for request in requests]
        entries = self._cached_prefixes(requests) if self.reuse_cache else [None] * len(requests)
        spare = _spare(requests)
        cache, past_mask = self._cache_from_entries(entries, spare)
        input_ids, new_mask, position_ids = self._new_token_inputs(contexts, entries)
        attention_mask = torch.cat([past_mask, new_mask], dim=1)
        logits = self._forward(input_ids, attention_mask, position_ids, cache)
        positions = torch.tensor([len(c) for c in contexts], device=self.device)
        return _Batch(requests=list(requests), cache=cache, attention_mask=attention_mask, positions=positions, logits=logits)

    def _merge(self, batch: _Batch | None, new: _Batch) -> _Batch:
        """One batch from the running rows and newly admitted ones (caches left-padded to one length)."""
        if batch is None:
            return new
        live = torch.tensor(batch.live, device=self.device)  # finished rows are dropped in the same copy
        length = max(batch.attention_mask.shape[1], new.attention_mask.shape[1])
        requests = [batch.requests[i] for i in batch.live] + new.requests
        cache = merged_cache(self.model.config, [batch.cache, new.cache], length, spare=_spare(requests), rows=[live, None])
        attention_mask = torch.cat([_left_pad(batch.attention_mask[live], length), _left_pad(new.attention_mask, length)])
        return _Batch(
            requests=requests,
            cache=cache,
            attention_mask=attention_mask,
            positions=torch.cat([batch.positions[live], new.positions]),
            logits=torch.cat([batch.logits[live], new.logits]),
        )

    def _cached_prefixes(self, requests: list[DecodeRequest]) -> list[CacheEntry | None]:
        """Each row's longest cached prefix; rows without one share a freshly computed common prefix."""
        entries = [self.prefix_cache.longest_prefix(request.context) for request in requests]
        uncached = [i for i, entry in enumerate(entries) if entry is None]
        if len(uncached) >= 2:
            shared = self._shared_prefix([requests[i] for i in uncached])
            if shared is not None:
                for i in uncached:
                    entries[i] = shared
        for request, entry in zip(requests, entries):
            if entry is not None:
                self.prefix_cache.consume(entry, request.owner)
        return entries

    def _shared_prefix(self, requests: list[DecodeRequest]) -> CacheEntry | None:
        contexts = [request.context for request in requests]
        length = min(common_prefix_length(contexts), min(len(c) for c in contexts) - 1)
        if length < MIN_SHARED_PREFIX:
            return None
        ids = contexts[0][:length]
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=ids.to(self.device).unsqueeze(0), use_cache=True, logits_to_keep=1, **{self.cache_argument: cache})
        owned = any(request.owner is not None for request in requests)
        layers = [(layer.keys[0], layer.values[0]) for layer in cache.layers]
        entry = CacheEntry(token_ids=ids, layers=layers, owner=SHARED if owned else None, shared=True)
        self.prefix_cache.add(entry)
        return entry

    def _cache_from_entries(self, entries: list[CacheEntry | None], spare: int) -> tuple[DynamicCache, torch.Tensor]:
        """A batched cache holding every row's cached prefix, left-padded to the longest, and its mask."""
        lengths = [len(entry) if entry is not None else 0 for entry in entries]
        past = max(lengths)
        attention_mask = torch.zeros((len(entries), past), dtype=torch.long, device=self.device)
        cache = growing_cache(self.model.config, spare=spare)
        if past == 0:
            return cache, attention_mask
        template = next(entry for entry in entries if entry is not None)
        for layer_index, (keys, values) in enumerate(template.layers):
            no_prefix = (keys.new_zeros((1, keys.shape[0], 0, keys.shape[2])), values.new_zeros((1, values.shape[0], 0, values.shape[2])))
            rows = [
                no_prefix if entry is None else (entry.layers[layer_index][0][None], entry.layers[layer_index][1][None])
                for entry in entries
            ]
            cache.layers[layer_index] = GrowingLayer.from_rows(rows, past, spare=spare)
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
    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_argument: cache},
        )
        return output.logits[:, -1, :]

    def _store(self, request: DecodeRequest, batch: _Batch, position: int) -> None:
        """Keep a finished row's KV for its episode's next turn: its context and every generated token but
        the last (never fed)."""
        if not self.reuse_cache:
            return
        valid = batch.attention_mask[position].bool()
        layers = [(layer.keys[position][:, valid], layer.values[position][:, valid]) for layer in batch.cache.layers]
        token_ids = torch.cat([request.context, torch.tensor(request.token_ids[:-1], dtype=torch.long)])
        if len(token_ids) == int(valid.sum()):  # always true; never store an entry that mismatches its ids
            self.prefix_cache.add(CacheEntry(token_ids=token_ids, layers=layers, owner=request.owner))


def _group_by(requests: list[DecodeRequest], key: Callable) -> list[tuple[object, list[int]]]:
    """`(value, positions)` for each distinct `key(request)` (compared by equality), in first-seen order."""
    groups: list[tuple[object, list[int]]] = []
    for position, request in enumerate(requests):
        value = key(request)
        for seen, positions in groups:
            if seen is value or seen == value:
                positions.append(position)
                break
        else:
            groups.append((value, [position]))
    return groups


def _spare(requests: list[DecodeRequest]) -> int:
    """Room to reserve in the cache: the longest turn any of the rows may still generate."""
    return max(request.settings.max_new_tokens for request in requests)


def _left_pad(mask: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad a `[rows, len]` attention mask on the left to `length` columns."""
    return F.pad(mask, (length - mask.shape[1], 0))
