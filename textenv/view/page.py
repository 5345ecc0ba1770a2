"""The `textenv view` page: one self-contained HTML file (inline CSS, JavaScript and data, no network).

The template (`page.html`, `page.css`, `page.js`, shipped with the package) is filled in one pass; the run's
data goes in a ``<script type="application/json">`` block with ``<``, ``>`` and ``&`` written as JSON escapes,
so no text of an episode (``<request>``, ``</script>``, ``<!--``) can end the block or become markup. The
JavaScript puts every text on the page with `textContent`.
"""

from __future__ import annotations

import html
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Optional, Union

from textenv.environment.history import TextHistory
from textenv.view.data import RunData, load_run, phase_summaries

# Segment kind -> the `TextHistory` colour `show_text` / `show_tokens` give it.
COLOUR_ATTRIBUTES = {"prompt": "prompt_color", "tool": "system_color", "model": "model_color", "reward": "reward_color"}
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def segment_colours() -> Dict[str, Dict[str, str]]:
    """``{kind: {"color", "background"}}`` as hex, from the rich styles of `TextHistory` (`show_text`'s colours).

    Returns:
        One entry for each of ``"prompt"``, ``"tool"`` (system text), ``"model"`` and ``"reward"``.
    """
    from rich.style import Style

    colours = {}
    for kind, attribute in COLOUR_ATTRIBUTES.items():
        style = Style.parse(getattr(TextHistory, attribute))
        colours[kind] = {"color": style.color.get_truecolor().hex, "background": style.bgcolor.get_truecolor().hex}
    return colours


def colour_css() -> str:
    """CSS classes ``.kind-prompt``, ``.kind-tool``, ``.kind-model``, ``.kind-reward`` in `segment_colours`."""
    return "\n".join(f".kind-{kind} {{ color: {c['color']}; background-color: {c['background']}; }}" for kind, c in segment_colours().items())


def script_json(data: Any) -> str:
    """`data` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` are ``\\u`` escapes
    (``</script>`` and ``<!--`` cannot appear), and the text still parses as the same JSON."""
    text = json.dumps(data, ensure_ascii=False, default=repr, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page_data(run: RunData, title: str) -> Dict[str, Any]:
    """What the page's script reads: the title, the files read, the episodes, the steps and a summary per phase."""
    kinds = phase_summaries(run.episodes, "env_kind")
    data = {"title": title, "sources": run.sources, "episodes": run.episodes, "steps": run.steps, "phases": phase_summaries(run.episodes),
            "kinds": kinds if len(kinds) > 1 else []}  # a table only when a run played several environment kinds
    return _finite(data)


def render_page(run: RunData, title: str = "textenv view") -> str:
    """The HTML page of `run`.

    Args:
        run (`RunData`): what to show (see `load_run`).
        title (`str`, defaults to ``"textenv view"``): the page title.

    Returns:
        The page, one self-contained HTML document.
    """
    values = {
        "title": html.escape(title),
        "sources": html.escape(", ".join(run.sources)),
        "style": _asset("page.css"),
        "colours": colour_css(),
        "script": _asset("page.js"),
        "data": script_json(page_data(run, title)),
    }
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], _asset("page.html"))


def build_page(path: Union[str, Path], output: Union[str, Path, None] = None, title: Optional[str] = None) -> str:
    """Read a run (see `load_run`) and return its page; with `output`, also write it there.

    Args:
        path (`str` or `Path`): a run directory, or an `episodes.jsonl` / `completions.jsonl` file.
        output (`str` or `Path`, *optional*): where to write the HTML file (parent folders are created).
        title (`str`, *optional*): the page title (default: ``"textenv view: <path>"``).

    Returns:
        The HTML.
    """
    page = render_page(load_run(path), title or f"textenv view: {path}")
    if output is not None:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(page, encoding="utf-8")
    return page


def _asset(name: str) -> str:
    return resources.files("textenv.view").joinpath(name).read_text(encoding="utf-8")


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by `None` (JSON has neither; the page skips `None`)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
