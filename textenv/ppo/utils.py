"""The helpers legacy TRL kept in ``trl.core`` next to the PPO math: statistics dictionaries, seeding, response
sampling for tests, and length sampling. Re-exported from `textenv.ppo.core` and `textenv.core`."""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

WANDB_PADDING = -1


def flatten_dict(nested: dict, sep: str = "/") -> dict:
    """Flatten nested dictionaries into one level, joining keys with ``sep`` (``{"a": {"b": 1}}`` -> ``{"a/b": 1}``).

    Raises:
        ValueError: a key contains ``sep``.
    """
    flat: dict = {}

    def _walk(prefix: str, inner: Mapping) -> None:
        for key, value in inner.items():
            if sep in key:
                raise ValueError(f"separator '{sep}' not allowed to be in key '{key}'")
            if isinstance(value, Mapping):
                _walk(prefix + key + sep, value)
            else:
                flat[prefix + key] = value

    _walk("", nested)
    return flat


def stack_dicts(stats_dicts: list[dict]) -> dict:
    """Stack each key's tensors (flattened) into `[n, max_len]`, padding with -1."""
    return {
        key: torch.nn.utils.rnn.pad_sequence(
            [torch.flatten(stats[key]) for stats in stats_dicts], batch_first=True, padding_value=WANDB_PADDING
        )
        for key in stats_dicts[0]
    }


def add_suffix(input_dict: dict, suffix: str) -> dict:
    """The same dictionary with ``suffix`` appended to every key."""
    return {key + suffix: value for key, value in input_dict.items()}


def stats_to_np(stats_dict: dict) -> dict:
    """Tensors -> numpy arrays (bf16 upcast to float32); numpy/python scalars -> ``float``."""
    converted = {}
    for key, value in stats_dict.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        converted[key] = float(value) if np.isscalar(value) else value
    return converted


def convert_to_scalar(stats: dict) -> dict:
    """Single-element tensors and arrays (shape `[]` or `[1]`) -> Python scalars, for loggers without arrays."""
    scalars = {}
    for key, value in stats.items():
        if isinstance(value, (torch.Tensor, np.ndarray)) and (
            len(value.shape) == 0 or (len(value.shape) == 1 and value.shape[0] == 1)
        ):
            value = value.item()
        scalars[key] = value
    return scalars


def pad_to_size(tensor: torch.Tensor, size: int, dim: int = 1, padding: int = 50256) -> torch.Tensor:
    """Right-pad the last dimension with ``padding`` until dimension ``dim`` has ``size`` entries."""
    current = tensor.size()[dim]
    if current == size:
        return tensor
    return F.pad(tensor, (0, size - current), "constant", padding)


def top_k_top_p_filtering(
    logits: torch.Tensor,
    top_k: int = 0,
    top_p: float = 1.0,
    filter_value: float = -float("inf"),
    min_tokens_to_keep: int = 1,
) -> torch.Tensor:
    """Set the logits outside the ``top_k`` most likely tokens and outside the nucleus of probability ``top_p``
    to ``filter_value``. `[B, V]` -> `[B, V]`."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    if top_k > 0:
        logits = TopKLogitsWarper(top_k=top_k, filter_value=filter_value, min_tokens_to_keep=min_tokens_to_keep)(None, logits)
    if 0 <= top_p <= 1.0:
        logits = TopPLogitsWarper(top_p=top_p, filter_value=filter_value, min_tokens_to_keep=min_tokens_to_keep)(None, logits)
    return logits


def respond_to_batch(
    model: nn.Module, queries: torch.LongTensor, txt_len: int = 20, top_k: int = 0, top_p: float = 1.0
) -> torch.LongTensor:
    """Sample ``txt_len`` tokens after `[B, T]` ``queries``, one full forward pass per token (no cache).

    Returns:
        `[B, txt_len]` the sampled tokens.
    """
    input_ids = queries
    for _ in range(txt_len):
        next_token_logits = model(input_ids)[0][:, -1, :]  # [B, V]
        next_token_logits = top_k_top_p_filtering(next_token_logits, top_k=top_k, top_p=top_p)
        probs = F.softmax(next_token_logits, dim=-1)
        next_token = torch.multinomial(probs, num_samples=1).squeeze(1)  # [B]
        input_ids = torch.cat([input_ids, next_token.unsqueeze(-1)], dim=-1)
    return input_ids[:, -txt_len:]


def set_seed(seed: int) -> None:
    """Seed ``random``, numpy and torch (every accelerator too) for reproducible runs."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.manual_seed_all(seed)
    else:
        torch.cuda.manual_seed_all(seed)


class LengthSampler:
    """Draws a length uniformly from ``range(min_value, max_value)`` on each call (numpy's global RNG).

    Example: ``PPOTrainer.generate(query, length_sampler=LengthSampler(4, 16))``.
    """

    def __init__(self, min_value: int, max_value: int):
        self.values = list(range(min_value, max_value))

    def __call__(self) -> int:
        return np.random.choice(self.values)
