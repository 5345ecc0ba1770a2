"""What a tool is, how it is named and how it is called.

A tool is anything that turns the model's query string into a response string:

* a plain function or lambda, ``fn(query) -> str``;
* an object with ``__call__(query)``;
* an ``async`` function or an object with an ``async __call__``;
* a smolagents ``Tool`` (a subclass of ``smolagents.Tool``, including the ``@tool`` decorator's tools and
  smolagents' own tools such as ``PythonInterpreterTool``);
* a smolagents-style duck-typed object (legacy TRL): a ``name`` attribute and a ``forward(query)`` method.

A real smolagents ``Tool`` is always called through ``Tool.__call__``, the way smolagents' own agents call
it: ``tool(**arguments, sanitize_inputs_outputs=True)``. ``__call__`` runs the tool's ``setup()`` on first
use and converts agent types in its inputs and output. For the one-string tag syntax the query becomes the
tool's single input (its only input, or its only one not marked ``"nullable"``; a tool without inputs is
called without arguments); a tool that needs several inputs cannot be called from one string and answers
a ``"Tool error: ..."`` asking for JSON tool calls (``tool_format="json"``). A duck-typed ``name`` +
``forward`` object that is not a smolagents ``Tool`` is called through ``forward``, unless its class
defines ``__call__`` itself. smolagents is never imported here: a tool is recognised by its classes.

Responses that are not strings are converted with ``str()``; an exception becomes ``"Tool error: ..."``.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Mapping

from textenv.asyncio_bridge import run_sync
from textenv.tools.schema import required_inputs

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
    if _is_smolagents_tool(tool):
        return lambda query: _call_smolagents_tool_on_query(tool, query)
    if _is_smolagents_style(tool) and not _is_plain_callable_object(tool):
        return tool.forward
    return tool


def _is_smolagents_tool(tool: Any) -> bool:
    """Whether ``tool`` is an instance of ``smolagents.Tool``, checked without importing smolagents."""
    return any(
        cls.__name__ == "Tool" and (cls.__module__ == "smolagents" or cls.__module__.startswith("smolagents."))
        for cls in type(tool).__mro__
    )


def _call_smolagents_tool_on_query(tool: Any, query: str) -> Any:
    """Call a smolagents ``Tool`` on the one query string of the tag syntax, through ``Tool.__call__``.

    Raises:
        ValueError: the tool needs more than one input, which one string cannot fill.
    """
    inputs = dict(getattr(tool, "inputs", None) or {})
    if not inputs:
        return tool(sanitize_inputs_outputs=True)
    if len(inputs) == 1:
        (input_name,) = inputs
    else:
        required = required_inputs(inputs)
        if len(required) != 1:
            raise ValueError(
                f"the smolagents tool {getattr(tool, 'name', type(tool).__name__)!r} takes several inputs "
                f"({', '.join(inputs)}), which one query string cannot fill. Call it with JSON tool calls "
                '(TextEnvironment(..., tool_format="json")).'
            )
        (input_name,) = required
    return tool(**{input_name: query}, sanitize_inputs_outputs=True)


def _is_plain_callable_object(tool: Any) -> bool:
    # A duck-typed name + forward object (real smolagents Tools are handled before this) may inherit a
    # framework's __call__ (a torch module's): prefer __call__ only when its own class defines it.
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
    does: awaited if async, exceptions and timeouts as ``"Tool error: ..."`` text. A smolagents ``Tool`` is
    called as smolagents' agents call it, ``tool(**arguments, sanitize_inputs_outputs=True)``: its
    ``__call__`` runs ``setup()`` on first use and converts agent types in its inputs and output."""
    if _is_smolagents_tool(tool):
        return _call_with_timeout(lambda: tool(**arguments, sanitize_inputs_outputs=True), timeout)
    return _call_with_timeout(lambda: tool(**arguments), timeout)


def truncate_response(response: str, max_response: int | None) -> str:
    """`response` cut to `max_response` characters, the last three of them `"..."` (`None`: no limit)."""
    if max_response is not None and len(response) > max_response:
        return response[: max_response - 3] + "..."
    return response


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
    # exactly str: a str subclass (smolagents' AgentText) becomes plain text
    return result if type(result) is str else _to_text(result)


def _to_text(result: Any) -> str:
    try:
        return str(result)
    except Exception as error:  # noqa: BLE001 - a hostile __str__ must not kill the episode
        return f"{TOOL_ERROR_PREFIX}the tool returned a {type(result).__name__} that cannot be shown: {error}"
