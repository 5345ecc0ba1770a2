"""The engine entry: the backends of the engine interface (`textenv.engine.interface.Engine`), chosen by name.
Both front ends build their engine here.

- `"textenv"` (the default): textenv's in-process `GenerationEngine`;
- `"transformers"`: `TransformersEngine`, transformers' continuous batching (paged attention);
- `"vllm"`: `VLLMEngine`, on vLLM servers or colocated;
- `"auto"`: by device and measurement (`auto_engine`): textenv's engine on a CPU, where it measured 2-4x faster
  than transformers' continuous batching on the Gym shape; transformers' on a GPU, where textenv's loop measured
  slower than a plain `generate` loop. The choice and its reason are logged.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from textenv.engine.interface import DEFAULT_GENERATION_BATCH_SIZE  # noqa: F401 - re-exported: the front ends' default

logger = logging.getLogger(__name__)

IN_PROCESS = "textenv"
TRANSFORMERS = "transformers"
VLLM = "vllm"
AUTO = "auto"
ENGINES = (IN_PROCESS, TRANSFORMERS, VLLM, AUTO)
VLLM_MODES = ("server", "colocate")
# `vllm_kwargs` keys and where they go.
CLIENT_KWARGS = ("request_timeout", "max_retries", "retry_pause")
ENGINE_KWARGS = ("sync_weights", "weights_dir", "check_model")


def build_engine(
    engine: Any,
    model,
    tokenizer,
    *,
    batch_size: int,
    mixed_precision: str | None = None,
    vllm_server_url: str | Sequence[str] | None = None,
    vllm_mode: str = "server",
    vllm_kwargs: dict | None = None,
    generation_kwargs: dict | None = None,
):
    """The engine for a front end.

    Args:
        engine (`str` or engine): `"textenv"` (the in-process engine), `"transformers"` (transformers'
            continuous batching), `"vllm"`, `"auto"` (see `auto_engine`), or an engine object to use as it is
            (a `GenerationEngine`, `TransformersEngine` or `VLLMEngine` built by the caller).
        generation_kwargs (`dict`, *optional*): the front end's generation settings, checked by the transformers
            backend before any episode (a setting it cannot keep is refused with the option that fixes it).
        vllm_server_url (`str` or `list[str]`): with `engine="vllm"` in server mode, the servers (several: an
            episode stays on the server it started on). Also a comma-separated string.
        vllm_mode (`str`): `"server"` (HTTP to running servers) or `"colocate"` (vLLM in this process).
        vllm_kwargs (`dict`, *optional*): `request_timeout`, `max_retries`, `retry_pause` (per server),
            `sync_weights`, `weights_dir`, `check_model` (see `VLLMEngine`), and for colocated mode `model`
            (the folder vLLM loads; default: the policy's `name_or_path`) and `llm_kwargs`.
    """
    if not isinstance(engine, str):
        return engine
    if engine == AUTO:
        engine = auto_engine(model, vllm_server_url)
    if engine == TRANSFORMERS:
        from textenv.engine.transformers_cb import TransformersEngine

        if vllm_server_url is not None:
            raise ValueError("vllm_server_url is given but engine='transformers': pass engine='vllm'.")
        if mixed_precision not in (None, "no"):
            raise ValueError("engine='transformers' decodes in the model's own dtype, not under autocast: load the model in the dtype to decode "
                             "in (torch_dtype=torch.bfloat16), or pass engine='textenv' for mixed_precision.")
        return TransformersEngine(model, tokenizer, generation_kwargs, batch_size=batch_size)
    if engine == IN_PROCESS:
        from textenv.engine.engine import GenerationEngine

        if vllm_server_url is not None:
            raise ValueError("vllm_server_url is given but engine='textenv' (the in-process engine): pass engine='vllm'.")
        return GenerationEngine(model, tokenizer, batch_size=batch_size, mixed_precision=mixed_precision)
    if engine != VLLM:
        raise ValueError(f"engine must be one of {ENGINES} or an engine object, got {engine!r}.")
    if mixed_precision not in (None, "no"):
        raise ValueError("mixed_precision sets the in-process engine's autocast; a vLLM server decodes in its own --dtype (textenv serve --dtype bfloat16).")
    from textenv.vllm.engine import VLLMEngine

    vllm_kwargs = dict(vllm_kwargs or {})
    clients = vllm_clients(model, vllm_server_url, vllm_mode, vllm_kwargs)
    unknown = set(vllm_kwargs) - set(CLIENT_KWARGS) - set(ENGINE_KWARGS) - {"model", "llm_kwargs"}
    if unknown:
        raise ValueError(f"Unknown vllm_kwargs {sorted(unknown)}; known: {sorted(CLIENT_KWARGS + ENGINE_KWARGS + ('model', 'llm_kwargs'))}.")
    engine_kwargs = {key: vllm_kwargs[key] for key in ENGINE_KWARGS if key in vllm_kwargs}
    return VLLMEngine(model, tokenizer, clients, batch_size=batch_size, **engine_kwargs)


def auto_engine(model, vllm_server_url: str | Sequence[str] | None = None) -> str:
    """The backend `engine="auto"` picks, logged with its reason: `"vllm"` when servers are given; else by the
    model's device: textenv's engine on a CPU (it measured 2-4x faster than transformers' continuous batching on
    the Gym shape, benchmarks/README.md), transformers' continuous batching on a GPU (textenv's loop measured
    0.66-0.77x a per-turn `generate` loop on an H200; `make gpu-check` measures both)."""
    from textenv.engine.unwrapping import model_device

    if vllm_server_url is not None:
        choice, reason = VLLM, "vllm_server_url is given"
    elif model_device(model).type == "cuda":
        choice, reason = TRANSFORMERS, "the model is on a GPU, where textenv's loop measured slower than a plain generate loop"
    else:
        choice, reason = IN_PROCESS, f"the model is on {model_device(model).type}, where textenv's engine measured fastest"
    logger.warning("engine='auto' chose %r: %s.", choice, reason)
    return choice


def vllm_clients(model, urls: str | Sequence[str] | None, mode: str, vllm_kwargs: dict) -> list:
    """The servers' clients (server mode) or one colocated vLLM (colocate mode)."""
    if mode not in VLLM_MODES:
        raise ValueError(f"vllm_mode must be one of {VLLM_MODES}, got {mode!r}.")
    if mode == "colocate":
        from textenv.engine.unwrapping import unwrap_model
        from textenv.vllm.colocate import ColocatedVLLM

        folder = vllm_kwargs.get("model") or getattr(getattr(unwrap_model(model), "config", None), "name_or_path", None)
        if not folder:
            raise ValueError("vllm_mode='colocate' needs the model folder for vLLM: pass vllm_kwargs={'model': PATH}.")
        return [ColocatedVLLM(folder, **vllm_kwargs.get("llm_kwargs", {}))]
    from textenv.vllm.client import VLLMServerClient

    if urls is None:
        raise ValueError("engine='vllm' in server mode needs vllm_server_url='http://HOST:PORT' (start one with `textenv serve`).")
    urls = [url.strip() for url in urls.split(",")] if isinstance(urls, str) else list(urls)
    client_kwargs = {key: vllm_kwargs[key] for key in CLIENT_KWARGS if key in vllm_kwargs}
    return [VLLMServerClient(url, **client_kwargs) for url in urls if url]
