"""What an OpenEnv server says, read for `textenv.environments.openenv`: the app of an installed environment package
(``env_id``), the action a reply fills (its schema's text field, or MCP tools as the chat template takes them), the
text the model reads of an observation or a tool result, the opening messages, and a session the server refused at
its cap. Written against what openenv 0.10 and openenv-core 0.3 (the registry's packages) both say; where they
differ, each place says how."""

from __future__ import annotations

import copy
import importlib.util
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from textenv.gym.env import Messages

NOT_TEXT_FIELDS = ("reward", "done", "metadata")  # observation fields that never go to the model
TOOL_ACTION_FIELDS = ("tool_name", "arguments")  # openenv's CallToolAction
HUB_SPACES = "https://huggingface.co/spaces"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
CAPACITY_REACHED = "CAPACITY_REACHED"  # the code of openenv's error for a session the server refuses


def refused_session(error: Exception, max_sessions: int) -> Optional[RuntimeError]:
    """What to report for a session the server refused at its cap, or `None` where `error` is not that. openenv 0.10
    answers with a CAPACITY_REACHED error; openenv-core 0.3 sends it and at once closes the connection normally, which
    its client's reset meets first (websockets' ``ConnectionClosedOK``)."""
    if CAPACITY_REACHED in str(error):
        said = f"{error}. The server holds"
    elif type(error).__name__ == "ConnectionClosedOK":
        said = (f"The server closed the session's connection before its reset ({error}), as openenv-core 0.3 does for a "
                "session over its cap. If the server holds")
    else:
        return None
    return RuntimeError(f"{said} fewer sessions than max_sessions={max_sessions}: pass its app's own cap (its "
                        "max_concurrent_envs) as max_sessions.")


@dataclass
class ServedActions:
    """What a served environment takes as an action, read from its schema once per run.

    Attributes:
        url (`str`): the server's base URL.
        text_field (`str`, *optional*): the action field a reply's text fills (text environments).
        tool_schemas (`list[dict]`, *optional*): the MCP tools, as the chat template takes them (MCP environments).
    """

    url: str
    text_field: Optional[str] = None
    tool_schemas: Optional[List[dict]] = None


def installed_app(env_id: str) -> str:
    """The app of the installed OpenEnv environment `env_id` (openenv's discovery of ``openenv-*`` packages),
    ``<module>.server.app:app``, the layout ``openenv init`` writes.

    Raises:
        ModuleNotFoundError: no installed package provides `env_id`, or it has no ``server.app`` module.
    """
    from openenv.auto._discovery import _normalize_env_name, get_discovery

    name = env_id.rstrip("/").rpartition("/")[2]
    discovery = get_discovery()
    info = discovery.get_environment_by_name(name)
    if info is None:  # installed after openenv's discovery cache was written
        discovery.discover(use_cache=False)
        info = discovery.get_environment_by_name(name)
    if info is None:
        space = env_id.rstrip("/") if "/" in env_id else f"openenv/{_normalize_env_name(name)}"
        installed = sorted(discovery.discover()) or ["none"]
        raise ModuleNotFoundError(
            f"env_id={env_id!r}: no installed OpenEnv environment package provides it (installed: {', '.join(installed)}). Install "
            f"it first: pip install git+{HUB_SPACES}/{space} (an OpenEnv Space is a pip-installable package), or pip install -e "
            f"path/to/{_normalize_env_name(name)} for a local checkout; or pass app='module:attribute' of its FastAPI app.")
    module = info.client_module_path.rpartition(".")[0]
    if importlib.util.find_spec(f"{module}.server.app") is None:
        raise ModuleNotFoundError(f"env_id={env_id!r}: {info.package_name} is installed but has no {module}.server.app module; "
                                  f"pass app='module:attribute' of its FastAPI app.")
    return f"{module}.server.app:app"


async def read_actions(url: str, action_field: Optional[str]) -> ServedActions:
    """What the server at `url` takes: its action schema (``GET /schema``) gives the text field, or, for an MCP
    environment, the tools (listed with openenv's `MCPToolClient`).

    Raises:
        ValueError: see `text_field`; an MCP environment that lists no tools.
    """
    import httpx
    from openenv.core.mcp_client import MCPToolClient

    local = urllib.parse.urlsplit(url).hostname in LOOPBACK_HOSTS
    async with httpx.AsyncClient(timeout=30.0, trust_env=not local) as client:  # no proxy between us and a local server
        response = await client.get(f"{url}/schema")
        response.raise_for_status()
    schema = response.json()["action"]
    if not is_tool_action(schema):
        return ServedActions(url, text_field=text_field(schema, action_field))
    tools_client = MCPToolClient(base_url=url)
    try:
        tools = await tools_client.list_tools()
    finally:
        await tools_client.close()
    if not tools:  # openenv's client answers [] when listing fails
        raise ValueError(f"the OpenEnv server at {url} takes MCP tool calls ({schema.get('title')}) but listed no tools: check that "
                         "its environment's MCP server defines some and that tools/list works on its /mcp endpoint.")
    return ServedActions(url, tool_schemas=[function_schema(tool.name, tool.description, tool.input_schema) for tool in tools])


def is_tool_action(schema: Mapping[str, Any]) -> bool:
    """Whether an action schema is openenv's MCP ``CallToolAction``, or the bare ``Action`` (which takes only MCP actions)."""
    fields = set(schema.get("properties", {})) - {"metadata"}
    return not fields or set(TOOL_ACTION_FIELDS) <= fields


def text_field(schema: Mapping[str, Any], action_field: Optional[str]) -> str:
    """The field of an action schema that a reply's text fills: `action_field`, else the only string field.

    Raises:
        ValueError: `action_field` is not a field; no or several string fields and no `action_field`; other fields
            are required (a reply fills only one).
    """
    properties = {name: spec for name, spec in schema.get("properties", {}).items() if name != "metadata"}
    title = schema.get("title", "the action")
    if action_field is not None and action_field not in properties:
        raise ValueError(f"action_field={action_field!r}: {title} has no such field; its fields are {sorted(properties)}.")
    strings = [name for name, spec in properties.items() if _takes_string(spec)]
    if action_field is None and len(strings) != 1:
        raise ValueError(f"action_field: {title} has {len(strings)} text fields ({strings}) among {sorted(properties)}; pass "
                         "action_field='NAME', the field the model's reply fills.")
    field = action_field or strings[0]
    others = sorted(set(schema.get("required", ())) - {field})
    if others:
        raise ValueError(f"{title} requires {others} besides {field!r}, and a reply fills one field: textenv can drive actions "
                         "with one required field (a text environment) or MCP tool calls.")
    return field


def _takes_string(spec: Mapping[str, Any]) -> bool:
    return spec.get("type") == "string" or any(option.get("type") == "string" for option in spec.get("anyOf", ()))


def function_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict:
    """An MCP tool as the chat template's ``tools=`` takes it (the OpenAI function form)."""
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": dict(parameters) or {"type": "object", "properties": {}}}}


def observation_text(observation: Mapping[str, Any]) -> str:
    """What the model reads of an observation: its only text field, else its fields as JSON (``""`` without any);
    `reward`, `done` and `metadata` are left out."""
    fields = {name: value for name, value in observation.items() if name not in NOT_TEXT_FIELDS}
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    return json.dumps(fields, ensure_ascii=False, default=str) if fields else ""


def tool_result_text(observation: Mapping[str, Any]) -> Tuple[str, Optional[str]]:
    """`(text, error)` of a ``call_tool`` step's observation: the tool's text content, or openenv's tool error
    (unknown tool, bad arguments, a tool that raised); an observation of another kind reads as `observation_text`."""
    if "tool_name" not in observation:
        return observation_text(observation), None
    error = observation.get("error")
    if error:
        message = error.get("message", str(error)) if isinstance(error, Mapping) else str(error)
        return f"Error: {message}", message
    result = observation.get("result")
    if isinstance(result, Mapping) and isinstance(result.get("content"), list):
        texts = [item.get("text", "") for item in result["content"] if isinstance(item, Mapping) and item.get("type") == "text"]
        text = "\n".join(texts)
        return text, (text or "the tool failed") if result.get("is_error") else None
    return (result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)), None


def opening_messages(prompt: Any, observation: str) -> Messages:
    """The row's `prompt` (none, a string, or chat messages) with the reset observation's text after it: appended to
    its last user message (a blank line between), or as a user message of its own.

    Raises:
        TypeError: a prompt that is not a string or a list of messages.
    """
    if prompt is None:
        messages: Messages = []
    elif isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(isinstance(message, Mapping) for message in prompt):
        messages = [dict(copy.deepcopy(message)) for message in prompt]
    else:
        raise TypeError(f"the row's prompt is {type(prompt).__name__} {prompt!r:.80}; expected a string or a list of chat messages.")
    if messages and messages[-1].get("role") == "user":
        before = messages[-1].get("content") or ""
        messages[-1]["content"] = f"{before}\n\n{observation}" if before and observation else before + observation
    else:
        messages.append({"role": "user", "content": observation})
    return messages
