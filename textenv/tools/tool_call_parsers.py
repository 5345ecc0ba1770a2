"""Read the tool calls out of a model's turn, in the formats today's open model families' chat templates teach.

The parsers (``tool_parser=`` / ``--tool_parser`` names; each a function ``text -> ParsedTurn``):

- ``"hermes"`` / ``"qwen"`` (Qwen2.5, Qwen3, Hermes): ``<tool_call>\\n{"name": "f", "arguments": {"a": 1}}\\n</tool_call>``;
- ``"llama3"`` (Llama 3.1-3.3, Llama 4 JSON): ``<|python_tag|>{"name": "f", "parameters": {"a": 1}}``, the whole turn;
- ``"mistral"``: ``[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123XYZ"}]`` (v3 tokenizers),
  ``[TOOL_CALLS]f[ARGS]{"a": 1}`` (v11+) or ``[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{"a": 1}``;
- ``"qwen3_coder"`` (Qwen3-Coder, Qwen3.5+, Nemotron 3):
  ``<tool_call>\\n<function=f>\\n<parameter=a>\\n1\\n</parameter>\\n</function>\\n</tool_call>``;
- ``"glm4"`` (GLM-4.5, GLM-4.6): ``<tool_call>f\\n<arg_key>a</arg_key>\\n<arg_value>1</arg_value>\\n</tool_call>``;
- ``"gpt_oss"`` (harmony): ``<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>``;
- ``"deepseek_v3"``: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{"a": 1}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>``;
- ``"deepseek_v31"`` (V3.1+): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>``;
- ``"pythonic"`` (LFM2, Llama 3.2 / 4 pythonic): ``<|tool_call_start|>[f(a=1, b="x"), g()]<|tool_call_end|>`` or ``[f(a=1)]``;
- ``"phi4_mini"``: ``<|tool_call|>[{"name": "f", "arguments": {"a": 1}}]<|/tool_call|>``;
- ``"gemma4"``: ``<|tool_call>call:f{a:1,b:<|"|>x<|"|>}<tool_call|>``.

Several calls per turn are read in order, with the text around them as the content. Thinking (``<think>...</think>``,
Magistral's ``[THINK]...[/THINK]``, Gemma 4's ``<|channel>thought...<channel|>``, harmony's analysis channel) is
set aside as `ParsedTurn.reasoning`: calls written there are not read. A call that cannot be read (malformed, or
cut off by the turn budget) is still returned, with `name` and/or `arguments` `None`, an `error` saying why and
the model's raw `text`, so the caller can tell the model what went wrong: the parsers never raise. They receive
the turn without its end-of-turn token but tolerate trailing whitespace and any of `END_OF_TURN_STRINGS`
(``<|im_end|>``, ``<|eot_id|>``, ``<|eom_id|>``, ``</s>``, ``<end_of_turn>``, ``<|return|>``, ``<|call|>``,
``<|end|>``, ``<｜end▁of▁sentence｜>``, ...).

The parsers are textenv's own and the only path at run time: transformers' ``parse_response`` with TRL's response
templates covers some of these formats (the tests check that both read the same calls from the same text), but
it raises on one malformed call, reads a cut-off XML call as a complete one, needs the prompt as a prefix, and is
missing from the lowest supported releases. The families' modules are in `textenv.tools.call_formats`.
"""

from textenv.tools import call_formats
from textenv.tools.call_formats import *  # noqa: F401,F403 - the public names of the formats' package, re-exported

__all__ = list(call_formats.__all__)
