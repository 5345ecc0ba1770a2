"""The parsers by name (``--tool_parser``), the parser a chat template's text calls for, and resolving a
``tool_parser`` argument."""

from __future__ import annotations

from typing import Callable

from .deepseek import parse_deepseek_v3, parse_deepseek_v31
from .gemma4 import parse_gemma4
from .harmony import parse_gpt_oss
from .json_formats import parse_hermes, parse_llama3, parse_phi4_mini
from .mistral import parse_mistral
from .pythonic import parse_pythonic
from .turn import ParsedTurn
from .xml_formats import parse_glm4, parse_qwen3_coder

TOOL_CALL_PARSERS: dict[str, Callable[[str], ParsedTurn]] = {
    "hermes": parse_hermes,
    "qwen": parse_hermes,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
    "qwen3_coder": parse_qwen3_coder,
    "glm4": parse_glm4,
    "gpt_oss": parse_gpt_oss,
    "deepseek_v3": parse_deepseek_v3,
    "deepseek_v31": parse_deepseek_v31,
    "pythonic": parse_pythonic,
    "phi4_mini": parse_phi4_mini,
    "gemma4": parse_gemma4,
}

# What a template's text holds, per format, first match wins: any one group, all of its markers. The order
# matters where templates share markers: Qwen3.5 and GLM templates hold <tool_call> too, DeepSeek-V3's fences
# tell it from V3.1.
TEMPLATE_MARKERS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("mistral", (("[TOOL_CALLS]",),)),
    ("gpt_oss", (("<|channel|>", "<|message|>"),)),
    ("deepseek_v3", (("<｜tool▁call▁begin｜>", "```json"),)),
    ("deepseek_v31", (("<｜tool▁call▁begin｜>",),)),
    ("gemma4", (("<|tool_call>",),)),
    ("glm4", (("<arg_key>",),)),
    ("qwen3_coder", (("<function=", "<parameter="),)),
    ("hermes", (("<tool_call>",),)),
    ("phi4_mini", (("<|tool|>",), ("<|tool_call|>",))),
    ("pythonic", (("<|tool_call_start|>",), ("<|tool_list_start|>",))),
    ("llama3", (("<|python_tag|>",), ("<|start_header_id|>", "parameters"), ("<|header_start|>", "parameters"))),
)


def parser_for_template(chat_template: str | None) -> str:
    """Name (a key of `TOOL_CALL_PARSERS`) of the parser for the tool-call format a chat template writes.

    Args:
        chat_template (`str`, *optional*): the Jinja chat template; `None` when the tokenizer has none.

    Returns:
        `str`: the first format of `TEMPLATE_MARKERS` whose markers the template holds (``"mistral"`` for
        ``[TOOL_CALLS]``, ``"gpt_oss"`` for harmony's ``<|channel|>``, ``"deepseek_v3"`` / ``"deepseek_v31"``
        for ``<｜tool▁call▁begin｜>`` with / without a ```` ```json ```` fence, ``"gemma4"`` for ``<|tool_call>``,
        ``"glm4"`` for ``<arg_key>``, ``"qwen3_coder"`` for ``<function=`` and ``<parameter=``, ``"hermes"`` for
        ``<tool_call>``, ``"phi4_mini"`` for ``<|tool|>``, ``"pythonic"`` for LFM2's ``<|tool_call_start|>`` or
        ``<|tool_list_start|>``, ``"llama3"`` for ``<|python_tag|>`` or a Llama header with ``parameters``);
        otherwise ``"hermes"``, the format of textenv's own tool template.
    """
    template = chat_template or ""
    for name, groups in TEMPLATE_MARKERS:
        if any(all(marker in template for marker in group) for group in groups):
            return name
    return "hermes"


def get_tool_call_parser(parser: str | Callable[[str], ParsedTurn]) -> Callable[[str], ParsedTurn]:
    """Resolve a ``tool_parser`` argument.

    Args:
        parser (`str` or `Callable`): a key of `TOOL_CALL_PARSERS`, or a callable ``text -> ParsedTurn``.

    Returns:
        The parser function (a callable `parser` itself).

    Raises:
        ValueError: `parser` is a string that names no parser (one line, with the known names).
        TypeError: `parser` is neither a string nor callable.
    """
    if isinstance(parser, str):
        if parser not in TOOL_CALL_PARSERS:
            known = ", ".join(repr(name) for name in TOOL_CALL_PARSERS)
            raise ValueError(f"tool_parser={parser!r} (--tool_parser) is not a known tool-call parser; use one of {known} "
                             "or a callable text -> ParsedTurn")
        return TOOL_CALL_PARSERS[parser]
    if callable(parser):
        return parser
    raise TypeError(f"tool_parser must be a parser name or a callable, got {type(parser).__name__}")
