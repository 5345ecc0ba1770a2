"""textenv: teach language models to use tools with reinforcement learning.

Public names are imported lazily (`_PUBLIC_NAMES`, through `lazy_exports`), so `import textenv` stays fast and
pulls in torch/transformers only when a name that needs them is used. Main names: `TextEnvironment`,
`TextHistory`, `GenerationEngine`, `Calculator`, `PythonInterpreter`, `WikiSearch`, `load_tool`, `PPOConfig`,
`PPOTrainer`, `AutoModelForCausalLMWithValueHead`, `GRPOConfig`, `GRPOTrainer`, `Env`, `ContextManager`,
`GymScheduler`, `load_model`, `load_bundled_model`, `load_tokenizer` (`__all__` lists them all).

Packages: `environment` (the legacy front end and `TextHistory`), `gym` (the Gym front end, TRL and verifiers
environments), `episodes` (the one episode driver), `engine` (the engine entry and the in-process engine),
`vllm` (the vLLM backend), `chat` (chat templates with exact tokens), `tools`, `ppo`, `grpo`, `training` (the
one training loop, `textenv train`), `view` (`textenv view`), `tasks` (ready-made tasks).

Top-level modules, one concern each:

- `cli`: the `textenv` command and its `SUBCOMMANDS` table; `demo`: `textenv demo`;
- `options`: the options the commands share (`EpisodeArguments`, `GymArguments`, ...) and `parse_options`;
- `models`: `load_model`, `load_bundled_model`, `load_tokenizer`; `testing`: `tiny_causal_lm` for tests;
- `core`: the legacy `trl.core` import path; `transformers_compat`: fixes for supported transformers releases;
- `off_policy`: the off-policy correction shared by PPO and GRPO;
- `padding`, `jsonl`, `logs`, `hardware`, `extras`, `checks`, `asyncio_bridge`, `reporting`: small helpers.

May import: textenv.engine, textenv.environment, textenv.grpo, textenv.gym, textenv.models, textenv.ppo, textenv.tools (lazily, by name)
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
