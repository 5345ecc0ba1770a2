"""textenv: teach language models to use tools with reinforcement learning.

Public names are imported lazily, so `import textenv` stays fast and pulls in torch/transformers only
when a name that needs them is used.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

__version__ = "0.1.0"

_PUBLIC_NAMES = {
    # environment
    "TextEnvironment": "textenv.environment",
    "TextHistory": "textenv.environment",
    "parse_tool_call": "textenv.environment",
    # generation engine
    "GenerationEngine": "textenv.engine",
    "RolloutEngine": "textenv.engine",
    # tools
    "Calculator": "textenv.tools",
    "PythonInterpreter": "textenv.tools",
    "WikiSearch": "textenv.tools",
    "load_tool": "textenv.tools",
    "save_tool": "textenv.tools",
    # PPO
    "PPOConfig": "textenv.ppo",
    "PPOTrainer": "textenv.ppo",
    "AutoModelForCausalLMWithValueHead": "textenv.ppo",
    "AutoModelForSeq2SeqLMWithValueHead": "textenv.ppo",
    "PreTrainedModelWrapper": "textenv.ppo",
    "create_reference_model": "textenv.ppo",
    "set_seed": "textenv.ppo",
    "LengthSampler": "textenv.ppo",
    "AdaptiveKLController": "textenv.ppo",
    "FixedKLController": "textenv.ppo",
    # GRPO
    "GRPOConfig": "textenv.grpo",
    "GRPOTrainer": "textenv.grpo",
    # Gym
    "Env": "textenv.gym",
    "ContextManager": "textenv.gym",
    "GymScheduler": "textenv.gym",
    # models
    "load_model": "textenv.models",
    "load_bundled_model": "textenv.models",
    "load_tokenizer": "textenv.models",
}

__all__ = sorted(_PUBLIC_NAMES)


def lazy_exports(module: str, names: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module's `__getattr__` that imports each public name of `names` (name -> module) at its first use and
    keeps it in `namespace` (the module's globals)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        namespace[name] = value
        return value

    return __getattr__


__getattr__ = lazy_exports("textenv", _PUBLIC_NAMES, globals())


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
