"""The vLLM backend: rollouts on vLLM servers (or vLLM in this process), behind the same engine entry as
textenv's in-process engine. Names are imported lazily: `textenv.vllm.colocate` and the server launcher
must import in vLLM's own environment, which lacks textenv's dependencies."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC_NAMES = {
    "VLLMEngine": "textenv.vllm.engine",
    "VLLMPath": "textenv.vllm.engine",
    "VLLMServerClient": "textenv.vllm.client",
    "VLLMServerError": "textenv.vllm.client",
    "VLLMServer": "textenv.vllm.server",
    "WeightSync": "textenv.vllm.weights",
    "checkpoint_state_dict": "textenv.vllm.weights",
    "ColocatedVLLM": "textenv.vllm.colocate",
}

__all__ = list(_PUBLIC_NAMES)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_NAMES:
        return getattr(importlib.import_module(_PUBLIC_NAMES[name]), name)
    raise AttributeError(f"module 'textenv.vllm' has no attribute {name!r}")
