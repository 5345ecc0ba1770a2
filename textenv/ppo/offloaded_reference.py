"""A frozen reference model whose weights live in a snapshot file and are memory-mapped only while it runs.

PPO needs the reference for one no-grad forward pass per step. A full copy on the heap costs a model's
worth of memory for the whole run, at the peak of every optimisation phase too. Here the policy's weights
are written once to a file; each use maps them (no copy on CPU) into a weightless skeleton of the model and
unmaps them afterwards. Between uses they are clean page cache, which the kernel can drop and read again,
not process memory. The outputs are those of an in-memory copy, bit for bit (the same float32 values).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import weakref
from typing import Iterator

import torch
from torch import nn

SNAPSHOT_FILE = "reference.pt"
AUTO_OFFLOAD_MIN_BYTES = 256 * 2**20  # smaller models: an in-memory copy is cheap and easier to inspect


def should_offload(setting: bool | None, model: nn.Module, device: torch.device) -> bool:
    """``PPOConfig.offload_reference``: ``None`` (auto) offloads on CPU for models of 256 MiB or more."""
    if setting is not None:
        return setting
    size = sum(param.numel() * param.element_size() for param in model.parameters())
    return device.type == "cpu" and size >= AUTO_OFFLOAD_MIN_BYTES


class OffloadedReference:
    """A frozen copy of ``model`` kept in a snapshot file under ``folder`` (default: the system temp folder).

    Use it with ``with reference.loaded() as model: ...``; the file is deleted when this object is
    garbage-collected or the interpreter exits.

    Args:
        model: the policy to copy (its current weights).
        device: where the loaded weights go (CPU: mapped from the file; other devices: copied there).
        folder: where to write the snapshot.
    """

    def __init__(self, model: nn.Module, device: torch.device | str = "cpu", folder: str | None = None):
        self.device = torch.device(device)
        self.folder = tempfile.mkdtemp(prefix="textenv-reference-", dir=folder)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        self.path = os.path.join(self.folder, SNAPSHOT_FILE)
        # Named by module path (as ``named_parameters``), not by ``state_dict()`` keys, which a module's state-dict
        # hooks may rename (the value-head wrappers drop their ``pretrained_model.`` prefix).
        state = {name: tensor.detach().cpu() for name, tensor in _state_tensors(model)}
        torch.save(state, self.path)  # tensors that share storage (tied embeddings) are written once
        self.skeleton = _weightless_copy(model, self.device)
        # The skeleton's own parameter and buffer objects by the same names: loading sets their ``.data``, so
        # tied weights stay one parameter.
        self._slots = dict(_state_tensors(self.skeleton))
        self._empty = {name: _placeholder(tensor, self.device) for name, tensor in state.items()}
        del state

    @contextlib.contextmanager
    def loaded(self) -> Iterator[nn.Module]:
        """The reference model with its weights mapped in; they are released when the block ends."""
        state = torch.load(self.path, mmap=True, weights_only=True, map_location="cpu")
        for name, slot in self._slots.items():
            slot.data = state[name] if self.device.type == "cpu" else state[name].to(self.device)
        del state
        try:
            yield self.skeleton
        finally:
            for name, slot in self._slots.items():
                slot.data = self._empty[name]

    def close(self) -> None:
        """Delete the snapshot file now."""
        self._cleanup()


def _weightless_copy(model: nn.Module, device: torch.device) -> nn.Module:
    # deepcopy returns the memo entry for every parameter: empty placeholders, so nothing model-sized is copied.
    memo = {id(param): nn.Parameter(_placeholder(param, device), requires_grad=False) for param in model.parameters()}
    skeleton = copy.deepcopy(model, memo).to(device)  # buffers that are not in the state dict (rotary tables)
    for param in skeleton.parameters():
        param.requires_grad_(False)
    return skeleton.eval()


def _placeholder(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A 0-element tensor of the same dtype on ``device`` (``.data`` can only move between tensors of one kind)."""
    return torch.empty(0, dtype=tensor.dtype, device=device)


def _state_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What ``state_dict`` holds (parameters and persistent buffers, shared ones under each of their names),
    named by module path; non-persistent buffers (rotary tables) stay in the skeleton as copied."""
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for name, param in module._parameters.items():
            if param is not None:
                yield prefix + name, param
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                yield prefix + name, buffer
