"""Optional dependencies: importing one that is missing says which `textenv[...]` extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {
    "matplotlib": "demo",
    "gguf": "demo",
    "bm25s": "search",
    "Stemmer": "search",
    "tensorboard": "tensorboard",
    "wandb": "trackers",
    "trackio": "trackers",
    "deepspeed": "deepspeed",
    "smolagents": "smolagents",
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require(module: str, purpose: str) -> ModuleType:
    """Import `module`, or raise `MissingExtraError` saying that `purpose` needs it and which
    ``pip install 'textenv[extra]'`` installs it.

    Args:
        module (`str`): the module to import (``"matplotlib.pyplot"`` needs the ``matplotlib`` extra).
        purpose (`str`): what needs it, for the message (``"the demo's reward curve"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        extra = EXTRAS.get(top)
        fix = f"pip install 'textenv[{extra}]'" if extra else f"pip install {top}"
        raise MissingExtraError(f"{purpose} needs the `{top}` package, which is not installed: {fix}") from error
