"""Messages between verifiers and textenv: verifiers' pydantic messages as textenv's chat dicts, and a model
turn of textenv's as the `vf.Response` verifiers' rollout code expects from a client.

verifiers 0.3 writes a tool call flat (``ToolCall(id, name, arguments: str)``); the chat templates and textenv
write it OpenAI's way (``{"id", "type": "function", "function": {"name", "arguments"}}``). Arguments go to
verifiers as a JSON string (``json.dumps(..., ensure_ascii=False)``, what vLLM's tool parsers send); a call
textenv could not read keeps its raw text there, so the environment's own `ToolEnv` answers the parse error.

The chat conversions need no verifiers; the classic API's types are imported by the two functions that build
them (verifiers 0.4 has no `verifiers.legacy`, and its v1 adapter uses the conversions too). So do
`installed_verifiers` and `is_v1_environment`, which choose between the two adapters.
"""

from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Sequence

from textenv.engine.stopping import FINISH_LENGTH
from textenv.tools.json_calls import ToolCallRecord

CHAT_ROLES = ("system", "user", "assistant", "tool")
V1_RELEASE = "0.4."  # the verifiers release whose v1 API textenv drives (0.4 has no classic API)


def installed_verifiers() -> str:
    """The installed verifiers version.

    Raises:
        ImportError: verifiers is not installed (the message names both extras).
    """
    import importlib.metadata

    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError("--task verifiers needs verifiers: pip install 'textenv[verifiers]' (classic environments, verifiers 0.3) "
                          "or 'textenv[verifiers-v1]' (v1 tasksets, verifiers 0.4).") from error


def is_v1_environment(environment: Any) -> bool:
    """A verifiers v1 `Env` (or subclass), told without importing verifiers."""
    return any(cls.__module__ == "verifiers.v1.env" and cls.__name__ == "Env" for cls in type(environment).__mro__)


def text_content(content: Any, where: str) -> str:
    """A message's content as text: a string, `None` (``""``) or a list of text parts (joined).

    Raises:
        ValueError: an image, audio or other non-text part (textenv's chat templates take text only).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = getattr(part, "type", None) if not isinstance(part, dict) else part.get("type")
        text = getattr(part, "text", None) if not isinstance(part, dict) else part.get("text")
        if kind != "text" or not isinstance(text, str):
            raise ValueError(f"{where}: a {kind!r} content part; textenv renders text only (images and audio are not supported).")
        texts.append(text)
    return "".join(texts)


def chat_dicts(messages: Sequence[Any], where: str, tool_names: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """verifiers messages (pydantic models or dicts) as textenv chat dicts; a tool message gets the `name` of
    the call it answers when `tool_names` (call id -> tool name) knows it.

    Raises:
        ValueError: a role textenv cannot render (verifiers' completion-format ``"text"`` messages) or
            non-text content.
    """
    tool_names = dict(tool_names or {})
    converted = []
    for index, message in enumerate(messages):
        fields = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        role = fields.get("role")
        if role not in CHAT_ROLES:
            raise ValueError(f"{where}[{index}] has role {role!r}; textenv plays chat environments (roles {list(CHAT_ROLES)}).")
        entry: Dict[str, Any] = {"role": role, "content": text_content(fields.get("content"), f"{where}[{index}]")}
        if role == "assistant" and fields.get("tool_calls"):
            entry["tool_calls"] = [openai_tool_call(call) for call in fields["tool_calls"]]
            tool_names.update({call["id"]: call["function"]["name"] for call in entry["tool_calls"]})
        if role == "tool":
            entry["tool_call_id"] = fields.get("tool_call_id", "")
            if entry["tool_call_id"] in tool_names:
                entry["name"] = tool_names[entry["tool_call_id"]]
        converted.append(entry)
    return converted


def openai_tool_call(call: Any) -> Dict[str, Any]:
    """A verifiers tool call (a `ToolCall`, its JSON as verifiers' saved outputs hold it, or a dict, flat or
    already in OpenAI's form) in OpenAI's form."""
    fields = call if isinstance(call, dict) else json.loads(call) if isinstance(call, str) else call.model_dump()
    if "function" in fields:
        return fields
    return {"id": fields.get("id", ""), "type": "function", "function": {"name": fields.get("name", ""), "arguments": fields.get("arguments", "")}}


def verifiers_tool_calls(message: Dict[str, Any]) -> Optional[list]:
    """The `tool_calls` textenv parsed from a reply, as verifiers' `ToolCall`s (`None` without calls)."""
    from verifiers.legacy.types import ToolCall

    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {})
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(id=str(call.get("id", "")), name=function.get("name") or "", arguments=arguments))
    return calls or None


def model_response(message: Dict[str, Any], finish_reason: Optional[str], model: str, response_id: str) -> Any:
    """A model turn as the `vf.Response` a verifiers client returns: the reply's text and tool calls;
    ``"length"`` when the turn hit its token budget (`is_truncated`), else ``"tool_calls"`` or ``"stop"``.
    No `usage` and no `tokens`: textenv keeps the exact token ids in its own episode."""
    from verifiers.legacy.types import Response, ResponseMessage

    tool_calls = verifiers_tool_calls(message)
    truncated = finish_reason == FINISH_LENGTH
    reason = "length" if truncated else ("tool_calls" if tool_calls else "stop")
    reply = ResponseMessage(content=message.get("content") or "", tool_calls=tool_calls, finish_reason=reason, is_truncated=truncated)
    return Response(id=response_id, created=int(time.time()), model=model, message=reply)


def tool_call_records(calls: Sequence[Dict[str, Any]], answers: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One `ToolCallRecord` per call of a reply (the tool message's text as `result`, and `error` when textenv
    could not read the call), as dicts, for the step's info and the run's tool-call counts."""
    results = {answer.get("tool_call_id"): answer.get("content") for answer in answers if answer.get("role") == "tool"}
    records = []
    for call in calls:
        function = call.get("function", {})
        record = ToolCallRecord(call.get("id"), function.get("name"), function.get("arguments"), results.get(call.get("id")), call.get("error"))
        records.append(record.as_dict())
    return records
