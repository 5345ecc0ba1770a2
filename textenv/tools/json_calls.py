"""JSON tool calls as one reaction, shared by `TextEnvironment(tool_format="json")` and the Gym `ToolEnv`.

The model's turn is parsed into an assistant message with OpenAI-style `tool_calls` (see
`textenv.tools.tool_call_parsers`); `JsonToolCalls.answer` runs every call of the turn and returns one
`role: "tool"` message per call. Whatever goes wrong (a call that is not valid JSON, an unknown tool,
arguments the function does not take, the tool failing or timing out) becomes a ``"Tool error: ..."``
message to the model and an error in the call's record, never an exception.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional

from textenv.environment.syntax import CONTROL_TAGS
from textenv.tools.base import TOOL_ERROR_PREFIX, call_tool_with_arguments, truncate_response
from textenv.tools.schema import argument_error, tool_schema
from textenv.tools.tool_call_parsers import ToolCall

TOOL_FORMATS = ("tags", "json")
CALL_SHAPE = '{"name": <tool>, "arguments": {...}}'
JSON_CONTROL_STRINGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "[TOOL_CALLS]", "[TOOL_RESULTS]", "<|python_tag|>")
# What text that did not come from the model (tool results, observations) may not hold, besides the
# tokenizer's special tokens: the tags of both tool-call formats.
OBSERVATION_CONTROL_STRINGS = (*CONTROL_TAGS, *JSON_CONTROL_STRINGS)


def check_tool_format(tool_format: str) -> str:
    """`tool_format` if it is one of `TOOL_FORMATS`.

    Raises:
        ValueError: any other value, naming the choices.
    """
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be 'tags' (the legacy <request><Tool>query<call> syntax) or 'json' (the chat template's tool calls), got {tool_format!r}.")
    return tool_format


def call_id(index: int) -> str:
    """The id of a turn's `index`-th call in an episode: nine letters and digits (Mistral requires that)."""
    return f"call{index:05d}"


def openai_tool_calls(calls: list[ToolCall], first_index: int = 0) -> list[dict]:
    """Parsed calls in the chat-template form ``{"id", "type": "function", "function": {"name",
    "arguments"}}``; a call that could not be read keeps its raw text as a string `arguments`, an empty
    name and the reason under ``"error"``, so the answer can say what was wrong. A call keeps the id its model
    wrote (Mistral's) when that is nine letters and digits and new in the turn; others get `call_id`."""
    converted = []
    for offset, call in enumerate(calls):
        function = {"name": call.name or "", "arguments": call.arguments if call.error is None else call.text}
        own = call.id if call.id and len(call.id) == 9 and call.id.isalnum() and call.id.isascii() else None
        identifier = own if own and own not in {entry["id"] for entry in converted} else call_id(first_index + offset)
        converted.append({"id": identifier, "type": "function", "function": function})
        if call.error is not None:
            converted[-1]["error"] = call.error
    return converted


@dataclass
class ToolCallRecord:
    """One call as it happened, for histories and `completions.jsonl`.

    Attributes:
        id (`str`): the call's id (the tool message's `tool_call_id`).
        name (`str`): the tool named (``""`` when the call could not be read).
        arguments: the arguments (a dict), or the raw text when they were not valid JSON.
        result (`str`): what the model was told.
        error (`str`, *optional*): why the call failed.
    """

    id: str
    name: str
    arguments: Any
    result: str
    error: Optional[str] = None

    def as_dict(self) -> dict:
        return asdict(self)


class JsonToolCalls:
    """Runs the JSON tool calls of a model turn.

    Args:
        tools (`dict`): tools by name; a call's arguments are passed as keyword arguments.
        timeout (`float`, *optional*): seconds a tool may run before its result becomes a timeout error.
        max_response (`int`, *optional*): longest result in characters (its first `max_response - 3`
            characters and ``"..."``); `None`: no limit.
    """

    def __init__(self, tools: Mapping[str, Any], timeout: Optional[float] = None, max_response: Optional[int] = None):
        self.tools = dict(tools)
        self.timeout = timeout
        self.max_response = max_response

    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, for the chat template's `tools=`."""
        return [tool_schema(name, tool) for name, tool in self.tools.items()]

    def answer(self, tool_calls: list[dict], neutralize: Callable[[str], str] = lambda text: text) -> tuple[list[dict], list[ToolCallRecord]]:
        """Run every call of a turn, in order.

        Args:
            tool_calls (`list[dict]`): the assistant message's `tool_calls`.
            neutralize (`Callable`): defuses control strings in a result before the model sees it.

        Returns:
            `(tool_messages, records)`: one ``{"role": "tool", "tool_call_id", "name", "content"}`` message
            and one `ToolCallRecord` per call.
        """
        messages, records = [], []
        for index, call in enumerate(tool_calls):
            record = self._run(call, index)
            record.result = truncate_response(neutralize(record.result), self.max_response)
            records.append(record)
            messages.append({"role": "tool", "tool_call_id": record.id, "name": record.name, "content": record.result})
        return messages, records

    def _run(self, call: dict, index: int) -> ToolCallRecord:
        call = call if isinstance(call, dict) else {}
        function = call.get("function", call)
        identifier = str(call.get("id") or call_id(index))
        name, arguments = function.get("name") or "", function.get("arguments", {})
        error = None
        if call.get("error"):
            error = f"the tool call could not be read ({call['error']}); write it as {CALL_SHAPE}"
        elif isinstance(arguments, str):
            arguments, error = _decode_arguments(arguments)
        if error is None and not name:
            error = f"the tool call has no tool name; write it as {CALL_SHAPE}"
        elif error is None and name not in self.tools:
            error = f"unknown tool {name!r}; the tools are {', '.join(self.tools) or 'none'}"
        elif error is None and (mismatch := argument_error(self.tools[name], arguments)):
            error = f"wrong arguments for {name}: {mismatch}"
        if error is not None:
            return ToolCallRecord(identifier, name, arguments, f"{TOOL_ERROR_PREFIX}{error}", error)
        result = call_tool_with_arguments(self.tools[name], arguments, timeout=self.timeout)
        failed = result[len(TOOL_ERROR_PREFIX) :] if result.startswith(TOOL_ERROR_PREFIX) else None
        return ToolCallRecord(identifier, name, arguments, result, failed)


def _decode_arguments(text: str) -> tuple[Any, Optional[str]]:
    """Arguments given as a JSON string (the OpenAI form): the object, or the text and why not."""
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError) as error:
        return text, f"the arguments are not valid JSON ({error})"
    if isinstance(decoded, dict):
        return decoded, None
    return text, f"the arguments must be a JSON object, got {type(decoded).__name__}"
