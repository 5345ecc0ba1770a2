"""Tools: the protocol (:mod:`.base`), the built-in tools and tool repositories."""

from .base import TOOL_ERROR_PREFIX, call_tool, tool_name, tools_by_name
from .calculator import Calculator
from .loading import load_tool, save_tool
from .python_interpreter import PythonInterpreter
from .wiki_search import WikiSearch

__all__ = [
    "TOOL_ERROR_PREFIX",
    "Calculator",
    "PythonInterpreter",
    "WikiSearch",
    "call_tool",
    "load_tool",
    "save_tool",
    "tool_name",
    "tools_by_name",
]
