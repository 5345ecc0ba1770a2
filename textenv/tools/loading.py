"""Tool repositories: save a tool to a folder and load it back, from a local folder or the Hugging Face Hub.

A tool repository is a folder with a ``tool_config.json``::

    {"tool_class": "textenv.tools.Calculator", "init_kwargs": {"max_length": 256}}

for a built-in tool (no code in the folder), or, for a user's tool, its source file next to the config::

    {"tool_class": "MyTool", "module": "my_tool.py", "init_kwargs": {...}}

``"tool_function"`` replaces ``"tool_class"`` for a plain function tool. ``"file_kwargs"`` lists the
constructor arguments that name files inside the folder (resolved to full paths at load time, and
refused if they lead outside it); a tool class can declare such arguments itself in a
``file_arguments`` class attribute, as :class:`WikiSearch` does for ``documents``. The
legacy transformers layout (``{"tool_class": "tool.SimpleCalculatorTool"}`` next to ``tool.py``) and a
folder holding only ``tool.py`` are read too.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from .calculator import Calculator
from .python_interpreter import PythonInterpreter
from .wiki_search import WikiSearch

CONFIG_NAME = "tool_config.json"
# Hub tools of the legacy TRL examples, answered by the built-in equivalents without any download, so an
# old notebook's `load_tool("ybelkada/simple-calculator")` runs offline after the import swap.
LEGACY_TOOL_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "ybelkada/simple-calculator": ("Calculator", {"legacy_format": True}),
    "lvwerra/python-interpreter": ("PythonInterpreter", {}),
}
LEGACY_MODULE_NAME = "tool.py"
BUILTIN_TOOLS: dict[str, type] = {
    f"textenv.tools.{cls.__name__}": cls for cls in (Calculator, PythonInterpreter, WikiSearch)
}


def save_tool(tool: Any, folder: str | os.PathLike) -> Path:
    """Save ``tool`` as a tool repository in ``folder`` (created if needed) and return the folder.

    For a built-in textenv tool the config names the built-in class and no code is written. For a
    user's class (or top-level function) its source file is copied into the folder; loading it back
    then needs ``trust_remote_code=True``. Constructor arguments are read from the instance attributes
    named like the ``__init__`` parameters (the usual Hugging Face convention) and must be
    JSON-serialisable; a tool with a ``save_files(folder) -> dict`` method writes its own data files
    (as :class:`WikiSearch` does with its documents).

    Raises:
        ValueError: the tool's code is not in an importable file (a notebook or a nested class), or a
            constructor argument cannot be stored as JSON.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = _code_config(tool, folder)
    if not inspect.isfunction(tool):
        config["init_kwargs"], file_kwargs = _init_kwargs(tool, folder)
        if file_kwargs:
            config["file_kwargs"] = file_kwargs
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return folder


def load_tool(
    repo_id_or_path: str | os.PathLike,
    trust_remote_code: bool = False,
    revision: str | None = None,
    **kwargs: Any,
) -> Any:
    """Load a tool from a local folder, or from a Hugging Face Hub repository when the argument is not
    an existing folder (downloaded with ``huggingface_hub.snapshot_download``: model repos first, then
    Spaces, where the legacy TRL tools lived).

    Built-in textenv tools load without trust. A repository whose tool is defined in a Python file runs
    that file, so it requires ``trust_remote_code=True``. Module and data files named by the config must
    stay inside the repository (no ``..``, absolute paths or symlinks pointing out).

    Args:
        repo_id_or_path (`str` or `os.PathLike`): A folder, or a Hub repo id such as ``"user/my-tool"``.
        trust_remote_code (`bool`, *optional*, defaults to `False`): Allow running the repository's code.
        revision (`str`, *optional*): Hub branch, tag or commit.
        kwargs: Constructor arguments, overriding those in the config.

    Raises:
        ValueError: code needs ``trust_remote_code=True``, the config is invalid, or a path escapes
            the repository.
        FileNotFoundError: a local-looking path does not exist.
    """
    if str(repo_id_or_path) in LEGACY_TOOL_ALIASES and not Path(repo_id_or_path).is_dir():
        return _legacy_alias(str(repo_id_or_path), kwargs)
    folder, allowed_roots = _locate(repo_id_or_path, revision)
    config = _read_config(folder)
    tool_factory = _resolve_factory(config, folder, allowed_roots, trust_remote_code, str(repo_id_or_path))
    if "tool_function" in config:
        return tool_factory
    init_kwargs = dict(config.get("init_kwargs") or {})
    file_arguments = set(config.get("file_kwargs") or []) | set(getattr(tool_factory, "file_arguments", ()))
    for name in sorted(file_arguments & set(init_kwargs)):
        # A config must not point a built-in tool at the user's own files (e.g. WikiSearch over ~/.ssh).
        if not isinstance(init_kwargs[name], (list, dict)):
            init_kwargs[name] = str(_inside(folder, init_kwargs[name], allowed_roots, what=f"file argument {name!r}"))
    loosened = _changed_security_arguments(tool_factory, init_kwargs)
    if loosened and not trust_remote_code and not Path(repo_id_or_path).is_dir():
        raise ValueError(
            f"load_tool({str(repo_id_or_path)!r}): the downloaded config sets the sandbox limits {loosened}. "
            "Pass trust_remote_code=True to accept them, or pass your own values as keyword arguments."
        )
    init_kwargs.update(kwargs)
    return tool_factory(**init_kwargs)


def _changed_security_arguments(tool_factory: Any, init_kwargs: dict[str, Any]) -> list[str]:
    """Sandbox-limit arguments that the config sets to something other than the constructor's default."""
    import inspect

    names = getattr(tool_factory, "security_arguments", ())
    if not names:
        return []
    defaults = {name: p.default for name, p in inspect.signature(tool_factory).parameters.items()}
    def changed(name: str) -> bool:
        value, default = init_kwargs[name], defaults.get(name)
        both_empty = value in (None, [], ()) and default in (None, [], ())  # read_paths: None, saved as []
        return value != default and not both_empty

    return sorted(name for name in names if name in init_kwargs and changed(name))


def _legacy_alias(repo_id: str, kwargs: dict[str, Any]) -> Any:
    from textenv import tools

    class_name, alias_kwargs = LEGACY_TOOL_ALIASES[repo_id]
    return getattr(tools, class_name)(**{**alias_kwargs, **kwargs})


# --- saving ---------------------------------------------------------------------------------------


def _code_config(tool: Any, folder: Path) -> dict[str, Any]:
    tool_type = tool if inspect.isfunction(tool) else type(tool)
    builtin_name = f"textenv.tools.{tool_type.__name__}"
    if BUILTIN_TOOLS.get(builtin_name) is tool_type:
        return {"tool_class": builtin_name}
    source_file = _source_file(tool_type)
    shutil.copyfile(source_file, folder / source_file.name)
    key = "tool_function" if inspect.isfunction(tool) else "tool_class"
    return {key: tool_type.__name__, "module": source_file.name}


def _source_file(tool_type: type | Callable) -> Path:
    kind = "function" if inspect.isfunction(tool_type) else "class"
    if "<locals>" in tool_type.__qualname__ or "." in tool_type.__qualname__:
        raise ValueError(f"save_tool: {tool_type.__qualname__} must be a top-level {kind} of a .py file to be saved.")
    try:
        source = inspect.getsourcefile(tool_type)
    except TypeError:
        source = None
    if not source or not source.endswith(".py") or not os.path.isfile(source):
        raise ValueError(
            f"save_tool: the {kind} {tool_type.__name__} is not defined in a .py file (a notebook or an "
            "interactive session?). Move it to a module file and import it from there."
        )
    return Path(source)


def _init_kwargs(tool: Any, folder: Path) -> tuple[dict[str, Any], list[str]]:
    init_kwargs = {}
    for name, parameter in inspect.signature(type(tool).__init__).parameters.items():
        if name == "self" or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if hasattr(tool, name):
            init_kwargs[name] = getattr(tool, name)
    file_kwargs: dict[str, str] = {}
    if callable(getattr(tool, "save_files", None)):
        file_kwargs = tool.save_files(folder)
        init_kwargs.update(file_kwargs)
    for name, value in init_kwargs.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"save_tool: the constructor argument {name}={value!r:.60} of {type(tool).__name__} cannot be "
                "stored as JSON. Give the tool a save_files(folder) method that writes it to a file."
            ) from None
    return init_kwargs, sorted(file_kwargs)


# --- loading --------------------------------------------------------------------------------------


def _locate(repo_id_or_path: str | os.PathLike, revision: str | None) -> tuple[Path, list[Path]]:
    """The local folder of the repository and the roots its files may resolve into."""
    path = Path(repo_id_or_path).expanduser()
    if path.is_dir():
        return path, [path.resolve()]
    text = str(repo_id_or_path)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise FileNotFoundError(f"load_tool: {text!r} is not a folder, nor a Hub repo id like 'user/tool-name'.")
    folder = _download(text, revision)
    roots = [folder.resolve()]
    if folder.parent.name == "snapshots":  # the Hub cache: snapshot files are symlinks into ../../blobs
        roots.append((folder.parent.parent / "blobs").resolve())
    return folder, roots


def _download(repo_id: str, revision: str | None) -> Path:
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        return Path(huggingface_hub.snapshot_download(repo_id, revision=revision))
    except RepositoryNotFoundError:
        return Path(huggingface_hub.snapshot_download(repo_id, revision=revision, repo_type="space"))


def _read_config(folder: Path) -> dict[str, Any]:
    config_path = folder / CONFIG_NAME
    if not config_path.is_file():
        if (folder / LEGACY_MODULE_NAME).is_file():
            return {"module": LEGACY_MODULE_NAME}
        raise ValueError(f"load_tool: {folder} has no {CONFIG_NAME} (nor a {LEGACY_MODULE_NAME}).")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"load_tool: {config_path} is not valid JSON ({error.msg}).") from None
    if not isinstance(config, dict):
        raise ValueError(f"load_tool: {config_path} must hold a JSON object.")
    return config


def _resolve_factory(
    config: dict[str, Any], folder: Path, allowed_roots: list[Path], trust_remote_code: bool, source: str
) -> Callable[..., Any]:
    name = config.get("tool_function") or config.get("tool_class")
    module_file = config.get("module")
    if name in BUILTIN_TOOLS and not module_file:
        return BUILTIN_TOOLS[name]
    if not module_file and isinstance(name, str) and name.count(".") == 1:
        module_stem, name = name.split(".")  # legacy transformers: "tool.SimpleCalculatorTool" + tool.py
        module_file = f"{module_stem}.py"
    if not module_file:
        raise ValueError(
            f"load_tool: {source} names {name!r}, which is not a built-in tool ({', '.join(BUILTIN_TOOLS)}) "
            "and no module file."
        )
    module_path = _inside(folder, module_file, allowed_roots, what="module")
    if not trust_remote_code:
        raise ValueError(
            f"load_tool: the tool in {source} is defined by code in {module_file}, which would run on your "
            "machine. Read that file, and if you trust it, call load_tool(..., trust_remote_code=True)."
        )
    module = _import_file(module_path)
    return _tool_in(module, name, module_file)


def _inside(folder: Path, relative: Any, allowed_roots: list[Path], what: str) -> Path:
    """``folder / relative``, refused unless it is a relative path that resolves inside the repository."""
    if not isinstance(relative, str) or not relative:
        raise ValueError(f"load_tool: the {what} path must be a non-empty string, got {relative!r}.")
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        raise ValueError(f"load_tool: the {what} path {relative!r} points outside the tool repository.")
    resolved = (folder / candidate).resolve()
    if not any(resolved == root or root in resolved.parents for root in allowed_roots):
        raise ValueError(f"load_tool: the {what} path {relative!r} resolves outside the tool repository (a symlink?).")
    if not resolved.is_file():
        raise ValueError(f"load_tool: the {what} file {relative!r} does not exist in the tool repository.")
    return resolved


def _import_file(module_path: Path):
    # Hub blobs have no .py suffix, hence the explicit source loader. The module is registered in
    # sys.modules (under a name unique to its path) so that inspect, pickle and save_tool work on it.
    digest = hashlib.sha256(str(module_path).encode()).hexdigest()[:12]
    name = f"textenv_tool_{digest}"
    loader = importlib.machinery.SourceFileLoader(name, str(module_path))
    spec = importlib.util.spec_from_file_location(name, module_path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _tool_in(module: Any, name: str | None, module_file: str) -> Callable[..., Any]:
    if name:
        found = getattr(module, name, None)
        if found is None:
            raise ValueError(f"load_tool: {module_file} defines no {name!r}.")
        return found
    # A folder with only tool.py: the one tool-like class defined in it.
    candidates = [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and value.__module__ == module.__name__
        and ("forward" in vars(value) or "__call__" in vars(value))
    ]
    if len(candidates) != 1:
        found_names = [candidate.__name__ for candidate in candidates]
        raise ValueError(
            f"load_tool: {module_file} must define exactly one tool class (with forward or __call__), "
            f"found {found_names}. Add a {CONFIG_NAME} naming it."
        )
    return candidates[0]
