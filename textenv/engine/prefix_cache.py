"""A store of per-sequence KV caches keyed by token ids, so a context that extends a sequence the model
has already processed (the same episode one turn later, or a shared prompt) needs only its new tokens.

Entries belong to an episode (its `owner`) and live until that episode ends (`release`); a prompt prefix
shared by several new rows lives until every episode that used it has ended. Entries without an owner
(made by the engine's synchronous batch calls) live for a call or two (`end_call`). Entries are only valid
for the weights that computed them: the store remembers a fingerprint of the model's parameters (object
ids and in-place version counters, which `load_state_dict` and most optimizers bump) and of the number of
optimizer steps taken in this process (fused optimizers, such as the PPO trainer's fused Adam, update weights
without bumping version counters), and empties itself when it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

LayerKV = tuple[torch.Tensor, torch.Tensor]  # keys, values: [kv_heads, length, head_dim]


@dataclass
class CacheEntry:
    """The KV cache of one token sequence (no padding).

    Attributes:
        token_ids (`torch.LongTensor`): the sequence, 1-D, on CPU.
        layers (`list[LayerKV]`): per layer, keys and values of shape `[kv_heads, length, head_dim]`.
        owner (`Hashable`, *optional*): the episode whose sequence it is; `None` for an entry of a batch call.
        shared (`bool`): a prompt prefix shared by several rows (kept while rows keep using it).
        users (`set`): the owners of the rows that started from this shared prefix.
        idle_calls (`int`): batch calls since an entry without owner was last used or made.
    """

    token_ids: torch.Tensor
    layers: list[LayerKV]
    owner: Hashable | None = None
    shared: bool = False
    users: set = field(default_factory=set)
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
        max_idle_calls (`int`, defaults to 1): an entry without owner that nobody extended for more than
            this many batch calls is dropped.
        max_tokens (`int`, defaults to 65536): the most cached tokens kept; when more are stored, the
            entries used least recently go first.
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
        """Store `entry` (most recently used), then drop the least recently used over the token budget."""
        self.entries.append(entry)
        total = sum(len(e) for e in self.entries)
        while total > self.max_tokens and len(self.entries) > 1:
            total -= len(self.entries.pop(0))

    def consume(self, entry: CacheEntry, owner: Hashable | None) -> None:
        """A row of `owner` extended `entry`: a private entry is superseded by the row's new one; a shared
        one is kept (and remembers its user)."""
        entry.idle_calls = 0
        if entry.shared:
            if owner is not None:
                entry.users.add(owner)
            self.entries = [e for e in self.entries if e is not entry] + [entry]  # most recently used
        else:
            self.entries = [e for e in self.entries if e is not entry]

    def release(self, owner: Hashable) -> None:
        """An episode ended: drop its entries, and the shared prefixes no running episode uses any more."""
        kept = []
        for entry in self.entries:
            entry.users.discard(owner)
            if entry.owner == owner or (entry.shared and entry.owner is not None and not entry.users):
                continue
            kept.append(entry)
        self.entries = kept

    def end_call(self) -> None:
        """Age the entries without owner after a batch call and drop the stale ones."""
        for entry in self.entries:
            if entry.owner is None:
                entry.idle_calls += 1
        self.entries = [e for e in self.entries if e.owner is not None or e.idle_calls <= self.max_idle_calls + 1]

    def clear(self) -> None:
        self.entries.clear()


_optimizer_steps = 0


def _count_optimizer_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


# Every optimizer's step in this process, whatever its kind, runs this hook.
register_optimizer_step_post_hook(_count_optimizer_step)


def parameters_fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter is replaced or modified in place (`load_state_dict`, in-place edits) and
    after any optimizer step in this process (fused optimizers leave version counters alone)."""
    return (id(model), _optimizer_steps, tuple((id(p), p._version) for p in model.parameters()))


def common_prefix_length(sequences: Sequence[torch.Tensor]) -> int:
    """Length of the longest common prefix of 1-D id tensors."""
    shortest = min(len(s) for s in sequences)
    if shortest == 0:
        return 0
    stacked = torch.stack([s[:shortest] for s in sequences])
    equal = (stacked == stacked[0]).all(dim=0)
    mismatches = (~equal).nonzero()
    return int(mismatches[0]) if len(mismatches) else shortest
