"""Fixes for transformers releases inside textenv's supported range, applied once when imported.

transformers 5.16-5.20 register alias modules (``transformers.image_processing_utils_fast``,
``transformers.models.<model>.image_processing_<model>_fast`` for every image processor, ...) whose ``__getattr__`` imports the target module for any name asked, dunder names
included. ``unittest``'s ``assertWarns`` reads ``__warningregistry__`` from every module in ``sys.modules``, so
the first alias whose target needs torchvision raised ``ModuleNotFoundError`` inside ``assertWarns`` (two of
legacy TRL's PPO tests). Here a dunder name an alias does not hold raises ``AttributeError``, as a plain module
would; every other name is forwarded as before. Releases without such aliases (5.21 and newer) are untouched.

On those releases ``transformers.processing_utils`` runs transformers' ``__init__`` a second time when first
imported (``direct_transformers_import``), which makes the aliases anew: it is imported here first (0.25 s).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import transformers  # noqa: F401  (creates the aliases this module fixes)

_ALIAS_PREFIX = "transformers."


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _dunder_safe(forward: Callable[[str], Any]) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if _is_dunder(name):
            raise AttributeError(name)
        return forward(name)

    __getattr__.textenv_dunder_safe = True
    return __getattr__


def make_alias_modules_dunder_safe() -> int:
    """Wraps the ``__getattr__`` of every loaded ``transformers.*_fast`` alias module (a module with no file) so that
    dunder names it does not hold raise ``AttributeError``; returns how many were wrapped (0 on releases without
    them, and on a second call)."""
    wrapped = 0
    for name, module in list(sys.modules.items()):
        if not (name.startswith(_ALIAS_PREFIX) and name.endswith("_fast")):
            continue
        forward = module.__dict__.get("__getattr__")
        if module.__dict__.get("__file__") is not None or forward is None or getattr(forward, "textenv_dunder_safe", False):
            continue
        module.__getattr__ = _dunder_safe(forward)
        wrapped += 1
    return wrapped


if make_alias_modules_dunder_safe():
    import transformers.processing_utils  # noqa: E402,F401  (remakes the aliases, once)

    make_alias_modules_dunder_safe()
