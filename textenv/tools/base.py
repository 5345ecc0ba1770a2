"""What a tool is, how it is named and how it is called.

A tool is anything that turns the model's query string into a response string:

* a plain function or lambda, ``fn(query) -> str``;
* an object with ``__call__(query)``;
* an ``async`` function or an object with an ``async __call__``;
* a smolagents-style ``Tool`` object: a ``name`` attribute and a ``forward(query)`` method.

Responses that are not strings are converted with ``str()``; an exception becomes ``"Tool error: ..."``.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Mapping

from textenv.asyncio_bridge import run_sync

TOOL_ERROR_PREFIX = "Tool error: "


def tool_name(tool: Any) -> str:
    """The name a tool gets when tools are given as a list: its ``name`` attribute for smolagents-style
    tools, else its class name (as in legacy TRL: ``DummyTool()`` is ``"DummyTool"``)."""
    if _is_smolagents_style(tool) and isinstance(getattr(tool, "name", None), str):
        return tool.name
    return type(tool).__name__


def tools_by_name(tools: Mapping[str, Any] | list | tuple | None) -> dict[str, Any]:
    """Normalise the ``tools`` argument to a ``{name: tool}`` dict.

    Raises:
        TypeError: ``tools`` is neither a mapping nor a list/tuple, or an entry is not callable.
        ValueError: two tools in a list share a name.
    """
    if tools is None:
        return {}
    if isinstance(tools, Mapping):
        named = dict(tools)
    elif isinstance(tools, (list, tuple)):
        named = {}
        for tool in tools:
            name = tool_name(tool)
            if name in named:
                raise ValueError(
                    f"tools: two tools are named {name!r}. Pass a dict {{name: tool}} to name them yourself."
                )
            named[name] = tool
    else:
        raise TypeError(f"tools must be a dict {{name: tool}} or a list of tools, got {type(tools).__name__}.")
    for name, tool in named.items():
        if not (callable(tool) or _is_smolagents_style(tool)):
            raise TypeError(f"tools[{name!r}] is a {type(tool).__name__}, which is not callable.")
    return named


def _is_smolagents_style(tool: Any) -> bool:
    return callable(getattr(tool, "forward", None)) and hasattr(tool, "name")


def _callable_of(tool: Any) -> Callable[[str], Any]:
    if _is_smolagents_style(tool) and not _is_plain_callable_object(tool):
        return tool.forward
    return tool


def _is_plain_callable_object(tool: Any) -> bool:
    # smolagents Tools define __call__ that wraps forward with input sanitising; torch modules too.
    # Only prefer __call__ when the object defines it itself rather than inheriting a framework's.
    call = getattr(type(tool), "__call__", None)
    forward = getattr(type(tool), "forward", None)
    return call is not None and forward is not None and "__call__" in type(tool).__dict__


def call_tool(tool: Any, query: str, timeout: float | None = None) -> str:
    """Call ``tool`` on ``query`` and return its response as a string.

    Async tools are awaited (in a private event loop, so this works inside a running loop such as a
    notebook's). Exceptions are returned as ``"Tool error: <message>"``, never raised.

    Args:
        tool: any tool (see the module docstring).
        query: the text the model wrote between the tool tag and ``<call>``.
        timeout: seconds to wait for the response; after that the response is
            ``"Tool error: timed out after N s"``. A thread cannot be killed, so a Python tool that never
            returns keeps its (daemon) thread; tools that run foreign code should run it in a process, as
            `PythonInterpreter` does.
    """
    return _call_with_timeout(lambda: _callable_of(tool)(query), timeout)


def call_tool_with_arguments(tool: Any, arguments: dict[str, Any], timeout: float | None = None) -> str:
    """Call ``tool(**arguments)`` (a JSON tool call) and return its response as a string, as `call_tool`
    does: awaited if async, exceptions and timeouts as ``"Tool error: ..."`` text. A smolagents tool is
    called through its ``__call__``, which checks and converts its inputs."""
    return _call_with_timeout(lambda: tool(**arguments), timeout)


def _call_with_timeout(call: Callable[[], Any], timeout: float | None) -> str:
    if timeout is None:
        return _response_of(call)
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(_response_of(call)), daemon=True)
    worker.start()
    worker.join(timeout)
    if not outcome:
        return f"{TOOL_ERROR_PREFIX}timed out after {timeout:g} s"
    return outcome[0]


def _response_of(call: Callable[[], Any]) -> str:
    try:
        result = call()
        if inspect.isawaitable(result):
            result = run_sync(result)
    except Exception as error:  # noqa: BLE001 - any tool failure becomes text for the model
        return f"{TOOL_ERROR_PREFIX}{error}"
    return result if isinstance(result, str) else _to_text(result)


def _to_text(result: Any) -> str:
    try:
        return str(result)
    except Exception as error:  # noqa: BLE001 - a hostile __str__ must not kill the episode
        return f"{TOOL_ERROR_PREFIX}the tool returned a {type(result).__name__} that cannot be shown: {error}"
