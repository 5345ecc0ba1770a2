"""The legacy tool-call syntax as one reaction, shared by `TextEnvironment` and the Gym `ToolEnv`.

The model calls a tool by writing ``<request><ToolName>query<call>`` and ends its episode with
``<submit>`` (or by writing no tool call at all). `TagToolCalls` decides whether a model turn ends the
episode and, if not, runs the tool it asked for and returns the response text.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from textenv.environment.syntax import CALL_TOKEN, REQUEST_TOKEN, SUBMIT_TOKEN, parse_tool_call
from textenv.tools.base import call_tool, truncate_response


class TagToolCalls:
    """Runs the tool a model turn asks for with the tag syntax.

    Args:
        tools (`dict`): tools by name.
        timeout (`float`, *optional*): seconds a tool may run before its response becomes
            `"Tool error: ... timed out"`.
        max_response (`int`, *optional*): longest response in characters; a longer one keeps its first
            `max_response - 3` characters followed by `"..."`. `None`: no limit.
        parse (`Callable`, defaults to `parse_tool_call`): ``parse(text) -> (tool_name, query)``.
    """

    def __init__(
        self,
        tools: Mapping[str, Any],
        timeout: Optional[float] = None,
        max_response: Optional[int] = None,
        parse: Callable[[str], tuple[Optional[str], Optional[str]]] = parse_tool_call,
    ):
        self.tools = tools
        self.timeout = timeout
        self.max_response = max_response
        self.parse = parse

    @staticmethod
    def calls_tool(text: str) -> bool:
        """Whether a model turn holds a tool call (``<request>`` ... ``<call>``)."""
        return REQUEST_TOKEN in text and CALL_TOKEN in text

    @classmethod
    def ends_episode(cls, text: str) -> bool:
        """Whether a model turn ends its episode: it submits, or calls no tool."""
        return SUBMIT_TOKEN in text or not cls.calls_tool(text)

    def respond(self, text: str) -> str:
        """The response to the tool call in `text`: the tool's output, or a message saying that the call
        could not be parsed or names an unknown tool (not yet truncated: see `truncate`)."""
        name, query = self.parse(text)
        if name is None or query is None:
            return f"Unknown tool call: {text}"
        if name not in self.tools:
            return f"Unknown tool {name}."
        return call_tool(self.tools[name], query, timeout=self.timeout)

    def truncate(self, response: str) -> str:
        """`response` cut to `max_response` characters, the last three of them `"..."`."""
        return truncate_response(response, self.max_response)
