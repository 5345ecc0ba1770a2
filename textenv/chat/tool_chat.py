"""A tokenizer's chat template set up for JSON tool calls: the template, the call parser, the conformance."""

from __future__ import annotations

import json
import warnings
from typing import Optional

from textenv.chat.conformance import Conformance, check_conformance
from textenv.chat.renderer import ChatRenderer
from textenv.chat.templates import tool_chat_template
from textenv.tools.tool_call_parsers import get_tool_call_parser, parser_for_template


class ChatTools:
    """What a JSON tool-call run needs from the tokenizer: the template, the parser and its conformance.

    Args:
        tokenizer: the model's tokenizer.
        chat_template (`str`, *optional*): a template to use instead of the tokenizer's (default: the
            tokenizer's when it takes `tools=`, else textenv's tool-aware ChatML template).
        tool_parser (`str` or `Callable`, *optional*): `"hermes"`, `"qwen"`, `"llama3"`, `"mistral"` or
            ``parser(text) -> ParsedTurn``; default: the format the template writes.

    Attributes:
        conformance (`Conformance`): whether the template renders turn by turn append-only (checked once,
            at construction; a warning says so when it does not).
    """

    def __init__(self, tokenizer, chat_template: Optional[str] = None, tool_parser=None):
        self.chat_template = tool_chat_template(tokenizer, chat_template)
        self.renderer = ChatRenderer(tokenizer, chat_template=self.chat_template)
        if tool_parser is None:
            tool_parser = parser_for_template(self.chat_template or tokenizer.chat_template)
        self.parser_name = tool_parser if isinstance(tool_parser, str) else None
        self.parse = get_tool_call_parser(tool_parser)
        self.conformance: Conformance = check_conformance(self.renderer.with_tools(_SAMPLE_SCHEMAS))
        self._renderers: dict[str, ChatRenderer] = {}
        self._budgets: dict[str, int] = {}
        if not self.conformance.append_only:
            warnings.warn(f"The chat template is {self.conformance.summary()}.", stacklevel=3)

    def turn_budget(self, schemas: list[dict]) -> int:
        """Tokens a model turn needs to call any of `schemas`' tools: the longest call as the template writes it,
        each argument a `PLACEHOLDER_CHARS`-character string, plus `TEXT_BEFORE_CALL` tokens of text before it;
        at least the JSON default of `textenv.options`. One number per distinct list, reused."""
        key = json.dumps(schemas, sort_keys=True, default=str)
        if key not in self._budgets:
            renderer = self.renderer_for(schemas)
            question = [{"role": "user", "content": "?"}]
            asked = len(renderer.encode(renderer.render(question, add_generation_prompt=True)))
            longest = max((len(renderer.encode(renderer.render([*question, _placeholder_call(schema)]))) - asked for schema in schemas), default=0)
            self._budgets[key] = max(JSON_TURN_BUDGET, longest + TEXT_BEFORE_CALL)
        return self._budgets[key]

    def renderer_for(self, schemas: list[dict]) -> ChatRenderer:
        """A renderer that describes `schemas` (one per distinct list, reused)."""
        key = json.dumps(schemas, sort_keys=True, default=str)
        if key not in self._renderers:
            self._renderers[key] = self.renderer.with_tools(schemas)
        return self._renderers[key]


JSON_TURN_BUDGET = 48  # textenv.options.DEFAULT_MAX_NEW_TOKENS["json"]: a calculator call is about 34 tokens
TEXT_BEFORE_CALL = 24
PLACEHOLDER_CHARS = 24


def _placeholder_call(schema: dict) -> dict:
    """An assistant message calling `schema`'s function with every parameter set to a placeholder string."""
    function = schema.get("function", schema)
    parameters = (function.get("parameters") or {}).get("properties") or {}
    arguments = {name: "x" * PLACEHOLDER_CHARS for name in parameters}
    call = {"type": "function", "function": {"name": function.get("name", "tool"), "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


_SAMPLE_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "Calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
