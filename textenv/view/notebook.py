"""`show(path)`: the `textenv view` page of a run inside a notebook (an iframe with the page as `srcdoc`)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional, Union

from textenv.view.page import build_page


class RunView:
    """A run's page for a notebook: Jupyter displays it through `_repr_html_`.

    Args:
        page (`str`): the HTML page (see `build_page`).
        height (`int`, defaults to 900): the iframe's height in pixels.

    Attributes:
        html (`str`): the page.
    """

    def __init__(self, page: str, height: int = 900):
        self.html = page
        self.height = height

    def _repr_html_(self) -> str:
        """An iframe holding the page (its own document: the page's script and styles stay inside it)."""
        return f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width: 100%; height: {self.height}px; border: 1px solid #ddd;"></iframe>'

    def save(self, path: Union[str, Path]) -> Path:
        """Write the page to `path` and return it."""
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path


def show(path: Union[str, Path], title: Optional[str] = None, height: int = 900) -> RunView:
    """The `textenv view` page of a run directory or an `episodes.jsonl` / `completions.jsonl` file, for a notebook.

    Args:
        path (`str` or `Path`): what `textenv view` takes.
        title (`str`, *optional*): the page title.
        height (`int`, defaults to 900): the iframe's height in pixels.

    Returns:
        A `RunView` (displayed by Jupyter as the page).
    """
    return RunView(build_page(path, title=title), height=height)
