"""Tools: the protocol, the built-in tools, tool repositories and the two tool-call formats.

- `base`: what a tool is (any callable ``fn(query) -> str``, async or a smolagents ``Tool``), `call_tool`,
  `tool_name`, `tools_by_name`, `TOOL_ERROR_PREFIX`;
- `calculator`: `Calculator`; `python_interpreter`: `PythonInterpreter` (runs code through `.sandbox`);
  `wiki_search`: `WikiSearch` (BM25 over local documents);
- `loading`: `load_tool` / `save_tool` (tool repositories, `BUILTIN_TOOLS`, legacy hub aliases);
- `schema`: `tool_schema`, JSON schemas of tools for the chat template, and argument checks;
- `tag_calls`: `TagToolCalls`, the legacy ``<request><Tool>query<call>`` syntax as a reaction;
- `json_calls`: `JsonToolCalls`, the chat template's JSON tool calls as a reaction, `ToolCallRecord`;
- `tool_call_parsers`: `get_tool_call_parser`, `ToolCall`, `ParsedTurn`: the calls read from a model's turn, in
  each model family's format (Hermes, Llama, Mistral, Qwen3-Coder, GLM, GPT-OSS, DeepSeek, pythonic, Phi-4, Gemma 4);
- `sandbox/`: the sandbox's process machinery (its own package); `call_formats/`: the parsers, one module per
  family group (its own package).

May import: textenv.asyncio_bridge, textenv.environment (the tag syntax only; a cycle), textenv.extras
"""

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
