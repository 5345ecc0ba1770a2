"""Whether the engine's own decoding loop can serve a model, decided by asking the model.

The loop feeds a model a KV cache of its own (`kv_cache.growing_cache`), `position_ids` and
``logits_to_keep=1``. transformers has renamed the cache argument before (`past_key_values`, `cache` since
5.24) and may again, so the decision is not taken from a parameter's name: a probe runs two tiny forwards
(two tokens, then one more on top of them) through each candidate argument and keeps the first one whose
cache then holds all three tokens. transformers' own cache API tells whether that cache is a plain per-layer
KV cache (no sliding window, no recurrent state). A model that fails is served by `generate`, and
`DecodingPath.reason` says why. The probe runs once per model, when an engine first needs the answer, in the
engine's precision; its forwards are real ones (a forward hook sees them), on three tokens.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
import warnings
import weakref
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from textenv.engine.kv_cache import growing_cache

logger = logging.getLogger(__name__)

# Every name transformers has given the decoder's cache argument, newest first.
CACHE_ARGUMENTS = ("cache", "past_key_values")
LOOP = "textenv decoding loop"
GENERATE = "transformers generate"
FALLBACK_COST = (
    "every turn then goes through `generate` in static batches and recomputes its whole context (no KV reuse "
    "across turns, no continuous batching): 1.5-3x slower multi-turn rollouts in textenv's benchmarks"
)
GPU_COST = (
    "on an NVIDIA H200 the engine's loop measured 0.66-0.77x the speed of a plain per-turn `generate` loop (its "
    "per-step Python work is not hidden behind the GPU's kernels; docs/guides/gpu.md). For rollouts on a GPU use "
    "transformers' continuous batching, engine=\"transformers\" (`--engine transformers`, nothing more to install), or "
    "vLLM, engine=\"vllm\"; `make gpu-check` measures them"
)


@dataclass(frozen=True)
class DecodingPath:
    """How a model's turns are decoded.

    Attributes:
        fast (`bool`): `True` when the engine's own loop serves the model, `False` for `generate`.
        cache_argument (`str`, *optional*): the forward argument that takes the KV cache (fast path only).
        reason (`str`): why the model cannot use the loop (empty on the fast path).
    """

    fast: bool
    cache_argument: str | None = None
    reason: str = ""

    def __str__(self) -> str:
        return LOOP if self.fast else f"{GENERATE} ({self.reason})"


_probed: "weakref.WeakKeyDictionary[torch.nn.Module, DecodingPath]" = weakref.WeakKeyDictionary()
_probing = threading.Lock()


def decoding_path(model) -> DecodingPath:
    """The `DecodingPath` of `model` (an unwrapped causal LM), probed on first use and remembered; a model
    the loop cannot serve is reported once, with the reason and the cost, as a logged warning."""
    if not isinstance(model, torch.nn.Module):
        return DecodingPath(fast=False, reason=f"{type(model).__name__} is not a torch module")
    with _probing:
        if model not in _probed:
            _probed[model] = path = _probe(model)
            if not path.fast:
                logger.warning("%s is served by %s, not by %s: %s. Cost: %s.", type(model).__name__, GENERATE, LOOP, path.reason, FALLBACK_COST)
            elif model_device(model).type == "cuda":
                logger.warning("%s decodes on %s with the in-process engine: %s.", type(model).__name__, LOOP, GPU_COST)
        return _probed[model]


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without parameters)."""
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _probe(model: torch.nn.Module) -> DecodingPath:
    config = getattr(model, "config", None)
    if config is None:
        return _generate(f"{type(model).__name__} has no transformers config")
    if getattr(config, "is_encoder_decoder", False):
        return _generate(f"{type(model).__name__} is an encoder-decoder model; the loop decodes decoder-only models")
    try:
        layers = DynamicCache(config=config).layers
    except Exception as error:  # noqa: BLE001 - an unusual config: generate handles it
        return _generate(f"transformers builds no DynamicCache for its config ({type(error).__name__}: {error})")
    other_layers = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    if not layers or other_layers:
        kinds = ", ".join(other_layers) or "no"
        return _generate(f"its cache has {kinds} layers (sliding window or recurrent state); the loop keeps a plain KV cache")
    failures = []
    for name in _candidate_arguments(model):
        failure = _probe_forward(model, name)
        if failure is None:
            return DecodingPath(fast=True, cache_argument=name)
        failures.append(f"`{name}`: {failure}")
    return _generate(f"{type(model).__name__}.forward kept no KV cache passed as " + "; as ".join(failures))


def _generate(reason: str) -> DecodingPath:
    return DecodingPath(fast=False, reason=reason)


def _candidate_arguments(model: torch.nn.Module) -> list[str]:
    """`CACHE_ARGUMENTS`, those the forward's signature names first (a deprecated name still works, with a
    notice on every call)."""
    parameters = inspect.signature(model.forward).parameters
    return sorted(CACHE_ARGUMENTS, key=lambda name: name not in parameters)


def _probe_forward(model: torch.nn.Module, cache_argument: str) -> str | None:
    """Feed two tokens, then a third, the way the loop does; `None` if the cache then holds all three and
    only the last position's logits came back, else what went wrong."""
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return "the model has no parameters"
    cache = growing_cache(model.config, spare=1)
    feeds = [(torch.zeros((1, 2), dtype=torch.long), torch.tensor([[0, 1]])), (torch.zeros((1, 1), dtype=torch.long), torch.tensor([[2]]))]
    try:
        with torch.inference_mode(), _random_state_kept(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for input_ids, position_ids in feeds:
                seen = int(position_ids[0, -1]) + 1
                output = model(
                    input_ids=input_ids.to(device),
                    attention_mask=torch.ones((1, seen), dtype=torch.long, device=device),
                    position_ids=position_ids.to(device),
                    use_cache=True,
                    logits_to_keep=1,
                    **{cache_argument: cache},
                )
    except Exception as error:  # noqa: BLE001 - the reason is reported
        return f"{type(error).__name__}: {error}"
    if cache.get_seq_length() != 3:
        return f"the cache held {cache.get_seq_length()} of the 3 tokens fed"
    if output.logits.shape[1] != 1:
        return "`logits_to_keep=1` was not honoured"
    return None


def _random_state_kept(device: torch.device):
    """The probe must not move the random generators (a model in train mode may run dropout)."""
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device])
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return contextlib.nullcontext()


def cache_keyword(model) -> str:
    """The keyword under which `model.forward` (or, for a PEFT model, its base model's) takes a KV cache
    handed in by a caller: the first of `CACHE_ARGUMENTS` its signature names, else ``past_key_values``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    parameters = inspect.signature(base.forward).parameters
    return next((name for name in CACHE_ARGUMENTS if name in parameters), "past_key_values")


def returned_cache(output):
    """The KV cache a transformers model output holds, under either name (`None` when it has none)."""
    return output.get("cache", output.get("past_key_values"))
