"""`textenv view`: one self-contained HTML page of a run: reward and accuracy curves, tool calls and errors per
step, and every episode, filterable, with its text coloured as `show_text` colours it and its tokens.

PATH is a run directory (`episodes.jsonl` and `steps.jsonl`, written by `textenv train` and `train(run_dir=...)`,
and/or `completions.jsonl`, written by `textenv rollout`) or one `episodes.jsonl` / `completions.jsonl` file.
The page needs no server and no network; ``--serve`` also serves it on http://127.0.0.1:PORT/.

    textenv view outputs/train --output page.html
    textenv view completions.jsonl --output rollout.html --serve
"""

from __future__ import annotations

import functools
import http.server
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from textenv.logs import LOG_LEVELS, setup_logging
from textenv.parsing import parse_options, settings_phase

logger = logging.getLogger(__name__)


@dataclass
class ViewArguments:
    """What `textenv view` reads and writes."""

    path: Optional[str] = field(
        default=None, metadata={"help": "the run directory or .jsonl file to show (may also be given as the first argument: textenv view PATH)"}
    )
    output: Optional[str] = field(default=None, metadata={"help": "the HTML file to write (default: view.html in the run directory, or FILE.html next to a file)"})
    title: Optional[str] = field(default=None, metadata={"help": "the page title (default: textenv view: PATH)"})
    serve: bool = field(default=False, metadata={"help": "also serve the page on http://127.0.0.1:PORT/ until interrupted"})
    port: int = field(default=8000, metadata={"help": "the port of --serve (0: any free port)"})
    log_level: str = field(default="info", metadata={"help": "what to print", "choices": list(LOG_LEVELS)})


def parse(argv: Optional[Sequence[str]] = None) -> ViewArguments:
    """The options; a first argument that is not an option is the PATH.

    Raises:
        ValueError: no PATH given.
    """
    argv = list(argv or [])
    if argv and not argv[0].startswith("-"):
        argv = ["--path", *argv]
    (view,) = parse_options((ViewArguments,), argv, prog="textenv view", description=__doc__)
    if not view.path:
        raise ValueError("PATH is missing: give a run directory (episodes.jsonl, steps.jsonl and/or completions.jsonl) or one such file, e.g. textenv view outputs/train --output page.html")
    return view


def default_output(path: Path) -> Path:
    """Where the page goes without ``--output``: `view.html` in a run directory, `FILE.html` next to a file."""
    return path / "view.html" if path.is_dir() else path.with_suffix(".html")


def serve(output: Path, port: int = 8000) -> http.server.ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 for the page's folder (not started: call `serve_forever`); `/` redirects to the page."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path in ("/", ""):
                self.send_response(302)
                self.send_header("Location", "/" + output.name)
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            logger.debug(format % args)

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(Handler, directory=str(output.parent)))


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Run `textenv view` and return what it wrote: ``{"output", "episodes", "steps"}``."""
    from textenv.view.data import load_run
    from textenv.view.page import render_page

    with settings_phase():
        view = parse(argv)
        setup_logging(view.log_level)
        path = Path(view.path)
        run = load_run(path)
        output = Path(view.output) if view.output else default_output(path)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(render_page(run, view.title or f"textenv view: {view.path}"), encoding="utf-8")
        logger.info(f"textenv view: {len(run.episodes)} episodes, {len(run.steps)} steps -> {output}")
        server = serve(output.resolve(), view.port) if view.serve else None  # a port in use is a settings error
    if server is not None:
        logger.info(f"serving http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C to stop)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return {"output": str(output), "episodes": len(run.episodes), "steps": len(run.steps)}
