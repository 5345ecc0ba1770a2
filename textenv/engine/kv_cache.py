"""A KV cache that appends in place: each layer keeps its keys and values in buffers with spare room.

transformers' ``DynamicLayer`` concatenates the whole cache with the new token at every decoding step, so
a step copies every layer's keys and values (a growing cost, about a tenth of decode time on CPU here).
`GrowingLayer` writes the new entries into spare room and exposes the filled part as a view; it
reallocates (with room for ``spare`` more tokens) only when the room runs out.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose ``keys``/``values`` are views of preallocated `[B, H, capacity, D]` buffers.

    Args:
        spare: tokens of room added whenever the buffers are (re)allocated.
    """

    def __init__(self, spare: int):
        super().__init__()
        self.spare = spare
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0

    @classmethod
    def from_rows(cls, blocks: list[tuple[torch.Tensor, torch.Tensor]], length: int, spare: int) -> "GrowingLayer":
        """One layer holding the rows of several `[rows, H, len, D]` key/value blocks, in order, each
        right-aligned to ``length`` (zeros on the left, masked by the caller), with room for ``spare`` more."""
        first_keys, first_values = blocks[0]
        rows = sum(keys.shape[0] for keys, _ in blocks)
        layer = cls(spare)
        layer.lazy_initialization(first_keys, first_values)
        layer._key_buffer = first_keys.new_empty((rows, first_keys.shape[1], length + spare, first_keys.shape[3]))
        layer._value_buffer = first_values.new_empty((rows, first_values.shape[1], length + spare, first_values.shape[3]))
        start = 0
        for keys, values in blocks:
            end, pad = start + keys.shape[0], length - keys.shape[2]
            for buffer, block in ((layer._key_buffer, keys), (layer._value_buffer, values)):
                buffer[start:end, :, :pad].zero_()  # never attended to, but must be finite
                buffer[start:end, :, pad:length] = block
            start = end
        layer._set_length(length)
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._reallocate(key_states, value_states, end + self.spare)
        self._key_buffer[:, :, self._length : end] = key_states
        self._value_buffer[:, :, self._length : end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._key_buffer is not None:
            self._key_buffer = self._key_buffer[indices]
            self._value_buffer = self._value_buffer[indices]
            self._set_length(self._length)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._key_buffer is not None:
            self._key_buffer = self._key_buffer.repeat_interleave(repeats, dim=0)
            self._value_buffer = self._value_buffer.repeat_interleave(repeats, dim=0)
            self._set_length(self._length)

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self._key_buffer is not None and tokens_to_remove < 0:
            self._set_length(self._length + tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device))

    def reset(self) -> None:
        # Dropped, as transformers 5.21+ does for DynamicLayer; before 5.21 its reset zeroed the views in place,
        # which kept their length.
        self._key_buffer = self._value_buffer = None
        self._length = 0
        self.keys = self.values = None
        self.is_initialized = False
        super().reset()

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        batch, heads, _, key_dim = key_states.shape
        keys = key_states.new_empty((batch, heads, capacity, key_dim))
        values = value_states.new_empty((batch, heads, capacity, value_states.shape[-1]))
        if self._length:
            keys[:, :, : self._length] = self.keys
            values[:, :, : self._length] = self.values
        self._key_buffer, self._value_buffer = keys, values

    def _set_length(self, length: int) -> None:
        self._length = length
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]


def growing_cache(config, spare: int) -> DynamicCache:
    """A `DynamicCache` for ``config`` whose layers are `GrowingLayer` (full-attention models only)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(spare) for _ in cache.layers]
    return cache


def merged_cache(config, caches: list[DynamicCache], length: int, spare: int, rows: list[torch.Tensor | None] | None = None) -> DynamicCache:
    """One cache with the rows of ``caches`` in order, right-aligned to ``length``; ``rows[i]`` (optional)
    picks which rows of ``caches[i]`` to keep. Each source layer is released as soon as it is copied, so the
    sources and the result do not all exist at once; the source caches are empty afterwards."""
    rows = rows or [None] * len(caches)
    cache = growing_cache(config, spare)
    for index in range(len(cache.layers)):
        sources = [source.layers[index] for source in caches]
        blocks = [
            (layer.keys, layer.values) if keep is None else (layer.keys[keep], layer.values[keep])
            for layer, keep in zip(sources, rows)
        ]
        cache.layers[index] = GrowingLayer.from_rows(blocks, length, spare)
        for layer in sources:
            layer.reset()
    return cache
