"""A store of per-sequence KV caches keyed by token ids, so a context that extends a sequence the model
has already processed (the same episode one turn later, or a shared prompt) needs only its new tokens.

Entries are only valid for the weights that computed them: the store remembers a fingerprint of the
model's parameters (object ids and in-place version counters, which every optimizer step bumps) and
empties itself when it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [kv_heads, length, head_dim]


@dataclass
class CacheEntry:
    """The KV cache of one token sequence (no padding).

    Attributes:
        token_ids (`torch.LongTensor`): the sequence, 1-D, on CPU.
        layers (`list[LayerKV]`): per layer, keys and values of shape `[kv_heads, length, head_dim]`.
        shared (`bool`): a prompt prefix shared by several rows (kept while rows keep using it).
        idle_calls (`int`): engine calls since the entry was last used or made.
    """

    token_ids: torch.Tensor
    layers: list[LayerKV]
    shared: bool = False
    idle_calls: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    def is_prefix_of(self, ids: torch.Tensor) -> bool:
        """Whether this sequence is a proper prefix of `ids` (at least one token of `ids` is left)."""
        return len(self) < len(ids) and torch.equal(ids[: len(self)], self.token_ids)


@dataclass
class PrefixCache:
    """Entries of recently generated sequences, looked up by longest prefix.

    Args:
        max_idle_calls (`int`, defaults to 1): an entry nobody extended for more than this many engine
            calls is dropped (a finished episode never comes back; a Gym episode waiting for its
            environment may skip a call).
        max_tokens (`int`, defaults to 65536): the most cached tokens kept; the longest-idle entries go first.
    """

    max_idle_calls: int = 1
    max_tokens: int = 65536
    entries: list[CacheEntry] = field(default_factory=list)
    fingerprint: Any = None

    def validate(self, model: torch.nn.Module) -> None:
        """Empty the store if the model or its weights changed since the entries were made."""
        fingerprint = parameters_fingerprint(model)
        if fingerprint != self.fingerprint:
            self.entries.clear()
            self.fingerprint = fingerprint

    def longest_prefix(self, ids: torch.Tensor) -> CacheEntry | None:
        """The longest entry that is a proper prefix of `ids`, or `None`."""
        best = None
        for entry in self.entries:
            if (best is None or len(entry) > len(best)) and entry.is_prefix_of(ids):
                best = entry
        return best

    def add(self, entry: CacheEntry) -> None:
        self.entries.append(entry)

    def consume(self, entry: CacheEntry) -> None:
        """A row extended `entry`: a private entry is superseded by the row's new one; a shared one is kept."""
        entry.idle_calls = 0
        if not entry.shared and any(e is entry for e in self.entries):
            self.entries = [e for e in self.entries if e is not entry]

    def end_call(self) -> None:
        """Age the entries after an engine call and drop the stale ones and those over the token budget."""
        for entry in self.entries:
            entry.idle_calls += 1
        self.entries = [e for e in self.entries if e.idle_calls <= self.max_idle_calls + 1]
        total = sum(len(e) for e in self.entries)
        for entry in sorted(self.entries, key=lambda e: -e.idle_calls):
            if total <= self.max_tokens:
                break
            self.entries = [e for e in self.entries if e is not entry]
            total -= len(entry)

    def clear(self) -> None:
        self.entries.clear()


def parameters_fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter is replaced or modified in place (optimizer steps, `load_state_dict`)."""
    return (id(model), tuple((id(p), p._version) for p in model.parameters()))


def common_prefix_length(sequences: Sequence[torch.Tensor]) -> int:
    """Length of the longest common prefix of 1-D id tensors."""
    shortest = min(len(s) for s in sequences)
    if shortest == 0:
        return 0
    stacked = torch.stack([s[:shortest] for s in sequences])
    equal = (stacked == stacked[0]).all(dim=0)
    mismatches = (~equal).nonzero()
    return int(mismatches[0]) if len(mismatches) else shortest
