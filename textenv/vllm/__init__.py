"""The vLLM backend: rollouts on vLLM servers (or vLLM in this process), behind the same engine entry as
textenv's in-process engine. Names are imported lazily: `textenv.vllm.colocate` and the server launcher
must import in vLLM's own environment, which lacks textenv's dependencies."""

from __future__ import annotations

from textenv import lazy_exports

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

__getattr__ = lazy_exports("textenv.vllm", _PUBLIC_NAMES, globals())
