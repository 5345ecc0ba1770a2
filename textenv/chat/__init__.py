"""Conversations through a chat template with exact tokens: rendering deltas, the transcript of an
episode, the tool-aware ChatML template textenv ships and the append-only conformance check."""

from textenv.chat.conformance import Conformance, check_conformance
from textenv.chat.renderer import ChatRenderer, ChatTemplateError, Message, Messages
from textenv.chat.templates import CHATML_TOOLS_TEMPLATE, template_takes_tools, tool_chat_template
from textenv.chat.tool_chat import ChatTools
from textenv.chat.transcript import Transcript

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "ChatRenderer",
    "ChatTemplateError",
    "ChatTools",
    "Conformance",
    "Message",
    "Messages",
    "Transcript",
    "check_conformance",
    "template_takes_tools",
    "tool_chat_template",
]
