"""Weights follow training: the trainer's policy, sent to vLLM after each step and loaded there in place.

`checkpoint_state_dict(model)` gives the policy's weights under the names of the model's own checkpoint
(`model.layers.0.self_attn.q_proj.weight`, ...): accelerate/DDP wrappers, the value-head wrapper and PEFT
are looked through, LoRA adapters are merged into new tensors (the trainer's weights are never touched),
the value head is left out. `WeightSync` hands them to a colocated vLLM in memory (`ColocatedVLLM.load_weights`:
one shared-memory block, no file), and for servers writes them to a folder (under `/dev/shm` when it exists) and
asks each server to reload from it; then every engine drops its prefix cache (KV computed with the old weights).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
import weakref
from typing import Any, Sequence

import torch

from textenv.engine.unwrapping import unwrap_model

logger = logging.getLogger(__name__)

# The worker method `textenv serve` adds (textenv/vllm/worker/textenv_vllm_worker.py), and vLLM's own.
TEXTENV_RELOAD = "textenv_reload_weights"
VLLM_RELOAD = "reload_weights"


def checkpoint_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The weights of the causal LM inside `model`, named as in its checkpoint, LoRA merged, on CPU.

    Args:
        model: a causal LM, a value-head wrapper around one, a PEFT model, or any of them wrapped by accelerate.

    Returns:
        `{checkpoint name: contiguous CPU tensor}`; a tied output layer is left out (it is the embeddings).
    """
    model = unwrap_model(model)
    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    merged = _merged_lora_weights(base)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name or ".original_module." in name:  # adapters are merged; a saved module's copy wins
            continue
        clean = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name.replace(".base_layer.", "."))
        state[clean] = merged.get(clean, tensor).detach().to("cpu").contiguous()
    if _ties_output_layer(base):
        state.pop("lm_head.weight", None)
    return state


def _merged_lora_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`{checkpoint name of a LoRA layer's weight: base weight + its active adapters' deltas}` (new tensors)."""
    merged = {}
    for name, module in model.named_modules():
        base_layer = getattr(module, "base_layer", None)
        if base_layer is None or not hasattr(module, "get_delta_weight") or getattr(module, "merged", False):
            continue
        adapters = [a for a in _active_adapters(module) if a in getattr(module, "lora_A", {})]
        if getattr(module, "disable_adapters", False) or not adapters:
            continue
        weight = base_layer.weight.detach().clone()
        with torch.no_grad():
            for adapter in adapters:
                weight += module.get_delta_weight(adapter).to(weight.dtype)
        merged[f"{name}.weight".replace(".base_layer.", ".")] = weight
    return merged


def _active_adapters(module) -> list[str]:
    active = getattr(module, "active_adapters", None) or getattr(module, "active_adapter", [])
    return [active] if isinstance(active, str) else list(active)


def _ties_output_layer(model) -> bool:
    head, embeddings = getattr(model, "get_output_embeddings", lambda: None)(), getattr(model, "get_input_embeddings", lambda: None)()
    return head is not None and embeddings is not None and head.weight is embeddings.weight


class WeightSync:
    """Sends a policy's weights to vLLM engines: in memory to those with a `load_weights` method (a colocated
    vLLM), through a checkpoint file to servers.

    Args:
        clients: the servers' `VLLMServerClient`s, or `ColocatedVLLM`s.
        weights_dir (`str`, *optional*): the folder the checkpoint is written to; every server must be able to
            read it. Default: a new folder under `/dev/shm` (else the temp folder), for servers on this machine,
            removed with this object; none is made when every engine loads in memory. The checkpoint is deleted
            once every server has reloaded it.

    Attributes:
        sync_seconds (`list[float]`): how long each sync took (export, write, reload on every server).
    """

    def __init__(self, clients: Sequence, weights_dir: str | None = None):
        self.clients = list(clients)
        self.in_memory = [client for client in self.clients if hasattr(client, "load_weights")]
        self.servers = [client for client in self.clients if not hasattr(client, "load_weights")]
        self.sync_seconds: list[float] = []
        self._methods: dict[str, str] = {}
        self.weights_dir, self._cleanup = None, None
        if not self.servers:
            return
        remote = [client.url for client in self.servers if not client.is_local]
        if remote and weights_dir is None:
            raise ValueError(
                f"vLLM servers on other machines ({', '.join(remote)}) cannot read weights this process writes to a "
                "local folder: pass vllm_kwargs={'weights_dir': <a folder every server can read>}, or {'sync_weights': False}."
            )
        self._own_dir = weights_dir is None
        root = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.weights_dir = weights_dir or tempfile.mkdtemp(prefix="textenv-weights-", dir=root)
        os.makedirs(self.weights_dir, exist_ok=True)
        # The folder this sync made goes with it (or at exit), also when `close` is never called.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.weights_dir, True) if self._own_dir else None

    def sync(self, model: Any) -> float:
        """Send `model`'s weights to every engine; returns the seconds it took."""
        started = time.perf_counter()
        state = checkpoint_state_dict(model)
        for client in self.in_memory:
            client.load_weights(state)
            client.reset_prefix_cache()
        if self.servers:
            self._sync_servers(state)
        seconds = time.perf_counter() - started
        self.sync_seconds.append(seconds)
        logger.info("Weights synced to %d vLLM server(s) in %.2f s (%d tensors).", len(self.clients), seconds, len(state))
        return seconds

    def _sync_servers(self, state: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        partial, checkpoint = (os.path.join(self.weights_dir, name) for name in ("model.safetensors.partial", "model.safetensors"))
        save_file(state, partial, metadata={"format": "pt"})
        os.replace(partial, checkpoint)
        try:
            for client in self.servers:
                self._reload(client)
                client.reset_prefix_cache()
        finally:  # the servers hold the weights now; a copy left in /dev/shm would take the model's size in memory
            os.remove(checkpoint)

    def _reload(self, client) -> None:
        from textenv.vllm.client import VLLMServerError

        method = self._methods.get(client.url, TEXTENV_RELOAD)
        try:
            client.collective_rpc(method, {"weights_path": self.weights_dir})
        except VLLMServerError as error:
            if method != TEXTENV_RELOAD or "textenv_reload_weights" not in str(error) and "has no attribute" not in str(error):
                raise
            logger.warning(
                "The vLLM server at %s was not started by `textenv serve` (it has no %s): its weights are reloaded "
                "with vLLM's %s instead. Cost: on vLLM 0.32 a model whose output layer is tied to its embeddings "
                "keeps its old output layer after that reload; start the server with `textenv serve`.",
                client.url, TEXTENV_RELOAD, VLLM_RELOAD,
            )
            self._methods[client.url] = VLLM_RELOAD
            client.collective_rpc(VLLM_RELOAD, {"weights_path": self.weights_dir})

    def close(self) -> None:
        """Remove the folder this sync made (a folder given as `weights_dir` is left)."""
        if self._cleanup is not None:
            self._cleanup()
