"""A tokenizer's chat template set up for JSON tool calls: the template, the call parser, the conformance."""

from __future__ import annotations

import functools
import inspect
import json
import warnings
from typing import Callable, Iterable, Optional

from textenv.chat.budget import call_budget
from textenv.chat.certificate import Certificate, certify
from textenv.chat.conformance import Conformance
from textenv.chat.renderer import ChatRenderer


class ChatTools:
    """What a JSON tool-call run needs from the tokenizer: the template, the parser and its conformance.

    Args:
        tokenizer: the model's tokenizer.
        chat_template (`str`, *optional*): a template to use instead of the tokenizer's (default: the
            tokenizer's when it takes `tools=`, else textenv's tool-aware ChatML template).
        tool_parser (`str` or `Callable`, *optional*): `"hermes"`, `"qwen"`, `"llama3"`, `"mistral"` or
            ``parser(text) -> ParsedTurn``; default: the format the template writes.
        stop_token_ids (`Iterable[int]`): the ids generation stops at besides the tokenizer's eos (the model's
            generation config and the run's ``eos_token_id``; `textenv.engine.sampling.end_token_ids`).

    Attributes:
        conformance (`Conformance`): whether the template renders turn by turn append-only (checked once,
            at construction; a warning says so when it does not).
    """

    def __init__(self, tokenizer, chat_template: Optional[str] = None, tool_parser=None, stop_token_ids: Iterable[int] = ()):
        self.certificate: Certificate = certify(tokenizer, chat_template=chat_template, tool_parser=tool_parser,
                                                stop_token_ids=stop_token_ids)
        if not self.certificate.works:
            raise ValueError(self.certificate.verdict())
        self.renderer: ChatRenderer = self.certificate.renderer
        self.chat_template = self.renderer.chat_template
        self.parser_name = self.certificate.parser_name if isinstance(tool_parser, (str, type(None))) else None
        self.parse = self.certificate.parse
        self.conformance: Conformance = self.certificate.conformance
        self._renderers: dict[str, ChatRenderer] = {}
        self._budgets: dict[str, int] = {}
        if not self.conformance.append_only:
            warnings.warn(f"The chat template is {self.conformance.summary()}.", stacklevel=3)

    def turn_budget(self, schemas: list[dict]) -> int:
        """Tokens a model turn needs to call any of `schemas`' tools (`textenv.chat.budget.call_budget`); one number
        per distinct list, reused."""
        key = json.dumps(schemas, sort_keys=True, default=str)
        if key not in self._budgets:
            self._budgets[key] = call_budget(self.renderer_for(schemas), schemas)
        return self._budgets[key]

    def parser_for(self, schemas: list[dict]) -> Callable:
        """The parser, told `schemas` where its format needs them to type the arguments (Qwen3-Coder's and GLM's
        XML calls write every value as text)."""
        if "tools" not in inspect.signature(self.parse).parameters:
            return self.parse
        return functools.partial(self.parse, tools=list(schemas))

    def renderer_for(self, schemas: list[dict]) -> ChatRenderer:
        """A renderer that describes `schemas` (one per distinct list, reused)."""
        key = json.dumps(schemas, sort_keys=True, default=str)
        if key not in self._renderers:
            self._renderers[key] = self.renderer.with_tools(schemas)
        return self._renderers[key]
