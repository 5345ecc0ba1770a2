"""Conversations through a chat template with exact tokens.

- `renderer`: `ChatRenderer`, the text new messages add as a delta of the template (earlier turns are never
  re-rendered), `ChatTemplateError`, `Message` / `Messages`;
- `transcript`: `Transcript`, one episode's conversation as the exact tokens of every message, and its
  `TextHistory` under a loss scale;
- `templates`: `CHATML_TOOLS_TEMPLATE` (the tool-aware ChatML template textenv ships) and `tool_chat_template`,
  the choice between it and the tokenizer's own;
- `tool_chat`: `ChatTools`, a tokenizer's template set up for JSON tool calls (template, call parser, conformance);
- `conformance`: `check_conformance`, whether a template renders a conversation append-only, token by token;
- `certificate`: `certify`, whether a model's tokenizer and template will work for JSON tool calls (`Certificate`,
  `Check`: ``textenv check-model``), and `budget`: the tokens a call needs (`call_budget`);
- `families`: `Family`, one model family's conventions (tool-call parser, thinking markers, stop strings, ...),
  `FAMILIES`, and `recognise_family`, a tokenizer's family from its chat template (`template_hashes` lists the
  templates known byte for byte).

May import: textenv.engine (Completion), textenv.environment (TextHistory, the tag syntax; a cycle), textenv.tools (tool-call parsers)
"""

from textenv.chat.budget import call_budget
from textenv.chat.certificate import Certificate, Check, certify
from textenv.chat.conformance import Conformance, check_conformance
from textenv.chat.families import FAMILIES, Family, Recognition, recognise_family
from textenv.chat.renderer import ChatRenderer, ChatTemplateError, Message, Messages
from textenv.chat.templates import CHATML_TOOLS_TEMPLATE, template_takes_tools, tool_chat_template
from textenv.chat.tool_chat import ChatTools
from textenv.chat.transcript import Transcript

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "Certificate",
    "Check",
    "FAMILIES",
    "ChatRenderer",
    "ChatTemplateError",
    "ChatTools",
    "Conformance",
    "Family",
    "Message",
    "Messages",
    "Recognition",
    "Transcript",
    "call_budget",
    "certify",
    "check_conformance",
    "recognise_family",
    "template_takes_tools",
    "tool_chat_template",
]
