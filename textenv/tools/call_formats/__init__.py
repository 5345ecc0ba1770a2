"""The tool-call formats of today's open model families, one module per family group; every parser reads a
model's turn into a `ParsedTurn` and never raises (see `textenv.tools.tool_call_parsers` for the formats).

- `turn`: `ToolCall`, `ParsedTurn`, end-of-turn strings, thinking blocks, ``OPEN ... CLOSE`` blocks;
- `json_values`: decoding JSON calls without raising, checking a call object, JSON lists of calls;
- `json_formats`: Hermes / Qwen (``<tool_call>{json}</tool_call>``), Llama 3.x / 4 JSON, Phi-4-mini;
- `mistral`: ``[TOOL_CALLS]`` (JSON list, ``name[ARGS]{...}``, ``name[CALL_ID]id[ARGS]{...}``);
- `xml_formats`: Qwen3-Coder / Qwen3.5+ ``<function=...>`` and GLM-4 MoE ``<arg_key>``; `argument_types`: how
  their text values are typed; `literals`: Python literals from a syntax tree (never evaluated);
- `harmony`: GPT-OSS's channels; `deepseek`: DeepSeek V3 and V3.1 call tokens; `pythonic`: ``[f(a=1)]`` (LFM2,
  Llama 3.2 / 4 pythonic); `gemma4`: ``<|tool_call>call:NAME{...}<tool_call|>``;
- `registry`: `TOOL_CALL_PARSERS`, `parser_for_template`, `get_tool_call_parser`.

May import: nothing from textenv
"""

from .deepseek import parse_deepseek_v3, parse_deepseek_v31
from .gemma4 import parse_gemma4
from .harmony import parse_gpt_oss
from .json_formats import parse_hermes, parse_llama3, parse_phi4_mini
from .mistral import parse_mistral
from .pythonic import parse_pythonic
from .registry import TEMPLATE_MARKERS, TOOL_CALL_PARSERS, get_tool_call_parser, parser_for_template
from .turn import END_OF_TURN_STRINGS, ParsedTurn, ToolCall
from .xml_formats import parse_glm4, parse_qwen3_coder

__all__ = [
    "END_OF_TURN_STRINGS",
    "TEMPLATE_MARKERS",
    "TOOL_CALL_PARSERS",
    "ParsedTurn",
    "ToolCall",
    "get_tool_call_parser",
    "parse_deepseek_v3",
    "parse_deepseek_v31",
    "parse_gemma4",
    "parse_glm4",
    "parse_gpt_oss",
    "parse_hermes",
    "parse_llama3",
    "parse_mistral",
    "parse_phi4_mini",
    "parse_pythonic",
    "parse_qwen3_coder",
    "parser_for_template",
]
