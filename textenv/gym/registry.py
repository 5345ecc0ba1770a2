"""Name -> class registries for envs and context managers, plugin loading and name resolution.

A plugin is a Python file that registers its classes when imported::

    from textenv.gym import Env, envs

    class MyEnv(Env):
        ...

    envs["my_env"] = MyEnv

Load it with ``textenv rollout --external_plugins plugin.py`` or ``load_plugins("plugin.py")``. A dataset
row picks its classes with ``env_config={"name": "my_env", ...}`` and ``ctx_config={"name": ...}``; the
row's name wins over the default given on the command line. `load_object` reads options that name a Python
object (``module:Name`` or ``path/to/file.py:Name``, e.g. ``--environment_factory``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Type, Union

from textenv.environments.kind import SimpleKind
from textenv.gym.builtin import DummyContextManager, SimpleMathEnv, SlidingWindowContextManager, ToolEnv
from textenv.gym.env import ContextManager, Env

DEFAULT_CONTEXT_MANAGER = "dummyContextManager"

envs: Dict[str, Type[Env]] = {
    "math_env": SimpleMathEnv,
    "tool_env": ToolEnv,
}
context_managers: Dict[str, Type[ContextManager]] = {
    DEFAULT_CONTEXT_MANAGER: DummyContextManager,
    "sliding_window": SlidingWindowContextManager,
}

_loaded_plugins: Dict[Path, ModuleType] = {}


def register_env(name: str) -> Callable[[Type[Env]], Type[Env]]:
    """Class decorator: ``@register_env("my_env")`` is ``envs["my_env"] = cls``."""

    def register(cls: Type[Env]) -> Type[Env]:
        envs[name] = cls
        return cls

    return register


def register_context_manager(name: str) -> Callable[[Type[ContextManager]], Type[ContextManager]]:
    """Class decorator: ``@register_context_manager("x")`` is ``context_managers["x"] = cls``."""

    def register(cls: Type[ContextManager]) -> Type[ContextManager]:
        context_managers[name] = cls
        return cls

    return register


def load_plugins(paths: Union[str, Path, Iterable[Union[str, Path]], None]) -> list[ModuleType]:
    """Import plugin files so that they register their classes.

    Args:
        paths: one path or several (a comma-separated string is split). A file already loaded is not
            executed again.

    Returns:
        The plugin modules, in order.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    if paths is None:
        return []
    if isinstance(paths, (str, Path)):
        paths = [p for p in str(paths).split(",") if p.strip()]
    return [_load_plugin(Path(path).expanduser().resolve()) for path in paths]


def _load_plugin(path: Path) -> ModuleType:
    if path in _loaded_plugins:
        return _loaded_plugins[path]
    if not path.is_file():
        raise FileNotFoundError(f"plugin file not found: {path}")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"textenv_plugin_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _loaded_plugins[path] = module
    return module


def load_object(spec: str, option: str) -> Any:
    """The object named by ``module:attribute`` (an importable module) or ``path/to/file.py:attribute``.

    Raises:
        ValueError: `spec` is not of that form, or the module has no such attribute (names `option`).
    """
    source, colon, attribute = spec.strip().rpartition(":")
    if not colon or not source or not attribute:
        raise ValueError(f"{option}: {spec!r} is not of the form module:Name or path/to/file.py:Name.")
    if source.endswith(".py") or "/" in source or "\\" in source:
        module = _load_plugin(Path(source).expanduser().resolve())
    else:
        module = _import_module(source)
    if not hasattr(module, attribute):
        raise ValueError(f"{option}: {source} has no attribute {attribute!r}.")
    return getattr(module, attribute)


def _import_module(name: str) -> Any:
    """Import `name`; if it is not found, once more with the working directory on `sys.path` (the `textenv`
    console script does not put it there, `python -m` does)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name != name.split(".")[0] or os.getcwd() in sys.path:
            raise
    sys.path.append(os.getcwd())
    return importlib.import_module(name)


def resolve_env(env_config: Optional[Mapping[str, Any]], default: Optional[str] = None) -> Type[Env]:
    """The env class for a row: ``env_config["name"]`` if present, else `default`.

    Raises:
        ValueError: the name is missing or not registered (the message lists the registered names).
        TypeError: the registered class is abstract (for example an empty registration stub).
    """
    return _resolve(envs, "Environment", env_config, default)


class RegisteredEnvs(SimpleKind):
    """The registered Gym `Env`s as an environment kind: each row's `env_config` names its class (``name``,
    else `default`), built with that config.

    Args:
        default (`str`, *optional*): the env name for rows whose `env_config` has no `name` (``--gym_env``).
    """

    kind = "gym"

    def __init__(self, default: Optional[str] = None):
        self.default = default

    def env_name(self, row: Mapping[str, Any]) -> Optional[str]:
        return dict(row.get("env_config") or {}).get("name", self.default)

    def adapter(self, row: Mapping[str, Any], index: int) -> Env:
        env_config = dict(row.get("env_config") or {})
        return resolve_env(env_config, self.default)(env_config)


def resolve_context_manager(
    ctx_config: Optional[Mapping[str, Any]], default: Optional[str] = DEFAULT_CONTEXT_MANAGER
) -> Type[ContextManager]:
    """The context manager class for a row: ``ctx_config["name"]``, else `default`, else the dummy one.

    Raises:
        ValueError: the name is not registered (the message lists the registered names).
        TypeError: the registered class is abstract.
    """
    return _resolve(context_managers, "Context manager", ctx_config, default or DEFAULT_CONTEXT_MANAGER)


def _resolve(registry: Mapping[str, type], kind: str, config: Optional[Mapping[str, Any]], default: Optional[str]) -> type:
    name = (config or {}).get("name", default)
    if name is None:
        raise ValueError(
            f"{kind} not chosen: give the row a config with a 'name' key or pass a default "
            f"(--gym_env / --context_manager). Available: {sorted(registry)}"
        )
    if name not in registry:
        raise ValueError(f"{kind} {name!r} not found. Available: {sorted(registry)}")
    cls = registry[name]
    if inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        raise TypeError(f"{kind} {name!r} ({cls.__name__}) is abstract: implement {missing}.")
    return cls
