"""The engine's mixed precision: accelerate's setting names as autocast dtypes, and the autocast context of a
decoding loop (with a warning, once, on a CPU that emulates bf16)."""

from __future__ import annotations

import torch

from textenv.hardware import warn_if_bf16_emulated

MIXED_PRECISION_DTYPES = {None: None, "no": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_dtype(mixed_precision: str | None) -> torch.dtype | None:
    """The autocast dtype of a ``mixed_precision`` setting (accelerate's names), ``ValueError`` for others."""
    if mixed_precision not in MIXED_PRECISION_DTYPES:
        raise ValueError(f"mixed_precision must be None, 'no', 'bf16' or 'fp16', got {mixed_precision!r}.")
    return MIXED_PRECISION_DTYPES[mixed_precision]


def decoding_autocast(model: torch.nn.Module, dtype: torch.dtype | None) -> torch.autocast:
    """``torch.autocast`` in ``dtype`` on ``model``'s device (disabled for ``None``)."""
    device_type = next(model.parameters()).device.type
    if device_type == "cpu" and dtype == torch.bfloat16:
        warn_if_bf16_emulated("bf16 autocast decoding (mixed_precision='bf16')")
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)
