"""Text environments: the legacy front end, its tool-call syntax and the episode history.

- `text_environment`: `TextEnvironment`, the legacy TRL front end: `run(queries)` plays episodes on the one
  driver and returns what `PPOTrainer.step` takes plus the histories (imported lazily: it imports
  `textenv.chat`, which imports this package's leaf modules);
- `history`: `TextHistory`, one episode as text segments with the exact tokens behind them and a training mask;
- `syntax`: the tags (`REQUEST_TOKEN`, `CALL_TOKEN`, `RESPONSE_TOKEN`, `SUBMIT_TOKEN`), `parse_tool_call`,
  `neutralize`;
- `chat_tools`: `TextEnvironment(tool_format="json")`: episodes as chat conversations with JSON tool calls;
- `ending`: the legacy end checks and `compute_reward` (`EndingAndRewards`);
- `rendering`: rich views of a `TextHistory` (terminal and notebook HTML).

May import: textenv.asyncio_bridge, textenv.chat, textenv.checks, textenv.engine, textenv.episodes, textenv.logs, textenv.padding, textenv.tools
"""

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
