"""Rich views of a TextHistory: coloured text in a terminal, coloured HTML in a notebook.

rich's global console detects Jupyter and renders the same `Text` objects as HTML there, so one set of
views serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    from rich.console import Console
    from rich.text import Text
except ImportError:  # pragma: no cover - rich is a hard dependency; this keeps the message clear
    Console = Text = None

if TYPE_CHECKING:
    from textenv.environment.history import TextHistory


def _require_rich() -> None:
    if Text is None:
        raise ImportError("Displaying histories needs `rich`: pip install rich")


def text_view(history: "TextHistory") -> "Text":
    """The full text, the prompt segment, system segments and model segments each in their colour,
    followed by the reward line."""
    _require_rich()
    view = Text(history.text)
    prompt_end = history.text_spans[1][0] if len(history.text_spans) > 1 else len(history.text)
    view.stylize(history.prompt_color, 0, prompt_end)
    for (start, end), system in zip(history.text_spans[1:], history.system_spans[1:]):
        view.stylize(history.system_color if system else history.model_color, start, end)
    view.append(f"\n\nReward: {history.reward}", style=history.reward_color)
    return view


def tokens_view(history: "TextHistory", tokenizer) -> "Text":
    """Every token as `tokenizer.convert_ids_to_tokens` spells it, separated by spaces and coloured
    prompt / system / model, followed by the reward line."""
    _require_rich()
    view = Text()
    prompt_end = history.token_spans[0][1]
    for index, (token_id, mask) in enumerate(zip(history.tokens.tolist(), history.token_masks.tolist())):
        if index < prompt_end:
            style = history.prompt_color
        else:
            style = history.model_color if mask else history.system_color
        view.append(str(tokenizer.convert_ids_to_tokens(token_id)), style=style)
        view.append(" ")
    view.append(f"\n\nReward: {history.reward}", style=history.reward_color)
    return view


def legend_view(history: "TextHistory") -> "Text":
    """`(Colour Legend: Prompt|System|Model|Reward)` with each word in its colour."""
    _require_rich()
    view = Text("\n\n(Colour Legend: ")
    entries = [
        ("Prompt", history.prompt_color),
        ("System", history.system_color),
        ("Model", history.model_color),
        ("Reward", history.reward_color),
    ]
    for position, (label, style) in enumerate(entries):
        if position:
            view.append("|")
        view.append(label, style=style)
    view.append(")")
    return view


def print_renderable(renderable, console: "Console | None" = None) -> None:
    """Print with the given console, else rich's global one (which writes HTML in a notebook)."""
    if console is None:
        from rich import get_console

        console = get_console()
    console.print(renderable)


def to_html(renderable) -> str:
    """Standalone coloured HTML of a view (used by `TextHistory._repr_html_`)."""
    _require_rich()
    console = Console(record=True, width=120, file=_NullFile(), force_terminal=False, force_jupyter=False)
    console.print(renderable)
    return console.export_html(inline_styles=True)


class _NullFile:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass
