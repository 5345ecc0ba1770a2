"""Where a checkpoint keeps the value head's weights, and how to read them back.

Legacy TRL (0.11.4) stored the ``v_head.*`` tensors inside the wrapped model's own weight files:

- a full model: ``model.safetensors`` (or ``pytorch_model.bin``), or the shards listed in
  ``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``, next to the model's own keys;
- a PEFT model: the adapter files written by ``peft`` and a ``pytorch_model.bin`` holding only ``v_head.*``.

Earlier textenv versions wrote the head to its own ``value_head.safetensors``; that file is still read when the
legacy places hold no ``v_head.*`` tensor. Only the value-head tensors are read from each file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SAFE_WEIGHTS = "model.safetensors"
BIN_WEIGHTS = "pytorch_model.bin"
SAFE_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
OLD_VALUE_HEAD_FILE = "value_head.safetensors"  # written by textenv before it used the legacy layout
VALUE_HEAD_PREFIX = "v_head."


@dataclass(frozen=True)
class CheckpointLocation:
    """A local folder or a Hub repository, with the download options ``from_pretrained`` was given.

    Args:
        name_or_path: local folder or Hub repository id.
        subfolder: folder inside it.
        token / revision / cache_dir / local_files_only: as for ``huggingface_hub.hf_hub_download``.
    """

    name_or_path: str
    subfolder: str = ""
    token: str | bool | None = None
    revision: str | None = None
    cache_dir: str | None = None
    local_files_only: bool = False

    @classmethod
    def from_kwargs(cls, name_or_path: str | os.PathLike, kwargs: dict) -> "CheckpointLocation":
        """The location of ``name_or_path`` with the download options found in ``from_pretrained`` kwargs."""
        return cls(
            str(name_or_path),
            subfolder=kwargs.get("subfolder") or "",
            token=kwargs.get("token"),
            revision=kwargs.get("revision"),
            cache_dir=kwargs.get("cache_dir"),
            local_files_only=bool(kwargs.get("local_files_only", False)),
        )

    @property
    def is_local(self) -> bool:
        return Path(self.name_or_path).is_dir()

    def find(self, filename: str) -> str | None:
        """Local path of ``filename`` (downloaded first for a Hub repository), or None if there is none."""
        if self.is_local:
            path = Path(self.name_or_path, self.subfolder, filename)
            return str(path) if path.is_file() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        try:
            return hf_hub_download(
                self.name_or_path,
                filename,
                subfolder=self.subfolder or None,
                revision=self.revision,
                token=self.token,
                cache_dir=self.cache_dir,
                local_files_only=self.local_files_only,
            )
        except (
            EntryNotFoundError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        ):
            return None


def read_value_head_state(location: CheckpointLocation) -> dict[str, torch.Tensor]:
    """The ``v_head.*`` tensors of a checkpoint (keys as stored), or ``{}`` when it has none.

    Looks, in this order, in ``model.safetensors``, ``pytorch_model.bin``, the shards of
    ``model.safetensors.index.json`` or ``pytorch_model.bin.index.json`` (only when there is no single weight
    file), then the old ``value_head.safetensors``.
    """
    found_single_file = False
    for filename in (SAFE_WEIGHTS, BIN_WEIGHTS):
        path = location.find(filename)
        if path is not None:
            found_single_file = True
            state = _read_value_head_tensors(path)
            if state:
                return state
    if not found_single_file:
        for index_name in (SAFE_INDEX, BIN_INDEX):
            index_path = location.find(index_name)
            if index_path is not None:
                state = _read_sharded(location, index_path)
                if state:
                    return state
                break
    path = location.find(OLD_VALUE_HEAD_FILE)
    return _read_value_head_tensors(path) if path is not None else {}


def is_value_head_key(key: str) -> bool:
    """A value-head tensor name: ``v_head.*``, also nested (``pretrained_model.v_head.*``), as legacy matched it."""
    return key.startswith(VALUE_HEAD_PREFIX) or f".{VALUE_HEAD_PREFIX}" in key


def _read_sharded(location: CheckpointLocation, index_path: str) -> dict[str, torch.Tensor]:
    weight_map = json.loads(Path(index_path).read_text())["weight_map"]
    state: dict[str, torch.Tensor] = {}
    for shard in sorted({file for key, file in weight_map.items() if is_value_head_key(key)}):
        path = location.find(shard)
        if path is None:
            raise FileNotFoundError(f"{index_path} lists {shard}, which {location.name_or_path} does not have")
        state.update(_read_value_head_tensors(path))
    return state


def _read_value_head_tensors(path: str) -> dict[str, torch.Tensor]:
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as handle:
            return {key: handle.get_tensor(key) for key in handle.keys() if is_value_head_key(key)}
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # a file in torch's pre-1.6 (non-zip) format cannot be memory-mapped
        state = torch.load(path, map_location="cpu", weights_only=True)
    return {key: value.clone() for key, value in state.items() if is_value_head_key(key)}
