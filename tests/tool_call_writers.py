"""Each tool-call format written as its family's template (or model) writes it, for the parser tests: one `Format`
per parser of `textenv.tools.tool_call_parsers.TOOL_CALL_PARSERS` (the ``"qwen"`` alias excepted)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from textenv.tools.tool_call_parsers import TOOL_CALL_PARSERS, ParsedTurn

Calls = list[tuple[str, dict]]


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Format:
    """How one format writes calls.

    Args:
        parser: the parser's name.
        write: the calls of a turn as the format writes them.
        think: a thinking block holding a text, as written before the calls.
        before / after: content written before / after the calls; `shown`: the text of them the content holds.
        end_of_turn: the family's end-of-turn strings.
        malformed: a turn with one call that cannot be read.
        typed_by_schema: the format writes strings bare (XML-style): its parser takes `tools=` to type values.
        decoy_in_thinking: a call in the format's own syntax can be written inside its thinking block.
    """

    parser: str
    write: Callable[[Calls], str]
    think: Callable[[str], str]
    before: str
    after: str
    shown: tuple[str, ...]
    end_of_turn: tuple[str, ...]
    malformed: str
    typed_by_schema: bool = False
    decoy_in_thinking: bool = True

    def parse(self, text: str, calls: Calls = ()) -> ParsedTurn:
        """`text` read by the format's parser; the XML-style ones get the schemas of `calls`' arguments."""
        parser = TOOL_CALL_PARSERS[self.parser]
        return parser(text, tools=schemas(calls)) if self.typed_by_schema else parser(text)


def schemas(calls: Calls) -> list[dict]:
    """OpenAI-style tool schemas whose parameter types are those of the written arguments (merged per tool)."""
    kinds = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}
    properties: dict[str, dict] = {}
    for name, arguments in calls:
        properties.setdefault(name, {}).update({key: {"type": kinds.get(type(value), "string")} for key, value in arguments.items()})
    return [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": tool_properties}}}
            for name, tool_properties in properties.items()]


def _text(value: Any) -> str:
    """An XML-style argument: strings bare, everything else as JSON (as the Qwen3.5 and GLM templates write it)."""
    return value if isinstance(value, str) else to_json(value)


def _python(value: Any) -> str:
    """An LFM2 argument: strings as Python literals, mappings and lists as JSON, as its template writes them."""
    return repr(value) if isinstance(value, (str, bool)) or value is None else to_json(value)


def _gemma(value: Any) -> str:
    """A Gemma 4 argument, as its template's format_argument macro writes it."""
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{_gemma(item)}" for key, item in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma(item) for item in value) + "]"
    return str(value)


def _qwen_call(name: str, arguments: dict) -> str:
    parameters = "".join(f"<parameter={key}>\n{_text(value)}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def _glm_call(name: str, arguments: dict) -> str:
    pairs = "".join(f"<arg_key>{key}</arg_key>\n<arg_value>{_text(value)}</arg_value>\n" for key, value in arguments.items())
    return f"<tool_call>{name}\n{pairs}</tool_call>"


def _pythonic_call(name: str, arguments: dict) -> str:
    return f"{name}({', '.join(f'{key}={_python(value)}' for key, value in arguments.items())})"


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n\n"


DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

FORMATS = {format.parser: format for format in (
    Format("hermes", lambda calls: "\n".join(f"<tool_call>\n{to_json({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls),
           _think, "Let me check.\n", "\nDone.", ("Let me check.", "Done."), ("<|im_end|>", "<|endoftext|>"),
           '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'),
    Format("llama3", lambda calls: ";".join(to_json({"name": n, "parameters": a}) for n, a in calls),
           _think, "<|python_start|>Let me check.<|python_end|>", "\nDone.", ("Let me check.", "Done."),
           ("<|eot_id|>", "<|eom_id|>", "<|eot|>"), '{"name": "f", "parameters": {"a": 1}'),
    Format("mistral", lambda calls: "".join(f"[TOOL_CALLS]{n}[ARGS]{to_json(a)}" for n, a in calls),
           lambda text: f"[THINK]{text}[/THINK]", "Let me check.", "\nDone.", ("Let me check.", "Done."), ("</s>",),
           '[TOOL_CALLS]f[ARGS]{"a": 1'),
    Format("qwen3_coder", lambda calls: "\n".join(_qwen_call(n, a) for n, a in calls),
           _think, "Let me check.\n\n", "\nDone.", ("Let me check.", "Done."), ("<|im_end|>", "<|endoftext|>"),
           "<tool_call>\n<func=f>\n</func>\n</tool_call>", typed_by_schema=True),
    Format("glm4", lambda calls: "\n".join(_glm_call(n, a) for n, a in calls),
           lambda text: f"<think>{text}</think>\n", "Let me check.\n", "\nDone.", ("Let me check.", "Done."),
           ("<|user|>", "<|observation|>", "<|endoftext|>"), "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1\n</tool_call>",
           typed_by_schema=True),
    Format("gpt_oss", lambda calls: "".join(f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{to_json(a)}<|call|>"
                                            for n, a in calls),
           lambda text: f"<|channel|>analysis<|message|>{text}<|end|>",
           "<|start|>assistant<|channel|>commentary<|message|>Let me check.<|end|>",
           "<|start|>assistant<|channel|>final<|message|>Done.<|return|>", ("Let me check.", "Done."), ("<|return|>", "<|call|>", "<|end|>"),
           '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1<|call|>', decoy_in_thinking=False),
    Format("deepseek_v3", lambda calls: DS_CALLS + "\n".join(f"{DS_CALL}function{DS_SEP}{n}\n```json\n{to_json(a)}\n```{DS_CALL_END}" for n, a in calls)
           + DS_CALLS_END, _think, "Let me check.", "\nDone.", ("Let me check.", "Done."), ("<｜end▁of▁sentence｜>",),
           f'{DS_CALLS}{DS_CALL}function{DS_SEP}f\n```json\n{{"a": 1\n```{DS_CALL_END}{DS_CALLS_END}'),
    Format("deepseek_v31", lambda calls: DS_CALLS + "".join(f"{DS_CALL}{n}{DS_SEP}{to_json(a)}{DS_CALL_END}" for n, a in calls) + DS_CALLS_END,
           _think, "Let me check.", "\nDone.", ("Let me check.", "Done."), ("<｜end▁of▁sentence｜>",),
           f'{DS_CALLS}{DS_CALL}f{DS_SEP}{{"a": 1{DS_CALL_END}{DS_CALLS_END}'),
    Format("pythonic", lambda calls: "<|tool_call_start|>[" + ", ".join(_pythonic_call(n, a) for n, a in calls) + "]<|tool_call_end|>",
           _think, "Let me check.", "Done.", ("Let me check.", "Done."), ("<|im_end|>", "<|eot|>", "<|eot_id|>"),
           "<|tool_call_start|>[f(a=1,, b=2)]<|tool_call_end|>"),
    Format("phi4_mini", lambda calls: "<|tool_call|>" + to_json([{"name": n, "arguments": a} for n, a in calls]) + "<|/tool_call|>",
           _think, "Let me check. ", " Done.", ("Let me check.", "Done."), ("<|end|>", "<|endoftext|>"),
           '<|tool_call|>[{"name": "f", "arguments": {"a": 1}]<|/tool_call|>'),
    Format("gemma4", lambda calls: "".join(f"<|tool_call>call:{n}{_gemma(a)}<tool_call|>" for n, a in calls),
           lambda text: f"<|channel>thought\n{text}<channel|>", "Let me check.", "Done.", ("Let me check.", "Done."),
           ("<turn|>", "<|tool_response>", "<eos>"), "<|tool_call>call:f{a:1,,}<tool_call|>"),
)}
