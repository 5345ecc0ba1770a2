"""Text environments: tool-call syntax, episode histories and the TextEnvironment."""

from textenv.environment.history import TextHistory
from textenv.environment.syntax import (
    CALL_TOKEN,
    REQUEST_TOKEN,
    RESPONSE_TOKEN,
    SUBMIT_TOKEN,
    neutralize,
    parse_tool_call,
)
from textenv.environment.text_environment import TextEnvironment

__all__ = [
    "CALL_TOKEN",
    "REQUEST_TOKEN",
    "RESPONSE_TOKEN",
    "SUBMIT_TOKEN",
    "TextEnvironment",
    "TextHistory",
    "neutralize",
    "parse_tool_call",
]
