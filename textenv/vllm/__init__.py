"""The vLLM backend: rollouts on vLLM servers (or vLLM in this process), behind the same engine entry as
textenv's in-process engine. Names are imported lazily: `textenv.vllm.colocate` and the server launcher
must import in vLLM's own environment, which lacks textenv's dependencies.

- `engine`: `VLLMEngine`, the engine entry on vLLM (the same ``generate`` and `Completion` as
  `GenerationEngine`), `VLLMPath`;
- `client`: `VLLMServerClient`, token ids in and out of one server, `VLLMServerError`;
- `colocate`: `ColocatedVLLM`, vLLM in the training process with the client's methods;
- `server`: `VLLMServer` and `textenv serve`; `guard`: stops a server's processes when textenv goes away;
- `weights`: `WeightSync`, `checkpoint_state_dict`: the trainer's weights sent to vLLM after each step;
- `gate`: `ServingGate`, every turn served by one version of the weights while training runs beside;
- `checks`: refuse a server that serves another model or tokenizer;
- `worker/textenv_vllm_worker.py`: worker methods loaded into the server (it imports nothing from textenv).

May import: textenv (lazy_exports), textenv.asyncio_bridge, textenv.engine (a cycle), textenv.hardware, textenv.logs, textenv.models, textenv.padding, textenv.parsing (textenv serve's one-line errors)
"""

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
