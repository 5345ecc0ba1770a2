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

def __getattr__(name: str):
    # Lazy: text_environment imports textenv.chat, whose modules import this package's leaf modules.
    if name == "TextEnvironment":
        from textenv.environment.text_environment import TextEnvironment

        return TextEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
