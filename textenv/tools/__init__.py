"""Tools: the protocol (:mod:`.base`), the built-in tools and tool repositories."""

from .base import TOOL_ERROR_PREFIX, call_tool, tool_name, tools_by_name
from .calculator import Calculator
from .json_calls import JsonToolCalls, ToolCallRecord
from .loading import load_tool, save_tool
from .python_interpreter import PythonInterpreter
from .schema import tool_schema
from .tag_calls import TagToolCalls
from .tool_call_parsers import ParsedTurn, ToolCall, get_tool_call_parser
from .wiki_search import WikiSearch

__all__ = [
    "TOOL_ERROR_PREFIX",
    "Calculator",
    "JsonToolCalls",
    "ParsedTurn",
    "PythonInterpreter",
    "TagToolCalls",
    "ToolCall",
    "ToolCallRecord",
    "WikiSearch",
    "call_tool",
    "get_tool_call_parser",
    "load_tool",
    "save_tool",
    "tool_name",
    "tool_schema",
    "tools_by_name",
]
